//! Finding the next definition of a symbol, the one after this library in
//! the lookup order (real.rs says why and for what): `dlsym(RTLD_NEXT)`
//! run as the shim's own code, and the cached pointers the entry points
//! call through.

use core::ffi::c_void;
use core::sync::atomic::{AtomicPtr, Ordering};

use crate::reentrancy;

/// One allocator entry point of the next library: the resolved function,
/// or until then the bootstrap function.
pub struct Next(pub AtomicPtr<c_void>);

impl Next {
    pub const fn new(bootstrap: *mut c_void) -> Next {
        Next(AtomicPtr::new(bootstrap))
    }

    /// The current function pointer. Relaxed: the pointer is the only data
    /// (the function's code is immutable), and any value is callable.
    #[inline(always)]
    pub fn get(&self) -> *mut c_void {
        self.0.load(Ordering::Relaxed)
    }
}

/// Looks up the next definition of `name` (NUL-terminated) as the shim's
/// own code, or returns `fallback`.
pub fn lookup(name: &[u8], fallback: *mut c_void) -> *mut c_void {
    debug_assert_eq!(name.last(), Some(&0));
    // SAFETY: RTLD_NEXT with a valid NUL-terminated name.
    let p = reentrancy::own(|| unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) });
    if p.is_null() {
        fallback
    } else {
        p
    }
}

/// Whether a bootstrap function was reached during resolution (as the
/// shim's own code): it must not resolve again.
#[inline]
pub fn resolving() -> bool {
    reentrancy::get() == reentrancy::OWN
}

/// The next definition of `name` after this library, cached in `cache`.
/// Null if there is none.
pub fn next(cache: &AtomicPtr<c_void>, name: &[u8]) -> *mut c_void {
    debug_assert_eq!(name.last(), Some(&0));
    let cached = cache.load(Ordering::Acquire);
    if !cached.is_null() {
        return cached;
    }
    // dlsym may calloc (error state) and takes ld.so's lock: lookup does
    // it as our own code, so the calloc comes from the shim's private heap. Two
    // threads racing here store the same pointer.
    let p = lookup(name, core::ptr::null_mut());
    cache.store(p, Ordering::Release);
    p
}
