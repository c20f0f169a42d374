//! The session layer: the state of a tracing session, and the design and
//! invariants of the whole layer, which is cut along its seams:
//!
//! - session/mod.rs (this file): the session's state ([`Session`] and its
//!   parts, [`CONTROL`], [`SESSION`]), its configuration and its errors,
//!   and a thread's flush at its exit;
//! - meta.rs: the tracer's own batches (info, types, generation end,
//!   trace end) and `finish_generation`; process.rs, the command line;
//! - lifecycle.rs: start, advance, stop, and `end_generation`;
//! - host.rs: the session as the writer thread's `WriterHost`;
//! - advancer.rs: the thread that ends over-budget generations;
//! - fork.rs: the pthread_atfork handlers;
//! - channel.rs: the control thread, which answers `alloctrace ps`,
//!   `snapshot` and `save` on a unix socket (socket.rs, its mechanics);
//! - crash.rs: the fatal-signal flush, and deadline.rs, its deadline.
//!
//! Above it: event/ (the event calls and the event path, `emit`, which
//! keeps these invariants too). Under it (and never importing it; lib.rs
//! lists the layers): writer/ (the writer thread, given what it needs
//! through `writer::WriterHost`, its output and the end batch), stacks/
//! (the capture, the stack tables and their listing before each batch),
//! and the machinery: thread.rs, handshake.rs, buffer.rs, clock.rs,
//! shared.rs, tls.rs, type_table.rs, lost.rs. The invariants below are
//! numbered; the code that relies on one says so ("invariant N", meaning
//! this list).
//!
//! ## Design
//!
//! Tracing runs in *sessions* (trace_start .. trace_stop), each writing one
//! trace, divided into *generations* (FORMAT.md section 6). The current
//! generation lives in [`SHARED.generation`][SHARED]; 0 means tracing is
//! off, which is all the event path checks before returning when disabled.
//!
//! Each thread writes into its own batch buffers, `bufs[generation % 2]
//! [stream]` of its [`ThreadSlot`], reused until full. A full buffer is
//! sealed and pushed on the session's queue of full buffers; the writer
//! thread (writer/mod.rs) writes it out and returns it to the free pool.
//!
//! An advance (and stop, which is a last advance to generation 0) bumps
//! [`SHARED.generation`][SHARED], runs the [handshake](crate::handshake)
//! with every slot, then takes every slot's previous-generation buffers,
//! including those of idle or blocked threads, writes the type table and a
//! generation-end batch, and so completes the old generation. Besides
//! `trace_advance`, the tracer's advancer thread (advancer.rs) ends a
//! generation once the writer has written `generation_bytes` of it, which
//! bounds what a reader holds in memory. The tracer's own batches (info,
//! types, generation end, trace end; meta.rs) are written by the thread
//! running start/advance/stop into buffers of its own, with thread ID 0.
//!
//! An event takes one of two paths (emit.rs). The fast path
//! (`write_event_fast`) handles the common case (a slot, room in the buffer,
//! an address on the grid, membarrier available) with no call and no stack
//! frame; everything else goes to the slow path (`emit_slow`: claim a slot,
//! refill, long form, count a loss). Both make the same three steps, each
//! written once: the timestamp (`next_ticks`), the choice of form and the
//! address's ID (`short_form`, the format crate's `short_form` with the
//! session's alignment of the kind's class), and the bytes (`append_event`,
//! the format crate's `encode_event`, the writer's only event encoder). The
//! C header's inline path (include/alloctrace_inline.h) is the fast path
//! again, in C, over the same layouts ([`SHARED`](crate::shared::SHARED),
//! `ThreadSlot`, `Buffer`, whose offsets are asserted), with the format's
//! numbers generated from the format crate into include/alloctrace_format.h
//! and the same invariants; it falls back to the exported functions, i.e. to
//! emit.rs. c_tests/test_inline_encoding.c checks that it writes the same
//! bytes as emit.rs for every event kind and address class.
//!
//! ## Invariants
//!
//! 1. A thread MUST read [`SHARED.generation`][SHARED] only between
//!    `seq.try_begin()` and `seq.end()` of its slot, and touch buffers only
//!    of the parity it read. Otherwise an advance could take a buffer the
//!    thread is still writing.
//! 2. Advance and stop MUST store the new generation before waiting on any
//!    slot's seqlock, and take old-parity buffers only after the wait.
//!    Otherwise a thread could keep writing to a taken buffer.
//! 3. Every batch of generation `g` MUST be pushed before the generation-end
//!    batch of `g`. The full queue is FIFO and the handshake orders every
//!    thread's pushes before the advancer's; otherwise a reader would close
//!    the generation early.
//! 4. start, advance and stop MUST hold [`CONTROL`]. Otherwise two advances
//!    could interleave and a third generation could open before the first
//!    one ends (FORMAT.md allows at most two open).
//! 5. A session's advancer thread MUST advance only its own session, and
//!    stop's second phase MUST end only the session whose advancer its first
//!    phase told to exit. Stop releases [`CONTROL`] between its phases, so
//!    another thread may stop that session and start a new one meanwhile:
//!    ending (and joining the advancer of) a session that never got its exit
//!    signal would wait forever with [`CONTROL`] held.
//! 6. The event path MUST NOT allocate, lock or panic, and makes syscalls
//!    only when it needs a new buffer (or a slot, thread.rs). Otherwise it
//!    could deadlock or recurse inside the host's malloc.
//! 7. An event that cannot be recorded MUST be counted in its generation's
//!    `lost_events`. Otherwise the trace would lie about what happened.
//!
//! ## Corner cases
//!
//! - Thread exit: a pthread key destructor flushes the thread's buffers
//!   and marks its slot exiting; the thread keeps the slot and its thread
//!   ID for the events it still records (other destructors, glibc's
//!   `free(NULL)` calls after them), which advance and stop take as any idle
//!   thread's. The slot is reclaimed, and what it holds flushed, only once
//!   the thread is gone (thread.rs). The reclaimer owns the slot's seqlock
//!   from then on, so the handshake is unchanged.
//! - Calls before start or after stop see generation 0 and return. After
//!   a `stop_at_exit` the caller (the LD_PRELOAD shim) passes the calls it
//!   no longer records to `late_event`, which counts them as lost events
//!   of the trace's last generation, rewritten in place (late.rs).
//! - A signal about to kill the process: its handler may call
//!   `flush_for_fatal_signal` (crash.rs), which ends the session as stop
//!   does but with every wait bounded, and with the signalled thread's own
//!   buffers handed over directly (it may be inside an event).
//! - A signal handler emitting while its thread is inside the event path
//!   finds the slot's seqlock odd; that event is counted as lost.
//! - Calls from the snapshot callback to start/advance/stop return
//!   TRACE_ERR_BUSY instead of deadlocking on [`CONTROL`].
//! - start, stop and advance from several threads at once: each call is
//!   whole under [`CONTROL`]; two stops of one session give one `Ok` and
//!   one `NotStarted`, also when a start slipped in between (invariant 5;
//!   tests/lifecycle_stress.rs).
//! - More threads than slots: events of slotless threads are counted lost.
//! - fork: the first start registers pthread_atfork handlers (fork.rs).
//!   Prepare takes [`CONTROL`] so no start/advance/stop is half done at the
//!   fork; the child turns tracing off, closes its copy of the trace's
//!   descriptor (one the core opened) and forgets the parent's session (its
//!   buffers and queue may be mid-update by threads the child does not have,
//!   and its trace is the parent's), so the child's events cost nothing and
//!   never reach the parent's file, nor does the child hold it open. A child that wants its own trace calls
//!   start again (the LD_PRELOAD shim does, with a file of its own).
//!
//! [`ThreadSlot`]: crate::thread::ThreadSlot
//! [SHARED]: crate::shared::SHARED

pub(crate) mod advancer;
pub(crate) mod channel;
pub(crate) mod crash;
pub(crate) mod deadline;
pub(crate) mod fork;
pub(crate) mod host;
pub(crate) mod lifecycle;
pub(crate) mod meta;
pub(crate) mod process;
pub(crate) mod socket;

use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::cell::Cell;
use std::sync::{Arc, Mutex};

use alloctrace_format::exact_log2;

use crate::buffer::{Buffer, BufferPool};
use crate::clock;
use crate::lost::LOST_WITHOUT_SLOT;
use crate::shared::SHARED;
use crate::thread::{self, ThreadSignals, ThreadSlot, STREAMS};
use crate::writer::Writer;

/// The running session, or null. Published by start before the first
/// generation, cleared by stop after the last handshake; events read it only
/// inside their seqlock section with a non-zero generation.
pub(crate) static SESSION: AtomicPtr<Session> = AtomicPtr::new(core::ptr::null_mut());

/// Serialises start, advance and stop (invariant 4).
pub(crate) static CONTROL: Mutex<Control> = Mutex::new(Control {
    session: None,
    writer: None,
    advancer: None,
    channel: None,
});

thread_local! {
    /// Set while this thread runs start/advance/stop, so a snapshot callback
    /// calling them gets an error instead of a self-deadlock.
    pub(crate) static IN_CONTROL: Cell<bool> = const { Cell::new(false) };
}

/// What [`CONTROL`] guards: the running session and the handles of its
/// two threads, joined by stop.
pub(crate) struct Control {
    pub(crate) session: Option<Arc<Session>>,
    pub(crate) writer: Option<thread::InternalThread>,
    /// The thread that ends over-budget generations.
    pub(crate) advancer: Option<thread::InternalThread>,
    /// The control thread (channel.rs), if the session has one.
    pub(crate) channel: Option<thread::InternalThread>,
}

/// One tracing session, in named parts: its buffers, what its writer and
/// advancer threads signal, its byte accounting, and what its info batches
/// repeat.
pub(crate) struct Session {
    /// The batch buffers: free, held by threads, and full ones queued for
    /// the writer.
    pub(crate) pool: BufferPool,
    /// The writer thread's part: the output and what the writer signals.
    pub(crate) writer: Writer,
    /// The advancer thread's part (advancer.rs).
    pub(crate) advancer: AdvancerSignals,
    /// The control thread's part (channel.rs).
    pub(crate) channel: channel::ChannelSignals,
    /// The bytes written, against the generation budget.
    pub(crate) bytes: ByteCount,
    /// What the info batch of every generation repeats.
    pub(crate) info: SessionInfo,
    /// What the process batch of every generation repeats (process.rs);
    /// `None`: no process batch.
    pub(crate) command_line: Option<crate::session::process::CommandLine>,
}

/// What the advancer thread and the rest of the session tell each other.
pub(crate) struct AdvancerSignals {
    /// Set by the writer when the current generation is over its budget;
    /// taken by the advancer thread.
    pub(crate) wanted: AtomicBool,
    /// Tells the advancer thread to exit.
    pub(crate) exit: AtomicBool,
    /// The advancer thread, once ready; done when it will run no more
    /// advances.
    pub(crate) thread: ThreadSignals,
    /// Non-zero: the advancer also ends a generation this often (the
    /// flight recorder's age, `Config::flight_recorder_age_ms`, over
    /// `GENERATIONS_PER_RING`), in milliseconds.
    pub(crate) every_ms: u64,
}

impl AdvancerSignals {
    pub(crate) fn new(every_ms: u64) -> AdvancerSignals {
        AdvancerSignals {
            wanted: AtomicBool::new(false),
            exit: AtomicBool::new(false),
            thread: ThreadSignals::new(),
            every_ms,
        }
    }
}

/// The session's byte accounting: what the writer thread has written, and
/// where the current generation started, against the generation budget.
pub(crate) struct ByteCount {
    /// Bytes the writer thread has written (or discarded after an error).
    pub(crate) written: AtomicU64,
    /// `written` when the current generation started.
    pub(crate) generation_start: AtomicU64,
    /// Bytes after which the advancer ends a generation; 0 for never.
    pub(crate) generation_bytes: u64,
}

impl ByteCount {
    pub(crate) fn new(generation_bytes: u64) -> ByteCount {
        ByteCount {
            written: AtomicU64::new(0),
            generation_start: AtomicU64::new(0),
            generation_bytes,
        }
    }
}

/// What the info batch of every generation repeats.
#[derive(Clone, Copy)]
pub(crate) struct SessionInfo {
    pub(crate) min_heap_addr: u64,
    pub(crate) page_size: u64,
    pub(crate) min_heap_align: u64,
    pub(crate) min_stack_align: u64,
    pub(crate) ticks_per_sec: u64,
    pub(crate) pid: u64,
    /// The sampling mean, 0 when every allocation is recorded.
    pub(crate) sample_bytes: u64,
}

impl Session {
    /// Seals a buffer and queues it for the writer, or recycles it when it
    /// holds only a batch header.
    ///
    /// Must not allocate: runs on the event path when a buffer fills.
    pub(crate) fn hand_over(&self, buf: NonNull<Buffer>) {
        // SAFETY: the caller took the buffer out of its slot, so it holds it.
        let b = unsafe { &mut *buf.as_ptr() };
        if b.len == 0 {
            self.pool.recycle(buf);
            return;
        }
        b.seal();
        self.pool.push_full(buf);
    }
}

/// Errors of the lifecycle calls; the C API maps them to `trace_result`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// Invalid configuration: the message says which field.
    BadConfig(&'static str),
    AlreadyStarted,
    NotStarted,
    /// An I/O error, with errno.
    Io(i32),
    OutOfMemory,
    /// Called from inside the snapshot callback.
    Busy,
}

/// Words for the user: `Io` as the system's text for its errno
/// (strerror), e.g. "No space left on device".
impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Error::BadConfig(what) => write!(f, "bad configuration: {what}"),
            Error::AlreadyStarted => f.write_str("tracing is already started"),
            Error::NotStarted => f.write_str("tracing is not started"),
            Error::Io(errno) => {
                let mut buf = [0 as libc::c_char; 256];
                // SAFETY: buf is writable for its length; the XSI
                // strerror_r NUL-terminates what it writes.
                let ok = unsafe { libc::strerror_r(errno, buf.as_mut_ptr(), buf.len() - 1) } == 0;
                // SAFETY: as above; buf ends with a NUL either way (zeroed).
                let text = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
                if ok && !text.is_empty() {
                    f.write_str(&text)
                } else {
                    write!(f, "unknown error {errno}")
                }
            }
            Error::OutOfMemory => f.write_str("out of memory (buffers or the tracer's threads)"),
            Error::Busy => f.write_str("called from inside the snapshot callback"),
        }
    }
}

impl std::error::Error for Error {}

/// A validated configuration (see `trace_config` in the C API).
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub min_heap_addr: u64,
    pub page_size: u64,
    pub min_heap_align: u64,
    pub min_stack_align: u64,
    /// Bytes per batch buffer.
    pub buffer_size: usize,
    /// Which clock stamps events.
    pub clock: clock::ClockKind,
    /// Compress batches with zstd in the writer thread.
    pub compress: bool,
    /// Upper bound on full-size buffer memory, in bytes; producers wait
    /// beyond it. Each thread also holds a one-page buffer per stream as it
    /// starts a generation (buffer.rs `SMALL_BUFFER_CAP`), outside it.
    pub max_buffer_memory: usize,
    /// A generation that has written this many bytes is ended by the
    /// tracer's advancer thread, so a reader (which holds one or two
    /// generations in memory) never needs more than about twice this,
    /// however long the trace. 0 turns automatic advances off.
    pub generation_bytes: u64,
    /// Which native call stacks the tracer captures by itself
    /// (stacks/capture): for the shim's allocations, and for the C API's
    /// plain alloc calls.
    pub stacks: crate::stacks::capture::StackMode,
    /// The depth limit of those stacks, 1 to `capture::MAX_DEPTH`.
    pub stack_depth: usize,
    /// The C API's plain alloc calls capture stacks (`trace_config.stacks`):
    /// the header's inline event path then hands every event to the
    /// library (inline mode out of line), whose calls capture.
    pub plain_calls_capture: bool,
    /// Sampling mode (issue 22): the mean bytes between sampled heap-object
    /// allocations, 0 (the default) to record every one. Only sampled
    /// allocations, and the frees of those, are recorded; the exact totals
    /// go in each generation-end batch (docs/FORMAT.md, version 6). The
    /// header's inline event path then hands every event to the library.
    pub sample_bytes: u64,
    /// The seed of the sampling countdowns: a fixed seed samples the same
    /// allocations of a deterministic program (for tests); 0 (the default)
    /// takes one from the clock and the process ID.
    pub sample_seed: u64,
    /// Flight-recorder mode when non-zero: the size in bytes of the ring
    /// that keeps the last complete generations in memory
    /// (writer/flight.rs), written out only by a dump. 0: off.
    pub flight_recorder: u64,
    /// With the flight recorder: the writer thread dumps the ring to the
    /// output once, the first time the process's RSS reaches this many
    /// bytes. 0: never.
    pub dump_on_rss: u64,
    /// With the flight recorder: keep only the generations that ended in
    /// the last this many milliseconds (1 s to 7 days), ending one every
    /// eighth of it; 0 (the default): as many as the ring holds.
    pub flight_recorder_age_ms: u64,
}

/// The shortest age the flight recorder keeps.
pub const MIN_FLIGHT_RECORDER_AGE_MS: u64 = 1000;
/// The longest: a week.
pub const MAX_FLIGHT_RECORDER_AGE_MS: u64 = 7 * 24 * 3600 * 1000;

/// Default size at which the advancer thread ends a generation.
pub const DEFAULT_GENERATION_BYTES: u64 = 16 << 20;

/// Default bytes per batch buffer.
pub const DEFAULT_BUFFER_SIZE: usize = 64 << 10;
pub use crate::limits::MIN_BUFFER_SIZE;
/// The largest buffer size a session accepts.
pub const MAX_BUFFER_SIZE: usize = alloctrace_format::MAX_BATCH_PAYLOAD as usize;

impl Default for Config {
    fn default() -> Config {
        Config {
            min_heap_addr: 0,
            page_size: 4096,
            min_heap_align: 8,
            min_stack_align: 4096,
            buffer_size: DEFAULT_BUFFER_SIZE,
            clock: clock::ClockKind::Precise,
            compress: false,
            max_buffer_memory: 256 << 20,
            generation_bytes: DEFAULT_GENERATION_BYTES,
            stacks: crate::stacks::capture::StackMode::None,
            stack_depth: crate::stacks::capture::DEFAULT_DEPTH,
            plain_calls_capture: false,
            sample_bytes: 0,
            sample_seed: 0,
            flight_recorder: 0,
            dump_on_rss: 0,
            flight_recorder_age_ms: 0,
        }
    }
}

impl Config {
    /// Checks every field, naming the first bad one.
    pub fn validate(&self) -> Result<(), Error> {
        match exact_log2(self.page_size) {
            Some(shift)
                if (alloctrace_format::pages::MIN_PAGE_SHIFT
                    ..=alloctrace_format::pages::MAX_PAGE_SHIFT)
                    .contains(&shift) => {}
            _ => {
                return Err(Error::BadConfig(
                    "page_size must be a power of two from 16 to 2^40",
                ))
            }
        }
        if exact_log2(self.min_heap_align).is_none() {
            return Err(Error::BadConfig("min_heap_align must be a power of two"));
        }
        if exact_log2(self.min_stack_align).is_none() {
            return Err(Error::BadConfig("min_stack_align must be a power of two"));
        }
        if !(MIN_BUFFER_SIZE..=MAX_BUFFER_SIZE).contains(&self.buffer_size) {
            return Err(Error::BadConfig(
                "buffer_size must be 0 (default) or 4096..16777216",
            ));
        }
        if self.flight_recorder != 0
            && !(crate::writer::flight::MIN_FLIGHT_RECORDER_BYTES
                ..=crate::writer::flight::MAX_FLIGHT_RECORDER_BYTES)
                .contains(&self.flight_recorder)
        {
            return Err(Error::BadConfig(
                "flight_recorder must be 0 (off) or 1 MiB..1 TiB",
            ));
        }
        if self.dump_on_rss != 0 && self.flight_recorder == 0 {
            return Err(Error::BadConfig(
                "dump_on_rss needs the flight recorder (flight_recorder)",
            ));
        }
        if self.flight_recorder_age_ms != 0 && self.flight_recorder == 0 {
            return Err(Error::BadConfig(
                "flight_recorder_age_ms needs the flight recorder (flight_recorder)",
            ));
        }
        if self.flight_recorder_age_ms != 0
            && !(MIN_FLIGHT_RECORDER_AGE_MS..=MAX_FLIGHT_RECORDER_AGE_MS)
                .contains(&self.flight_recorder_age_ms)
        {
            return Err(Error::BadConfig(
                "flight_recorder_age_ms must be 0 or 1000 (1 s) to 604800000 (7 days)",
            ));
        }
        if !(1..=crate::stacks::capture::MAX_DEPTH).contains(&self.stack_depth) {
            return Err(Error::BadConfig(
                "stack_depth must be 0 (default) or 1..256",
            ));
        }
        Ok(())
    }
}

/// Statistics of the running session, for tests and benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub struct SessionStats {
    pub buffers_mapped: usize,
    pub producer_waits: usize,
}

/// Statistics of the running session, if any.
pub fn session_stats() -> Option<SessionStats> {
    let control = CONTROL.lock().unwrap_or_else(|p| p.into_inner());
    control.session.as_ref().map(|s| SessionStats {
        buffers_mapped: s.pool.mapped(),
        producer_waits: s.pool.waits(),
    })
}

/// Flushes the current generation's buffers of `slot` and folds its lost
/// count into the global one. The caller is the slot's owner: the thread
/// itself at its exit or in trace_thread_destroy, or a thread reclaiming the
/// slot of a thread that is gone. thread.rs, which is below this module,
/// calls it through the pointer start installs (`thread::set_exit_flush`).
///
/// Only the current generation's parity: the other parity is empty unless
/// an advance is between its generation store and its take, and then that
/// advance takes it (taking it here could push a batch of the old
/// generation after its generation-end batch, invariant 3).
pub(crate) fn flush_exiting_thread(slot: &ThreadSlot) {
    if !slot.seq.try_begin() {
        return;
    }
    let generation = SHARED.generation.load(Ordering::Acquire);
    // SAFETY: a non-zero generation read inside the seqlock section keeps
    // the session alive until seq.end() (stop waits for it).
    let session = unsafe { SESSION.load(Ordering::SeqCst).as_ref() };
    if let (1.., Some(session)) = (generation, session) {
        let parity = (generation & 1) as usize;
        // As in refill: a batch taken is pushed before a signal can look.
        thread::without_signals(|| {
            for stream in 0..STREAMS {
                if let Some(buf) = slot.take_buffer(parity, stream) {
                    session.hand_over(buf);
                }
            }
        });
        let lost = slot.lost[parity].swap(0, Ordering::Relaxed);
        LOST_WITHOUT_SLOT[parity].fetch_add(lost, Ordering::Relaxed);
    }
    // With tracing off every buffer is empty: stop took them all.
    slot.seq.end();
}
