//! The tracer: session lifecycle (start, advance, stop) and the event path.
//!
//! ## Design
//!
//! Tracing runs in *sessions* (trace_start .. trace_stop), each writing one
//! trace, divided into *generations* (FORMAT.md section 6). The current
//! generation lives in [`SHARED.generation`](SHARED); 0 means tracing is off, which is all
//! the event path checks before returning when disabled.
//!
//! Each thread writes into its own batch buffers, `bufs[generation % 2]
//! [stream]` of its [`ThreadSlot`], reused until full. A full buffer is
//! sealed and pushed on the session's queue of full buffers; the writer
//! thread (output.rs) writes it out and returns it to the free pool.
//!
//! An advance (and stop, which is a last advance to generation 0) bumps
//! [`SHARED.generation`](SHARED), runs the [handshake](crate::handshake) with every slot,
//! then takes every slot's previous-generation buffers, including those of
//! idle or blocked threads, writes the type table and a generation-end
//! batch, and so completes the old generation. Besides `trace_advance`, the
//! tracer's advancer thread ends a generation once the writer has written
//! `generation_bytes` of it, which bounds what a reader holds in memory.
//! The tracer's own batches
//! (info, types, generation end, trace end) are written by the thread running
//! start/advance/stop into buffers of its own, with thread ID 0.
//!
//! An event takes one of two paths. The fast path ([`write_event_fast`])
//! handles the common case (a slot, room in the buffer, an address on the
//! grid, membarrier available) with no call and no stack frame; everything
//! else goes to the slow path ([`emit_slow`]: claim a slot, refill, long
//! form, count a loss). Both make the same three steps, each written once:
//! the timestamp ([`next_ticks`]), the choice of form and the address's ID
//! ([`short_form`], the format crate's `short_form` with the session's
//! alignment of the kind's class), and the bytes ([`append_event`], the
//! format crate's `encode_event`, the writer's only event encoder). The C
//! header's inline path (include/alloctrace_inline.h) is the fast path
//! again, in C, over the same layouts ([`SHARED`](crate::shared::SHARED),
//! `ThreadSlot`, `Buffer`, whose offsets are asserted), with the format's
//! numbers generated from the format crate into include/alloctrace_format.h
//! and the same invariants; it falls back to the exported functions, i.e.
//! to this file. c_tests/test_inline_encoding.c checks that it writes the
//! same bytes as this file for every event kind and address class.
//!
//! ## Invariants
//!
//! 1. A thread MUST read [`SHARED.generation`](SHARED) only between `seq.try_begin()` and
//!    `seq.end()` of its slot, and touch buffers only of the parity it read.
//!    Otherwise an advance could take a buffer the thread is still writing.
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
//!    only when it needs a new buffer (or a slot, thread.rs). Otherwise it could deadlock or recurse
//!    inside the host's malloc.
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
//! - Calls before start or after stop see generation 0 and return.
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
//! - fork: the first start registers pthread_atfork handlers. Prepare takes
//!   [`CONTROL`] so no start/advance/stop is half done at the fork; the
//!   child turns tracing off and forgets the parent's session (its buffers
//!   and queue may be mid-update by threads the child does not have, and
//!   its trace is the parent's), so the child's events cost nothing and
//!   never reach the parent's file. A child that wants its own trace calls
//!   start again (the LD_PRELOAD shim does, with a file of its own).

use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::cell::Cell;
use std::sync::{Arc, Mutex};

use alloctrace_format::{
    exact_log2, uvarint_len, AddressClass, BatchKind, EventKind, FileHeader, ENTRY_TAG,
    FILE_HEADER_LEN, LONG_FORM, MAX_BATCH_HEADER_LEN, MAX_EVENT_LEN, VERSION,
};

use crate::buffer::{Buffer, BufferPool};
use crate::clock::{self, ClockPair};
use crate::output::{self, Output, Writer, WriterHost};
use crate::shared::{inline_mode, SHARED};
use crate::thread::{self, InternalThread, Stream, ThreadSignals, ThreadSlot, STREAMS};
use crate::type_table;

/// The running session, or null. Published by start before the first
/// generation, cleared by stop after the last handshake; events read it only
/// inside their seqlock section with a non-zero generation.
pub(crate) static SESSION: AtomicPtr<Session> = AtomicPtr::new(core::ptr::null_mut());

/// Events lost by threads without a slot, per generation parity.
pub(crate) static LOST_WITHOUT_SLOT: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Serialises start, advance and stop (invariant 4).
pub(crate) static CONTROL: Mutex<Control> = Mutex::new(Control {
    session: None,
    writer: None,
    advancer: None,
});

thread_local! {
    /// Set while this thread runs start/advance/stop, so a snapshot callback
    /// calling them gets an error instead of a self-deadlock.
    pub(crate) static IN_CONTROL: Cell<bool> = const { Cell::new(false) };
}

/// [`CONTROL`]'s guard, held by the forking thread from the atfork prepare
/// handler to the parent or child handler. A static rather than a
/// thread-local: a thread-local holding a guard needs a destructor, whose
/// registration would allocate inside fork.
struct ForkGuard(core::cell::UnsafeCell<Option<std::sync::MutexGuard<'static, Control>>>);

// SAFETY: only the thread that holds CONTROL touches the cell: prepare
// stores the guard after locking, parent/child take it before unlocking,
// all on the forking thread, and no other thread can hold CONTROL then.
unsafe impl Sync for ForkGuard {}

static FORK_GUARD: ForkGuard = ForkGuard(core::cell::UnsafeCell::new(None));

/// Registers the fork handlers, once per process.
fn install_fork_handlers() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        // SAFETY: the handlers are extern "C" functions with no arguments.
        unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    });
}

extern "C" fn fork_prepare() {
    if IN_CONTROL.with(|c| c.get()) {
        // fork() from the snapshot callback: CONTROL is ours already.
        return;
    }
    let guard = CONTROL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // SAFETY: we hold CONTROL (see ForkGuard).
    unsafe { *FORK_GUARD.0.get() = Some(guard) };
}

/// Takes the guard stored by fork_prepare, if this thread stored one.
fn take_fork_guard() -> Option<std::sync::MutexGuard<'static, Control>> {
    if IN_CONTROL.with(|c| c.get()) {
        // fork() from the snapshot callback: prepare stored nothing.
        return None;
    }
    // SAFETY: we hold CONTROL (see ForkGuard).
    unsafe { (*FORK_GUARD.0.get()).take() }
}

extern "C" fn fork_parent() {
    drop(take_fork_guard());
}

extern "C" fn fork_child() {
    SHARED.generation.store(0, Ordering::SeqCst);
    SESSION.store(core::ptr::null_mut(), Ordering::SeqCst);
    thread::reset_after_fork();
    let mut guard = take_fork_guard();
    if let Some(control) = guard.as_mut() {
        // The parent's session and tracer threads are not ours: forget them
        // without running their destructors (no unmapping of buffers, no
        // join of a thread that does not exist here).
        core::mem::forget(control.session.take());
        #[allow(clippy::forget_non_drop)] // forgetting is the point; harmless if they gain Drop
        {
            core::mem::forget(control.writer.take());
            core::mem::forget(control.advancer.take());
        }
    }
    drop(guard);
}

pub(crate) struct Control {
    pub(crate) session: Option<Arc<Session>>,
    pub(crate) writer: Option<thread::InternalThread>,
    /// The thread that ends over-budget generations.
    pub(crate) advancer: Option<thread::InternalThread>,
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
    /// The bytes written, against the generation budget.
    pub(crate) bytes: ByteCount,
    /// What the info batch of every generation repeats.
    pub(crate) info: SessionInfo,
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
}

impl AdvancerSignals {
    pub(crate) fn new() -> AdvancerSignals {
        AdvancerSignals {
            wanted: AtomicBool::new(false),
            exit: AtomicBool::new(false),
            thread: ThreadSignals::new(),
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

/// The writer thread's view of the session (output.rs is below this
/// module: it gets these passed down).
impl WriterHost for Session {
    fn writer(&self) -> &Writer {
        &self.writer
    }

    fn pool(&self) -> &BufferPool {
        &self.pool
    }

    /// Counts bytes out, and asks the advancer to end the generation once
    /// it is over budget.
    fn count_written(&self, n: usize) {
        let bytes = &self.bytes;
        let total = bytes.written.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        let start = bytes.generation_start.load(Ordering::Relaxed);
        if bytes.generation_bytes > 0
            && total.saturating_sub(start) >= bytes.generation_bytes
            && !self.advancer.wanted.swap(true, Ordering::AcqRel)
        {
            self.advancer.thread.wake();
        }
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
    /// Upper bound on buffer memory, in bytes; producers wait beyond it.
    pub max_buffer_memory: usize,
    /// A generation that has written this many bytes is ended by the
    /// tracer's advancer thread, so a reader (which holds one or two
    /// generations in memory) never needs more than about twice this,
    /// however long the trace. 0 turns automatic advances off.
    pub generation_bytes: u64,
}

/// Default size at which the advancer thread ends a generation.
pub const DEFAULT_GENERATION_BYTES: u64 = 16 << 20;

/// Default bytes per batch buffer.
pub const DEFAULT_BUFFER_SIZE: usize = 64 << 10;
/// Smallest and largest buffer size accepted.
pub const MIN_BUFFER_SIZE: usize = 4096;
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
        Ok(())
    }
}

/// Runs `f` as a lifecycle call: refuses re-entry from the snapshot callback
/// and holds [`CONTROL`].
fn with_control<T>(f: impl FnOnce(&mut Control) -> Result<T, Error>) -> Result<T, Error> {
    if IN_CONTROL.with(|c| c.get()) {
        return Err(Error::Busy);
    }
    let mut control = CONTROL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    IN_CONTROL.with(|c| c.set(true));
    let result = f(&mut control);
    IN_CONTROL.with(|c| c.set(false));
    result
}

/// Starts tracing into `output`. `snapshot`, if any, runs once tracing is on,
/// to emit the *_exists events of memory that is already live.
pub fn start(
    config: &Config,
    output: Output,
    snapshot: Option<&mut dyn FnMut()>,
) -> Result<(), Error> {
    start_with(config, || Ok(output), snapshot)
}

/// Like [`start`], but opens the output only once the configuration and the
/// state allow the start, so a refused start never creates or truncates a
/// file.
pub fn start_with(
    config: &Config,
    open_output: impl FnOnce() -> Result<Output, Error>,
    snapshot: Option<&mut dyn FnMut()>,
) -> Result<(), Error> {
    config.validate()?;
    with_control(|control| {
        if control.session.is_some() {
            return Err(Error::AlreadyStarted);
        }
        let output = open_output()?;
        output
            .write_all(
                &FileHeader {
                    version: VERSION,
                    flags: 0,
                }
                .encode(),
            )
            .map_err(Error::Io)?;
        debug_assert_eq!(FILE_HEADER_LEN, 16);
        thread::set_exit_flush(flush_exiting_thread);
        thread::ensure_exit_key();
        thread::note_process();
        install_fork_handlers();
        let asymmetric = crate::handshake::enable_asymmetric_fences();

        let max_buffers = (config.max_buffer_memory / config.buffer_size).max(64);
        let session = Arc::new(Session {
            pool: BufferPool::new(config.buffer_size, max_buffers),
            writer: Writer::new(output, config.compress),
            advancer: AdvancerSignals::new(),
            bytes: ByteCount::new(config.generation_bytes),
            info: SessionInfo {
                min_heap_addr: config.min_heap_addr,
                page_size: config.page_size,
                min_heap_align: config.min_heap_align,
                min_stack_align: config.min_stack_align,
                ticks_per_sec: clock::ticks_per_sec(),
                // SAFETY: getpid has no preconditions.
                pid: unsafe { libc::getpid() } as u64,
            },
        });
        // A few buffers ready for the first threads (BufferPool::reserve).
        session.pool.reserve(4);
        let writer = output::spawn_writer(&session).map_err(|_| Error::OutOfMemory)?;
        let coarse = config.clock == clock::ClockKind::Coarse;
        clock::COARSE.store(coarse, Ordering::Relaxed);
        clock::publish();
        let advancer = if config.generation_bytes > 0 || coarse {
            match spawn_advancer(&session, advance_own) {
                Ok(a) => Some(a),
                Err(_) => {
                    session.writer.stop();
                    writer.join();
                    return Err(Error::OutOfMemory);
                }
            }
        } else {
            None
        };

        SHARED
            .min_heap_addr
            .store(config.min_heap_addr, Ordering::Relaxed);
        SHARED
            .page_shift
            .store(config.page_size.trailing_zeros(), Ordering::Relaxed);
        SHARED
            .heap_shift
            .store(config.min_heap_align.trailing_zeros(), Ordering::Relaxed);
        SHARED
            .stack_shift
            .store(config.min_stack_align.trailing_zeros(), Ordering::Relaxed);
        // The header's inline path stamps events with rdtsc and uses only a
        // compiler fence on its side of the handshake.
        let mode = match (asymmetric && cfg!(target_arch = "x86_64"), coarse) {
            (false, _) => inline_mode::OUT_OF_LINE,
            (true, false) => inline_mode::PRECISE,
            (true, true) => inline_mode::COARSE,
        };
        SHARED.inline_mode.store(mode, Ordering::Relaxed);
        for lost in &LOST_WITHOUT_SLOT {
            lost.store(0, Ordering::Relaxed);
        }
        // Counts left from a signal handler after the last session ended
        // belong to no generation of this trace.
        for slot in thread::used_slots() {
            for lost in &slot.lost {
                lost.store(0, Ordering::Relaxed);
            }
        }
        SESSION.store(Arc::as_ptr(&session).cast_mut(), Ordering::SeqCst);

        write_info(&session, 1);
        SHARED.generation.store(1, Ordering::SeqCst);
        control.session = Some(session);
        control.writer = Some(writer);
        control.advancer = advancer;
        Ok(())
    })?;
    if let Some(snapshot) = snapshot {
        IN_CONTROL.with(|c| c.set(true));
        snapshot();
        IN_CONTROL.with(|c| c.set(false));
    }
    Ok(())
}

/// How often the advancer looks at its flags when nobody wakes it (with the
/// precise clock; with the coarse one, [`clock::COARSE_PERIOD`]).
const PERIOD: std::time::Duration = std::time::Duration::from_millis(100);

/// Starts the advancer thread of `session`, which ends a generation once
/// it has written `generation_bytes`, and returns once it is ready
/// (`thread::spawn_ready`). `advance` ends the current generation of the
/// session it is given, and only of that session (invariant 5).
fn spawn_advancer(
    session: &Arc<Session>,
    advance: fn(&Session),
) -> std::io::Result<InternalThread> {
    thread::spawn_ready(
        c"alloctrace-advancer",
        session,
        |s| &s.advancer.thread,
        |_| (),
        move |s, ()| run_advancer(s, advance),
    )
}

/// The advancer's loop, until stop (or a fatal-signal flush) sets `exit`.
fn run_advancer(session: &Session, advance: fn(&Session)) {
    let signals = &session.advancer;
    // With the coarse clock this thread also publishes the time.
    let coarse = clock::COARSE.load(Ordering::Relaxed);
    let period = if coarse { clock::COARSE_PERIOD } else { PERIOD };
    while !signals.exit.load(Ordering::Acquire) {
        std::thread::park_timeout(period);
        if coarse {
            clock::publish();
        }
        if session.bytes.generation_bytes > 0
            && signals.wanted.swap(false, Ordering::AcqRel)
            && !signals.exit.load(Ordering::Acquire)
        {
            // This session's generation only: never one of a session
            // started after this one was stopped.
            advance(session);
        }
    }
}

/// Ends the current generation and starts the next.
pub fn advance() -> Result<(), Error> {
    advance_session(None)
}

/// The advancer thread's advance: of its own session only.
fn advance_own(session: &Session) {
    let _ = advance_session(Some(session));
}

/// [`advance`], of `only` if given: `NotStarted` when the running session
/// is another one (the advancer thread of a session that has stopped).
fn advance_session(only: Option<&Session>) -> Result<(), Error> {
    with_control(|control| {
        let session = control.session.as_ref().ok_or(Error::NotStarted)?;
        if only.is_some_and(|only| !core::ptr::eq(only, Arc::as_ptr(session))) {
            return Err(Error::NotStarted);
        }
        let old = SHARED.generation.load(Ordering::Relaxed);
        let new = old + 1;
        write_info(session, new);
        if clock::COARSE.load(Ordering::Relaxed) {
            // After the new generation's start time was read, before any
            // event can be in it: its coarse times are never before its start.
            clock::publish();
        }
        end_generation(session, old, new);
        Ok(())
    })
}

/// Flushes everything, ends the trace and closes the output (a path it
/// opened; a descriptor the caller passed stays open). Returns the first
/// write error, if any: EBADF when the program closed or replaced the
/// output's descriptor (output.rs), which is then not closed.
pub fn stop() -> Result<(), Error> {
    // The advancer may be waiting for CONTROL inside advance(): ask it to
    // stop and wait for it without holding CONTROL. Wait on a flag, not by
    // joining: a join frees memory on this thread, which must not happen
    // while tracing is on (a traced allocator would see it).
    let session = with_control(|control| {
        let session = control.session.clone().ok_or(Error::NotStarted)?;
        session.advancer.exit.store(true, Ordering::Release);
        session.advancer.thread.wake();
        Ok(session)
    })?;
    if session.advancer.thread.started() {
        while !session.advancer.thread.is_done() {
            std::thread::yield_now();
        }
    }
    with_control(|control| {
        // Between the two phases another thread may have stopped this
        // session and started a new one: that one is not ours to end (its
        // advancer was never told to exit, so joining it would never
        // return), and ours is already stopped.
        if !control
            .session
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, &session))
        {
            return Err(Error::NotStarted);
        }
        drop(session);
        let session = control.session.take().ok_or(Error::NotStarted)?;
        let last = SHARED.generation.load(Ordering::Relaxed);
        end_generation(&session, last, 0);
        let mut end = MetaWriter::new(&session, BatchKind::TraceEnd, last);
        end.finish();
        SESSION.store(core::ptr::null_mut(), Ordering::SeqCst);
        session.writer.stop();
        if let Some(writer) = control.writer.take() {
            writer.join();
        }
        if let Some(advancer) = control.advancer.take() {
            advancer.join();
        }
        let errno = session.writer.io_error.load(Ordering::Relaxed);
        // Leaves a descriptor the program closed or replaced alone.
        let close_result = session.writer.output.close();
        drop(session);
        match (errno, close_result) {
            (0, Ok(())) => Ok(()),
            (0, Err(e)) | (e, _) => Err(Error::Io(e)),
        }
    })
}

/// Whether tracing is on.
#[inline(always)]
pub fn enabled() -> bool {
    SHARED.generation.load(Ordering::Relaxed) != 0
}

/// Stores `new` as the generation (0 to stop), waits for every thread to
/// leave the old one, and completes the old generation in the trace.
fn end_generation(session: &Session, old: u64, new: u64) {
    if new != 0 {
        // Every thread that writes now needs a fresh buffer in the new
        // generation: have them ready (BufferPool::reserve).
        let writing = thread::used_slots()
            .iter()
            .filter(|s| {
                !s.bufs[(old & 1) as usize][Stream::Events as usize]
                    .load(Ordering::Relaxed)
                    .is_null()
            })
            .count();
        session.pool.reserve(writing + 2);
    }
    SHARED.generation.store(new, Ordering::SeqCst);
    crate::handshake::heavy_barrier();
    session.bytes.generation_start.store(
        session.bytes.written.load(Ordering::Relaxed),
        Ordering::Relaxed,
    );
    session.advancer.wanted.store(false, Ordering::Relaxed);
    let slots = thread::used_slots();
    for slot in slots {
        slot.seq.wait_quiescent();
    }
    let parity = (old & 1) as usize;
    let mut lost = LOST_WITHOUT_SLOT[parity].swap(0, Ordering::Relaxed);
    for slot in slots {
        for stream in 0..STREAMS {
            if let Some(buf) = slot.take_buffer(parity, stream) {
                session.hand_over(buf);
            }
        }
        lost += slot.lost[parity].swap(0, Ordering::Relaxed);
    }
    finish_generation(session, old, lost);
}

/// Writes the type table and the generation-end batch of `old`, whose
/// batches are all queued, with `lost` events lost in it.
pub(crate) fn finish_generation(session: &Session, old: u64, lost: u64) {
    write_types(session, old);
    let end = ClockPair::now();
    let mut batch = MetaWriter::new(session, BatchKind::GenerationEnd, old);
    batch.base_ticks(end.ticks);
    batch.varint(end.ticks);
    batch.varint(end.mono_ns);
    batch.varint(lost);
    batch.finish();
    count_generation_end(lost);
}

/// Flushes the current generation's buffers of `slot` and folds its lost
/// count into the global one. The caller is the slot's owner: the thread
/// itself at its exit or in trace_thread_destroy, or a thread reclaiming the
/// slot of a thread that is gone (thread.rs).
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
        without_signals(|| {
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
        let buf = self.session.pool.take(|| self.session.writer.wake())?;
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

    /// Writes one entry (varints then bytes) so that it is never split
    /// across batches.
    fn entry(&mut self, varints: &[u64], bytes: &[u8]) {
        let n = varints.iter().map(|&v| uvarint_len(v)).sum::<usize>() + bytes.len();
        if let Some(b) = self.room(n) {
            for &v in varints {
                b.put_varint(v);
            }
            b.put_bytes(bytes);
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

/// Writes the info batch that opens generation `generation`.
fn write_info(session: &Session, generation: u64) {
    let info = session.info;
    let start = ClockPair::now();
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
    ] {
        batch.varint(v);
    }
    batch.finish();
}

/// Writes every registered type into generation `generation`.
fn write_types(session: &Session, generation: u64) {
    let mut batch = MetaWriter::new(session, BatchKind::Types, generation);
    let mut any = false;
    type_table::for_each(|t| {
        any = true;
        batch.entry(&[t.id, t.size, t.ptr_bytes, t.name.len() as u64], t.name);
    });
    if any {
        batch.finish();
    }
}

// ---------------------------------------------------------------------------
// The event path.

/// Records one event. `addr` is compressed into an ID with the alignment of
/// the kind's class; `arg1`, `arg2` are the remaining arguments (for stack
/// alloc/exists, `arg1` is the size in bytes, written as its log2).
///
/// Must not allocate, lock or panic: runs inside the host's malloc.
#[inline(always)]
pub(crate) fn emit<const KIND: u8>(addr: u64, arg1: u64, arg2: u64) {
    emit_tagged::<KIND, false>(addr, arg1, arg2, 0);
}

/// [`emit`] with an entry-point tag (when `TAGGED`), for the LD_PRELOAD
/// shim. `KIND` is an [`EventKind`] as u8: a const parameter, so each event
/// kind gets its own out-of-line body with its address class, argument
/// count and stack-size logic folded away.
#[inline(always)]
pub(crate) fn emit_tagged<const KIND: u8, const TAGGED: bool>(
    addr: u64,
    arg1: u64,
    arg2: u64,
    entry: u64,
) {
    // Tracing off: one relaxed load and a branch.
    if SHARED.generation.load(Ordering::Relaxed) == 0 {
        return;
    }
    emit_enabled::<KIND, TAGGED>(addr, arg1, arg2, entry);
}

/// Runs `write` for one event inside the calling thread's seqlock section
/// (invariant 1), with the generation it read. Counts the event as lost when
/// the thread has no slot or is already inside the event path.
#[inline(always)]
fn with_slot(write: impl FnOnce(&ThreadSlot, u64)) {
    let Some(slot) = thread::current_or_claim() else {
        count_lost_without_slot();
        return;
    };
    if !slot.seq.try_begin() {
        // A signal handler interrupted an event on this thread.
        let generation = SHARED.generation.load(Ordering::Relaxed);
        slot.lost[(generation & 1) as usize].fetch_add(1, Ordering::Relaxed);
        return;
    }
    let generation = SHARED.generation.load(Ordering::Acquire);
    if generation != 0 {
        write(slot, generation);
    }
    slot.seq.end();
}

/// Out of line, so the disabled path at every call site stays a load and a
/// branch with no stack frame.
#[inline(never)]
fn emit_enabled<const KIND: u8, const TAGGED: bool>(addr: u64, arg1: u64, arg2: u64, entry: u64) {
    let Some(kind) = EventKind::from_u8(KIND) else {
        return;
    };
    let entry = if TAGGED { entry } else { 0 };
    if !write_event_fast(kind, addr, arg1, arg2, entry) {
        emit_slow(kind, addr, arg1, arg2, entry);
    }
}

/// Everything the fast path leaves: a thread without a slot yet, a full or
/// missing buffer, a new generation, the long form, an event interrupted by
/// a signal handler.
#[cold]
#[inline(never)]
fn emit_slow(kind: EventKind, addr: u64, arg1: u64, arg2: u64, entry: u64) {
    with_slot(
        #[inline(always)]
        |slot, generation| write_event(slot, generation, kind, addr, arg1, arg2, entry),
    );
}

/// The common case of [`write_event`], with no call in it (so no stack
/// frame): a thread with a slot and room in its buffer, an address on the
/// grid, a precise or coarse clock where the advancer uses membarrier.
/// The same steps and bytes as the header's inline path
/// (include/alloctrace_inline.h; c_tests/test_inline_encoding.c compares
/// them). Returns false, having recorded nothing and left the seqlock even,
/// when the slow path must run instead.
#[inline(always)]
fn write_event_fast(kind: EventKind, addr: u64, arg1: u64, arg2: u64, entry: u64) -> bool {
    let mode = SHARED.inline_mode.load(Ordering::Relaxed);
    let class = kind.address_class();
    if mode == inline_mode::OUT_OF_LINE || class == AddressClass::Raw {
        return false;
    }
    let Some(slot) = thread::current() else {
        return false;
    };
    let Some(s) = slot.seq.try_begin_asymmetric() else {
        return false;
    };
    let generation = SHARED.generation.load(Ordering::Acquire);
    let buf = slot.bufs[(generation & 1) as usize][Stream::Events as usize].load(Ordering::Relaxed);
    // No panic below (invariant 6): short_form and encode_event (format
    // crate) use only wrapping, bitwise and checked operations on the
    // caller's values; the shifts are trailing_zeros of powers of two
    // Config::validate checked, so < 64; the parity index is 0 or 1 into
    // arrays of 2.
    let short = short_form(kind, addr, arg1);
    let room = if generation != 0 {
        // SAFETY: a non-null pointer in the slot's current-parity entry is
        // held by this thread (invariant 1).
        unsafe { event_room(buf) }
    } else {
        None
    };
    let (Some((id, second)), Some(out)) = (short, room) else {
        slot.seq.end_from(s);
        return false;
    };
    // SAFETY: non-null (event_room gave room in it), and this thread's.
    let b = unsafe { &mut *buf };
    let ticks = next_ticks(slot, mode == inline_mode::COARSE);
    let first = b.ids.encode(class, id);
    let flags = if entry != 0 { ENTRY_TAG } else { 0 };
    append_event(b, out, kind, flags, ticks, [first, second, arg2, entry]);
    slot.seq.end_from(s);
    true
}

/// log2 of the alignment IDs of `class` are compressed with, in the running
/// session (0 for [`AddressClass::Raw`], which is not compressed).
#[inline(always)]
fn align_shift(class: AddressClass) -> u32 {
    match class {
        AddressClass::Span => SHARED.page_shift.load(Ordering::Relaxed),
        AddressClass::HeapObject => SHARED.heap_shift.load(Ordering::Relaxed),
        AddressClass::Stack => SHARED.stack_shift.load(Ordering::Relaxed),
        AddressClass::Raw => 0,
    }
}

/// The short form of the event's first two arguments in the running
/// session ([`alloctrace_format::short_form`]), or `None` for long form.
#[inline(always)]
fn short_form(kind: EventKind, addr: u64, arg1: u64) -> Option<(u64, u64)> {
    let min = SHARED.min_heap_addr.load(Ordering::Relaxed);
    alloctrace_format::short_form(kind, addr, arg1, min, align_shift(kind.address_class()))
}

/// The bytes one event may take at the end of `buf`'s batch, or `None` when
/// `buf` is null or has less than [`MAX_EVENT_LEN`] bytes of room.
///
/// # Safety
/// `buf` is null or a buffer the calling thread holds, and stays so while
/// the result lives.
#[inline(always)]
unsafe fn event_room<'a>(buf: *mut Buffer) -> Option<&'a mut [u8; MAX_EVENT_LEN]> {
    // SAFETY: the caller's guarantee.
    let b = unsafe { buf.as_mut() }?;
    if b.room() < MAX_EVENT_LEN {
        return None;
    }
    // SAFETY: MAX_EVENT_LEN bytes at `len` are inside the batch capacity
    // (checked above), after the header, and only this thread touches them.
    Some(unsafe { &mut *b.data().add(b.len).cast::<[u8; MAX_EVENT_LEN]>() })
}

/// Appends one event to `b`, in `out` (its [`event_room`]), with the
/// format's encoder ([`alloctrace_format::encode_event`]) and makes `ticks`
/// the batch's time base.
#[inline(always)]
fn append_event(
    b: &mut Buffer,
    out: &mut [u8; MAX_EVENT_LEN],
    kind: EventKind,
    flags: u8,
    ticks: u64,
    args: [u64; 4],
) {
    let n =
        alloctrace_format::encode_event(out, kind, flags, ticks.wrapping_sub(b.last_ticks), args);
    b.len += n;
    b.last_ticks = ticks;
}

/// The calling thread's next timestamp, for every event: with the precise
/// clock the clock, kept strictly above the thread's previous one; with the
/// coarse clock the published time, which only grows (clock::publish), or
/// the thread's previous time should it be later (the max keeps deltas
/// unsigned). The inline path of the header does the same.
#[inline(always)]
fn next_ticks(slot: &ThreadSlot, coarse: bool) -> u64 {
    let last = slot.last_ticks.load(Ordering::Relaxed);
    let ticks = if coarse {
        SHARED.published_ticks.load(Ordering::Relaxed).max(last)
    } else {
        let ticks = clock::ticks();
        if ticks <= last {
            last.wrapping_add(1)
        } else {
            ticks
        }
    };
    slot.last_ticks.store(ticks, Ordering::Relaxed);
    ticks
}

/// The slot's buffer for `generation` and `stream` with at least `need`
/// bytes of room, refilled when needed. `None` (the event counted as lost)
/// only when no buffer could be had at all.
#[inline(always)]
fn buffer_with_room(
    slot: &ThreadSlot,
    generation: u64,
    stream: Stream,
    need: usize,
    ticks: u64,
) -> Option<&'static mut Buffer> {
    let parity = (generation & 1) as usize;
    let mut buf = slot.bufs[parity][stream as usize].load(Ordering::Relaxed);
    // SAFETY: a non-null pointer in the slot's current-parity entry is held
    // by this thread (invariant 1).
    if buf.is_null() || unsafe { (*buf).room() } < need {
        match refill(slot, generation, stream, ticks) {
            Some(b) => buf = b.as_ptr(),
            None => {
                slot.lost[parity].fetch_add(1, Ordering::Relaxed);
                return None;
            }
        }
    }
    // SAFETY: as above; the buffer stays this thread's until the event ends.
    Some(unsafe { &mut *buf })
}

/// The page tracer's word layout for the running session.
#[inline(always)]
fn page_layout() -> alloctrace_format::pages::Layout {
    alloctrace_format::pages::Layout {
        page_shift: SHARED.page_shift.load(Ordering::Relaxed),
        lost_bits: alloctrace_format::pages::TIME_LOST_BITS,
    }
}

/// Records one page tracer event (a kind from `alloctrace_format::pages`).
///
/// Must not allocate, lock or panic: runs inside the host's page allocator.
#[inline(always)]
pub(crate) fn emit_page(kind: u64, base: u64, npages: u64) {
    if SHARED.generation.load(Ordering::Relaxed) == 0 {
        return;
    }
    emit_page_enabled(kind, base, npages);
}

#[inline(never)]
fn emit_page_enabled(kind: u64, base: u64, npages: u64) {
    with_slot(
        #[inline(always)]
        |slot, generation| write_page_event(slot, generation, kind, base, npages),
    );
}

/// Most bytes one page event takes: a time sync word, then a long event
/// (sync word, base, npages).
const MAX_PAGE_EVENT_LEN: usize = 4 * 8;

#[inline(always)]
fn write_page_event(slot: &ThreadSlot, generation: u64, kind: u64, base: u64, npages: u64) {
    use alloctrace_format::pages::{self, SYNC_LONG_EVENT, SYNC_TIME};
    let ticks = next_ticks(slot, clock::COARSE.load(Ordering::Relaxed));
    let Some(b) = buffer_with_room(slot, generation, Stream::Pages, MAX_PAGE_EVENT_LEN, ticks)
    else {
        return;
    };
    // No panic below: `base`, `npages` (the caller's) only meet bitwise
    // operations; the layout's page shift is the validated one (16..2^40:
    // 4..=40), so its shifts and `page_shift - 3` stay in range, and
    // put_word checks its room.
    let layout = page_layout();
    let units = ticks >> pages::TIME_LOST_BITS;
    // A pages buffer keeps its time base, in units, in last_ticks.
    if units.wrapping_sub(b.last_ticks) >> pages::DELTA_BITS != 0 {
        b.put_word(pages::sync_word(SYNC_TIME, units));
        b.last_ticks = units;
    }
    let delta = units.wrapping_sub(b.last_ticks);
    if layout.page_shift >= pages::MIN_PAGE_SHIFT && layout.fits(base) {
        b.put_word(layout.event_word(kind, base, npages, delta));
        if layout.is_large(npages) {
            b.put_word(npages);
        }
    } else {
        // Off the page grid or above 48 bits: recorded exactly, long form.
        b.put_word(pages::sync_word(SYNC_LONG_EVENT, kind | delta << 2));
        b.put_word(base);
        b.put_word(npages);
    }
}

#[cold]
fn count_lost_without_slot() {
    if thread::is_internal() {
        return;
    }
    let generation = SHARED.generation.load(Ordering::Relaxed);
    LOST_WITHOUT_SLOT[(generation & 1) as usize].fetch_add(1, Ordering::Relaxed);
}

/// Encodes one event into the slot's buffer for `generation`. `entry` is an
/// entry-point tag, or 0 for none.
#[inline(always)]
fn write_event(
    slot: &ThreadSlot,
    generation: u64,
    kind: EventKind,
    addr: u64,
    arg1: u64,
    arg2: u64,
    entry: u64,
) {
    let short = short_form(kind, addr, arg1);
    let ticks = next_ticks(slot, clock::COARSE.load(Ordering::Relaxed));
    let Some(b) = buffer_with_room(slot, generation, Stream::Events, MAX_EVENT_LEN, ticks) else {
        return;
    };
    let buf: *mut Buffer = b;
    // SAFETY: buffer_with_room gave this thread's buffer, with the room.
    let Some(out) = (unsafe { event_room(buf) }) else {
        return;
    };
    // SAFETY: as above.
    let b = unsafe { &mut *buf };
    let tag = if entry != 0 { ENTRY_TAG } else { 0 };
    match short {
        // Short-form IDs travel as deltas from the batch's previous ID of
        // the same class (FORMAT.md section 3, compact events).
        Some((id, second)) => {
            let first = b.ids.encode(kind.address_class(), id);
            append_event(b, out, kind, tag, ticks, [first, second, arg2, entry]);
        }
        // Odd arguments go in long form, raw.
        None => append_event(
            b,
            out,
            kind,
            LONG_FORM | tag,
            ticks,
            [addr, arg1, arg2, entry],
        ),
    }
}

/// Replaces the slot's buffer for `generation` and `stream` with an empty one
/// holding a fresh batch header, handing the old one to the writer.
///
/// Must not allocate or lock: runs inside the host's malloc. Waits (lossless
/// back-pressure) when the writer is behind and the memory bound is reached.
#[cold]
#[inline(never)]
fn refill(
    slot: &ThreadSlot,
    generation: u64,
    stream: Stream,
    ticks: u64,
) -> Option<NonNull<Buffer>> {
    // The syscalls below (mmap, futex, sched_yield) may set errno; the
    // program's errno must come out of an event call as it went in.
    let _errno = KeepErrno::new();
    // SAFETY: the caller read a non-zero generation inside its seqlock
    // section, so the session outlives this call (stop waits for us).
    let session = unsafe { SESSION.load(Ordering::SeqCst).as_ref() }?;
    let parity = (generation & 1) as usize;
    let entry = &slot.bufs[parity][stream as usize];
    // Between the swap and the push the old batch is in neither the slot
    // nor the queue: a fatal-signal flush (crash.rs) on this thread would
    // lose it. Signals wait for the push instead (two system calls per
    // buffer, not per event).
    without_signals(|| {
        if let Some(old) = NonNull::new(entry.swap(core::ptr::null_mut(), Ordering::Relaxed)) {
            session.hand_over(old);
        }
    });
    let buf = session.pool.take(|| session.writer.wake())?;
    // SAFETY: take gave us the buffer; it has room for a header and an event
    // because buffer sizes are at least MIN_BUFFER_SIZE.
    let b = unsafe { &mut *buf.as_ptr() };
    debug_assert!(b.cap >= MAX_BATCH_HEADER_LEN + 3 * 8 + MAX_EVENT_LEN.max(MAX_PAGE_EVENT_LEN));
    let thread_id = slot.id.load(Ordering::Relaxed);
    match stream {
        Stream::Events => b.begin(BatchKind::CompactEvents, generation, thread_id, ticks),
        Stream::Pages => {
            use alloctrace_format::pages::{self, SYNC_THREAD, SYNC_TIME};
            b.begin(BatchKind::Pages, generation, thread_id, ticks);
            let units = ticks >> pages::TIME_LOST_BITS;
            b.put_word(page_layout().word());
            b.put_word(pages::sync_word(SYNC_THREAD, thread_id));
            b.put_word(pages::sync_word(SYNC_TIME, units));
            b.last_ticks = units;
        }
    }
    entry.store(buf.as_ptr(), Ordering::Relaxed);
    Some(buf)
}

/// Runs `f` with every signal blocked on this thread, so a signal handler
/// (the fatal-signal flush of crash.rs) never sees a batch that `f` has
/// taken out of its slot but not yet pushed on the full queue. Slow path
/// only: two rt_sigprocmask calls. The caller keeps errno (KeepErrno).
fn without_signals(f: impl FnOnce()) {
    // SAFETY: an all-zero sigset_t is valid storage; sigfillset fills it.
    let mut all: libc::sigset_t = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { core::mem::zeroed() };
    // SAFETY: valid sigset pointers; pthread_sigmask only reads `all` and
    // writes `old` (glibc leaves its internal signals alone).
    let blocked = unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old) == 0
    };
    f();
    if blocked {
        // SAFETY: restores the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut()) };
    }
}

/// Restores the calling thread's errno when dropped: event calls leave
/// errno as they found it (a program reads it after its malloc failed, and
/// the LD_PRELOAD shim records events in between).
struct KeepErrno(libc::c_int);

impl KeepErrno {
    fn new() -> KeepErrno {
        // SAFETY: __errno_location always returns this thread's errno.
        KeepErrno(unsafe { *libc::__errno_location() })
    }
}

impl Drop for KeepErrno {
    fn drop(&mut self) {
        // SAFETY: as in new.
        unsafe { *libc::__errno_location() = self.0 };
    }
}

/// Statistics of the running session, for tests and benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub struct SessionStats {
    pub buffers_mapped: usize,
    pub producer_waits: usize,
}

/// Generation-end batches this process has written, over all its
/// sessions, and the events they counted as lost (see [`written_totals`]).
static WRITTEN_GENERATIONS: AtomicU64 = AtomicU64::new(0);
static WRITTEN_LOST: AtomicU64 = AtomicU64::new(0);

/// Counts one generation-end batch (end_generation, under CONTROL).
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

/// Statistics of the running session, if any.
pub fn session_stats() -> Option<SessionStats> {
    let control = CONTROL.lock().unwrap_or_else(|p| p.into_inner());
    control.session.as_ref().map(|s| SessionStats {
        buffers_mapped: s.pool.mapped(),
        producer_waits: s.pool.waits(),
    })
}
