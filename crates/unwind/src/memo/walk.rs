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
        if let Some(w) = take_alt::<LAZY>(cur, memo, out) {
            return w;
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
        alts,
        alt_next,
        alt_credit,
        alt_probe,
        ..
    } = memo;
    // f[j] is the frame at out[n].
    if changed_to_end(ck, ck_end, old_term, j) != 0 {
        return resume(memo, unwinder, cache, fence.hi, out, n, j, cur.bp);
    }
    // Keep the displaced frames while branches are taken, else now and
    // then (ALT_CREDIT); when not, the branches they would move go.
    *alt_probe = alt_probe.wrapping_add(1);
    if *alt_probe % ALT_PROBE == 0 {
        *alt_credit = (*alt_credit).max(ALTS as u32 + 1);
    }
    if *alt_credit > 0 {
        *alt_credit -= 1;
        displace(alts, alt_next, f, j, old_len, old_tag, None);
    } else {
        for a in alts.iter_mut() {
            if a.j > j {
                a.m = 0;
            }
        }
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

/// Before the memo's frames `f[j + 1..len]` (`len` its frames) are
/// replaced by a walk that matched at `f[j]`: moves every branch called
/// from a frame further in than `f[j]` onto `f[j]`, with the memo's frames
/// from its own down to `f[j + 1]` (forgotten when they do not fit), and
/// keeps the replaced frames as a branch (the walk's `tag`) in slot `into`
/// (else a free one, else the one kept longest ago), when they fit and
/// every step from the innermost of them outward can be re-checked.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
fn displace(
    alts: &mut [Alt; ALTS],
    alt_next: &mut usize,
    f: &[MFrame; CAP],
    j: usize,
    len: usize,
    tag: u64,
    into: Option<usize>,
) {
    for a in alts.iter_mut() {
        if a.m == 0 || a.j <= j {
            continue;
        }
        let extra = a.j - j;
        // f[a.j], f[a.j - 1], ..., f[j + 1] after the branch's frames.
        match (a.f.get_mut(a.m..a.m + extra), f.get(j + 1..=a.j)) {
            (Some(dst), Some(src)) => {
                for (d, x) in dst.iter_mut().zip(src.iter().rev()) {
                    *d = *x;
                }
                a.m += extra;
                a.j = j;
            }
            _ => a.m = 0,
        }
    }
    let m = len.wrapping_sub(j + 1);
    let Some(src) = f.get(j + 1..len) else {
        return;
    };
    if m == 0 || m > ALT || src.last().is_none_or(|x| x.lim != NO_LIM) {
        return;
    }
    let slot = into
        .or_else(|| alts.iter().position(|a| a.m == 0))
        .unwrap_or(*alt_next);
    *alt_next = (slot + 1) % ALTS;
    let Some(a) = alts.get_mut(slot) else {
        return;
    };
    for (d, x) in a.f.iter_mut().zip(src.iter().rev()) {
        *d = *x;
    }
    a.m = m;
    a.j = j;
    a.tag = tag;
}

/// Re-reads the words the steps of branch `a` read (its frames' and the
/// step from its outermost frame to `oj`, the memo frame it is called
/// from), as `append` computes them from the frames: zero when every one
/// holds.
///
/// Every address was read by a compact step of a frame at or above the
/// branch's innermost one, through a fence with the memo's `hi` (the
/// caller checks that the innermost is in the current walk's state).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
fn alt_changed(a: &Alt, oj: &MFrame) -> u64 {
    let fr = a.f.get(..a.m).unwrap_or_default();
    let mut acc = 0u64;
    for (i, me) in fr.iter().enumerate() {
        let o = fr.get(i + 1).unwrap_or(oj);
        // SAFETY: see this function's docs.
        acc |= unsafe { load(o.sp.wrapping_sub(8)) ^ o.ra };
        if kind_of(me) != S_PASS && o.flags & F_DEP != 0 {
            // SAFETY: as above.
            acc |= unsafe { load(me.slot) ^ o.bp };
        }
    }
    acc
}

/// A branch ([`Alt`]) taken: when `cur` is in the state of a branch's
/// innermost frame and every word its steps and the memo's steps from
/// `f[j]` outward read (with the ending) holds, the walk is exactly that
/// earlier walk, as [`memo_walk`] would give it. The memo's inner frames
/// become a branch in its place (`displace`) and the branch's frames are
/// appended after `f[j]` (`append`, as `walk_to_match` appends new ones).
/// `None`, with nothing written, otherwise. The caller checked that the
/// memo is of this unwinder and fence.
// Must not allocate, lock, make a system call or panic: runs inside malloc.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
pub(super) fn take_alt<const LAZY: bool>(
    cur: Regs,
    memo: &mut WalkMemo,
    out: &mut [u64],
) -> Option<MemoWalk> {
    let h = memo.alts.iter().position(|a| {
        a.m != 0 && {
            let b = &a.f[0];
            b.sp == cur.sp
                && b.ra == cur.pc
                && (b.flags & F_IP != 0) == cur.ip
                && (b.flags & F_DEP == 0 || b.bp == cur.bp)
        }
    })?;
    let WalkMemo {
        f,
        ck,
        ck_end,
        ra_rev,
        s,
        alts,
        alt_next,
        ..
    } = memo;
    let a = alts.get(h)?;
    let (m, j, tag) = (a.m, a.j, a.tag);
    let len = j + 1 + m;
    if memo.len <= j || len > out.len() || len > CAP {
        return None;
    }
    if alt_changed(a, f.get(j)?) | changed_to_end(ck, ck_end, memo.term, j) != 0 {
        return None;
    }
    // `shared`: f[..=j], and the branch's outer frames whose addresses
    // are those of the previous walk's frames after f[j] (a recursion
    // deeper or shallower than the branch's, say).
    let more =
        a.f.get(..m)
            .unwrap_or_default()
            .iter()
            .rev()
            .zip(f.get(j + 1..memo.len).unwrap_or_default())
            .take_while(|(x, y)| x.ra == y.ra)
            .count();
    // The branch's frames to the scratch, its slot freed for the memo's
    // inner frames, then the branch's frames appended after f[j].
    let (Some(dst), Some(src)) = (s.get_mut(..m), a.f.get(..m)) else {
        return None;
    };
    dst.copy_from_slice(src);
    if let Some(a) = alts.get_mut(h) {
        a.m = 0;
    }
    displace(alts, alt_next, f, j, memo.len, memo.tag, Some(h));
    let ok = put_back(f, ck, ck_end, ra_rev, j, s.get(..m).unwrap_or_default());
    if !ok {
        memo.len = 0;
        memo.forget_alts();
        return None;
    }
    memo.len = len;
    memo.steps = 0;
    memo.took_alt = true;
    memo.alt_credit = ALT_CREDIT;
    memo.tag = tag;
    // The branch's addresses (innermost first), then f[j], ..., f[0]'s:
    // left to `fill` by a lazy capture, which interns only the first.
    for (o, x) in out.iter_mut().zip(s.iter().take(m)) {
        *o = x.ra;
    }
    if LAZY {
        memo.unfilled = j + 1;
    } else if let (Some(dst), Some(src)) = (out.get_mut(m..len), ra_rev.get(CAP - 1 - j..)) {
        copy_words(dst, src);
    }
    Some(MemoWalk {
        len,
        truncated: memo.truncated,
        shared: j + 1 + more,
    })
}

/// [`append`] for a branch's frames `new` (innermost first), taken back
/// after `f[j]`, the frame they were called from: their flags (`F_DEP`
/// among them) and limits are already what `append` would compute (`f[j]`
/// and its outer frames are as they were when the memo held them, and
/// every limit is none), so the frames are copied as they are and only
/// their checks, `ck_end` and addresses are written. False, with nothing
/// written, when they would not fit (the caller empties the memo).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
fn put_back(
    f: &mut [MFrame; CAP],
    ck: &mut [Check; CHECKS],
    ck_end: &mut [u8; CAP],
    ra_rev: &mut [u64; CAP],
    j: usize,
    new: &[MFrame],
) -> bool {
    let n = new.len();
    let end = j + 1 + n;
    let Some(&oj) = f.get(j) else {
        return false;
    };
    let mut e = ck_end.get(j).map_or(0, |&e| usize::from(e));
    if end > CAP || e + 2 * n > CHECKS {
        return false;
    }
    let mut o = oj;
    for (i, me) in new.iter().rev().enumerate() {
        let at = j + 1 + i;
        if let Some(c) = ck.get_mut(e) {
            *c = Check {
                at: o.sp.wrapping_sub(8),
                want: o.ra,
            };
        }
        e += 1;
        if kind_of(me) != S_PASS && o.flags & F_DEP != 0 {
            if let Some(c) = ck.get_mut(e) {
                *c = Check {
                    at: me.slot,
                    want: o.bp,
                };
            }
            e += 1;
        }
        if let Some(x) = f.get_mut(at) {
            *x = *me;
        }
        if let Some(x) = ck_end.get_mut(at) {
            // At most 2 * CAP (< 256) checks.
            *x = e as u8;
        }
        if let Some(x) = ra_rev.get_mut(CAP - 1 - at) {
            *x = me.ra;
        }
        o = *me;
    }
    true
}
