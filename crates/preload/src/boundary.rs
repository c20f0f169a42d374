//! The panic boundary of the shim's exports.
//!
//! The crate is built with `panic = "unwind"` (the workspace sets no
//! strategy), and a panic that reaches an `extern "C"` function aborts the
//! process (Rust 1.81 on): the traced program would die for a bug in the
//! tracer. So every export's tracing code (the events, the span table, the
//! module table refreshes, the run's environment, the signal view, the
//! session's start and stop) runs inside [`shielded`], and the program's
//! call proceeds without it: the real function is called, its answer
//! returned. One line on stderr says the first time it happened.
//!
//! A panic inside the shim leaves what it was doing half done (an event
//! not written, a span not recorded): the trace may miss that call, and
//! `alloctrace check` may then report an unknown free; the program itself
//! behaves as without the shim.

use core::sync::atomic::{AtomicBool, Ordering};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`; if it panics, says so once on stderr and returns
/// `fallback()` instead.
#[inline]
pub fn shielded<T>(f: impl FnOnce() -> T, fallback: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            // Dropping the payload may itself panic (a payload whose drop
            // panics): leak it instead.
            core::mem::forget(payload);
            report();
            fallback()
        }
    }
}

/// Runs `f` (tracing code with no answer of its own) inside the boundary.
#[inline]
pub fn quietly(f: impl FnOnce()) {
    shielded(f, || ());
}

#[cold]
fn report() {
    static REPORTED: AtomicBool = AtomicBool::new(false);
    if !REPORTED.swap(true, Ordering::Relaxed) {
        let msg =
            b"alloctrace: internal error (a panic in the tracer); the program's calls go on\n";
        // SAFETY: a valid buffer; a short or failed write only loses the
        // message.
        unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
    }
}
