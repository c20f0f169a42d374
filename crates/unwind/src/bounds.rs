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

    /// The calling thread's stack found without malloc, locks or stdio:
    /// the mapping of `/proc/self/maps` that holds the current stack
    /// pointer and is readable, read with raw `open`/`read`/`close` into a
    /// 4 KiB buffer on the stack and parsed by hand. `hi` is the mapping's
    /// end. `lo` is its start, except for the main thread's stack (the
    /// mapping named `[stack]`, which the kernel grows down on demand):
    /// there `lo` is where it may grow to, `hi - RLIMIT_STACK` or the end of
    /// the mapping below, whichever is higher (glibc's computation), so that
    /// a later, deeper capture is still inside the bounds. Returns `None`
    /// when the file cannot be read or no such mapping is found. `errno` is
    /// left as it was.
    ///
    /// Why: the C API's first capture on a thread the host did not
    /// describe may run inside the host's malloc, where [`current`]
    /// (`pthread_getattr_np`, which mallocs, and for the main thread
    /// `fopen`s the maps) must not be called. This makes system calls
    /// (open, read, close, and getrlimit on the main thread): once per
    /// thread, at its first capture, never per capture.
    ///
    /// Compared with [`current`]: on a `pthread_create` thread the mapping
    /// is the thread's stack block above its guard page, the same range
    /// (unless the kernel merged it with an adjacent mapping of the same
    /// permissions, which only widens `hi` over mapped memory). On the main
    /// thread `hi` is the `[stack]` mapping's end, above glibc's (which
    /// stops at the page above `__libc_stack_end`; the arguments,
    /// environment and auxiliary vector lie between); both are mapped.
    ///
    /// [`current`]: StackBounds::current
    pub fn from_maps() -> Option<StackBounds> {
        #[cfg(target_os = "linux")]
        {
            let sp = current_sp();
            // SAFETY: __errno_location returns the calling thread's errno,
            // valid for the thread's lifetime.
            let errno = unsafe { *libc::__errno_location() };
            let found = maps::stack_mapping(sp);
            // SAFETY: as above.
            unsafe { *libc::__errno_location() = errno };
            let m = found?;
            let lo = if m.grows_down {
                let mut rl = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                // SAFETY: getrlimit writes the rlimit it is given.
                let rc = unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut rl) };
                // SAFETY: as above.
                unsafe { *libc::__errno_location() = errno };
                let limit = if rc == 0 { rl.rlim_cur } else { 0 };
                let by_limit = if limit == libc::RLIM_INFINITY {
                    0
                } else {
                    (m.end.saturating_sub(limit)) & !0xfff
                };
                by_limit.max(m.below_end).min(m.start)
            } else {
                m.start
            };
            if !(lo <= sp && sp < m.end) {
                return None;
            }
            Some(StackBounds {
                lo,
                hi: m.end,
                _thread: PhantomData,
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            None
        }
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

/// Reading `/proc/self/maps` without malloc, locks or stdio.
#[cfg(target_os = "linux")]
mod maps {
    /// The mapping that holds the stack pointer.
    pub(super) struct Mapping {
        pub(super) start: u64,
        pub(super) end: u64,
        /// The end of the mapping listed before it (0 for the first).
        pub(super) below_end: u64,
        /// It is the main thread's `[stack]`.
        pub(super) grows_down: bool,
    }

    /// The readable mapping of `/proc/self/maps` that contains `sp`.
    // No malloc, no lock, no stdio: raw system calls and a stack buffer.
    pub(super) fn stack_mapping(sp: u64) -> Option<Mapping> {
        // SAFETY: a NUL-terminated path; the descriptor is closed below.
        let fd = unsafe {
            libc::open(
                c"/proc/self/maps".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return None;
        }
        let mut scan = Scan::new(sp);
        let mut buf = [0u8; 4096];
        let found = loop {
            // SAFETY: buf is valid for buf.len() bytes of writes.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                // SAFETY: reads the calling thread's errno.
                if unsafe { *libc::__errno_location() } == libc::EINTR {
                    continue;
                }
                break None;
            }
            let Some(bytes) = buf.get(..n as usize) else {
                break None;
            };
            if bytes.is_empty() {
                break None;
            }
            if let Some(m) = scan.feed(bytes) {
                break Some(m);
            }
        };
        // SAFETY: fd was opened above and is closed once.
        unsafe { libc::close(fd) };
        found
    }

    /// A line-by-line parser of the maps fed in pieces of any size (a line
    /// may straddle two reads): `start-end perms offset dev inode path`.
    pub(super) struct Scan {
        sp: u64,
        start: u64,
        end: u64,
        /// 0: start, 1: end, 2: the permissions' first letter, 3: the rest.
        field: u8,
        digits: u8,
        /// The line is well formed so far.
        ok: bool,
        readable: bool,
        /// The line's last 8 bytes (for its path's end).
        tail: u64,
        /// The end of the previous well-formed line's mapping.
        prev_end: u64,
    }

    /// `[stack]`, as the last 7 bytes of `tail`.
    const STACK: u64 = u64::from_be_bytes(*b"\0[stack]");
    const LOW_7_BYTES: u64 = (1 << 56) - 1;

    impl Scan {
        pub(super) fn new(sp: u64) -> Scan {
            Scan {
                sp,
                start: 0,
                end: 0,
                field: 0,
                digits: 0,
                ok: true,
                readable: false,
                tail: 0,
                prev_end: 0,
            }
        }

        /// Parses `bytes`; the mapping that holds `sp`, once its line is
        /// complete.
        pub(super) fn feed(&mut self, bytes: &[u8]) -> Option<Mapping> {
            for &b in bytes {
                if b == b'\n' {
                    if self.ok && self.field == 3 {
                        if self.readable && self.start <= self.sp && self.sp < self.end {
                            return Some(Mapping {
                                start: self.start,
                                end: self.end,
                                below_end: self.prev_end,
                                grows_down: self.tail & LOW_7_BYTES == STACK,
                            });
                        }
                        self.prev_end = self.end;
                    }
                    *self = Scan {
                        prev_end: self.prev_end,
                        ..Scan::new(self.sp)
                    };
                    continue;
                }
                if !self.ok {
                    continue;
                }
                match self.field {
                    0 | 1 => {
                        let digit = match b {
                            b'0'..=b'9' => Some(b - b'0'),
                            b'a'..=b'f' => Some(b - b'a' + 10),
                            _ => None,
                        };
                        match (digit, b, self.field) {
                            (Some(d), _, _) if self.digits < 16 => {
                                let v = if self.field == 0 {
                                    &mut self.start
                                } else {
                                    &mut self.end
                                };
                                *v = *v << 4 | u64::from(d);
                                self.digits += 1;
                            }
                            (None, b'-', 0) | (None, b' ', 1) if self.digits > 0 => {
                                self.field += 1;
                                self.digits = 0;
                            }
                            _ => self.ok = false,
                        }
                    }
                    2 => {
                        self.readable = b == b'r';
                        self.field = 3;
                    }
                    _ => self.tail = self.tail << 8 | u64::from(b),
                }
            }
            None
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        const MAPS: &str = "\
55d0c0a00000-55d0c0a21000 r--p 00000000 08:01 1234                       /usr/bin/x
7ffd1000-7ffd2000 ---p 00000000 00:00 0
7ffd2000-7ffd9000 rw-p 00000000 00:00 0
garbage line with 7ffd9000-7ffda000
7ffda000-7ffdf000 rw-p 00000000 00:00 0                          [stack]
7ffdf000-7ffe0000 r-xp 00000000 00:00 0                          [vdso]
";

        fn scan(sp: u64, piece: usize) -> Option<(u64, u64, u64, bool)> {
            let mut s = Scan::new(sp);
            MAPS.as_bytes()
                .chunks(piece)
                .find_map(|c| s.feed(c))
                .map(|m| (m.start, m.end, m.below_end, m.grows_down))
        }

        #[test]
        fn finds_the_mapping_in_pieces_of_any_size() {
            for piece in [1, 2, 3, 7, 64, 4096] {
                assert_eq!(
                    scan(0x7ffd3000, piece),
                    Some((0x7ffd2000, 0x7ffd9000, 0x7ffd2000, false))
                );
                assert_eq!(
                    scan(0x7ffdeff8, piece),
                    Some((0x7ffda000, 0x7ffdf000, 0x7ffd9000, true))
                );
                // Not readable, in no mapping, in the garbage line's range.
                assert_eq!(scan(0x7ffd1008, piece), None);
                assert_eq!(scan(0x1000, piece), None);
                assert_eq!(scan(0x7ffd9008, piece), None);
                // The end is exclusive.
                assert_eq!(scan(0x7ffd9000, piece), None);
            }
        }
    }
}
