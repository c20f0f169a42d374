//! Libraries coming and going: the module table and the unwinder of native
//! call stacks (alloctrace_writer::capture) follow `dlclose`.
//!
//! dlclose is interposed: after the real call returns, the writer re-reads
//! the loaded objects, notes the unload in the module table (the reader
//! then attributes no later frame to the library) and replaces the unwinder
//! built with the library's unwind tables.
//!
//! dlopen is deliberately *not* interposed: glibc resolves a relative name
//! against the RUNPATH of dlopen's caller (its return address), which a
//! wrapper would change to the shim's, so that a library found through its
//! caller's `$ORIGIN` would no longer be found. Loads are noticed instead
//! by the writer: a capture that stops in code outside every known module
//! flags the table stale, and the writer thread re-reads it (at most every
//! 100 ms), so a library's frames are unwound by its tables from then on.

use core::ffi::{c_int, c_void};

use crate::{real, reentrancy};

/// Interposed dlclose(3): the real call, then the module table refreshed
/// (as the shim's own code: the refresh allocates and takes the loader's
/// lock, after the real call has released it).
///
/// # Safety
/// As dlclose(3).
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    let Some(real_dlclose) = real::dlclose() else {
        return -1;
    };
    // SAFETY: the caller's handle, unchanged.
    let rc = unsafe { real_dlclose(handle) };
    if rc == 0 && reentrancy::get() != reentrancy::OWN {
        // Keep the program's dlerror and errno state as the real call left it.
        let errno = real::errno();
        reentrancy::own(alloctrace_writer::capture::modules_changed);
        real::set_errno(errno);
    }
    rc
}
