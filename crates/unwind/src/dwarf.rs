//! The DWARF CFI walk (framehop over the in-memory `.eh_frame_hdr` and
//! `.eh_frame` of every loaded object).

use core::ops::Deref;

use framehop::{
    CacheNative, ExplicitModuleSectionInfo, FrameAddress, Module, MustNotAllocateDuringUnwind,
    UnwindRegsNative, Unwinder, UnwinderNative,
};

use crate::bounds::StackBounds;
use crate::modules::Modules;
use crate::Walk;

/// A range of a loaded object's memory (an unwind section), read in place.
#[derive(Clone, Copy, Debug)]
pub struct MappedBytes {
    ptr: *const u8,
    len: usize,
}

// SAFETY: MappedBytes is a read-only view of a loaded object's unwind
// section; reading it from any thread is as safe as from the one that made
// it (DwarfUnwinder::from_modules' contract keeps it mapped).
unsafe impl Send for MappedBytes {}
// SAFETY: as for Send: shared read-only memory.
unsafe impl Sync for MappedBytes {}

impl Default for MappedBytes {
    /// An empty view.
    fn default() -> Self {
        MappedBytes {
            ptr: core::ptr::NonNull::<u8>::dangling().as_ptr(),
            len: 0,
        }
    }
}

impl Deref for MappedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr/len describe a section of a loaded object, mapped
        // readable while the unwinder that owns this view is in use
        // (DwarfUnwinder::from_modules' contract).
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// The unwind tables of a [`Modules`] snapshot, ready for [`capture_dwarf`].
///
/// Built at set-up from a snapshot (it allocates: framehop's module list);
/// shared read-only by every thread's captures (`&DwarfUnwinder`). Rebuilt
/// with the snapshot after each `dlopen`/`dlclose`.
pub struct DwarfUnwinder {
    inner: UnwinderNative<MappedBytes, MustNotAllocateDuringUnwind>,
    modules: usize,
}

impl DwarfUnwinder {
    /// Registers every module of `modules` that has an `.eh_frame_hdr` and
    /// `.eh_frame`; a module without them is unwound by frame pointer.
    ///
    /// # Safety
    /// Every object in `modules` stays loaded (its unwind sections mapped)
    /// for as long as this unwinder is used: a dlclose wrapper must swap in
    /// an unwinder built without the object before any capture can run
    /// after the object is unmapped (in practice: rebuild after dlclose,
    /// and keep captures from using the old one once a new library can be
    /// mapped at the old one's address).
    pub unsafe fn from_modules(modules: &Modules) -> DwarfUnwinder {
        let mut inner = UnwinderNative::new();
        let mut count = 0;
        for m in modules.modules() {
            if m.eh_frame_hdr == 0 || m.eh_frame == 0 {
                continue;
            }
            let hdr = MappedBytes {
                ptr: m.eh_frame_hdr as *const u8,
                len: m.eh_frame_hdr_len as usize,
            };
            let eh = MappedBytes {
                ptr: m.eh_frame as *const u8,
                len: m.eh_frame_len as usize,
            };
            // Section addresses as the object states them (the load bias
            // taken off): framehop resolves the header's pc- and
            // data-relative pointers against them.
            let hdr_svma = m.eh_frame_hdr - m.bias;
            let eh_svma = m.eh_frame - m.bias;
            let info = ExplicitModuleSectionInfo {
                base_svma: 0,
                eh_frame_hdr_svma: Some(hdr_svma..hdr_svma + m.eh_frame_hdr_len),
                eh_frame_hdr: Some(hdr),
                eh_frame_svma: Some(eh_svma..eh_svma + m.eh_frame_len),
                eh_frame: Some(eh),
                ..Default::default()
            };
            let module = Module::new(m.path_lossy(), m.start..m.end, m.bias, info);
            inner.add_module(module);
            count += 1;
        }
        DwarfUnwinder {
            inner,
            modules: count,
        }
    }

    /// How many modules have unwind tables registered.
    pub fn module_count(&self) -> usize {
        self.modules
    }
}

/// One thread's unwind cache: framehop's rule cache (509 slots keyed by
/// address) and its fixed-size DWARF evaluation storage
/// (`MustNotAllocateDuringUnwind`). Allocated at thread set-up, owned by
/// the thread, passed `&mut` to each capture.
pub struct DwarfCache {
    inner: CacheNative<MustNotAllocateDuringUnwind>,
}

impl DwarfCache {
    /// A new, empty cache (allocates; set-up only).
    pub fn new() -> DwarfCache {
        DwarfCache {
            inner: CacheNative::new_in(),
        }
    }

    /// Rule-cache statistics: (hits, misses).
    pub fn hits_and_misses(&self) -> (u64, u64) {
        let s = self.inner.stats();
        (s.hits(), s.misses())
    }
}

impl Default for DwarfCache {
    fn default() -> Self {
        Self::new()
    }
}

/// Captures the calling thread's return addresses by DWARF CFI, innermost
/// first, into `out`; returns how many it wrote and whether the walk
/// stopped before the end of the stack.
///
/// Same conventions as [`capture_fp`](crate::capture_fp): `out[0]` is the
/// return address into the direct caller, `skip` drops that many first,
/// `out.len()` is the depth limit. Each frame is unwound by its module's
/// `.eh_frame` rule (cached per address in `cache`); where no rule exists
/// (no module, no FDE: JIT code, a hand-written stub) framehop falls back to
/// the frame pointer. Stack memory is read only through a closure that
/// checks each address against `bounds` (from the current stack pointer up)
/// and 8-byte alignment; a failed read, a rule framehop cannot apply, or a
/// frame that does not move the stack pointer up ends the walk, truncated.
/// The end of the stack (a CFI rule marking the outermost frame, or a zero
/// return address) ends it untruncated.
///
/// Must not allocate, lock, make a system call, panic or fault: it runs
/// inside the host's malloc. On targets other than x86_64 Linux it returns
/// an empty, truncated walk.
#[inline(never)]
pub fn capture_dwarf(
    skip: usize,
    bounds: &StackBounds,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    out: &mut [u64],
) -> Walk {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let (ip, sp, bp): (u64, u64, u64);
        // SAFETY: copies rip (the address of the next instruction, still in
        // this function), rsp and rbp into registers; touches no memory.
        unsafe {
            core::arch::asm!(
                "lea {ip}, [rip]",
                "mov {sp}, rsp",
                "mov {bp}, rbp",
                ip = out(reg) ip,
                sp = out(reg) sp,
                bp = out(reg) bp,
                options(nomem, nostack, preserves_flags),
            );
        }
        let Some(fence) = bounds.fence(sp) else {
            return Walk {
                len: 0,
                truncated: true,
            };
        };
        let mut read_stack = |addr: u64| fence.read(addr).ok_or(());
        let mut regs = UnwindRegsNative::new(ip, sp, bp);
        let mut frame = FrameAddress::from_instruction_pointer(ip);
        let mut skip = skip;
        let mut n = 0usize;
        loop {
            let prev_sp = regs.sp();
            let ret = match unwinder.inner.unwind_frame(
                frame,
                &mut regs,
                &mut cache.inner,
                &mut read_stack,
            ) {
                Ok(Some(ret)) => ret,
                Ok(None) => {
                    return Walk {
                        len: n,
                        truncated: false,
                    }
                }
                Err(_) => {
                    return Walk {
                        len: n,
                        truncated: true,
                    }
                }
            };
            let Some(next) = FrameAddress::from_return_address(ret) else {
                // A zero return address: the outermost frame.
                return Walk {
                    len: n,
                    truncated: false,
                };
            };
            if regs.sp() <= prev_sp {
                // The caller's frame must lie above this one's.
                return Walk {
                    len: n,
                    truncated: true,
                };
            }
            if skip > 0 {
                skip -= 1;
            } else {
                let Some(slot) = out.get_mut(n) else {
                    return Walk {
                        len: n,
                        truncated: true,
                    };
                };
                *slot = ret;
                n += 1;
            }
            frame = next;
        }
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let _ = (skip, bounds, unwinder, cache, out);
        Walk {
            len: 0,
            truncated: true,
        }
    }
}
