//! The frame-pointer walk.

use crate::bounds::{Fence, StackBounds};
use crate::Walk;

/// Captures the return addresses of the calling thread's frame-pointer
/// chain, innermost first, into `out`; returns how many it wrote and
/// whether the walk stopped before the end of the stack.
///
/// `out[0]` is the return address into the direct caller of `capture_fp`
/// (an address inside the caller, just after its call); `skip` drops that
/// many innermost addresses first. Here `skip` counts the addresses the
/// walk produces, that is, frames with a frame record: a frame without one
/// is not counted (for skipping the tracer's own frames by count, use
/// [`capture_here`](crate::capture_here), which counts real frames).
/// `out.len()` is the depth limit: the caller picks it (the
/// project's default is 64, heaptrack's too) and a deeper stack gives
/// exactly `out.len()` addresses, truncated.
///
/// The walk starts at a frame record this function builds itself, so its
/// first address never depends on whether the caller was compiled with
/// frame pointers; from there it follows saved rbp values, starting with
/// the caller's rbp. When the caller (or a caller of it below the traced
/// program's frame) is optimised code that uses rbp as an ordinary
/// register, as Rust does by default, that value is not a frame record
/// and the walk stops or wanders there: call `capture_fp` only from code
/// built with frame pointers (`-C force-frame-pointers=yes`), or use
/// [`capture_here`](crate::capture_here). A caller without
/// a frame pointer is skipped (its frame has no record; the next record is
/// its caller's), and a frame whose rbp holds something other than a frame
/// record ends the walk if the value is outside `bounds`, misaligned or not
/// above the previous record; otherwise its garbage is followed as far as
/// it stays on this stack. A saved rbp of 0 (set by `_start` and by
/// `clone` for every thread) is the normal end of the chain.
///
/// Must not allocate, lock, make a system call, panic or fault: it runs
/// inside the host's malloc. On targets other than x86_64 Linux it returns
/// an empty, truncated walk.
///
/// Always inlined, so that the frame record the entry point pushes holds
/// the return address into the caller itself.
#[inline(always)]
pub fn capture_fp(skip: usize, bounds: &StackBounds, out: &mut [u64]) -> Walk {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        // SAFETY: `out` is valid for `out.len()` writes; the entry point
        // reads only inside `bounds`, which describe this thread's stack
        // (StackBounds is !Send; its constructors guarantee readability).
        let packed =
            unsafe { capture_fp_raw(skip, bounds.lo(), bounds.hi(), out.as_mut_ptr(), out.len()) };
        Walk {
            len: (packed & !TRUNCATED_BIT) as usize,
            truncated: packed & TRUNCATED_BIT != 0,
        }
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let _ = (skip, bounds, out);
        Walk {
            len: 0,
            truncated: true,
        }
    }
}

/// Walks a frame-pointer chain that starts at the frame record `fp`
/// (`[fp]` = the caller's saved rbp, `[fp + 8]` = a return address), the
/// same way [`capture_fp`] does, reading only inside `bounds` at or above
/// `fp`. For hand-built chains (tests) and for callers that already hold a
/// frame record (a signal handler's interrupted rbp).
///
/// # Safety
/// `bounds` describe readable memory (as [`StackBounds::from_raw`]).
pub unsafe fn walk_fp_chain(fp: u64, bounds: &StackBounds, skip: usize, out: &mut [u64]) -> Walk {
    match bounds.fence(fp) {
        Some(fence) => walk(fp, fence, skip, out.as_mut_ptr(), out.len()),
        None => Walk {
            len: 0,
            truncated: fp != 0,
        },
    }
}

/// Bit 63 of [`capture_fp_raw`]'s result: the walk was truncated.
pub const TRUNCATED_BIT: u64 = 1 << 63;

/// [`capture_fp`] with a C ABI, for callers that are not Rust (and for
/// tests that call it from C frames): writes at most `len` addresses to
/// `out` and returns their number, with bit 63 set when the walk was
/// truncated. `lo`/`hi` are the calling thread's [`StackBounds`].
///
/// It pushes a frame record (so the walk's first record is this call's,
/// whatever the caller did with rbp), then calls `fp_entry_inner` with
/// that record's address as the sixth argument. Stack alignment: rsp is 8
/// mod 16 at entry, 0 after the push, as the call needs.
///
/// # Safety
/// `out` is valid for `len` writes; `[lo, hi)` are bounds as
/// [`StackBounds::from_raw`] requires, for the calling thread.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[unsafe(naked)]
pub unsafe extern "sysv64" fn capture_fp_raw(
    _skip: usize,
    _lo: u64,
    _hi: u64,
    _out: *mut u64,
    _len: usize,
) -> u64 {
    core::arch::naked_asm!(
        "push rbp",
        "mov rbp, rsp",
        "mov r9, rsp",
        "call {inner}",
        "pop rbp",
        "ret",
        inner = sym fp_entry_inner,
    )
}

/// Body of [`capture_fp_raw`]; `frame` is the record it pushed.
// Must not allocate, lock, make a system call or panic: runs inside malloc.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
extern "sysv64" fn fp_entry_inner(
    skip: usize,
    lo: u64,
    hi: u64,
    out: *mut u64,
    len: usize,
    frame: u64,
) -> u64 {
    // SAFETY: lo/hi come from the caller's StackBounds (readable memory);
    // the fence below never reaches under `frame`, the live top of stack.
    let bounds = unsafe { StackBounds::from_raw(lo, hi) };
    let walk = match bounds.fence(frame) {
        Some(fence) => walk(frame, fence, skip, out, len),
        None => Walk {
            len: 0,
            truncated: true,
        },
    };
    walk.len as u64 | if walk.truncated { TRUNCATED_BIT } else { 0 }
}

/// Follows the chain from record `fp`, writing at most `len` addresses to
/// `out` after skipping `skip`.
// Must not allocate, lock, make a system call, panic or fault: runs inside
// malloc. Every read goes through `fence`.
#[inline(always)]
pub(crate) fn walk(mut fp: u64, fence: Fence, mut skip: usize, out: *mut u64, len: usize) -> Walk {
    let mut n = 0usize;
    loop {
        if fp == 0 {
            // The outermost frame's saved rbp: the end of the stack.
            return Walk {
                len: n,
                truncated: false,
            };
        }
        let (Some(next), Some(ret)) = (fence.read(fp), fence.read(fp.wrapping_add(8))) else {
            // Outside the stack, misaligned, or the record's second word is.
            return Walk {
                len: n,
                truncated: true,
            };
        };
        if ret == 0 {
            return Walk {
                len: n,
                truncated: false,
            };
        }
        if skip > 0 {
            skip -= 1;
        } else {
            if n == len {
                // The depth limit; there is at least this one frame more.
                return Walk {
                    len: n,
                    truncated: true,
                };
            }
            // SAFETY: n < len and `out` is valid for `len` writes.
            unsafe { out.add(n).write(ret) };
            n += 1;
        }
        if next != 0 && next <= fp {
            // Records must be strictly increasing: a loop or garbage.
            return Walk {
                len: n,
                truncated: true,
            };
        }
        fp = next;
    }
}
