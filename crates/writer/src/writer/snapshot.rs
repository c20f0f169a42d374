//! A snapshot of the live heap: the writer thread writes its live table
//! (live.rs) as a small trace of its own, in memory, when a snapshot is
//! asked for (`alloctrace snapshot`, `trace_snapshot_write`).
//!
//! ## The snapshot trace
//!
//! A file header (no flags), then one generation, numbered as the
//! session's generation the snapshot ended (a reader opens the first
//! generation it meets):
//!
//! - an info batch: the session's last one, its start clock read now (so
//!   `sample_bytes` is there, and readers show estimates in sampling
//!   mode), then the process batch (the command line) when there is one;
//! - the modules loaded now, the registered frames and the call-stack
//!   nodes the live objects' stacks use, ancestors first (node IDs are the
//!   process's: a parent's is smaller than its child's,
//!   call_stack_table.rs invariant 2), and the type table;
//! - one event per live object, all at the snapshot's tick, in events
//!   batches of thread 1: heap object and span allocs (with their stack
//!   when they have one), thread-stack allocs, and exists events for
//!   memory live before tracing started;
//! - the generation's end (no totals: a snapshot counts what is live, not
//!   what was allocated), and the trace end.
//!
//! So every reading command reads it as any trace, and what it reports
//! as leaked (live at the end) is what is live now.
//!
//! ## Corner cases
//!
//! - The bytes are in memory of the tracer's own (anonymous mappings,
//!   [`SnapshotBytes`]), never the program's malloc: a snapshot of a
//!   million objects is some tens of MB.
//! - Only the writer thread builds one (it owns the table), between two
//!   batches; the program's threads never wait for it, unless the buffers
//!   run out meanwhile (the session's memory bound).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use alloctrace_format::stacks::FrameWord;
use alloctrace_format::{
    batch_checksum, encode_batch_header, encode_event, exact_log2, get_uvarint, push_uvarint,
    short_form, AddressClass, BatchKind, EventKind, FileHeader, IdDeltas, LONG_FORM, MAX_EVENT_LEN,
    VERSION,
};

use crate::clock::{self, ClockPair};
use crate::reserved::{map_reserved, unmap};
use crate::stacks::call_stack_table::{self, MAX_NODES};
use crate::stacks::{frame_table, module_table};
use crate::writer::live::{LiveObject, LiveTable, Memory};

/// How long an asker waits for the writer thread.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(60);

/// Payload size past which a batch of the snapshot is closed.
const BATCH_LIMIT: usize = 60 << 10;

/// Growable bytes in an anonymous mapping of the tracer's own.
pub struct SnapshotBytes {
    base: *mut u8,
    cap: usize,
    len: usize,
    /// A mapping failed: the bytes are incomplete.
    failed: bool,
}

// SAFETY: the mapping is owned by the value; moved between threads whole.
unsafe impl Send for SnapshotBytes {}

impl Drop for SnapshotBytes {
    fn drop(&mut self) {
        if !self.base.is_null() {
            unmap(self.base, self.cap);
        }
    }
}

impl SnapshotBytes {
    fn new() -> SnapshotBytes {
        SnapshotBytes {
            base: core::ptr::null_mut(),
            cap: 0,
            len: 0,
            failed: false,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.failed {
            return;
        }
        if self.cap - self.len < bytes.len() {
            let cap = (self.len + bytes.len()).next_power_of_two().max(1 << 20);
            let base = map_reserved(cap);
            if base.is_null() {
                self.failed = true;
                return;
            }
            if !self.base.is_null() {
                // SAFETY: both mappings are ours, len <= both sizes.
                unsafe { core::ptr::copy_nonoverlapping(self.base, base, self.len) };
                unmap(self.base, self.cap);
            }
            self.base = base;
            self.cap = cap;
        }
        // SAFETY: len + bytes.len() <= cap, inside the mapping.
        unsafe {
            core::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(self.len), bytes.len())
        };
        self.len += bytes.len();
    }

    /// The snapshot trace.
    pub fn as_slice(&self) -> &[u8] {
        if self.base.is_null() {
            return &[];
        }
        // SAFETY: the first len bytes of the mapping were written.
        unsafe { core::slice::from_raw_parts(self.base, self.len) }
    }

    /// Appends one batch: its prefix and header, `body`, its trailer.
    fn batch(&mut self, kind: BatchKind, generation: u64, thread: u64, ticks: u64, body: &[u8]) {
        let (head, n) = encode_batch_header(kind, generation, thread, ticks, body.len());
        let crc = batch_checksum(&[&head[..n], body]);
        self.push(&head[..n]);
        self.push(body);
        self.push(&crc.to_le_bytes());
    }
}

/// A batch body under construction, closed into `out` at [`BATCH_LIMIT`].
struct Body {
    kind: BatchKind,
    generation: u64,
    thread: u64,
    ticks: u64,
    bytes: Vec<u8>,
}

impl Body {
    fn new(kind: BatchKind, generation: u64, thread: u64, ticks: u64) -> Body {
        Body {
            kind,
            generation,
            thread,
            ticks,
            bytes: Vec::with_capacity(BATCH_LIMIT + 4096),
        }
    }

    fn varint(&mut self, v: u64) {
        push_uvarint(&mut self.bytes, v);
    }

    fn string(&mut self, b: &[u8]) {
        self.varint(b.len() as u64);
        self.bytes.extend_from_slice(b);
    }

    /// Closes the batch if it is full; true if it did.
    fn full(&mut self, out: &mut SnapshotBytes) -> bool {
        if self.bytes.len() < BATCH_LIMIT {
            return false;
        }
        self.flush(out);
        true
    }

    fn flush(&mut self, out: &mut SnapshotBytes) {
        if !self.bytes.is_empty() {
            out.batch(
                self.kind,
                self.generation,
                self.thread,
                self.ticks,
                &self.bytes,
            );
            self.bytes.clear();
        }
    }
}

/// Writes the live table as a snapshot trace (module docs). Writer thread
/// only (live.rs invariant 1).
pub(crate) fn build(table: &LiveTable, generation: u64) -> Result<SnapshotBytes, String> {
    if table.info.is_empty() {
        return Err("no generation was written yet".to_string());
    }
    let mut out = SnapshotBytes::new();
    out.push(
        &FileHeader {
            version: VERSION,
            flags: 0,
        }
        .encode(),
    );
    let start = ClockPair::now();
    let ticks = start.ticks;

    // The info batch: the session's, its start clock now.
    let mut at = 0;
    let mut fields = [0u64; 10];
    for f in &mut fields {
        *f = get_uvarint(&table.info, &mut at).unwrap_or(0);
    }
    fields[4] = start.ticks;
    fields[5] = start.mono_ns;
    fields[6] = clock::wall_ns();
    let mut info = Body::new(BatchKind::Info, generation, 0, ticks);
    for f in fields {
        info.varint(f);
    }
    // Fields a later version added past the ten this one knows.
    info.bytes
        .extend_from_slice(table.info.get(at..).unwrap_or(&[]));
    info.flush(&mut out);
    let [min_heap_addr, page, heap_align, stack_align, ..] = fields;
    if !table.process.is_empty() {
        out.batch(BatchKind::Process, generation, 0, ticks, &table.process);
    }

    // One pass over the table: an event per live object, into batches of
    // their own (they go after the stacks), and the stacks they use, with
    // their ancestors.
    let shift = |v: u64| exact_log2(v).unwrap_or(0);
    let (page_shift, heap_shift, stack_shift) =
        (shift(page), shift(heap_align), shift(stack_align));
    let mut events_out = SnapshotBytes::new();
    let mut events = Body::new(BatchKind::CompactEvents, generation, 1, ticks);
    let mut deltas = IdDeltas::default();
    let mut event = [0u8; MAX_EVENT_LEN];
    let mut used = vec![0u64; MAX_NODES.div_ceil(64)];
    let mut any_stack = false;
    table.for_each(|o: LiveObject| {
        let kind = match (o.memory, o.exists, o.stack != 0) {
            (Memory::Heap, true, _) => EventKind::HeapObjectExists,
            (Memory::Heap, false, true) => EventKind::HeapObjectAllocStack,
            (Memory::Heap, false, false) => EventKind::HeapObjectAlloc,
            (Memory::Span, true, _) => EventKind::SpanExists,
            (Memory::Span, false, true) => EventKind::SpanAllocStack,
            (Memory::Span, false, false) => EventKind::SpanAlloc,
            (Memory::Stack, true, _) => EventKind::StackExists,
            (Memory::Stack, false, _) => EventKind::StackAlloc,
        };
        let align = match kind.address_class() {
            AddressClass::Span => page_shift,
            AddressClass::Stack => stack_shift,
            _ => heap_shift,
        };
        let (flags, first, second) = match short_form(kind, o.addr, o.size, min_heap_addr, align) {
            Some((id, arg1)) => (0, deltas.encode(kind.address_class(), id), arg1),
            None => (LONG_FORM, o.addr, o.size),
        };
        let args = [first, second, o.type_id, u64::from(o.stack), 0];
        let n = encode_event(&mut event, kind, flags, 0, args);
        events.bytes.extend_from_slice(&event[..n]);
        if events.full(&mut events_out) {
            // A new batch: its deltas start from 0.
            deltas = IdDeltas::default();
        }
        let mut id = o.stack as usize;
        while id > 0 && id < MAX_NODES && used[id / 64] & (1 << (id % 64)) == 0 {
            used[id / 64] |= 1 << (id % 64);
            any_stack = true;
            match call_stack_table::node_fields(id as u32) {
                Some((parent, _)) if (parent as usize) < id => id = parent as usize,
                _ => break,
            }
        }
    });
    let nodes = || {
        used.iter().enumerate().flat_map(|(w, &bits)| {
            (0..64)
                .filter(move |b| bits & (1 << b) != 0)
                .map(move |b| (w * 64 + b) as u32)
        })
    };
    if any_stack {
        let mut modules = Body::new(BatchKind::Modules, generation, 0, ticks);
        module_table::for_each_loaded(|m| {
            m.encode(&mut modules.bytes);
            modules.full(&mut out);
        });
        modules.flush(&mut out);
        let mut frames = Body::new(BatchKind::Frames, generation, 0, ticks);
        let mut listed = std::collections::HashSet::new();
        for id in nodes() {
            if let Some((_, word)) = call_stack_table::node_fields(id) {
                if let FrameWord::Registered(f) = FrameWord::from_word(word) {
                    if listed.insert(f) {
                        if let Some(r) = frame_table::record(f) {
                            r.encode(&mut frames.bytes);
                            frames.full(&mut out);
                        }
                    }
                }
            }
        }
        frames.flush(&mut out);
        let mut calls = Body::new(BatchKind::CallStacks, generation, 0, ticks);
        for id in nodes() {
            if let Some((parent, word)) = call_stack_table::node_fields(id) {
                calls.varint(u64::from(id));
                calls.varint(u64::from(parent));
                calls.varint(word);
                calls.full(&mut out);
            }
        }
        calls.flush(&mut out);
    }
    drop(used);
    let mut types = Body::new(BatchKind::Types, generation, 0, ticks);
    crate::type_table::for_each(|t| {
        for v in [t.id, t.size, t.ptr_bytes] {
            types.varint(v);
        }
        types.string(t.name);
        types.full(&mut out);
    });
    types.flush(&mut out);

    events.flush(&mut events_out);
    out.push(events_out.as_slice());
    out.failed |= events_out.failed;
    drop(events_out);

    let end = ClockPair::now();
    let end_ticks = end.ticks.max(ticks + 1);
    let mut gen_end = Body::new(BatchKind::GenerationEnd, generation, 0, end_ticks);
    for v in [end_ticks, end.mono_ns, 0, 0, 0, 0, 0, 0] {
        gen_end.varint(v);
    }
    gen_end.flush(&mut out);
    out.batch(BatchKind::TraceEnd, generation, 0, 0, &[]);
    if out.failed {
        return Err("the snapshot's memory could not be mapped".to_string());
    }
    Ok(out)
}

/// A request for a snapshot, between whoever asks (the control thread,
/// `trace_snapshot_write`) and the writer thread, which answers.
pub(crate) struct SnapshotSignals {
    /// Whether the writer thread keeps a live table (not in flight-recorder
    /// mode, nor with `ALLOCTRACE_LIVE_TABLE=off`).
    pub(crate) enabled: bool,
    /// Non-zero: a snapshot is wanted once the writer has passed the end
    /// of this generation. Set by the asker, cleared by the writer thread
    /// when it answers.
    pub(crate) want: AtomicU64,
    /// The writer thread's answer.
    pub(crate) answer: Mutex<Option<Result<SnapshotBytes, String>>>,
    /// One asker at a time.
    pub(crate) asking: Mutex<()>,
}

impl SnapshotSignals {
    pub(crate) fn new(enabled: bool) -> SnapshotSignals {
        SnapshotSignals {
            enabled,
            want: AtomicU64::new(0),
            answer: Mutex::new(None),
            asking: Mutex::new(()),
        }
    }

    /// Writer thread, between two batches: answers a request whose
    /// generation it has passed.
    pub(crate) fn serve(&self, table: &LiveTable, ended: u64) {
        let want = self.want.load(Ordering::Acquire);
        if want == 0 || ended < want {
            return;
        }
        let answer = build(table, want);
        *self.answer.lock().unwrap_or_else(|p| p.into_inner()) = Some(answer);
        self.want.store(0, Ordering::Release);
    }
}

/// Asks the writer thread of `writer` for a snapshot once it has passed the
/// end of `generation` (the caller has ended it), and waits for it.
/// `gone`: whether to give up (the session stops); `wake`: wakes the
/// writer thread. Never on the event path: it sleeps.
pub(crate) fn ask(
    signals: &SnapshotSignals,
    generation: u64,
    gone: impl Fn() -> bool,
    wake: impl Fn(),
) -> Result<SnapshotBytes, String> {
    if !signals.enabled {
        return Err(
            "no live table: full mode keeps one only with ALLOCTRACE_LIVE_TABLE=on (it costs the writer thread about 30 ns per event), sampling mode unless ALLOCTRACE_LIVE_TABLE=off; read the trace itself with alloctrace top or leaks".to_string(),
        );
    }
    let _one = signals.asking.lock().unwrap_or_else(|p| p.into_inner());
    *signals.answer.lock().unwrap_or_else(|p| p.into_inner()) = None;
    signals.want.store(generation.max(1), Ordering::Release);
    let deadline = Instant::now() + SNAPSHOT_WAIT;
    loop {
        if let Some(answer) = signals
            .answer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            return answer;
        }
        if gone() {
            signals.want.store(0, Ordering::Release);
            return Err("tracing stopped".to_string());
        }
        if Instant::now() > deadline {
            signals.want.store(0, Ordering::Release);
            return Err("the writer thread did not answer in time".to_string());
        }
        wake();
        std::thread::sleep(Duration::from_micros(500));
    }
}
