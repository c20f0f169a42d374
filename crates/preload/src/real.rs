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
//! This file holds the allocator, the exec, spawn, thread, dl and exit
//! functions; the mappings are in real_mappings.rs, glibc's own definitions
//! in libc_symbols.rs, the lookup of the next definition in
//! next_symbol.rs. Callers reach them all through `real::`.
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

use crate::next_symbol::{lookup, next, resolving, Next};

// The concerns split out of this file, under the names callers use.
pub use crate::libc_symbols::libc_own;
pub use crate::real_mappings::{
    next_mmap, next_mmap64, next_mremap, next_munmap, resolve_mappings, sys_mmap, sys_mremap,
};

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
