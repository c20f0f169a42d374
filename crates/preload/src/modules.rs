//! Libraries coming and going: the module table and the unwinder of native
//! call stacks (alloctrace_writer::capture) follow `dlclose`.
//!
//! dlclose is interposed: before the real call the writer re-reads the
//! loaded objects (a library dlopened since the last look joins the module
//! table while it is still loaded), and after it again, noting the unload
//! (the reader then attributes no later frame to the library) and
//! replacing the unwinder built with the library's unwind tables.
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

/// Interposed dlclose(3): the module table refreshed, the real call, and
/// the table refreshed again (as the shim's own code: a refresh allocates
/// and takes the loader's lock, which neither call holds around it).
///
/// # Safety
/// As dlclose(3).
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    let Some(real_dlclose) = real::dlclose() else {
        return -1;
    };
    let traced = reentrancy::get() != reentrancy::OWN;
    if traced {
        // The object may have been dlopened since the last look (dlopen is
        // not wrapped): list it while it is still loaded, so that the trace
        // has it for the frames recorded in it.
        refresh();
    }
    // SAFETY: the caller's handle, unchanged.
    let rc = unsafe { real_dlclose(handle) };
    if rc == 0 && traced {
        refresh();
    }
    rc
}

/// Re-reads the loaded objects (alloctrace_writer::capture::modules_changed)
/// as the shim's own code, keeping the program's errno as it was.
fn refresh() {
    let errno = real::errno();
    reentrancy::own(alloctrace_writer::capture::modules_changed);
    real::set_errno(errno);
}
