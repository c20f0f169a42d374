//! Calls after the session ended at exit (state.rs's EXITED): threads
//! still running, exit handlers that run after the shim's. They are not
//! recorded (the trace is complete), but each is counted, as the one
//! event it would have been, in the trace's lost events
//! (`alloctrace_writer::late_event`, which rewrites the last
//! generation-end batch in place).
//!
//! The wrappers call [`note`] where they do not record a call. While the
//! session runs that is one relaxed load and a branch, on a path that
//! records nothing; only calls made after the end pay more (a pwrite).

use core::sync::atomic::{AtomicBool, Ordering};

use crate::{reentrancy, state};

/// Counts a call the wrapper did not record when the session ended at
/// exit, the call's family (`family`: state.rs's HEAP or MMAP) was
/// recorded, and the call is the program's (not the shim's own).
#[inline(always)]
pub fn note(family: &AtomicBool) {
    if state::LIFECYCLE.load(Ordering::Relaxed) == state::EXITED {
        late(family);
    }
}

#[cold]
#[inline(never)]
fn late(family: &AtomicBool) {
    if family.load(Ordering::Relaxed) && reentrancy::get() != reentrancy::OWN {
        alloctrace_writer::late_event();
    }
}
