//! Walks that start in the program's own frame: the shim's malloc entry
//! points hand over the caller's return address, stack pointer and frame
//! pointer ([`StartRegs`]), so no frame of the tracer is ever walked.

use crate::bounds::StackBounds;
use crate::dwarf::{DwarfCache, DwarfUnwinder};
use crate::memo::{MemoWalk, WalkMemo};

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

/// Captures the stack that starts at `start`, innermost first, into `out`:
/// `out[0]` is `start.ra`, then its callers. `out.len()` is the depth
/// limit; `len` and `truncated` as [`Walk`](crate::Walk); `shared` as
/// [`MemoWalk`] (the outermost frames proven to be the previous capture's
/// of this memo).
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
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        use crate::dwarf::{cfi_step, Step};
        use framehop::{FrameAddress, UnwindRegsNative};

        let _ = memo;
        let lost = MemoWalk {
            len: 0,
            truncated: true,
            shared: 0,
        };
        let Some(fence) = bounds.fence(start.sp) else {
            return lost;
        };
        let Some(first) = FrameAddress::from_return_address(start.ra) else {
            return MemoWalk {
                len: 0,
                truncated: start.ra != 0,
                shared: 0,
            };
        };
        let Some(slot) = out.first_mut() else {
            return lost;
        };
        *slot = start.ra;
        let mut read_stack = |addr: u64| fence.read(addr).ok_or(());
        let mut regs = UnwindRegsNative::new(start.ra, start.sp, start.bp);
        let mut frame = first;
        let mut n = 1usize;
        loop {
            let ret = match cfi_step(unwinder, cache, &mut regs, &mut frame, &mut read_stack) {
                Step::Ret(ret) => ret,
                Step::End => {
                    return MemoWalk {
                        len: n,
                        truncated: false,
                        shared: 0,
                    }
                }
                Step::Fail => {
                    return MemoWalk {
                        len: n,
                        truncated: true,
                        shared: 0,
                    }
                }
            };
            let Some(slot) = out.get_mut(n) else {
                return MemoWalk {
                    len: n,
                    truncated: true,
                    shared: 0,
                };
            };
            *slot = ret;
            n += 1;
        }
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let _ = (start, bounds, unwinder, cache, memo, out);
        MemoWalk {
            len: 0,
            truncated: true,
            shared: 0,
        }
    }
}
