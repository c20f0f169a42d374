//! A match whose outer words changed: re-walking from the innermost
//! changed step (`resume`, `rewrite`) or keeping the frames that held
//! (`window`).
use super::extend::{append, cached_step};
use super::*;

/// The rbp of `f[low]` in this walk, whose `n` new frames (in the
/// scratch `s`, from a first frame with rbp `bp0`) reached `f[j]` and
/// whose steps from `f[j]` down to `f[low + 1]` hold: read by the
/// outermost of those steps that read rbp (`S_SLOT`, `S_FP`: at its
/// slot), else passed through from the walk's rbp at `f[j]` (the one its
/// last step gave). One read, where a frame's rbp in the memo may be
/// stale (a match ignores it where no step further out uses it).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
pub(super) fn rbp_at(
    f: &[MFrame; CAP],
    s: &[MFrame; CAP],
    low: usize,
    j: usize,
    n: usize,
    bp0: u64,
) -> u64 {
    let read = f
        .get(low + 1..=j)
        .unwrap_or_default()
        .iter()
        .find(|me| kind_of(me) != S_PASS);
    match read {
        // SAFETY: the slot a compact step of the memo's walk read, at or
        // above that frame's sp >= the walk's sp, below `hi` (memo_walk's
        // docs): its words are the ones the checks read.
        Some(me) => unsafe { load(me.slot) },
        None => match n.checked_sub(1).and_then(|i| s.get(i)) {
            None => bp0,
            Some(x) if kind_of(x) == S_PASS => x.bp,
            // SAFETY: the slot the walk's last step read, an aligned word
            // at or above its frame's stack pointer and below `hi`.
            Some(x) => unsafe { load(x.slot) },
        },
    }
}

/// [`walk_to_match`] when the match at `f[j]` (`n` new frames stepped
/// from the walk's first frame, whose rbp is `bp0`) does not hold to the
/// walk's end: the same
/// leaf reached from another caller. The memo's steps from `f[j]` down
/// to `f[low + 1]` hold (`low` the innermost step that does not: the
/// frames `f[j]`, ..., `f[low]` are this walk's), so the walk steps on
/// from `f[low]` (its rbp recomputed from the slots those steps read:
/// where no step further out used it, the memo's may be stale) until a
/// frame equals a memo frame `f[k]`, `k < low`, whose walk holds to the
/// end. The common case, where the frames stepped replace
/// `f[k + 1..low]` one for one with the same number of checks each and
/// the same `dep` for the innermost (so that nothing the memo holds for
/// `f[low..=j]` changes but `f[low]`'s checks), is done in place: those
/// frames and checks are rewritten, and the new inner frames appended as
/// `walk_to_match` does. `shared` is `k + 1`. Anything else is `None`
/// (the caller runs `memo_walk`), with nothing but `out`, the scratch and
/// the cache written. Out of line: rare (on python's deep-stack loop,
/// all in its first rounds; bench/README.md has the count).
// Must not allocate, lock, make a system call or panic: runs inside malloc.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(clippy::too_many_arguments)]
#[inline(never)]
pub(super) fn resume(
    memo: &mut WalkMemo,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    hi: u64,
    out: &mut [u64],
    n: usize,
    j: usize,
    bp0: u64,
) -> Option<MemoWalk> {
    // It may rewrite frames of the memo's: the branches go, and the
    // walk is a new one.
    memo.forget_alts();
    memo.tag = 0;
    let (old_truncated, old_term) = (memo.truncated, memo.term);
    let WalkMemo {
        f,
        ck,
        ck_end,
        ra_rev,
        s,
        ..
    } = memo;
    // The innermost step of f[j..=1] whose words changed (none: the
    // ending changed; not handled here).
    let low = (1..=j)
        .rev()
        .find(|&t| check_span(checks_of(ck, ck_end, t, t)) != 0)?;
    let bp = rbp_at(f, s, low, j, n, bp0);
    let l = *f.get(low)?;
    let mut cur = Regs {
        pc: l.ra,
        sp: l.sp,
        bp,
        ip: l.flags & F_IP != 0,
    };
    let start = f.get(j)?.sp;
    if cur.sp & 7 != 0 || cur.sp < start || cur.sp > hi {
        return None;
    }
    // The frames stepped from f[low] (f[low] itself not counted): at
    // s[n..n + m], innermost first.
    let rules = &mut cache.rules;
    let mut hits = 0u64;
    let mut c = low;
    let mut m = 0usize;
    let k = loop {
        let sp = cur.sp;
        // SAFETY: checked above for f[low]; a compact step keeps it so.
        let (next, kind, slot) = unsafe { cached_step(&cur, hi, unwinder, rules, &mut hits) }?;
        if m > 0 {
            *s.get_mut(n + m - 1)? = MFrame {
                ra: cur.pc,
                sp,
                bp: cur.bp,
                slot,
                flags: u32::from(cur.ip) | u32::from(kind) << 1,
                lim: NO_LIM,
            };
        } else if kind != kind_of(&l) || slot != l.slot {
            // f[low]'s step is a function of its address and state.
            return None;
        }
        cur = next;
        m += 1;
        while c > 0 && f.get(c - 1)?.sp < cur.sp {
            c -= 1;
        }
        let o = f.get(c.checked_sub(1)?)?;
        if o.sp == cur.sp && o.ra == cur.pc && (o.flags & F_IP != 0) == cur.ip {
            if o.flags & F_DEP != 0 && o.bp != cur.bp {
                return None;
            }
            break c - 1;
        }
        // More frames than the ones they could replace: not one for one.
        if m >= low {
            return None;
        }
    };
    rules.hits = rules.hits.wrapping_add(hits);
    // m - 1 frames stepped beyond f[low]; one for one with f[k + 1..low].
    let m = m - 1;
    if k + 1 + m != low || changed_to_end(ck, ck_end, old_term, k) != 0 {
        return None;
    }
    // The same number of checks for each, and the same dep for f[low - 1].
    let ko = *f.get(k)?;
    let mut o_dep = ko.flags & F_DEP != 0;
    for i in 0..m {
        let me = s.get(n + m - 1 - i)?;
        let at = k + 1 + i;
        let kd = kind_of(me);
        let count = 1 + usize::from(kd != S_PASS && o_dep);
        let was = usize::from(*ck_end.get(at)?) - usize::from(*ck_end.get(at - 1)?);
        if count != was {
            return None;
        }
        o_dep = kd == S_FP || (kd == S_PASS && o_dep);
    }
    if m > 0 && o_dep != (f.get(low - 1)?.flags & F_DEP != 0) {
        return None;
    }
    // Rewrite f[k + 1..low] and their checks, then f[low]'s checks (every
    // index is in bounds: at <= low <= j < CAP, each frame's checks where
    // its old ones were; should one not be, the memo is emptied).
    if rewrite(f, ck, ck_end, ra_rev, s.get(n..n + m)?, k, l).is_none() {
        memo.len = 0;
        return None;
    }
    // The walk: the new frames (in out), f[j..=0] (the memo's, rewritten).
    let len = n + 1 + j;
    if let (Some(dst), Some(src)) = (out.get_mut(n + 1..len), ra_rev.get(CAP - j..)) {
        copy_words(dst, src);
    }
    let ok = len <= CAP && append(f, ck, ck_end, ra_rev, j, s.get(..n).unwrap_or_default());
    memo.len = if ok { len } else { 0 };
    memo.steps = (n + m + 1) as u32;
    Some(MemoWalk {
        len,
        truncated: old_truncated,
        shared: k + 1,
    })
}

/// [`resume`]'s rewrite: `new` (innermost first) in place of
/// `f[k + 1..k + 1 + new.len()]`, each with its checks, and the checks
/// of `l`, the frame after them, from its new outer neighbour.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
pub(super) fn rewrite(
    f: &mut [MFrame; CAP],
    ck: &mut [Check; CHECKS],
    ck_end: &[u8; CAP],
    ra_rev: &mut [u64; CAP],
    new: &[MFrame],
    k: usize,
    l: MFrame,
) -> Option<()> {
    let m = new.len();
    let ko = *f.get(k)?;
    let (mut o, mut o_dep) = (ko, ko.flags & F_DEP != 0);
    for i in 0..=m {
        let at = k + 1 + i;
        let me = if i < m { *new.get(m - 1 - i)? } else { l };
        let kd = kind_of(&me);
        let mut e = usize::from(*ck_end.get(at - 1)?);
        *ck.get_mut(e)? = Check {
            at: o.sp.wrapping_sub(8),
            want: o.ra,
        };
        e += 1;
        if kd != S_PASS && o_dep {
            *ck.get_mut(e)? = Check {
                at: me.slot,
                want: o.bp,
            };
        }
        let dep = kd == S_FP || (kd == S_PASS && o_dep);
        if i < m {
            *f.get_mut(at)? = MFrame {
                flags: (me.flags & !F_DEP) | if dep { F_DEP } else { 0 },
                lim: NO_LIM,
                ..me
            };
            *ra_rev.get_mut(CAP - 1 - at)? = me.ra;
        }
        (o, o_dep) = (me, dep);
    }
    Some(())
}

/// [`walk_to_match`] when the walk is cut by the depth limit (`out`'s
/// length `d`) inside the memo's frames: `n` new frames, the match at
/// `f[j]`, and `f[b]`, `b = n + j - d`, the frame beyond the limit. When
/// the memo's steps from `f[j]` down to `f[b + 1]` can be re-checked
/// (`lim`, `f[j]`'s, at most `b`) and hold, the walk is the new frames and
/// `f[j]`, ..., `f[b + 1]`, truncated, as `memo_walk` gives it; the memo
/// keeps `f[b..=j]`, moved to the front (`f[b]` its frame beyond the
/// limit), and the new frames.
///
/// The moved frames keep their flags and checks: where `memo_walk` would
/// find that no step further out uses a frame's rbp any more (the frames
/// below `f[b]` are gone), this memo still checks that rbp (a word more
/// to re-read, a match that needs the same rbp): stricter, never wrong.
// Must not allocate, lock, make a system call or panic: runs inside malloc.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(never)]
pub(super) fn window(
    memo: &mut WalkMemo,
    out: &mut [u64],
    n: usize,
    j: usize,
    lim: u32,
) -> Option<MemoWalk> {
    // It may move the memo's frames: the branches go, and the walk
    // is a new one.
    memo.forget_alts();
    memo.tag = 0;
    let d = out.len();
    let b = (n + j).checked_sub(d)?;
    if lim != NO_LIM && lim as usize > b {
        return None;
    }
    let (old_kept0, old_truncated) = (memo.kept0, memo.truncated);
    let WalkMemo {
        f,
        ck,
        ck_end,
        ra_rev,
        s,
        ..
    } = memo;
    if check_span(checks_of(ck, ck_end, b + 1, j)) != 0 {
        return None;
    }
    // f[j], ..., f[b + 1]: ra_rev[CAP - 1 - j..CAP - 1 - b].
    if let (Some(dst), Some(src)) = (out.get_mut(n..d), ra_rev.get(CAP - 1 - j..CAP - 1 - b)) {
        copy_words(dst, src);
    }
    // The same window of the same frames as the previous walk's: its
    // outer frames are the previous capture's.
    let shared = if b == 0 && !old_kept0 && old_truncated {
        j
    } else {
        0
    };
    let total = j - b + 1 + n;
    if total > CAP {
        memo.len = 0;
    } else {
        if b > 0 {
            let e0 = ck_end.get(b).map_or(0, |&e| usize::from(e));
            let e1 = ck_end.get(j).map_or(0, |&e| usize::from(e));
            f.copy_within(b..=j, 0);
            ck.copy_within(e0..e1, 0);
            ck_end.copy_within(b..=j, 0);
            for e in ck_end.get_mut(..=j - b).unwrap_or_default() {
                *e -= e0 as u8;
            }
            ra_rev.copy_within(CAP - 1 - j..CAP - b, CAP - 1 - (j - b));
        }
        // f[0] is beyond the limit: no step of the memo's reaches the
        // walk's end.
        for x in f.get_mut(..=j - b).unwrap_or_default() {
            x.lim = 0;
        }
        let ok = append(f, ck, ck_end, ra_rev, j - b, s.get(..n).unwrap_or_default());
        memo.len = if ok { total } else { 0 };
        memo.kept0 = false;
        memo.truncated = true;
        memo.term = Term::default();
    }
    memo.steps = n as u32;
    Some(MemoWalk {
        len: d,
        truncated: true,
        shared,
    })
}
