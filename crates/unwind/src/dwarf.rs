//! The DWARF CFI walk (framehop over the in-memory `.eh_frame_hdr` and
//! `.eh_frame` of every loaded object).

use core::ops::Deref;
use core::sync::atomic::{AtomicU64, Ordering};

use framehop::{
    CacheNative, ExplicitModuleSectionInfo, FrameAddress, Module, MustNotAllocateDuringUnwind,
    UnwindRegsNative, Unwinder, UnwinderNative,
};

use crate::bounds::{Fence, StackBounds};
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
    pub(crate) inner: UnwinderNative<MappedBytes, MustNotAllocateDuringUnwind>,
    /// Unique per unwinder built in this process: a [`WalkMemo`](crate::WalkMemo)
    /// made with another unwinder (other modules, other rules) is not reused.
    pub(crate) id: u64,
    modules: usize,
    /// Readable, executable segments `[start, end)` of every module, sorted:
    /// where a return address may be checked for the signal trampoline.
    code: Vec<(u64, u64)>,
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
        let mut code: Vec<(u64, u64)> = modules
            .modules()
            .iter()
            .flat_map(|m| m.segments.iter())
            .filter(|s| s.flags & PF_RX == PF_RX && s.start < s.end)
            .map(|s| (s.start, s.end))
            .collect();
        code.sort_unstable();
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
            let hdr_svma = m.eh_frame_hdr.wrapping_sub(m.bias);
            let eh_svma = m.eh_frame.wrapping_sub(m.bias);
            let info = ExplicitModuleSectionInfo {
                base_svma: 0,
                eh_frame_hdr_svma: Some(hdr_svma..hdr_svma.wrapping_add(m.eh_frame_hdr_len)),
                eh_frame_hdr: Some(hdr),
                eh_frame_svma: Some(eh_svma..eh_svma.wrapping_add(m.eh_frame_len)),
                eh_frame: Some(eh),
                ..Default::default()
            };
            let module = Module::new(m.path_lossy(), m.start..m.end, m.bias, info);
            inner.add_module(module);
            count += 1;
        }
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        DwarfUnwinder {
            inner,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            modules: count,
            code,
        }
    }

    /// Whether `ra` is the start of the x86_64 signal trampoline
    /// (`__restore_rt`: `mov $15, %rax; syscall`, the rt_sigreturn call the
    /// kernel makes a handler return to).
    // Must not allocate, lock or fault: runs inside malloc.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    pub(crate) fn is_sigreturn(&self, ra: u64) -> bool {
        const CODE: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
        let i = self.code.partition_point(|&(start, _)| start <= ra);
        let Some(&(_, end)) = i.checked_sub(1).and_then(|i| self.code.get(i)) else {
            return false;
        };
        if ra >= end || end - ra < CODE.len() as u64 {
            return false;
        }
        // SAFETY: [ra, ra + 9) lies inside a readable segment of a loaded
        // module (from_modules' contract keeps it mapped).
        let bytes = unsafe { core::ptr::read_unaligned(ra as *const [u8; 9]) };
        bytes == CODE
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
    pub(crate) inner: CacheNative<MustNotAllocateDuringUnwind>,
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

/// rip (the next instruction's address, in the calling function), rsp and
/// rbp, read where the macro is expanded.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
macro_rules! registers_here {
    () => {{
        let (ip, sp, bp): (u64, u64, u64);
        // SAFETY: copies rip, rsp and rbp into registers; touches no memory.
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
        (ip, sp, bp)
    }};
}
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) use registers_here;

/// `PF_R | PF_X`.
const PF_RX: u32 = 4 | 1;

/// One CFI unwinding step's outcome.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) enum Step {
    /// The frame's return address; `regs` and `frame` now describe its caller.
    Ret(u64),
    /// The end of the stack (an end-of-stack rule or a zero return address).
    End,
    /// No rule applied, a read failed, or the stack pointer did not go up.
    Fail,
}

/// Unwinds `frame` (with registers `regs`) by its CFI rule, or framehop's
/// frame-pointer fallback where it has none.
// Must not allocate, lock, make a system call or panic: runs inside malloc.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
pub(crate) fn cfi_step<F: FnMut(u64) -> Result<u64, ()>>(
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    regs: &mut UnwindRegsNative,
    frame: &mut FrameAddress,
    read_stack: &mut F,
) -> Step {
    let prev_sp = regs.sp();
    if let FrameAddress::ReturnAddress(ra) = *frame {
        if unwinder.is_sigreturn(ra.get()) {
            return signal_frame_step(regs, frame, read_stack);
        }
    }
    match unwinder
        .inner
        .unwind_frame(*frame, regs, &mut cache.inner, read_stack)
    {
        Ok(Some(ret)) => match FrameAddress::from_return_address(ret) {
            // A zero return address: the outermost frame.
            None => Step::End,
            // The caller's frame must lie above this one's.
            Some(_) if regs.sp() <= prev_sp => Step::Fail,
            Some(next) => {
                *frame = next;
                Step::Ret(ret)
            }
        },
        Ok(None) => Step::End,
        Err(_) => Step::Fail,
    }
}

/// Offset of `uc_mcontext.gregs` in the x86_64 `ucontext_t`: uc_flags (8),
/// uc_link (8), uc_stack (24); then the registers (`REG_RBP` = 10,
/// `REG_RSP` = 15, `REG_RIP` = 16), 8 bytes each.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) const UC_GREGS: u64 = 40;

/// Unwinds a signal frame: `frame` is the signal trampoline a handler
/// returned to, `regs.sp()` points at the `ucontext_t` the kernel saved
/// (the `rt_sigframe` after its return-address word). The interrupted
/// code's rip, rsp and rbp come from its `uc_mcontext.gregs`; rip is an
/// instruction pointer, not a return address (it is unwound as the first
/// frame of a walk is). framehop cannot apply the trampoline's CFI
/// expression, and its frame-pointer fallback would silently skip the
/// interrupted frames.
// Must not allocate, lock or panic: runs inside malloc (reads via the fence).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn signal_frame_step<F: FnMut(u64) -> Result<u64, ()>>(
    regs: &mut UnwindRegsNative,
    frame: &mut FrameAddress,
    read_stack: &mut F,
) -> Step {
    let uc = regs.sp();
    let reg = |i: u64, read_stack: &mut F| read_stack(uc.wrapping_add(UC_GREGS + 8 * i));
    let (Ok(bp), Ok(sp), Ok(ip)) = (
        reg(libc::REG_RBP as u64, read_stack),
        reg(libc::REG_RSP as u64, read_stack),
        reg(libc::REG_RIP as u64, read_stack),
    ) else {
        return Step::Fail;
    };
    if sp <= uc || ip == 0 {
        return Step::Fail;
    }
    *regs = UnwindRegsNative::new(ip, sp, bp);
    *frame = FrameAddress::from_instruction_pointer(ip);
    Step::Ret(ip)
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
        let (ip, sp, bp) = registers_here!();
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
            let ret = match cfi_step(unwinder, cache, &mut regs, &mut frame, &mut read_stack) {
                Step::Ret(ret) => ret,
                Step::End => {
                    return Walk {
                        len: n,
                        truncated: false,
                    }
                }
                Step::Fail => {
                    return Walk {
                        len: n,
                        truncated: true,
                    }
                }
            };
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

/// The fast mode for callers built without frame pointers: unwinds the
/// capture's own frame and the `skip` frames above it by CFI (the tracer's
/// own frames: their rules stay in `cache`, so each costs one cache hit),
/// then follows frame pointers from the rbp that CFI recovered for the
/// first kept frame.
///
/// This is what makes the frame-pointer walk usable from optimised Rust: a
/// function compiled without frame pointers may hold anything in rbp while
/// it runs, so [`capture_fp`](crate::capture_fp) called from such code (a
/// malloc wrapper in a release build) stops after one frame. Here CFI
/// restores the rbp of the first kept frame (the traced program's
/// allocating function), which the caller's own frames saved. From there
/// the walk is the frame-pointer walk, with its limits: it stops at, or
/// skips past, frames without frame pointers.
///
/// Conventions as [`capture_dwarf`]: `out[0]` is the return address the
/// walk keeps first (the `skip`-th above the caller's), `out.len()` is the
/// depth limit, `truncated` as there. Must not allocate, lock, make a
/// system call, panic or fault: it runs inside the host's malloc. On
/// targets other than x86_64 Linux it returns an empty, truncated walk.
#[inline(never)]
pub fn capture_mixed(
    skip: usize,
    bounds: &StackBounds,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    out: &mut [u64],
) -> Walk {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let (ip, sp, bp) = registers_here!();
        let Some(fence) = bounds.fence(sp) else {
            return Walk {
                len: 0,
                truncated: true,
            };
        };
        let mut read_stack = |addr: u64| fence.read(addr).ok_or(());
        let mut regs = UnwindRegsNative::new(ip, sp, bp);
        let mut frame = FrameAddress::from_instruction_pointer(ip);
        // CFI until the first kept return address.
        let mut skip = skip;
        let first = loop {
            match cfi_step(unwinder, cache, &mut regs, &mut frame, &mut read_stack) {
                Step::Ret(ret) if skip == 0 => break ret,
                Step::Ret(_) => skip -= 1,
                Step::End => {
                    return Walk {
                        len: 0,
                        truncated: false,
                    }
                }
                Step::Fail => {
                    return Walk {
                        len: 0,
                        truncated: true,
                    }
                }
            }
        };
        let Some(slot) = out.first_mut() else {
            return Walk {
                len: 0,
                truncated: true,
            };
        };
        *slot = first;
        // Frame pointers from the kept frame's rbp; its record cannot lie
        // below its stack pointer.
        let fence = Fence {
            lo: regs.sp().max(fence.lo),
            hi: fence.hi,
        };
        let rest = &mut out[1..];
        let w = crate::fp::walk(regs.bp(), fence, 0, rest.as_mut_ptr(), rest.len());
        Walk {
            len: 1 + w.len,
            truncated: w.truncated,
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
