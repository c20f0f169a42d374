//! The real mmap, mmap64, munmap and mremap (real.rs re-exports them):
//! the shim's own mappings as system calls, the program's through the next
//! definitions.

use core::ffi::{c_int, c_void};
use core::sync::atomic::Ordering;

use crate::next_symbol::{lookup, resolving, Next};
use crate::reentrancy;

// The shim's own mappings: system calls, which no interposer sees (they are
// not the program's calls).

/// mmap(2) as a system call, for the shim's own mappings. Returns
/// MAP_FAILED with errno set on failure, as glibc does.
///
/// # Safety
/// As mmap(2).
#[inline]
pub unsafe extern "C" fn sys_mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    // SAFETY: the caller's arguments go to the kernel unchanged; syscall()
    // maps -errno results to -1 (MAP_FAILED) with errno set.
    unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void }
}

/// munmap(2) as a system call, for the shim's own mappings.
///
/// # Safety
/// As munmap(2).
#[inline]
pub unsafe extern "C" fn sys_munmap(addr: *mut c_void, len: usize) -> c_int {
    // SAFETY: as sys_mmap above.
    unsafe { libc::syscall(libc::SYS_munmap, addr, len) as c_int }
}

/// mremap(2) as a system call, for the shim's own mappings; `new_addr` is
/// read by the kernel only with MREMAP_FIXED.
///
/// # Safety
/// As mremap(2).
#[inline]
pub unsafe extern "C" fn sys_mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    // SAFETY: as sys_mmap above.
    unsafe {
        libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) as *mut c_void
    }
}

// The program's mappings: the next mmap, mmap64, munmap and mremap, so an
// interposer preloaded after the shim sees every call the program makes.
// Cached pointers, as the allocator's: the event path pays a relaxed load
// and an indirect call (no lock, no system call, no dlsym). Each starts
// as a bootstrap function that resolves all four and makes the call; the
// system call is the fallback while resolving (dlsym, as the shim's own
// code) and where dlsym finds nothing (so the sys_ functions are
// extern "C").

type MmapFn = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, i64) -> *mut c_void;
type MunmapFn = unsafe extern "C" fn(*mut c_void, usize) -> c_int;
/// C declares mremap variadic (new_address is the optional fifth argument).
type MremapFn = unsafe extern "C" fn(*mut c_void, usize, usize, c_int, ...) -> *mut c_void;

static MMAP: Next = Next::new(boot_mmap as *mut c_void);
static MMAP64: Next = Next::new(boot_mmap64 as *mut c_void);
static MUNMAP: Next = Next::new(boot_munmap as *mut c_void);
static MREMAP: Next = Next::new(boot_mremap as *mut c_void);

/// Resolves the next mmap, mmap64, munmap and mremap (the constructor
/// calls it; so does the first program call made before the constructor).
pub fn resolve_mappings() {
    let found = [
        lookup(b"mmap\0", sys_mmap as *mut c_void),
        lookup(b"mmap64\0", sys_mmap as *mut c_void),
        lookup(b"munmap\0", sys_munmap as *mut c_void),
        lookup(b"mremap\0", sys_mremap as *mut c_void),
    ];
    for (next, p) in [&MMAP, &MMAP64, &MUNMAP, &MREMAP].into_iter().zip(found) {
        next.0.store(p, Ordering::Relaxed);
    }
}

unsafe extern "C" fn boot_mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { boot_mapping(&MMAP, addr, len, prot, flags, fd, off) }
}

unsafe extern "C" fn boot_mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { boot_mapping(&MMAP64, addr, len, prot, flags, fd, off) }
}

/// mmap's or mmap64's bootstrap (`next`, the one of the two called): the
/// system call while the next definitions are being resolved, else
/// resolves them and calls the next one.
///
/// # Safety
/// As mmap(2).
#[inline(always)]
unsafe fn boot_mapping(
    next: &Next,
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    if resolving() {
        // SAFETY: forwarded.
        return unsafe { sys_mmap(addr, len, prot, flags, fd, off) };
    }
    resolve_mappings();
    // SAFETY: forwarded to the resolved function.
    unsafe { next_mapping(next, addr, len, prot, flags, fd, off) }
}

unsafe extern "C" fn boot_munmap(addr: *mut c_void, len: usize) -> c_int {
    if resolving() {
        // SAFETY: forwarded.
        return unsafe { sys_munmap(addr, len) };
    }
    resolve_mappings();
    // SAFETY: forwarded to the resolved function.
    unsafe { next_munmap(addr, len) }
}

/// Called through [`MremapFn`] (variadic) with all five arguments: on the
/// x86-64 and AArch64 Linux ABIs a variadic argument travels exactly like a
/// fixed one, so a fixed fifth parameter receives it.
unsafe extern "C" fn boot_mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    if resolving() {
        // SAFETY: forwarded.
        return unsafe { sys_mremap(old, old_len, new_len, flags, new_addr) };
    }
    resolve_mappings();
    // SAFETY: forwarded to the resolved function.
    unsafe { next_mremap(old, old_len, new_len, flags, new_addr) }
}

/// The next mmap, for the program's call; the system call for the shim's
/// own code (state OWN), which the next library must not see.
///
/// # Safety
/// As mmap(2).
#[inline(always)]
pub unsafe fn next_mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    // SAFETY: as the caller's.
    unsafe { next_mapping(&MMAP, addr, len, prot, flags, fd, off) }
}

/// The next mmap64, as [`next_mmap`].
///
/// # Safety
/// As mmap(2).
#[inline(always)]
pub unsafe fn next_mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    // SAFETY: as the caller's.
    unsafe { next_mapping(&MMAP64, addr, len, prot, flags, fd, off) }
}

/// [`next_mmap`] or [`next_mmap64`] by `next` (`MMAP` or `MMAP64`).
///
/// # Safety
/// As mmap(2).
#[inline(always)]
unsafe fn next_mapping(
    next: &Next,
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    if reentrancy::get() == reentrancy::OWN {
        // SAFETY: as the caller's.
        return unsafe { sys_mmap(addr, len, prot, flags, fd, off) };
    }
    // SAFETY: MMAP and MMAP64 hold functions of this signature (above).
    unsafe {
        core::mem::transmute::<*mut c_void, MmapFn>(next.get())(addr, len, prot, flags, fd, off)
    }
}

/// The next munmap, as [`next_mmap`].
///
/// # Safety
/// As munmap(2).
#[inline(always)]
pub unsafe fn next_munmap(addr: *mut c_void, len: usize) -> c_int {
    if reentrancy::get() == reentrancy::OWN {
        // SAFETY: as the caller's.
        return unsafe { sys_munmap(addr, len) };
    }
    // SAFETY: as next_mmap.
    unsafe { core::mem::transmute::<*mut c_void, MunmapFn>(MUNMAP.get())(addr, len) }
}

/// The next mremap, as [`next_mmap`]; `new_addr` is passed on (read only
/// with MREMAP_FIXED).
///
/// # Safety
/// As mremap(2).
#[inline(always)]
pub unsafe fn next_mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    if reentrancy::get() == reentrancy::OWN {
        // SAFETY: as the caller's.
        return unsafe { sys_mremap(old, old_len, new_len, flags, new_addr) };
    }
    // SAFETY: as next_mmap.
    unsafe {
        core::mem::transmute::<*mut c_void, MremapFn>(MREMAP.get())(
            old, old_len, new_len, flags, new_addr,
        )
    }
}
