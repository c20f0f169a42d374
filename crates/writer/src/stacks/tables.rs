//! The writer thread's listing of the stack tables (docs/FORMAT.md section
//! 10): before it writes any batch of a generation, the writer thread
//! writes the modules, registered frames and call-stack nodes that
//! generation has come to use since its last listing, as batches of kinds
//! 10, 11 and 12 ([`Tables::before`]). So every batch of events in the file
//! comes after the stacks it names: a trace cut anywhere (the process
//! killed by SIGKILL, a Go program ending with a raw exit_group) keeps the
//! stacks of every event it holds, up to its last complete batch.
//!
//! Below the session layer, like writer/mod.rs: the session passes in what it
//! knows (a generation's start tick, whether it lists modules).
//!
//! ## Invariants
//!
//! 1. Only the writer thread lists, and it lists a generation's entries in
//!    the file before the batch it is about to write: the events of that
//!    batch marked their nodes before the batch was queued
//!    (call_stack_table.rs invariant 3), so the listing finds them.
//! 2. Within one listing, modules come first, then frames, then nodes; a
//!    frames batch is always put out before a call-stacks batch that may
//!    name one of its frames, and a node's ancestors before the node.
//! 3. A listing key (`serial << 32 | generation`) is unique to one writer
//!    thread's generation: tables outlive sessions (and a forked child's
//!    session counts its generations from 1 again), so marks of "listed"
//!    left by an earlier session never hide an entry from a later one.

use std::sync::atomic::{AtomicU64, Ordering};

use alloctrace_format::stacks::FrameWord;
use alloctrace_format::{
    encode_batch_header, get_uvarint, push_uvarint, BatchKind, BATCH_PREFIX_LEN,
};

use crate::clock;
use crate::stacks::call_stack_table::Lister;
use crate::stacks::{frame_table, module_table};

/// Writer threads started so far (listing keys, invariant 3).
static SERIAL: AtomicU64 = AtomicU64::new(0);

/// Payload size past which a table batch is closed and another begun.
const BATCH_LIMIT: usize = 60 << 10;

/// One table batch under construction: its body.
struct Body {
    kind: BatchKind,
    bytes: Vec<u8>,
}

impl Body {
    fn new(kind: BatchKind) -> Body {
        Body {
            kind,
            bytes: Vec::with_capacity(BATCH_LIMIT + 8192),
        }
    }

    fn varint(&mut self, v: u64) {
        push_uvarint(&mut self.bytes, v);
    }

    /// Moves the body, as a whole batch of `generation`, to `out`.
    fn flush(&mut self, generation: u64, out: &mut Vec<u8>) {
        if self.bytes.is_empty() {
            return;
        }
        let (head, n) =
            encode_batch_header(self.kind, generation, 0, clock::ticks(), self.bytes.len());
        out.extend_from_slice(&head[..n]);
        out.extend_from_slice(&self.bytes);
        self.bytes.clear();
    }
}

/// What a batch about to be written is, as [`Tables::before`] sees it.
pub(crate) struct Seen {
    pub(crate) generation: u64,
    /// The batch is the generation's end.
    pub(crate) end: bool,
}

/// The writer thread's listing state.
pub(crate) struct Tables {
    serial: u64,
    listers: [Lister; 2],
    /// Per parity: the generation last listed (0: none yet), and the
    /// module table's version it listed.
    generation: [u64; 2],
    modules_version: [u64; 2],
    modules: Body,
    frames: Body,
    nodes: Body,
    /// The batches of the last listing, back to back, without trailers.
    pub(crate) out: Vec<u8>,
}

impl Tables {
    /// Made on the writer thread before tracing is on (it allocates).
    pub(crate) fn new() -> Tables {
        Tables {
            serial: SERIAL.fetch_add(1, Ordering::Relaxed) + 1,
            listers: [Lister::new(), Lister::new()],
            generation: [0; 2],
            modules_version: [u64::MAX; 2],
            modules: Body::new(BatchKind::Modules),
            frames: Body::new(BatchKind::Frames),
            nodes: Body::new(BatchKind::CallStacks),
            out: Vec::with_capacity(4 * BATCH_LIMIT),
        }
    }

    /// Called with each batch the writer is about to write: lists into
    /// [`Tables::out`] (cleared first) what the batch's generation uses
    /// and no earlier listing of it has listed. `with_modules`: whether
    /// the session lists modules; `span`: the ticks its generation started
    /// and (once it has) ended at. Returns the batch's generation, or `None` for bytes that
    /// are not a batch with a header.
    pub(crate) fn before(
        &mut self,
        batch: &[u8],
        with_modules: bool,
        span: impl FnOnce(u64) -> (u64, Option<u64>),
    ) -> Option<Seen> {
        self.out.clear();
        let kind = BatchKind::from_u8(*batch.first()?)?;
        // Nothing to list before a generation's info batch (its first) or
        // after its end (the trace end carries the last one's number).
        if matches!(
            kind,
            BatchKind::Compressed
                | BatchKind::CompressedModeled
                | BatchKind::Info
                | BatchKind::TraceEnd
        ) {
            return None;
        }
        let mut pos = BATCH_PREFIX_LEN;
        let generation = get_uvarint(batch, &mut pos).ok()?;
        if generation == 0 {
            return None;
        }
        let parity = (generation & 1) as usize;
        let key = self.serial << 32 | (generation & 0xFFFF_FFFF);
        let first = self.generation[parity] != generation;
        if first {
            self.generation[parity] = generation;
            self.modules_version[parity] = u64::MAX;
        }
        if with_modules {
            let version = module_table::version();
            if version != self.modules_version[parity] {
                self.modules_version[parity] = version;
                let (start, end) = span(generation);
                let now = clock::ticks();
                let until = end.map_or(now, |end| end.min(now));
                let modules = &mut self.modules;
                let out = &mut self.out;
                module_table::list_pending(parity, key, start, until, |m| {
                    m.encode(&mut modules.bytes);
                    if modules.bytes.len() >= BATCH_LIMIT {
                        modules.flush(generation, out);
                    }
                });
                self.modules.flush(generation, &mut self.out);
            }
        }
        let (frames, nodes, out) = (&mut self.frames, &mut self.nodes, &mut self.out);
        self.listers[parity].list(generation, key, first, |id, parent, word| {
            if let FrameWord::Registered(f) = FrameWord::from_word(word) {
                if let Some(r) = frame_table::take_unlisted(f, parity, key) {
                    r.encode(&mut frames.bytes);
                    if frames.bytes.len() >= BATCH_LIMIT {
                        frames.flush(generation, out);
                    }
                }
            }
            nodes.varint(u64::from(id));
            nodes.varint(u64::from(parent));
            nodes.varint(word);
            if nodes.bytes.len() >= BATCH_LIMIT {
                // Invariant 2: the frames it may name go out first.
                frames.flush(generation, out);
                nodes.flush(generation, out);
            }
        });
        self.frames.flush(generation, &mut self.out);
        self.nodes.flush(generation, &mut self.out);
        Some(Seen {
            generation,
            end: kind == BatchKind::GenerationEnd,
        })
    }
}
