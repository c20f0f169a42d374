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
        if memo.alt.m != 0 {
            if let Some(w) = take_alt::<LAZY>(cur, memo, out) {
                return w;
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
    let (old_truncated, old_term, old_len, old_tag) =
        (memo.truncated, memo.term, memo.len, memo.tag);
    let WalkMemo {
        f,
        ck,
        ck_end,
        ra_rev,
        s,
        alt,
        ..
    } = memo;
    // f[j] is the frame at out[n].
    if changed_to_end(ck, ck_end, old_term, j) != 0 {
        return resume(memo, unwinder, cache, fence.hi, out, n, j, cur.bp);
    }
    if save_alt(alt, f, ck, ck_end, ra_rev, j, old_len) {
        alt.tag = old_tag;
    }
    memo.tag = 0;
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

/// Keeps the inner frames `f[j + 1..len]` of the memo's walk (`len` its
/// frames), which the walk matching at `f[j]` is about to replace, as the
/// other branch ([`Alt`]) when they fit and every step from the innermost
/// of them outward can be re-checked; else forgets the branch, unless
/// nothing is replaced and the branch hangs from `f[j]` or further out
/// (then the frames it needs stay as they are). True when it kept them
/// (the caller gives the branch the displaced walk's tag).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
fn save_alt(
    alt: &mut Alt,
    f: &[MFrame; CAP],
    ck: &[Check; CHECKS],
    ck_end: &[u8; CAP],
    ra_rev: &[u64; CAP],
    j: usize,
    len: usize,
) -> bool {
    let m = len.wrapping_sub(j + 1);
    if m == 0 && alt.j <= j {
        return false;
    }
    alt.m = 0;
    if m == 0 || m > ALT || len > CAP {
        return false;
    }
    let (Some(&e0), Some(&e1)) = (ck_end.get(j), ck_end.get(len - 1)) else {
        return false;
    };
    let (e0, e1) = (usize::from(e0), usize::from(e1));
    let (Some(fs), Some(cs), Some(es), Some(rs)) = (
        f.get(j + 1..len),
        ck.get(e0..e1),
        ck_end.get(j + 1..len),
        ra_rev.get(CAP - len..CAP - 1 - j),
    ) else {
        return false;
    };
    if fs.last().is_none_or(|x| x.lim != NO_LIM) {
        return false;
    }
    let (Some(af), Some(ac), Some(ae), Some(ar)) = (
        alt.f.get_mut(..m),
        alt.ck.get_mut(..cs.len()),
        alt.end.get_mut(..m),
        alt.ra.get_mut(ALT - m..),
    ) else {
        return false;
    };
    af.copy_from_slice(fs);
    ac.copy_from_slice(cs);
    ae.copy_from_slice(es);
    ar.copy_from_slice(rs);
    alt.m = m;
    alt.j = j;
    true
}

/// The other branch ([`Alt`]) taken: when `cur` is in the state of its
/// innermost frame and every word its steps and the memo's steps from
/// `f[alt.j]` outward read (with the ending) holds, the walk is exactly
/// that earlier walk, as [`memo_walk`] would give it; the branch and the
/// memo's inner frames change places (the memo then holds this walk, the
/// branch the previous one). `None`, with nothing written, otherwise.
/// The caller checked that the memo is of this unwinder and fence.
// Must not allocate, lock, make a system call or panic: runs inside malloc.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
pub(super) fn take_alt<const LAZY: bool>(
    cur: Regs,
    memo: &mut WalkMemo,
    out: &mut [u64],
) -> Option<MemoWalk> {
    let WalkMemo {
        f,
        ck,
        ck_end,
        ra_rev,
        alt,
        ..
    } = memo;
    let (m, j) = (alt.m, alt.j);
    let b = alt.f.get(m.wrapping_sub(1))?;
    let len = j + 1 + m;
    // f[..=j] are there (the memo holds at least them: else the branch
    // would have gone) and the walk fits the depth limit.
    if !(b.sp == cur.sp
        && b.ra == cur.pc
        && (b.flags & F_IP != 0) == cur.ip
        && (b.flags & F_DEP == 0 || b.bp == cur.bp)
        && memo.len > j
        && len <= out.len())
    {
        return None;
    }
    let e0 = usize::from(*ck_end.get(j)?);
    let k_new = usize::from(*alt.end.get(m - 1)?).checked_sub(e0)?;
    if check_span(alt.ck.get(..k_new)?) | changed_to_end(ck, ck_end, memo.term, j) != 0 {
        return None;
    }
    // Swap the branch with f[j + 1..memo.len] (as many places as the
    // longer of the two; what lies beyond either's end is not read).
    let m_old = memo.len - 1 - j;
    let k_old = usize::from(*ck_end.get(memo.len - 1)?).checked_sub(e0)?;
    let (mm, kk) = (m.max(m_old), k_new.max(k_old));
    if mm > ALT || j + 1 + mm > CAP || e0 + kk > CHECKS || kk > 2 * ALT {
        return None;
    }
    let (Some(fs), Some(cs), Some(es), Some(rs)) = (
        f.get_mut(j + 1..j + 1 + mm),
        ck.get_mut(e0..e0 + kk),
        ck_end.get_mut(j + 1..j + 1 + mm),
        ra_rev.get_mut(CAP - 1 - j - mm..CAP - 1 - j),
    ) else {
        return None;
    };
    let (Some(af), Some(ac), Some(ae), Some(ar)) = (
        alt.f.get_mut(..mm),
        alt.ck.get_mut(..kk),
        alt.end.get_mut(..mm),
        alt.ra.get_mut(ALT - mm..),
    ) else {
        return None;
    };
    swap_items(fs, af);
    swap_items(cs, ac);
    swap_items(es, ae);
    swap_items(rs, ar);
    // The displaced frames: the branch, if every step from the innermost
    // of them can be re-checked.
    alt.m = match alt.f.get(m_old.wrapping_sub(1)) {
        Some(x) if x.lim == NO_LIM => m_old,
        _ => 0,
    };
    memo.len = len;
    memo.steps = 0;
    memo.took_alt = true;
    core::mem::swap(&mut memo.tag, &mut alt.tag);
    // The branch's addresses (innermost first), then f[j], ..., f[0]'s:
    // left to `fill` by a lazy capture, which interns only the first.
    let upto = if LAZY { m } else { len };
    if let (Some(dst), Some(src)) = (out.get_mut(..upto), ra_rev.get(CAP - len..CAP - len + upto)) {
        copy_words(dst, src);
    }
    if LAZY {
        memo.unfilled = j + 1;
    }
    Some(MemoWalk {
        len,
        truncated: memo.truncated,
        shared: j + 1,
    })
}

/// Swaps `a` and `b` item by item (as many as the shorter holds): a short
/// inlined loop, for the few items of a branch.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
fn swap_items<T: Copy>(a: &mut [T], b: &mut [T]) {
    for (x, y) in a.iter_mut().zip(b.iter_mut()) {
        core::mem::swap(x, y);
    }
}
