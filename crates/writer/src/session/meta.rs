//! The tracer's own batches, which the thread running start, advance or
//! stop writes with thread ID 0: the info and process batches that open a
//! generation,
//! the type table (type_table.rs) and the generation-end batch that close
//! it, and the trace end ([`MetaWriter`], [`finish_generation`]); and the
//! process's count of generations written ([`written_totals`]).
//!
//! Relies on invariants 3 (`finish_generation` runs only once every batch
//! of the generation is queued) and 4 (its callers hold `CONTROL`) of
//! session/mod.rs.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};

use alloctrace_format::{command_line_args, uvarint_len, BatchKind, PROCESS_TRUNCATED};

use crate::buffer::Buffer;
use crate::clock::{self, ClockPair};
use crate::lost::LOST_STACKS;
use crate::session::Session;
use crate::stacks::{call_stack_table, capture};
use crate::type_table;

/// The start tick of the last generation of each parity (its info batch),
/// for its modules batches (tables.rs).
static GENERATION_START: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// The end tick of the last generation of each parity to end (its
/// generation-end batch), so its last listing leaves out modules loaded
/// after it.
static GENERATION_END: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Writes the type table and the generation-end batch of `old`, whose
/// batches are all queued, with `lost` events lost in it; `lost` padded to
/// a fixed width when `padded` (the last generation of a stop at exit,
/// whose count late.rs rewrites in place).
pub(crate) fn finish_generation(session: &Session, old: u64, lost: u64, padded: bool) {
    write_types(session, old);
    if lists_modules() {
        // Libraries loaded since the last look (a dlopen the shim did not
        // see) join the table before the writer thread lists the
        // generation's last entries, as it writes its end (tables.rs).
        capture::modules_changed();
    }
    let lost_stacks = LOST_STACKS[(old & 1) as usize].swap(0, Ordering::Relaxed);
    let end = ClockPair::now();
    GENERATION_END[(old & 1) as usize].store(end.ticks, Ordering::Relaxed);
    let mut batch = MetaWriter::new(session, BatchKind::GenerationEnd, old);
    batch.base_ticks(end.ticks);
    batch.varint(end.ticks);
    batch.varint(end.mono_ns);
    if padded {
        batch.entry(&[(&[], &crate::writer::late::padded_varint(lost))]);
    } else {
        batch.varint(lost);
    }
    batch.varint(lost_stacks);
    // Version 6: a sampling session's exact totals (0 otherwise).
    for v in crate::sampling::take_generation_totals() {
        batch.varint(v);
    }
    batch.finish();
    count_generation_end(lost);
}

/// A tracer batch (info, types, generation end, trace end) under
/// construction, spilling into further batches of the same kind when full.
pub(crate) struct MetaWriter<'a> {
    session: &'a Session,
    kind: BatchKind,
    generation: u64,
    base_ticks: u64,
    buf: Option<NonNull<Buffer>>,
    header_len: usize,
}

impl<'a> MetaWriter<'a> {
    pub(crate) fn new(session: &'a Session, kind: BatchKind, generation: u64) -> MetaWriter<'a> {
        MetaWriter {
            session,
            kind,
            generation,
            base_ticks: clock::ticks(),
            buf: None,
            header_len: 0,
        }
    }

    fn base_ticks(&mut self, ticks: u64) {
        self.base_ticks = ticks;
    }

    /// The current buffer, with at least `n` bytes of room.
    fn room(&mut self, n: usize) -> Option<&mut Buffer> {
        if let Some(buf) = self.buf {
            // SAFETY: this writer holds the buffer.
            if unsafe { (*buf.as_ptr()).fits(n) } {
                // SAFETY: as above, this writer holds the buffer.
                return self.buf.map(|b| unsafe { &mut *b.as_ptr() });
            }
            self.flush();
        }
        let buf = self.session.pool.take(
            crate::buffer::Want::Full,
            || self.session.writer.wake(),
            crate::session::deadline::past_deadline,
        )?;
        // SAFETY: take gave us the buffer.
        let b = unsafe { &mut *buf.as_ptr() };
        b.begin(self.kind, self.generation, 0, self.base_ticks);
        self.header_len = b.len;
        self.buf = Some(buf);
        Some(b)
    }

    fn varint(&mut self, v: u64) {
        if let Some(b) = self.room(uvarint_len(v)) {
            b.put_varint(v);
        }
    }

    /// Writes one entry, its parts in order (each some varints, then some
    /// bytes), so that it is never split across batches.
    fn entry(&mut self, parts: &[(&[u64], &[u8])]) {
        let n = parts
            .iter()
            .map(|(varints, bytes)| {
                varints.iter().map(|&v| uvarint_len(v)).sum::<usize>() + bytes.len()
            })
            .sum();
        if let Some(b) = self.room(n) {
            for (varints, bytes) in parts {
                for &v in *varints {
                    b.put_varint(v);
                }
                b.put_bytes(bytes);
            }
        }
    }

    fn flush(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.session.hand_over(buf);
        }
    }

    /// Queues the batch, writing an empty one if nothing was written.
    pub(crate) fn finish(&mut self) {
        if self.buf.is_none() {
            let _ = self.room(0);
        }
        self.flush();
    }
}

/// Writes the info batch, then the process batch, that open generation
/// `generation`.
pub(crate) fn write_info(session: &Session, generation: u64) {
    let info = session.info;
    let start = ClockPair::now();
    GENERATION_START[(generation & 1) as usize].store(start.ticks, Ordering::Relaxed);
    let mut batch = MetaWriter::new(session, BatchKind::Info, generation);
    batch.base_ticks(start.ticks);
    for v in [
        info.min_heap_addr,
        info.page_size,
        info.min_heap_align,
        info.min_stack_align,
        start.ticks,
        start.mono_ns,
        clock::wall_ns(),
        info.ticks_per_sec,
        info.pid,
        info.sample_bytes,
    ] {
        batch.varint(v);
    }
    batch.finish();
    write_process(session, generation);
}

/// Writes the process batch of generation `generation` (the session's
/// command line, process.rs), when the session has one. One batch: the
/// leading arguments that fit one buffer, with `PROCESS_TRUNCATED` when
/// any is left out (or the command line was cut when it was read).
fn write_process(session: &Session, generation: u64) {
    let Some(cmd) = &session.command_line else {
        return;
    };
    let mut batch = MetaWriter::new(session, BatchKind::Process, generation);
    let Some(room) = batch.room(0).map(|b| b.room()) else {
        return;
    };
    // The flags take 1 byte, the count at most 3 (it is at most
    // MAX_COMMAND_LINE, 2^16).
    let budget = room.saturating_sub(1 + 3);
    let (mut count, mut used) = (0u64, 0);
    let mut truncated = cmd.truncated;
    for arg in command_line_args(&cmd.raw) {
        let need = uvarint_len(arg.len() as u64) + arg.len();
        if used + need > budget {
            truncated = true;
            break;
        }
        used += need;
        count += 1;
    }
    batch.varint(if truncated { PROCESS_TRUNCATED } else { 0 });
    batch.varint(count);
    for arg in command_line_args(&cmd.raw).take(count as usize) {
        batch.entry(&[(&[arg.len() as u64], arg)]);
    }
    batch.finish();
}

/// Writes every registered type into generation `generation`.
fn write_types(session: &Session, generation: u64) {
    let mut batch = MetaWriter::new(session, BatchKind::Types, generation);
    let mut any = false;
    type_table::for_each(|t| {
        any = true;
        batch.entry(&[(&[t.id, t.size, t.ptr_bytes, t.name.len() as u64], t.name)]);
    });
    if any {
        batch.finish();
    }
}

/// Whether the session's generations list modules: it captures native
/// stacks, or a stack was interned (registered stacks may hold native
/// addresses).
pub(crate) fn lists_modules() -> bool {
    capture::mode() != capture::StackMode::None || call_stack_table::any()
}

/// The tick generation `generation` (of the running session) started at,
/// as its info batch says.
pub(crate) fn generation_start(generation: u64) -> u64 {
    GENERATION_START[(generation & 1) as usize].load(Ordering::Relaxed)
}

/// The ticks generation `generation` started and, once it has ended,
/// ended at. (Its parity's slots are not reused while the writer thread
/// still lists it: lifecycle.rs, `wait_for_parity`.)
pub(crate) fn generation_span(generation: u64) -> (u64, Option<u64>) {
    let start = generation_start(generation);
    let end = GENERATION_END[(generation & 1) as usize].load(Ordering::Relaxed);
    (start, (end > start).then_some(end))
}

/// Generation-end batches this process has written, over all its
/// sessions, and the events they counted as lost (see [`written_totals`]).
static WRITTEN_GENERATIONS: AtomicU64 = AtomicU64::new(0);
static WRITTEN_LOST: AtomicU64 = AtomicU64::new(0);

/// Counts one generation-end batch (finish_generation, under CONTROL).
fn count_generation_end(lost: u64) {
    WRITTEN_GENERATIONS.fetch_add(1, Ordering::Relaxed);
    WRITTEN_LOST.fetch_add(lost, Ordering::Relaxed);
}

/// What this process's sessions have written so far: generations
/// completed and the events their generation-end batches count as lost.
/// Monotonic over the process's life (a forked child starts from its
/// parent's counts): take it when a session starts and when `stop`
/// returns, and subtract, to get the session's totals without reading its
/// trace (the LD_PRELOAD shim reports them this way).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WrittenTotals {
    pub generations: u64,
    pub lost_events: u64,
}

/// See [`WrittenTotals`].
pub fn written_totals() -> WrittenTotals {
    WrittenTotals {
        generations: WRITTEN_GENERATIONS.load(Ordering::Relaxed),
        lost_events: WRITTEN_LOST.load(Ordering::Relaxed),
    }
}
