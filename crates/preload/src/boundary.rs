//! The panic boundary of the shim's exports.
//!
//! The crate is built with `panic = "unwind"` (the workspace sets no
//! strategy), and a panic that reaches an `extern "C"` function aborts the
//! process (Rust 1.81 on): the traced program would die for a bug in the
//! tracer. So every export runs its tracing code inside one of two
//! boundaries, and the program's call proceeds without it: the real
//! function is called, its answer (result, errno) returned unchanged.
//!
//! - [`event`]: the recording of a program's call (the malloc family's
//!   events and call stacks, the mapping calls' span events and stacks, a
//!   new thread's stack). A panic there leaves the thread's tracing state
//!   unknown (an event half written, a stack walk half done), so the thread
//!   records nothing more, for the rest of its life (reentrancy DISABLED).
//!   The trace says what it lacks: the event being recorded and one event
//!   per later call the thread makes to an interposed function (the malloc
//!   family, mmap, munmap, mremap) are counted in the generation's
//!   `lost_events`. The other threads are traced as before.
//! - [`shielded`] and [`quietly`]: the shim's own work around a call
//!   (session start and stop, the module table at dlopen and dlclose, the
//!   run's environment at exec and spawn, the signal view). A panic there
//!   leaves that work undone (a module table refreshed later, a session
//!   not stopped cleanly); the thread's state is as it was, and its calls
//!   are traced as before.
//!
//! **What the program sees.** Its calls' answers, unchanged: a panic
//! never reaches its frames, and its output and exit status are those of
//! an untraced run. On stderr, the first panic of the process (and only
//! it) writes one line,
//! `alloctrace: internal error (a panic in the tracer at FILE:LINE:COL: MESSAGE); CONSEQUENCE`,
//! where CONSEQUENCE says which of the above happened. Rust's own panic
//! message is never printed: the constructor installs [`hook`] as the panic
//! hook of the shim's copy of std (the program's own Rust code, if any,
//! has its own). The hook allocates nothing and takes no lock, so with
//! RUST_BACKTRACE set no backtrace is symbolised inside the program's
//! malloc; the boundary that catches the panic writes the line, except
//! where the hook knows the consequence first: a panic in the shim's own
//! code (state OWN, which includes the tracer's threads, whose catch says
//! nothing) and one that escaped every boundary, about to abort the
//! process ("aborting"). It notes where the panic happened, and turns the
//! thread's state to OWN for the rest of the unwind, so that what the
//! unwinder allocates (the exception object, the payload's box) comes
//! from the shim's private heap: never traced as the program's, never from
//! the program's allocator. Payloads are never dropped (a payload's drop
//! may panic). So a panic with a literal message allocates nothing of the
//! program's; one with a formatted message builds it before the hook
//! runs, in the thread's state of the moment: that block may be recorded
//! as an allocation of the program's, never freed.

use core::cell::UnsafeCell;
use core::fmt::Write as _;
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::reentrancy;

/// Runs `f`, the recording of a program's call; if it panics, turns the
/// thread's tracing off for good, counts the event as lost and says so
/// once on stderr.
#[inline(always)]
pub fn event(f: impl FnOnce()) {
    event_or(f, ());
}

/// [`event`] for a recording with an answer: `fallback` if it panics.
#[inline(always)]
pub fn event_or<T>(f: impl FnOnce() -> T, fallback: T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            event_panicked(payload);
            fallback
        }
    }
}

#[cold]
#[inline(never)]
fn event_panicked(payload: Box<dyn core::any::Any + Send>) {
    core::mem::forget(payload);
    reentrancy::disable();
    alloctrace_writer::events::lost();
    report("this thread's later calls go untraced, counted in the trace's lost_events");
}

/// Runs `f` (the shim's own work); if it panics, restores the thread's
/// state, says so once on stderr and returns `fallback()` instead.
#[inline]
pub fn shielded<T>(f: impl FnOnce() -> T, fallback: impl FnOnce() -> T) -> T {
    let state = reentrancy::get();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            core::mem::forget(payload);
            reentrancy::replace(state);
            report(OWN_WORK);
            fallback()
        }
    }
}

/// Runs `f` (the shim's own work, with no answer of its own) inside the
/// boundary.
#[inline]
pub fn quietly(f: impl FnOnce()) {
    shielded(f, || ());
}

/// Set once the process has written its one line.
static REPORTED: AtomicBool = AtomicBool::new(false);

/// Writes the process's one line about a panic, the first time, ending in
/// `consequence`; keeps errno.
#[cold]
pub fn report(consequence: &str) {
    if REPORTED.swap(true, Ordering::Relaxed) {
        return;
    }
    let mut line = Line::new();
    let _ = write!(line, "alloctrace: internal error (a panic in the tracer");
    FIRST.describe(&mut line);
    let _ = write!(line, "); {consequence}");
    line.finish_and_write();
}

/// Installs [`hook`] as the panic hook (the constructor calls it first).
pub fn install_hook() {
    // A function item (zero-sized): its box allocates nothing.
    std::panic::set_hook(Box::new(hook));
}

/// The panic hook: see the module's docs. Must not allocate or lock: runs
/// inside the program's malloc.
fn hook(info: &std::panic::PanicHookInfo<'_>) {
    let state = reentrancy::get();
    if state < reentrancy::OWN {
        reentrancy::replace(reentrancy::OWN);
    }
    FIRST.note(info);
    if let Some("panic in a function that cannot unwind" | "panic in a destructor during cleanup") =
        message(info)
    {
        // What core raises when an unwind reaches a frame it may not
        // leave (a panic that escaped every boundary): the process aborts
        // next.
        report("aborting");
    } else if state == reentrancy::OWN {
        // The shim's own code: its boundary is `shielded`, or the catch
        // of a tracer's thread (the writer's), which says nothing.
        report(OWN_WORK);
    }
}

/// The consequence of a panic in the shim's own work.
const OWN_WORK: &str = "the program's calls go on";

/// The panic's message, if it is a string (a literal or a formatted one).
fn message<'a>(info: &'a std::panic::PanicHookInfo<'_>) -> Option<&'a str> {
    let payload = info.payload();
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
}

/// Where the process's first panic happened (`at FILE:LINE:COL: MESSAGE`),
/// written once by the first hook to claim it.
struct First {
    /// 0 empty, 1 being written (by the claiming hook), 2 written.
    state: AtomicU8,
    len: AtomicUsize,
    bytes: UnsafeCell<[u8; FIRST_LEN]>,
}

const FIRST_LEN: usize = 320;

// SAFETY: `bytes` is written only by the one hook that moved `state` from
// 0 to 1, and read only after `state` is 2 (Release/Acquire); never
// written again.
unsafe impl Sync for First {}

static FIRST: First = First {
    state: AtomicU8::new(0),
    len: AtomicUsize::new(0),
    bytes: UnsafeCell::new([0; FIRST_LEN]),
};

impl First {
    fn note(&self, info: &std::panic::PanicHookInfo<'_>) {
        if self
            .state
            .compare_exchange(0, 1, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let mut text = Line::new();
        if let Some(loc) = info.location() {
            let _ = write!(text, " at {}:{}:{}", loc.file(), loc.line(), loc.column());
        }
        if let Some(msg) = message(info) {
            let _ = write!(text, ": {msg}");
        }
        let text = text.buf.get(..text.len.min(FIRST_LEN)).unwrap_or_default();
        // SAFETY: this hook claimed the buffer (state 0 -> 1): no one else
        // writes it, and no one reads it before state is 2.
        let bytes = unsafe { &mut *self.bytes.get() };
        if let Some(dst) = bytes.get_mut(..text.len()) {
            dst.copy_from_slice(text);
            self.len.store(text.len(), Ordering::Relaxed);
        }
        self.state.store(2, Ordering::Release);
    }

    fn describe(&self, line: &mut Line) {
        if self.state.load(Ordering::Acquire) == 2 {
            let n = self.len.load(Ordering::Relaxed);
            // SAFETY: state 2: written for good (see `note`).
            let bytes = unsafe { &*self.bytes.get() };
            line.push(bytes.get(..n).unwrap_or_default());
        }
    }
}

/// A line built on the stack (no allocation), cut at its capacity.
struct Line {
    buf: [u8; 512],
    len: usize,
}

impl Line {
    fn new() -> Line {
        Line {
            buf: [0; 512],
            len: 0,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        // One byte is kept for the newline.
        let room = self.buf.len() - 1 - self.len.min(self.buf.len() - 1);
        let n = bytes.len().min(room);
        if let (Some(dst), Some(src)) = (self.buf.get_mut(self.len..self.len + n), bytes.get(..n)) {
            dst.copy_from_slice(src);
            self.len += n;
        }
    }

    /// Appends the newline and writes the line to stderr, keeping errno.
    fn finish_and_write(mut self) {
        if let Some(b) = self.buf.get_mut(self.len) {
            *b = b'\n';
            self.len += 1;
        }
        write_stderr(self.buf.get(..self.len).unwrap_or_default());
    }
}

/// Writes `msg` to stderr, keeping errno (a short or failed write only
/// loses the message).
fn write_stderr(msg: &[u8]) {
    // SAFETY: __errno_location returns this thread's errno slot; msg is a
    // valid readable slice.
    unsafe {
        let errno = *libc::__errno_location();
        libc::write(2, msg.as_ptr().cast(), msg.len());
        *libc::__errno_location() = errno;
    }
}

impl core::fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.push(s.as_bytes());
        Ok(())
    }
}

/// The test hook's panic point for `kind` (an entry point's tag, or
/// [`TEST_THREAD`], [`TEST_DLOPEN`]): with the feature `panic-test`, see
/// [`test_panic`]; nothing otherwise.
#[inline(always)]
pub fn test_point(_kind: u8) {
    #[cfg(feature = "panic-test")]
    test_panic::point(_kind);
}

/// [`test_point`]'s kind for the recording of a new thread's stack.
pub const TEST_THREAD: u8 = 100;
/// [`test_point`]'s kind for the module table's refresh after a dlopen.
pub const TEST_DLOPEN: u8 = 101;

/// The test hook (feature `panic-test`, for `make preload-test`):
/// `ALLOCTRACE_TEST_PANIC=NAME` makes the first recording of one kind of
/// call in the process panic inside its boundary, where NAME is an entry
/// point (malloc, calloc, realloc, free, posix_memalign, aligned_alloc,
/// memalign, valloc, pvalloc, reallocarray, mmap, munmap, mremap), `thread`
/// (the recording of a new thread's stack, as it starts) or `dlopen` (the
/// module table's refresh after a dlopen). The constructor reads the
/// variable once ([`test_panic::init`]); a recording reads one relaxed
/// atomic.
#[cfg(feature = "panic-test")]
pub mod test_panic {
    use core::sync::atomic::{AtomicU8, Ordering};

    use alloctrace_writer::events::EntryPoint;

    use super::{TEST_DLOPEN, TEST_THREAD};

    /// The kind whose first recording panics; 0 none (or done).
    static ARMED: AtomicU8 = AtomicU8::new(0);

    const NAMES: [(&str, u8); 15] = [
        ("malloc", EntryPoint::Malloc as u8),
        ("calloc", EntryPoint::Calloc as u8),
        ("realloc", EntryPoint::Realloc as u8),
        ("free", EntryPoint::Free as u8),
        ("posix_memalign", EntryPoint::PosixMemalign as u8),
        ("aligned_alloc", EntryPoint::AlignedAlloc as u8),
        ("memalign", EntryPoint::Memalign as u8),
        ("valloc", EntryPoint::Valloc as u8),
        ("pvalloc", EntryPoint::Pvalloc as u8),
        ("reallocarray", EntryPoint::Reallocarray as u8),
        ("mmap", EntryPoint::Mmap as u8),
        ("munmap", EntryPoint::Munmap as u8),
        ("mremap", EntryPoint::Mremap as u8),
        ("thread", TEST_THREAD),
        ("dlopen", TEST_DLOPEN),
    ];

    /// Reads ALLOCTRACE_TEST_PANIC (the constructor, before any session).
    pub fn init() {
        // SAFETY: a NUL-terminated name; getenv's answer, if any, is a
        // NUL-terminated string of the environment, read before the
        // program's code runs.
        let value = unsafe {
            let v = libc::getenv(c"ALLOCTRACE_TEST_PANIC".as_ptr());
            if v.is_null() {
                return;
            }
            core::ffi::CStr::from_ptr(v).to_bytes()
        };
        match NAMES.iter().find(|(name, _)| name.as_bytes() == value) {
            Some(&(_, kind)) => ARMED.store(kind, Ordering::Relaxed),
            None => super::write_stderr(
                b"alloctrace: ALLOCTRACE_TEST_PANIC: not an entry point, thread or dlopen; no test panic\n",
            ),
        }
    }

    /// Panics if `kind` is armed, once per process.
    #[inline(always)]
    pub fn point(kind: u8) {
        if ARMED.load(Ordering::Relaxed) == kind
            && ARMED
                .compare_exchange(kind, 0, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            fire();
        }
    }

    #[cold]
    #[inline(never)]
    fn fire() {
        panic!("alloctrace test panic");
    }
}
