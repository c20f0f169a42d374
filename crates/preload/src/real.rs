//! The real functions behind the interposed ones, reached without calling
//! any symbol this library exports (which would recurse into the shim):
//!
//! - the allocator: the *next* definition of each entry point in the
//!   lookup order, `dlsym(RTLD_NEXT, name)`: glibc's, or the allocator the
//!   program links (jemalloc, tcmalloc, mimalloc) or preloads after the
//!   shim, or another interposer preloaded after the shim. See below;
//! - every other interposed function (mmap, mmap64, munmap, mremap,
//!   pthread_create, the exec family, posix_spawn(p), _exit, _Exit, the
//!   signal functions, dlopen, dlmopen, dlclose): the next definition
//!   too, so an interposer preloaded after the shim (sandboxing, fake
//!   time, fake root, another tracer) sees every call the program makes,
//!   and exactly those. dlsym runs in the shim's own state, so its calloc
//!   is served by the shim's private heap; the raw system call is only the
//!   fallback while resolving and where dlsym finds nothing;
//! - the shim's own work never reaches the next library: its mappings are
//!   system calls ([`sys_mmap`] and friends), its threads and signal
//!   handlers go to glibc's own pthread_create and sigaction ([`libc_own`]),
//!   and the library is linked with -Bsymbolic-functions (build.rs), so its
//!   calls of the names it defines bind to its own definitions, not to an
//!   interposer preloaded before it.
//!
//! ## The allocator's entry points
//!
//! Each one is a cached function pointer ([`Next`]): the hot path is a
//! relaxed load and an indirect call; no lock, no system call, no dlsym.
//! Every pointer starts out as a *bootstrap* function that resolves all of
//! them ([`resolve_allocator`]) and then makes the call. The constructor
//! resolves them before tracing starts; a heap call made before the
//! constructor (ld.so, other libraries' constructors) resolves them on
//! first use. Resolution runs as the shim's own code (reentrancy state OWN), so the
//! allocations dlsym makes come from the shim's private heap (private_heap.rs). A call
//! that reaches a bootstrap function *during* resolution (dlsym freeing a
//! block it did not get from the shim's heap) goes to glibc's `__libc_*`
//! entry point, as does any entry point dlsym cannot find. Two threads
//! resolving at once store the same pointers.

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicPtr, Ordering};

use crate::reentrancy;

mod libc_malloc {
    use core::ffi::c_void;
    extern "C" {
        pub fn __libc_malloc(size: usize) -> *mut c_void;
        pub fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
        pub fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
        pub fn __libc_free(p: *mut c_void);
        pub fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
        pub fn __libc_valloc(size: usize) -> *mut c_void;
        pub fn __libc_pvalloc(size: usize) -> *mut c_void;
    }
}

type MallocFn = unsafe extern "C" fn(usize) -> *mut c_void;
type CallocFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type ReallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);
type PosixMemalignFn = unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> c_int;
type AlignFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type ReallocarrayFn = unsafe extern "C" fn(*mut c_void, usize, usize) -> *mut c_void;
type UsableSizeFn = unsafe extern "C" fn(*mut c_void) -> usize;

/// One allocator entry point of the next library: the resolved function,
/// or until then the bootstrap function.
struct Next(AtomicPtr<c_void>);

impl Next {
    const fn new(bootstrap: *mut c_void) -> Next {
        Next(AtomicPtr::new(bootstrap))
    }

    /// The current function pointer. Relaxed: the pointer is the only data
    /// (the function's code is immutable), and any value is callable.
    #[inline(always)]
    fn get(&self) -> *mut c_void {
        self.0.load(Ordering::Relaxed)
    }
}

static MALLOC: Next = Next::new(boot_malloc as *mut c_void);
static CALLOC: Next = Next::new(boot_calloc as *mut c_void);
static REALLOC: Next = Next::new(boot_realloc as *mut c_void);
static FREE: Next = Next::new(boot_free as *mut c_void);
static POSIX_MEMALIGN: Next = Next::new(boot_posix_memalign as *mut c_void);
static ALIGNED_ALLOC: Next = Next::new(boot_aligned_alloc as *mut c_void);
static MEMALIGN: Next = Next::new(boot_memalign as *mut c_void);
static VALLOC: Next = Next::new(boot_valloc as *mut c_void);
static PVALLOC: Next = Next::new(boot_pvalloc as *mut c_void);
static REALLOCARRAY: Next = Next::new(boot_reallocarray as *mut c_void);
static USABLE_SIZE: Next = Next::new(boot_usable_size as *mut c_void);

/// glibc's reallocarray, the fallback when there is no next one: the
/// overflow check, then realloc.
unsafe extern "C" fn libc_reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: as the caller's.
        Some(bytes) => unsafe { libc_malloc::__libc_realloc(p, bytes) },
        None => {
            set_errno(libc::ENOMEM);
            core::ptr::null_mut()
        }
    }
}

unsafe extern "C" fn libc_posix_memalign(
    out: *mut *mut c_void,
    align: usize,
    size: usize,
) -> c_int {
    // SAFETY: as the caller's (glibc's posix_memalign, reached by address).
    unsafe { libc::posix_memalign(out, align, size) }
}

unsafe extern "C" fn libc_usable_size(p: *mut c_void) -> usize {
    // SAFETY: as the caller's.
    unsafe { libc::malloc_usable_size(p) }
}

/// Looks up the next definition of `name` (NUL-terminated) as the shim's
/// own code, or returns `fallback`.
fn lookup(name: &[u8], fallback: *mut c_void) -> *mut c_void {
    debug_assert_eq!(name.last(), Some(&0));
    // SAFETY: RTLD_NEXT with a valid NUL-terminated name.
    let p = reentrancy::own(|| unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) });
    if p.is_null() {
        fallback
    } else {
        p
    }
}

/// Resolves every allocator entry point (the constructor calls it; so does
/// the first heap call made before the constructor).
pub fn resolve_allocator() {
    let table: [(&Next, &[u8], *mut c_void); 11] = [
        (
            &MALLOC,
            b"malloc\0",
            libc_malloc::__libc_malloc as *mut c_void,
        ),
        (
            &CALLOC,
            b"calloc\0",
            libc_malloc::__libc_calloc as *mut c_void,
        ),
        (
            &REALLOC,
            b"realloc\0",
            libc_malloc::__libc_realloc as *mut c_void,
        ),
        (&FREE, b"free\0", libc_malloc::__libc_free as *mut c_void),
        (
            &POSIX_MEMALIGN,
            b"posix_memalign\0",
            libc_posix_memalign as *mut c_void,
        ),
        (
            &ALIGNED_ALLOC,
            b"aligned_alloc\0",
            libc_malloc::__libc_memalign as *mut c_void,
        ),
        (
            &MEMALIGN,
            b"memalign\0",
            libc_malloc::__libc_memalign as *mut c_void,
        ),
        (
            &VALLOC,
            b"valloc\0",
            libc_malloc::__libc_valloc as *mut c_void,
        ),
        (
            &PVALLOC,
            b"pvalloc\0",
            libc_malloc::__libc_pvalloc as *mut c_void,
        ),
        (
            &REALLOCARRAY,
            b"reallocarray\0",
            libc_reallocarray as *mut c_void,
        ),
        (
            &USABLE_SIZE,
            b"malloc_usable_size\0",
            libc_usable_size as *mut c_void,
        ),
    ];
    // Look every name up before storing any: a call made meanwhile (by
    // dlsym, on this thread) still finds the bootstrap functions, which
    // send it to glibc, so malloc and free never come from two libraries.
    let mut found = [core::ptr::null_mut(); 11];
    for (slot, (_, name, fallback)) in found.iter_mut().zip(table.iter()) {
        *slot = lookup(name, *fallback);
    }
    // glibc's reallocarray calls realloc through the PLT, which would
    // reach the shim's realloc and trace the call twice: do what it does
    // (the overflow check, then the next realloc) instead.
    if found[9] == lookup(b"__libc_reallocarray\0", core::ptr::null_mut()) {
        found[9] = checked_reallocarray as *mut c_void;
    }
    for ((next, _, _), p) in table.iter().zip(found) {
        next.0.store(p, Ordering::Relaxed);
    }
}

/// glibc's reallocarray on top of the next realloc.
unsafe extern "C" fn checked_reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: as the caller's.
        Some(bytes) => unsafe { realloc(p, bytes) },
        None => {
            set_errno(libc::ENOMEM);
            core::ptr::null_mut()
        }
    }
}

/// Whether a bootstrap function was reached during resolution (as the
/// shim's own code): it must not resolve again.
#[inline]
fn resolving() -> bool {
    reentrancy::get() == reentrancy::OWN
}

unsafe extern "C" fn boot_malloc(size: usize) -> *mut c_void {
    if resolving() {
        // SAFETY: forwarded.
        return unsafe { libc_malloc::__libc_malloc(size) };
    }
    resolve_allocator();
    // SAFETY: forwarded.
    unsafe { malloc(size) }
}

unsafe extern "C" fn boot_calloc(n: usize, size: usize) -> *mut c_void {
    if resolving() {
        // SAFETY: forwarded.
        return unsafe { libc_malloc::__libc_calloc(n, size) };
    }
    resolve_allocator();
    // SAFETY: forwarded.
    unsafe { calloc(n, size) }
}

unsafe extern "C" fn boot_realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if resolving() {
        // SAFETY: forwarded.
        return unsafe { libc_malloc::__libc_realloc(p, size) };
    }
    resolve_allocator();
    // SAFETY: forwarded.
    unsafe { realloc(p, size) }
}

unsafe extern "C" fn boot_free(p: *mut c_void) {
    if resolving() {
        // SAFETY: forwarded.
        return unsafe { libc_malloc::__libc_free(p) };
    }
    resolve_allocator();
    // SAFETY: forwarded.
    unsafe { free(p) }
}

unsafe extern "C" fn boot_posix_memalign(
    out: *mut *mut c_void,
    align: usize,
    size: usize,
) -> c_int {
    if resolving() {
        // SAFETY: forwarded.
        return unsafe { libc_posix_memalign(out, align, size) };
    }
    resolve_allocator();
    // SAFETY: forwarded.
    unsafe { posix_memalign(out, align, size) }
}

unsafe extern "C" fn boot_aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if resolving() {
        // SAFETY: forwarded.
        return unsafe { libc_malloc::__libc_memalign(align, size) };
    }
    resolve_allocator();
    // SAFETY: forwarded.
    unsafe { aligned_alloc(align, size) }
}

unsafe extern "C" fn boot_memalign(align: usize, size: usize) -> *mut c_void {
    if resolving() {
        // SAFETY: forwarded.
        return unsafe { libc_malloc::__libc_memalign(align, size) };
    }
    resolve_allocator();
    // SAFETY: forwarded.
    unsafe { memalign(align, size) }
}

unsafe extern "C" fn boot_valloc(size: usize) -> *mut c_void {
    if resolving() {
        // SAFETY: forwarded.
        return unsafe { libc_malloc::__libc_valloc(size) };
    }
    resolve_allocator();
    // SAFETY: forwarded.
    unsafe { valloc(size) }
}

unsafe extern "C" fn boot_pvalloc(size: usize) -> *mut c_void {
    if resolving() {
        // SAFETY: forwarded.
        return unsafe { libc_malloc::__libc_pvalloc(size) };
    }
    resolve_allocator();
    // SAFETY: forwarded.
    unsafe { pvalloc(size) }
}

unsafe extern "C" fn boot_reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    if resolving() {
        // SAFETY: forwarded.
        return unsafe { libc_reallocarray(p, n, size) };
    }
    resolve_allocator();
    // SAFETY: forwarded.
    unsafe { reallocarray(p, n, size) }
}

unsafe extern "C" fn boot_usable_size(p: *mut c_void) -> usize {
    if resolving() {
        // SAFETY: forwarded.
        return unsafe { libc_usable_size(p) };
    }
    resolve_allocator();
    // SAFETY: forwarded.
    unsafe { malloc_usable_size(p) }
}

// The calls. Must not allocate, lock or make a system call (beyond the
// next allocator's own): they run on the event path.

/// The next malloc.
///
/// # Safety
/// As malloc(3).
#[inline(always)]
pub unsafe fn malloc(size: usize) -> *mut c_void {
    // SAFETY: MALLOC holds a function of this signature (above).
    unsafe { core::mem::transmute::<*mut c_void, MallocFn>(MALLOC.get())(size) }
}

/// The next calloc.
///
/// # Safety
/// As calloc(3).
#[inline(always)]
pub unsafe fn calloc(n: usize, size: usize) -> *mut c_void {
    // SAFETY: as malloc.
    unsafe { core::mem::transmute::<*mut c_void, CallocFn>(CALLOC.get())(n, size) }
}

/// The next realloc.
///
/// # Safety
/// As realloc(3).
#[inline(always)]
pub unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: as malloc.
    unsafe { core::mem::transmute::<*mut c_void, ReallocFn>(REALLOC.get())(p, size) }
}

/// The next free.
///
/// # Safety
/// As free(3).
#[inline(always)]
pub unsafe fn free(p: *mut c_void) {
    // SAFETY: as malloc.
    unsafe { core::mem::transmute::<*mut c_void, FreeFn>(FREE.get())(p) }
}

/// The next posix_memalign.
///
/// # Safety
/// As posix_memalign(3).
#[inline(always)]
pub unsafe fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    // SAFETY: as malloc.
    unsafe {
        core::mem::transmute::<*mut c_void, PosixMemalignFn>(POSIX_MEMALIGN.get())(out, align, size)
    }
}

/// The next aligned_alloc.
///
/// # Safety
/// As aligned_alloc(3).
#[inline(always)]
pub unsafe fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    // SAFETY: as malloc.
    unsafe { core::mem::transmute::<*mut c_void, AlignFn>(ALIGNED_ALLOC.get())(align, size) }
}

/// The next memalign.
///
/// # Safety
/// As memalign(3).
#[inline(always)]
pub unsafe fn memalign(align: usize, size: usize) -> *mut c_void {
    // SAFETY: as malloc.
    unsafe { core::mem::transmute::<*mut c_void, AlignFn>(MEMALIGN.get())(align, size) }
}

/// The next valloc.
///
/// # Safety
/// As valloc(3).
#[inline(always)]
pub unsafe fn valloc(size: usize) -> *mut c_void {
    // SAFETY: as malloc.
    unsafe { core::mem::transmute::<*mut c_void, MallocFn>(VALLOC.get())(size) }
}

/// The next pvalloc.
///
/// # Safety
/// As pvalloc(3).
#[inline(always)]
pub unsafe fn pvalloc(size: usize) -> *mut c_void {
    // SAFETY: as malloc.
    unsafe { core::mem::transmute::<*mut c_void, MallocFn>(PVALLOC.get())(size) }
}

/// The next reallocarray.
///
/// # Safety
/// As reallocarray(3).
#[inline(always)]
pub unsafe fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    // SAFETY: as malloc.
    unsafe { core::mem::transmute::<*mut c_void, ReallocarrayFn>(REALLOCARRAY.get())(p, n, size) }
}

/// The next malloc_usable_size (the shim does not interpose it; it asks
/// the allocator that owns a block).
///
/// # Safety
/// As malloc_usable_size(3).
#[inline(always)]
pub unsafe fn malloc_usable_size(p: *mut c_void) -> usize {
    // SAFETY: as malloc.
    unsafe { core::mem::transmute::<*mut c_void, UsableSizeFn>(USABLE_SIZE.get())(p) }
}

/// The calling thread's errno.
#[inline(always)]
pub fn errno() -> c_int {
    // SAFETY: __errno_location always returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

#[inline(always)]
pub fn set_errno(e: c_int) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e };
}

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

/// The next execve, for the program's exec (the system call if there is
/// none). Returns only on failure (-1, errno set).
///
/// # Safety
/// As execve(2).
pub unsafe fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let p = next(&EXECVE, b"execve\0");
    if p.is_null() {
        // SAFETY: the caller's arguments go to the kernel unchanged.
        return unsafe { libc::syscall(libc::SYS_execve, path, argv, envp) as c_int };
    }
    // SAFETY: the symbol is execve, of this signature.
    unsafe { core::mem::transmute::<*mut c_void, Execve>(p)(path, argv, envp) }
}

pub type PthreadCreate = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    extern "C" fn(*mut c_void) -> *mut c_void,
    *mut c_void,
) -> c_int;
pub type Execvpe =
    unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
type Execve = Execvpe;
type Exit = unsafe extern "C" fn(c_int);
pub type Fexecve = unsafe extern "C" fn(c_int, *const *const c_char, *const *const c_char) -> c_int;
pub type PosixSpawn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *mut c_char,
    *const *mut c_char,
) -> c_int;

pub type Dlclose = unsafe extern "C" fn(*mut c_void) -> c_int;
pub type Dlopen = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;
pub type Dlmopen = unsafe extern "C" fn(libc::Lmid_t, *const c_char, c_int) -> *mut c_void;

static PTHREAD_CREATE: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static DLCLOSE: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static DLOPEN: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static DLMOPEN: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static EXECVPE: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static FEXECVE: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static POSIX_SPAWN: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static POSIX_SPAWNP: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static EXECVE: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static EXIT: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static EXIT_UPPER: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static OWN_PTHREAD_CREATE: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

/// The next definition of `name` after this library, cached in `cache`.
/// Null if there is none.
fn next(cache: &AtomicPtr<c_void>, name: &[u8]) -> *mut c_void {
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

/// Resolves every dlsym'd function now (called from the constructor, so
/// later calls never run dlsym inside the program's code).
pub fn resolve_all() {
    resolve_allocator();
    resolve_mappings();
    let _ = next(&EXECVE, b"execve\0");
    let _ = next(&EXIT, b"_exit\0");
    let _ = next(&EXIT_UPPER, b"_Exit\0");
    let _ = own_pthread_create();
    let _ = pthread_create();
    let _ = posix_spawn();
    let _ = posix_spawnp();
    let _ = execvpe();
    let _ = fexecve();
    let _ = dlclose();
    let _ = dlopen();
    let _ = dlmopen();
}

pub fn dlclose() -> Option<Dlclose> {
    let p = next(&DLCLOSE, b"dlclose\0");
    // SAFETY: the symbol is glibc's dlclose, of this signature.
    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, Dlclose>(p) })
}

pub fn dlopen() -> Option<Dlopen> {
    let p = next(&DLOPEN, b"dlopen\0");
    // SAFETY: the symbol is glibc's dlopen, of this signature.
    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, Dlopen>(p) })
}

pub fn dlmopen() -> Option<Dlmopen> {
    let p = next(&DLMOPEN, b"dlmopen\0");
    // SAFETY: the symbol is glibc's dlmopen, of this signature.
    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, Dlmopen>(p) })
}

pub fn pthread_create() -> Option<PthreadCreate> {
    let p = next(&PTHREAD_CREATE, b"pthread_create\0");
    // SAFETY: the symbol is glibc's pthread_create, of this signature.
    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, PthreadCreate>(p) })
}

pub fn execvpe() -> Option<Execvpe> {
    let p = next(&EXECVPE, b"execvpe\0");
    // SAFETY: the symbol is glibc's execvpe, of this signature.
    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, Execvpe>(p) })
}

pub fn fexecve() -> Option<Fexecve> {
    let p = next(&FEXECVE, b"fexecve\0");
    // SAFETY: the symbol is glibc's fexecve, of this signature.
    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, Fexecve>(p) })
}

pub fn posix_spawn() -> Option<PosixSpawn> {
    let p = next(&POSIX_SPAWN, b"posix_spawn\0");
    // SAFETY: the symbol is glibc's posix_spawn, of this signature.
    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, PosixSpawn>(p) })
}

pub fn posix_spawnp() -> Option<PosixSpawn> {
    let p = next(&POSIX_SPAWNP, b"posix_spawnp\0");
    // SAFETY: the symbol is glibc's posix_spawnp, of the same signature.
    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, PosixSpawn>(p) })
}

/// glibc's pthread_create itself, for the shim's own threads (the writer's):
/// they are not the program's, so no interposer after the shim sees them.
/// The next one where glibc's cannot be found.
pub fn own_pthread_create() -> Option<PthreadCreate> {
    let mut p = libc_own(&OWN_PTHREAD_CREATE, b"pthread_create\0");
    if p.is_null() {
        p = next(&PTHREAD_CREATE, b"pthread_create\0");
    }
    // SAFETY: the symbol is pthread_create, of this signature.
    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, PthreadCreate>(p) })
}

extern "C" {
    fn gnu_get_libc_version() -> *const c_char;
    fn dladdr1(
        addr: *const c_void,
        info: *mut libc::Dl_info,
        extra: *mut *mut c_void,
        flags: c_int,
    ) -> c_int;
}

/// dladdr1's request for the object's link map (glibc's dlfcn.h).
const RTLD_DL_LINKMAP: c_int = 2;

// glibc's own definitions, found in libc.so.6's dynamic symbol table (its
// GNU hash table) without dlsym: dlsym on libc's link map needs a search
// list that ld.so builds only for dlopen'd objects, and dlopen itself is
// interposed (by the shim, and maybe by the next library). 64-bit ELF.

/// struct link_map's public head (glibc's link.h).
#[repr(C)]
struct LinkMap {
    l_addr: usize,
    l_name: *const c_char,
    l_ld: *const ElfDyn,
}

#[repr(C)]
struct ElfDyn {
    d_tag: i64,
    d_val: u64,
}

#[repr(C)]
struct ElfSym {
    st_name: u32,
    st_info: u8,
    st_other: u8,
    st_shndx: u16,
    st_value: u64,
    st_size: u64,
}

const DT_NULL: i64 = 0;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;

/// The GNU hash of a symbol name (without its NUL).
fn gnu_hash(name: &[u8]) -> u32 {
    name.iter().fold(5381u32, |h, &c| {
        h.wrapping_mul(33).wrapping_add(u32::from(c))
    })
}

/// Looks `name` (NUL-terminated) up in libc.so.6's dynamic symbol table: the
/// address of its default-version definition, or null.
fn libc_symbol(name: &[u8]) -> *mut c_void {
    // SAFETY: a zeroed Dl_info is valid; dladdr1 fills it and `map`.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    let mut map: *mut c_void = core::ptr::null_mut();
    // SAFETY: the address of a function of libc.so.6 (nobody interposes
    // gnu_get_libc_version), valid out-pointers.
    let found = unsafe {
        dladdr1(
            gnu_get_libc_version as *const c_void,
            &mut info,
            &mut map,
            RTLD_DL_LINKMAP,
        )
    };
    if found == 0 || map.is_null() {
        return core::ptr::null_mut();
    }
    // SAFETY: (1) dladdr1 returned libc's link map, whose head is LinkMap
    // and whose l_ld is its mapped dynamic section, ended by DT_NULL.
    // (2) The dynamic entries point into libc's mapped image (ld.so has
    // added the load address on most targets; where it has not, the value
    // is below it and we add it). (3) The GNU hash table's layout is the
    // ELF gABI extension's: nbuckets, symoffset, bloom size and shift, the
    // bloom words, the buckets, then one chain word per symbol from
    // symoffset, the last of each chain with bit 0 set; every index read is
    // one the table itself gives.
    unsafe {
        let map = &*(map as *const LinkMap);
        let base = map.l_addr;
        let at = |v: u64| -> usize {
            let v = v as usize;
            if v < base {
                v + base
            } else {
                v
            }
        };
        let (mut strtab, mut symtab, mut hash, mut versym) = (0, 0, 0, 0);
        let mut d = map.l_ld;
        while (*d).d_tag != DT_NULL {
            match (*d).d_tag {
                DT_STRTAB => strtab = at((*d).d_val),
                DT_SYMTAB => symtab = at((*d).d_val),
                DT_GNU_HASH => hash = at((*d).d_val),
                DT_VERSYM => versym = at((*d).d_val),
                _ => {}
            }
            d = d.add(1);
        }
        if strtab == 0 || symtab == 0 || hash == 0 {
            return core::ptr::null_mut();
        }
        let key = &name[..name.len() - 1];
        let h = gnu_hash(key);
        let words = hash as *const u32;
        let (nbuckets, symoffset, bloom_size) = (*words, *words.add(1), *words.add(2));
        if nbuckets == 0 {
            return core::ptr::null_mut();
        }
        let buckets = words.add(4 + 2 * bloom_size as usize);
        let chains = buckets.add(nbuckets as usize);
        let mut i = *buckets.add((h % nbuckets) as usize);
        if i < symoffset {
            return core::ptr::null_mut();
        }
        loop {
            let h2 = *chains.add((i - symoffset) as usize);
            if h | 1 == h2 | 1 {
                let sym = &*(symtab as *const ElfSym).add(i as usize);
                let sym_name =
                    core::ffi::CStr::from_ptr((strtab + sym.st_name as usize) as *const c_char);
                // 0x8000: a hidden (non-default) version.
                let default = versym == 0 || *(versym as *const u16).add(i as usize) & 0x8000 == 0;
                // STT_FUNC only (an IFUNC's value is its resolver).
                let function = sym.st_info & 0xf == 2;
                if sym_name.to_bytes() == key
                    && sym.st_shndx != 0
                    && sym.st_value != 0
                    && function
                    && default
                {
                    return (base + sym.st_value as usize) as *mut c_void;
                }
            }
            if h2 & 1 != 0 {
                return core::ptr::null_mut();
            }
            i += 1;
        }
    }
}

/// glibc's own definition of `name` (NUL-terminated), cached in `cache`,
/// never an interposer's: for the shim's own calls, which must not reach
/// the next library (it counts, fakes or filters the program's calls).
/// Null if libc has none.
pub fn libc_own(cache: &AtomicPtr<c_void>, name: &[u8]) -> *mut c_void {
    debug_assert_eq!(name.last(), Some(&0));
    let cached = cache.load(Ordering::Acquire);
    if !cached.is_null() {
        return cached;
    }
    let p = libc_symbol(name);
    cache.store(p, Ordering::Release);
    p
}

/// The next `_exit` (`upper`: `_Exit`), then the system call if it
/// returns or there is none: ends the process.
pub fn exit(upper: bool, status: c_int) -> ! {
    let p = if upper {
        next(&EXIT_UPPER, b"_Exit\0")
    } else {
        next(&EXIT, b"_exit\0")
    };
    if !p.is_null() {
        // SAFETY: the symbol is _exit or _Exit, of this signature.
        unsafe { core::mem::transmute::<*mut c_void, Exit>(p)(status) };
    }
    exit_group(status)
}

/// Writes `msg` to stderr in one write(2), without stdio.
pub fn write_stderr(msg: &[u8]) {
    // SAFETY: msg is a valid readable slice; a short or failed write only
    // loses the message.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
}

/// Ends the process, as glibc's _exit does.
pub fn exit_group(status: c_int) -> ! {
    loop {
        // SAFETY: exit_group has no preconditions and does not return.
        unsafe { libc::syscall(libc::SYS_exit_group, status) };
    }
}
