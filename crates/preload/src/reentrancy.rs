//! The per-thread reentrancy state.
//!
//! The core's client TLS word (alloctrace_writer::tls): zero on every new
//! thread, no destructor, two instructions to read on x86-64; reading or
//! writing it never allocates or registers anything, so it is safe from the
//! first malloc ld.so makes to the last free of a dying thread.

use alloctrace_writer::tls::{self, Word};

/// The thread runs the program's code: interposed calls are traced.
pub const NORMAL: u8 = 0;
/// The thread records a mapping change (it holds the span table) or a
/// thread's stack. mmap, munmap and mremap made now come from a signal
/// handler and pass through untraced; malloc and friends are still traced
/// (the core counts an event that a signal handler makes mid-event as
/// lost).
pub const IN_EVENT: u8 = 1;
/// The thread runs the shim's own code (configuration, start, stop, dlsym,
/// pthread_getattr_np), or is one of the tracer's own threads: every
/// interposed call passes straight through, untraced.
pub const OWN: u8 = 2;
/// Tracing is off for the rest of the thread's life: a panic in the
/// recording of one of its calls (boundary.rs, `event`) left the thread's
/// tracing state unknown. Its calls go to the next allocator, untraced
/// (unlike OWN, which serves them from the private heap), each counted as
/// a lost event; otherwise the thread is the program's, as in NORMAL
/// (exit, exec and fork handling). A forked child of the thread inherits
/// the state.
pub const DISABLED: u8 = 3;

/// The calling thread's state.
#[inline(always)]
pub fn get() -> u8 {
    tls::get(Word::Client) as u8
}

/// Sets the calling thread's state and returns the previous one.
#[inline(always)]
pub fn replace(state: u8) -> u8 {
    let prev = get();
    tls::set(Word::Client, state as usize);
    prev
}

/// Whether the calling thread runs the program's code, traced or not
/// (NORMAL, DISABLED): not the shim's own, not an event a signal handler
/// interrupted. Such a thread holds none of the shim's locks.
#[inline]
pub fn in_program() -> bool {
    matches!(get(), NORMAL | DISABLED)
}

/// Runs `f` as the shim's own code: nothing it calls is traced.
#[inline]
pub fn own<T>(f: impl FnOnce() -> T) -> T {
    let prev = replace(OWN);
    let r = f();
    replace(prev);
    r
}

/// Runs `f` (heap event calls) unless the thread runs the shim's own code
/// or its tracing is off, where nothing is recorded. No state change is needed around them: the
/// core maps and unmaps its buffers with raw system calls, which the mmap
/// wrappers never see, and restores errno around them, so a program reads
/// the errno of its failed call.
#[inline(always)]
pub fn event(f: impl FnOnce()) {
    if get() < OWN {
        f();
    }
}

/// Turns tracing off for the calling thread for good (see [`DISABLED`]).
#[cold]
pub fn disable() {
    replace(DISABLED);
}
