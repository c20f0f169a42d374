//! Process-wide tables in memory of their own: regions reserved once, on
//! first use, with one anonymous mapping each, and an arena of byte strings
//! in such a region.
//!
//! The type table, the call-stack table and the frame table live here
//! rather than on the heap: they are filled from inside the host's malloc
//! (a runtime registers a type or a stack in its allocator, the shim
//! interns a stack in `malloc`), so they must never call malloc nor take a
//! lock. A region is reserved with MAP_NORESERVE: only the pages a table
//! touches take memory.
//!
//! ## Invariants
//!
//! 1. A region is mapped at most once and never unmapped: a pointer into it
//!    stays valid for the life of the process (tables outlive sessions; IDs
//!    handed out stay meaningful).
//! 2. Whoever maps publishes the base with a Release store of the state;
//!    every user loads the state with Acquire before the base. Otherwise a
//!    thread could see "mapped" and a null base.

use core::ptr;
use core::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering};

const UNMAPPED: u8 = 0;
const MAPPING: u8 = 1;
const MAPPED: u8 = 2;
const REFUSED: u8 = 3;

/// `LEN` bytes of zeroed memory, mapped on first use.
pub(crate) struct Region<const LEN: usize> {
    base: AtomicPtr<u8>,
    state: AtomicU8,
}

impl<const LEN: usize> Region<LEN> {
    pub(crate) const fn new() -> Self {
        Region {
            base: AtomicPtr::new(ptr::null_mut()),
            state: AtomicU8::new(UNMAPPED),
        }
    }

    /// The region's base, mapping it on the first call; `None` if the
    /// kernel refused (then for good: a table that cannot be mapped stays
    /// empty, and its users count what they could not record).
    ///
    /// The first call makes a syscall; a thread that finds another one
    /// mapping waits for it (yields), which happens once per process.
    pub(crate) fn base(&self) -> Option<*mut u8> {
        loop {
            match self.state.load(Ordering::Acquire) {
                MAPPED => return Some(self.base.load(Ordering::Relaxed)),
                REFUSED => return None,
                UNMAPPED => {
                    if self
                        .state
                        .compare_exchange(UNMAPPED, MAPPING, Ordering::Acquire, Ordering::Acquire)
                        .is_err()
                    {
                        continue;
                    }
                    let p = map_reserved(LEN);
                    if p.is_null() {
                        self.state.store(REFUSED, Ordering::Release);
                        return None;
                    }
                    self.base.store(p, Ordering::Relaxed);
                    self.state.store(MAPPED, Ordering::Release);
                    return Some(p);
                }
                _ => std::thread::yield_now(),
            }
        }
    }

    /// The base if the region is mapped, without mapping it.
    pub(crate) fn base_if_mapped(&self) -> Option<*mut u8> {
        (self.state.load(Ordering::Acquire) == MAPPED).then(|| self.base.load(Ordering::Relaxed))
    }
}

/// Maps `len` bytes, reserved (`MAP_NORESERVE`), zeroed; null when the
/// kernel refuses. A raw system call, as the buffers' (buffer.rs): an
/// interposer of mmap (the LD_PRELOAD shim) must not see the tracer's own
/// memory, which may be mapped inside the program's malloc. errno is kept.
pub(crate) fn map_reserved(len: usize) -> *mut u8 {
    #[cfg(miri)]
    // SAFETY: an anonymous private mapping with no hint has no
    // preconditions. Miri interprets libc's mmap, not the raw syscall, and
    // maps only MAP_PRIVATE | MAP_ANONYMOUS.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    #[cfg(not(miri))]
    let p = {
        // SAFETY: __errno_location always returns this thread's errno.
        let errno = unsafe { *libc::__errno_location() };
        // SAFETY: as above; the raw call returns the address or -errno.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mmap,
                ptr::null_mut::<libc::c_void>(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1 as libc::c_int,
                0 as libc::off_t,
            )
        };
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = errno };
        if r == -1 {
            libc::MAP_FAILED
        } else {
            r as *mut libc::c_void
        }
    };
    if p == libc::MAP_FAILED {
        ptr::null_mut()
    } else {
        p.cast()
    }
}

/// Where an arena put a string: `len` bytes at `offset`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

/// An append-only arena of byte strings in a region of `LEN` bytes.
pub(crate) struct Arena<const LEN: usize> {
    region: Region<LEN>,
    next: AtomicUsize,
}

impl<const LEN: usize> Arena<LEN> {
    pub(crate) const fn new() -> Self {
        Arena {
            region: Region::new(),
            next: AtomicUsize::new(0),
        }
    }

    /// Copies `bytes` in. Out of room (or unmappable), the string is kept
    /// empty: the caller keeps its entry, without the name.
    pub(crate) fn push(&self, bytes: &[u8]) -> Span {
        let Some(base) = self.region.base() else {
            return Span::default();
        };
        let offset = self.next.fetch_add(bytes.len(), Ordering::Relaxed);
        if offset > LEN || bytes.len() > LEN - offset {
            return Span::default();
        }
        // SAFETY: offset + len <= LEN is inside the region (invariant 1),
        // and fetch_add gave this call those bytes alone.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(offset), bytes.len()) };
        Span {
            offset,
            len: bytes.len(),
        }
    }

    /// The string at `span`, as [`Arena::push`] returned it. The caller
    /// reads it only after the push is published to it (a Release store
    /// of the entry holding the span, loaded with Acquire).
    pub(crate) fn get(&self, span: Span) -> &[u8] {
        match self.region.base_if_mapped() {
            // SAFETY: a span from push lies inside the region, whose bytes
            // were written before the span was published, and never change.
            Some(base) if span.len > 0 => unsafe {
                core::slice::from_raw_parts(base.add(span.offset), span.len)
            },
            _ => &[],
        }
    }
}

/// Unmaps `len` bytes at `p`, mapped by [`map_reserved`], with a raw
/// system call (as `map_reserved`); errno is kept. The caller guarantees
/// nothing uses the memory any more.
pub(crate) fn unmap(p: *mut u8, len: usize) {
    #[cfg(miri)]
    // SAFETY: the caller's contract: a mapping of ours, unused.
    unsafe {
        libc::munmap(p.cast(), len);
    }
    #[cfg(not(miri))]
    {
        // SAFETY: __errno_location always returns this thread's errno.
        let errno = unsafe { *libc::__errno_location() };
        // SAFETY: the caller's contract: a mapping of ours, unused.
        unsafe { libc::syscall(libc::SYS_munmap, p.cast::<libc::c_void>(), len) };
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = errno };
    }
}

/// Gives the pages of `len` bytes at `p`, mapped by [`map_reserved`], back
/// to the kernel: they read as zero again, and cost nothing until touched.
/// Another thread may read or write them meanwhile (its accesses see the
/// old bytes or zeros). A raw system call (as `map_reserved`); errno is kept.
pub(crate) fn discard(p: *mut u8, len: usize) {
    #[cfg(miri)]
    // SAFETY: the caller's contract: a mapping of ours.
    unsafe {
        libc::madvise(p.cast(), len, libc::MADV_DONTNEED);
    }
    #[cfg(not(miri))]
    {
        // SAFETY: __errno_location always returns this thread's errno.
        let errno = unsafe { *libc::__errno_location() };
        // SAFETY: the caller's contract: a private anonymous mapping of
        // ours, which MADV_DONTNEED refills with zeros.
        unsafe {
            libc::syscall(
                libc::SYS_madvise,
                p.cast::<libc::c_void>(),
                len,
                libc::MADV_DONTNEED,
            )
        };
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = errno };
    }
}
