//! The calling thread's stack range, and the bounds-checked read every walk
//! uses.

use core::marker::PhantomData;

/// The address range `[lo, hi)` of one thread's stack.
///
/// Found once per thread, at thread set-up ([`StackBounds::current`]), and
/// passed to every capture of that thread. It is `!Send`: bounds describe
/// the thread that found them, and a walk trusts them to be mapped memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackBounds {
    lo: u64,
    hi: u64,
    /// Not Send, not Sync: one thread's bounds stay on that thread.
    _thread: PhantomData<*const ()>,
}

impl StackBounds {
    /// The calling thread's stack, from `pthread_getattr_np` and
    /// `pthread_attr_getstack`: for a thread made by `pthread_create`, its
    /// allocated stack; for the main thread, glibc reads `/proc/self/maps`
    /// and reports the `[stack]` mapping's top as `hi` and
    /// `hi - RLIMIT_STACK` (or the end of the mapping below, whichever is
    /// higher) as `lo`. Returns `None` when glibc cannot tell, or when the
    /// current stack pointer is not inside the range it reports (a
    /// `makecontext` or otherwise hand-made stack).
    ///
    /// Set-up only: it may allocate and open a file (main thread); never call
    /// it inside a capture or with the tracer's recursion guard off.
    pub fn current() -> Option<StackBounds> {
        // SAFETY: a zeroed pthread_attr_t is a valid out-parameter for
        // pthread_getattr_np, which initialises it on success; it is
        // destroyed exactly once, only after that success.
        let (lo, size) = unsafe {
            let mut attr: libc::pthread_attr_t = core::mem::zeroed();
            if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
                return None;
            }
            let mut addr: *mut libc::c_void = core::ptr::null_mut();
            let mut size: libc::size_t = 0;
            let rc = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
            libc::pthread_attr_destroy(&mut attr);
            if rc != 0 {
                return None;
            }
            (addr as u64, size as u64)
        };
        let hi = lo.checked_add(size)?;
        let sp = current_sp();
        if size == 0 || sp < lo || sp >= hi {
            return None;
        }
        Some(StackBounds {
            lo,
            hi,
            _thread: PhantomData,
        })
    }

    /// Bounds from raw addresses (a stack the caller manages itself: a
    /// coroutine, a signal stack).
    ///
    /// # Safety
    /// Every 8-byte-aligned address in `[lo, hi)` at or above the calling
    /// thread's stack pointer is readable for as long as these bounds are
    /// used, and the bounds are used on the thread running on that stack.
    pub const unsafe fn from_raw(lo: u64, hi: u64) -> StackBounds {
        StackBounds {
            lo,
            hi,
            _thread: PhantomData,
        }
    }

    /// The lowest address of the stack.
    pub const fn lo(&self) -> u64 {
        self.lo
    }

    /// One past the highest address of the stack.
    pub const fn hi(&self) -> u64 {
        self.hi
    }

    /// Whether `addr` is inside `[lo, hi)`.
    pub const fn contains(&self, addr: u64) -> bool {
        addr >= self.lo && addr < self.hi
    }

    /// The fence for a walk starting at stack pointer `sp`: `[max(lo, sp),
    /// hi)`. Every frame of the walk's callers lives at or above `sp`, so
    /// nothing below it is read (on the main thread that part of `[lo, hi)`
    /// may not be mapped yet). `None` when `sp` is not on this stack (a
    /// signal handler on `sigaltstack`): the walk then reads nothing.
    #[inline(always)]
    pub(crate) fn fence(&self, sp: u64) -> Option<Fence> {
        if !self.contains(sp) {
            return None;
        }
        Some(Fence {
            lo: sp,
            hi: self.hi,
        })
    }
}

/// The range a walk may read: every read is checked against it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fence {
    pub(crate) lo: u64,
    pub(crate) hi: u64,
}

impl Fence {
    /// Whether the 8 bytes at `addr` are inside the fence and `addr` is
    /// 8-byte aligned.
    #[inline(always)]
    pub(crate) fn can_read(&self, addr: u64) -> bool {
        addr & 7 == 0 && addr >= self.lo && addr < self.hi && self.hi - addr >= 8
    }

    /// The 8 bytes at `addr`, or `None` outside the fence or misaligned.
    // Must not allocate, lock or fault: runs inside the host's malloc.
    #[inline(always)]
    pub(crate) fn read(&self, addr: u64) -> Option<u64> {
        if !self.can_read(addr) {
            return None;
        }
        // SAFETY: `addr` is 8-byte aligned and inside [lo, hi) of the
        // calling thread's stack at or above its stack pointer, which
        // StackBounds' constructors guarantee to be mapped and readable.
        // Stack words change under us only by our own callers' frames,
        // which are suspended; a volatile read keeps the compiler honest.
        Some(unsafe { core::ptr::read_volatile(addr as *const u64) })
    }
}

/// The stack pointer of the caller (approximately: of this inlined code).
#[inline(always)]
pub(crate) fn current_sp() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        let sp: u64;
        // SAFETY: reads rsp into a register; touches no memory.
        unsafe {
            core::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags));
        }
        sp
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let probe = 0u8;
        core::ptr::addr_of!(probe) as u64
    }
}
