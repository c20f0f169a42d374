//! The memoized walk's entry: step until a memo frame matches, re-read its
//! checks, take the shared frames.
use super::extend::{append, steps_to_match};
use super::resume::{resume, window};
use super::*;

/// The memoized walk from `cur` ([`memo_walk`]'s contract), first trying
/// the common case of a call site allocating again: `cur` in the state of
/// the previous walk's first frame, and that whole walk re-checkable.
/// When every word holds, [`memo_walk`] would take all of the memo and
/// leave it as it is: this gives the same result with nothing moved, and
/// without `memo_walk`'s frame.
// Must not allocate, lock, make a system call or panic: runs inside malloc.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
pub(crate) fn walk<const LAZY: bool>(
    cur: Regs,
    fence: &Fence,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    memo: &mut WalkMemo,
    out: &mut [u64],
) -> MemoWalk {
    // (`unfilled` is 0 here: both callers cleared it on entry.)
    if memo.unwinder == unwinder.id && memo.hi == fence.hi {
        if let Some(j) = memo.len.checked_sub(1) {
            if let (Some(o), Some(ras)) = (memo.f.get(j), memo.ra_rev.get(CAP - 1 - j..)) {
                if j < out.len()
                    && o.lim == NO_LIM
                    && o.sp == cur.sp
                    && o.ra == cur.pc
                    && (o.flags & F_IP != 0) == cur.ip
                    && (o.flags & F_DEP == 0 || o.bp == cur.bp)
                    && changed_to_end(&memo.ck, &memo.ck_end, memo.term, j) == 0
                {
                    if LAZY {
                        memo.unfilled = j + 1;
                    } else if let Some(dst) = out.get_mut(..=j) {
                        copy_words(dst, ras);
                    }
                    memo.steps = 0;
                    return MemoWalk {
                        len: j + 1,
                        truncated: memo.truncated,
                        shared: j + 1,
                    };
                }
            }
        }
    }
    match walk_to_match::<LAZY>(cur, fence, unwinder, cache, memo, out) {
        Some(w) => w,
        None => memo_walk(cur, fence, unwinder, cache, memo, out),
    }
}

/// The common case of [`memo_walk`], in one lean loop: the walk steps by
/// compact rows until a frame equals one of the memo's, in the same
/// state, and the memo's walk from there on can be re-checked (its `lim`
/// none) and holds entirely (with its ending): then the new frames, that
/// frame and the memo's outer frames are the walk, and the memo keeps its
/// frames up to that one with the new ones appended. This is exactly what
/// `memo_walk` gives and leaves in that case (the first match, taken
/// whole, with the same ending: `shared` is the matched frame's index + 1).
///
/// The steps are [`step`]'s compact ones, fused with what the memo records
/// of them: the rule from the thread's cache, the stack words read with
/// one bound each (every read is at or above the frame's stack pointer,
/// itself at or above the fence's `lo` and 8-byte aligned, so only `hi`
/// needs a check), and the frame written once, to the scratch.
///
/// `None` for anything else (no usable memo, a step that is not a compact
/// rsp or frame-record step, a walk that ends or fails before a match, a
/// match on all but rbp, a partial or unchecked match, the depth limit, a
/// memo that would overflow): the caller then runs `memo_walk` from the
/// start, which gives the same walk for the steps taken here. Nothing but
/// `out`, the scratch frames and `cache` is written before it returns
/// `Some`.
// Must not allocate, lock, make a system call or panic: runs inside malloc.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(never)]
pub(super) fn walk_to_match<const LAZY: bool>(
    cur: Regs,
    fence: &Fence,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    memo: &mut WalkMemo,
    out: &mut [u64],
) -> Option<MemoWalk> {
    if memo.len == 0
        || memo.unwinder != unwinder.id
        || memo.hi != fence.hi
        || cache.rules.id != unwinder.id
        || cur.sp & 7 != 0
        || cur.sp < fence.lo
        || cur.sp > fence.hi
    {
        return None;
    }
    let mut hits = 0u64;
    let found = steps_to_match(cur, fence.hi, unwinder, cache, memo, out, &mut hits);
    cache.rules.hits = cache.rules.hits.wrapping_add(hits);
    let (n, j) = found?;
    let d = out.len();
    let len = n + 1 + j;
    let lim = memo.f.get(j).map_or(0, |o| o.lim);
    if len > d {
        return window(memo, out, n, j, lim);
    }
    if lim != NO_LIM {
        return None;
    }
    let (old_truncated, old_term) = (memo.truncated, memo.term);
    let WalkMemo {
        f,
        ck,
        ck_end,
        ra_rev,
        s,
        ..
    } = memo;
    // f[j] is the frame at out[n].
    if changed_to_end(ck, ck_end, old_term, j) != 0 {
        return resume(memo, unwinder, cache, fence.hi, out, n, j, cur.bp);
    }
    // f[j - 1], ..., f[0]: ra_rev[CAP - j..], unchanged by the append.
    if LAZY {
        memo.unfilled = j;
    } else if let (Some(dst), Some(src)) = (out.get_mut(n + 1..len), ra_rev.get(CAP - j..)) {
        copy_words(dst, src);
    }
    let ok = len <= CAP && append(f, ck, ck_end, ra_rev, j, s.get(..n).unwrap_or_default());
    memo.len = if ok { len } else { 0 };
    memo.steps = n as u32;
    Some(MemoWalk {
        len,
        truncated: old_truncated,
        shared: j + 1,
    })
}
