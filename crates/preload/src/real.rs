//! The real functions behind the interposed ones, reached without calling
//! any symbol this library exports (which would recurse into the shim):
//!
//! - the allocator through glibc's `__libc_*` entry points, which need no
//!   dlsym and work before the constructor runs;
//! - mmap, munmap, mremap and execve as raw system calls, which is all
//!   glibc's versions are on Linux;
//! - pthread_create, execvpe and fexecve through `dlsym(RTLD_NEXT)`, made
//!   in the shim's own state so dlsym's calloc passes through untraced.

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicPtr, Ordering};

extern "C" {
    pub fn __libc_malloc(size: usize) -> *mut c_void;
    pub fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    pub fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    pub fn __libc_free(p: *mut c_void);
    pub fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
    pub fn __libc_valloc(size: usize) -> *mut c_void;
    pub fn __libc_pvalloc(size: usize) -> *mut c_void;
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

/// mmap(2). Returns MAP_FAILED with errno set on failure, as glibc does.
///
/// # Safety
/// As mmap(2).
#[inline]
pub unsafe fn mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64) -> *mut c_void {
    // SAFETY: the caller's arguments go to the kernel unchanged; syscall()
    // maps -errno results to -1 (MAP_FAILED) with errno set.
    unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void }
}

/// munmap(2).
///
/// # Safety
/// As munmap(2).
#[inline]
pub unsafe fn munmap(addr: *mut c_void, len: usize) -> c_int {
    // SAFETY: as mmap above.
    unsafe { libc::syscall(libc::SYS_munmap, addr, len) as c_int }
}

/// mremap(2); `new_addr` is read by the kernel only with MREMAP_FIXED.
///
/// # Safety
/// As mremap(2).
#[inline]
pub unsafe fn mremap(old: *mut c_void, old_len: usize, new_len: usize, flags: c_int, new_addr: *mut c_void) -> *mut c_void {
    // SAFETY: as mmap above.
    unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) as *mut c_void }
}

/// execve(2). Returns only on failure (-1, errno set).
///
/// # Safety
/// As execve(2).
pub unsafe fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    // SAFETY: as mmap above.
    unsafe { libc::syscall(libc::SYS_execve, path, argv, envp) as c_int }
}

pub type PthreadCreate = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    extern "C" fn(*mut c_void) -> *mut c_void,
    *mut c_void,
) -> c_int;
pub type Execvpe = unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
pub type Fexecve = unsafe extern "C" fn(c_int, *const *const c_char, *const *const c_char) -> c_int;

static PTHREAD_CREATE: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static EXECVPE: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static FEXECVE: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

/// The next definition of `name` after this library, cached in `cache`.
/// Null if there is none.
fn next(cache: &AtomicPtr<c_void>, name: &[u8]) -> *mut c_void {
    debug_assert_eq!(name.last(), Some(&0));
    let cached = cache.load(Ordering::Acquire);
    if !cached.is_null() {
        return cached;
    }
    // dlsym may calloc (error state) and takes ld.so's lock: do it as our
    // own code so the calloc passes straight to glibc. Two threads racing
    // here store the same pointer.
    // SAFETY: RTLD_NEXT with a valid NUL-terminated name.
    let p = crate::guard::own(|| unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) });
    cache.store(p, Ordering::Release);
    p
}

/// Resolves every dlsym'd function now (called from the constructor, so
/// later calls never run dlsym inside the program's code).
pub fn resolve_all() {
    let _ = pthread_create();
    let _ = execvpe();
    let _ = fexecve();
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
