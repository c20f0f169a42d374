//! Walks that start in the program's own frame: the shim's malloc entry
//! points hand over the caller's return address, stack pointer and frame
//! pointer ([`StartRegs`]), so no frame of the tracer is ever walked.

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
use crate::bounds::Fence;
use crate::bounds::StackBounds;
use crate::dwarf::{DwarfCache, DwarfUnwinder};
use crate::memo::{MemoWalk, WalkMemo};
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
use crate::step::{step, Mode, Rec, Regs, Step};
use crate::Walk;

/// Where a walk starts: the traced program's frame as a naked entry point
/// saw it on entry, before it pushed anything.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StartRegs {
    /// The return address into the program (`[rsp]` at the entry): the
    /// first address of the stack.
    pub ra: u64,
    /// The program's stack pointer once that return is taken (`rsp + 8`
    /// at the entry).
    pub sp: u64,
    /// rbp at the entry: the program's, which the entry does not touch.
    pub bp: u64,
}

const LOST: MemoWalk = MemoWalk {
    len: 0,
    truncated: true,
    shared: 0,
};

/// Captures the stack that starts at `start`, innermost first, into `out`:
/// `out[0]` is `start.ra`, then its callers. `out.len()` is the depth
/// limit; `len` and `truncated` as [`Walk`]; `shared` as [`MemoWalk`] (the
/// outermost frames proven to be the previous capture's of this memo).
///
/// The walk steps by the compact tables (framehop where they do not
/// apply, the ucontext for signal frames) until its state equals a frame
/// of `memo`'s previous walk, then re-reads the words that walk's steps
/// read from there on and takes its frames while they hold. The result is
/// exactly [`capture_from_compact`]'s (and [`capture_from_framehop`]'s).
///
/// Must not allocate, lock, make a system call, panic or fault: it runs
/// inside the host's malloc. On targets other than x86_64 Linux it returns
/// an empty, truncated walk.
#[inline(never)]
pub fn capture_from(
    start: StartRegs,
    bounds: &StackBounds,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    memo: &mut WalkMemo,
    out: &mut [u64],
) -> MemoWalk {
    from_memo::<false>(start, bounds, unwinder, cache, memo, out)
}

/// [`capture_from`] that may leave the outermost addresses it takes from
/// the memo unwritten: `memo.unfilled()` of them, the outermost of
/// `out[..len]` ([`WalkMemo::outermost`] is the last). A caller that
/// interns only the frames not shared with the previous capture reads
/// none of them; one that needs them calls [`WalkMemo::fill`] before the
/// memo's next capture. Saves the copy of a deep stack's shared
/// addresses in the common cases: the same state again and the first
/// match taken whole.
#[inline(never)]
pub fn capture_from_lazy(
    start: StartRegs,
    bounds: &StackBounds,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    memo: &mut WalkMemo,
    out: &mut [u64],
) -> MemoWalk {
    from_memo::<true>(start, bounds, unwinder, cache, memo, out)
}

#[inline(always)]
fn from_memo<const LAZY: bool>(
    start: StartRegs,
    bounds: &StackBounds,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    memo: &mut WalkMemo,
    out: &mut [u64],
) -> MemoWalk {
    memo.clear_unfilled();
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let Some(fence) = bounds.fence(start.sp) else {
            return LOST;
        };
        if start.ra == 0 {
            return MemoWalk {
                len: 0,
                truncated: false,
                shared: 0,
            };
        }
        if out.is_empty() {
            return LOST;
        }
        let cur = Regs {
            pc: start.ra,
            sp: start.sp,
            bp: start.bp,
            ip: false,
        };
        crate::memo::walk::<LAZY>(cur, &fence, unwinder, cache, memo, out)
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let _ = (start, bounds, unwinder, cache, memo, out);
        LOST
    }
}

/// The reference walk for [`capture_from`] without a memo: every frame
/// stepped by the compact tables (framehop where they do not apply).
#[inline(never)]
pub fn capture_from_compact(
    start: StartRegs,
    bounds: &StackBounds,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    out: &mut [u64],
) -> Walk {
    from_start(
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        Mode::Compact,
        start,
        bounds,
        unwinder,
        cache,
        out,
    )
}

/// The reference walk for [`capture_from`] by framehop alone (its rule
/// cache from the unwinder's set, its frame-pointer fallback, the ucontext
/// for signal frames): what the crate's captures gave before the compact
/// tables. `cache` is not used.
#[inline(never)]
pub fn capture_from_framehop(
    start: StartRegs,
    bounds: &StackBounds,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    out: &mut [u64],
) -> Walk {
    from_start(
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        Mode::Framehop,
        start,
        bounds,
        unwinder,
        cache,
        out,
    )
}

#[inline(always)]
fn from_start(
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))] mode: Mode,
    start: StartRegs,
    bounds: &StackBounds,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    out: &mut [u64],
) -> Walk {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let lost = Walk {
            len: 0,
            truncated: true,
        };
        let Some(fence) = bounds.fence(start.sp) else {
            return lost;
        };
        if start.ra == 0 {
            return Walk {
                len: 0,
                truncated: false,
            };
        }
        let Some(first) = out.first_mut() else {
            return lost;
        };
        *first = start.ra;
        let r = Regs {
            pc: start.ra,
            sp: start.sp,
            bp: start.bp,
            ip: false,
        };
        walk_steps(mode, r, 0, &fence, unwinder, cache, out, 1)
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let _ = (start, bounds, unwinder, cache, out);
        Walk {
            len: 0,
            truncated: true,
        }
    }
}

/// Captures the calling thread's stack from the caller of this function,
/// memoized: `out[0]` is the return address into the direct caller when
/// `skip` is 0; `skip` steps over that many of the caller's frames first
/// (the tracer's own, for the C API's `trace_stack_capture`), which are
/// unwound every time (not memoized). Then as [`capture_from`] from the
/// first kept frame. On targets other than x86_64 Linux it returns an
/// empty, truncated walk.
#[inline(never)]
pub fn capture_here(
    skip: usize,
    bounds: &StackBounds,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    memo: &mut WalkMemo,
    out: &mut [u64],
) -> MemoWalk {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let regs = crate::dwarf::registers_here!();
        here(regs, skip, bounds, unwinder, cache, memo, out)
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let _ = (skip, bounds, unwinder, cache, memo, out);
        LOST
    }
}

/// The body of [`capture_here`], from the registers `(ip, sp, bp)` read in the public function's frame.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
pub(crate) fn here(
    (ip, sp, bp): (u64, u64, u64),
    skip: usize,
    bounds: &StackBounds,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    memo: &mut WalkMemo,
    out: &mut [u64],
) -> MemoWalk {
    memo.clear_unfilled();
    let Some(fence) = bounds.fence(sp) else {
        return LOST;
    };
    let mut r = Regs {
        pc: ip,
        sp,
        bp,
        ip: true,
    };
    let mut rec = Rec::default();
    // This function's own frame, then the skipped ones.
    for _ in 0..=skip {
        match step(Mode::Compact, unwinder, cache, &mut r, &fence, &mut rec) {
            Step::Ret => {}
            Step::End => {
                return MemoWalk {
                    len: 0,
                    truncated: false,
                    shared: 0,
                }
            }
            Step::Fail => return LOST,
        }
    }
    if out.is_empty() {
        return LOST;
    }
    crate::memo::walk::<false>(r, &fence, unwinder, cache, memo, out)
}

/// Steps from `r` (a frame not written), writing each caller's address
/// after `skip` of them to `out[n..]`.
// Must not allocate, lock, make a system call or panic: runs inside malloc.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn walk_steps(
    mode: Mode,
    mut r: Regs,
    mut skip: usize,
    fence: &Fence,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    out: &mut [u64],
    mut n: usize,
) -> Walk {
    let mut rec = Rec::default();
    loop {
        match step(mode, unwinder, cache, &mut r, fence, &mut rec) {
            Step::Ret => {}
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
        }
        if skip > 0 {
            skip -= 1;
            continue;
        }
        let Some(slot) = out.get_mut(n) else {
            return Walk {
                len: n,
                truncated: true,
            };
        };
        *slot = r.pc;
        n += 1;
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
        let (ip, sp, bp) = crate::dwarf::registers_here!();
        let Some(fence) = bounds.fence(sp) else {
            return Walk {
                len: 0,
                truncated: true,
            };
        };
        let start = Regs {
            pc: ip,
            sp,
            bp,
            ip: true,
        };
        walk_steps(Mode::Compact, start, skip, &fence, unwinder, cache, out, 0)
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
