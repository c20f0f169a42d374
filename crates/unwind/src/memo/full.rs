//! The full walk that fills a memo: every step taken and what it read,
//! the checks the next capture re-reads, and the fixed frames.
use super::*;

/// Recomputes `dep`, `lim`, the checks and the addresses of
/// `f[from..len]` from their outer neighbours (`term` for `f[0]`); the
/// frames below `from` are left as they are.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(super) fn fix(
    f: &mut [MFrame],
    ck: &mut [Check; CHECKS],
    ck_end: &mut [u8; CAP],
    ra_rev: &mut [u64; CAP],
    from: usize,
    term: Term,
) {
    let mut outer = if from == 0 {
        None
    } else {
        f.get(from - 1).copied()
    };
    let mut e = if from == 0 {
        0
    } else {
        ck_end.get(from - 1).map_or(0, |&e| usize::from(e))
    };
    let mut push = |at: u64, want: u64, e: &mut usize| {
        if let Some(c) = ck.get_mut(*e) {
            *c = Check { at, want };
            *e += 1;
        }
    };
    for (i, me) in f.iter_mut().enumerate().skip(from) {
        let (dep, lim) = match outer {
            None => (term.ok && term.dep, if term.ok { NO_LIM } else { 0 }),
            Some(o) => {
                let k = kind_of(me);
                let odep = o.flags & F_DEP != 0;
                let dep = match k {
                    S_PASS => odep,
                    S_FP => true,
                    _ => false,
                };
                if k == S_OPAQUE {
                    (dep, i as u32)
                } else {
                    // The return-address slot; the rbp slot only where a
                    // step further out uses the rbp it gave.
                    push(o.sp.wrapping_sub(8), o.ra, &mut e);
                    if (k == S_SLOT || k == S_FP) && odep {
                        push(me.slot, o.bp, &mut e);
                    }
                    (dep, o.lim)
                }
            }
        };
        me.flags = (me.flags & !F_DEP) | if dep { F_DEP } else { 0 };
        me.lim = lim;
        if let Some(x) = ck_end.get_mut(i) {
            // At most 2 * CAP (< 256) checks.
            *x = e as u8;
        }
        if let Some(r) = ra_rev.get_mut((CAP - 1).wrapping_sub(i)) {
            *r = me.ra;
        }
        outer = Some(*me);
    }
}

/// The memoized walk from `cur`, a frame to keep (`out[0]`), reading
/// through `fence` (whose `lo` is at or below `cur.sp`).
///
/// Why the memo's reads need no bounds check: every address it re-reads
/// was read by a compact step of a previous walk through a fence with the
/// same `hi` (the memo records it), so it is aligned and below `hi`; a
/// compact step reads only at or above its own frame's stack pointer
/// (step.rs), and the frames a match re-checks are the matched frame (at
/// exactly `cur.sp`) and its callers (above it), so every address is at or
/// above the current stack pointer.
// Must not allocate, lock, make a system call or panic: runs inside malloc.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(never)]
pub(crate) fn memo_walk(
    mut cur: Regs,
    fence: &Fence,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    memo: &mut WalkMemo,
    out: &mut [u64],
) -> MemoWalk {
    let d = out.len();
    // It rewrites the memo's frames: the branches go, and the walk
    // is a new one.
    memo.forget_alts();
    memo.tag = 0;
    let usable = memo.len > 0 && memo.unwinder == unwinder.id && memo.hi == fence.hi;
    let old_len = if usable { memo.len.min(CAP) } else { 0 };
    let (old_kept0, old_truncated, old_term) = (memo.kept0, memo.truncated, memo.term);
    let WalkMemo {
        f,
        ck,
        ck_end,
        ra_rev,
        s,
        ..
    } = memo;
    // Candidates for a match: f[..c] (f[c - 1] the innermost left).
    let mut c = old_len;
    let (mut n, mut ns) = (0usize, 0usize);
    let mut overflow = false;
    let mut steps = 0u32;
    let mut rec = Rec::default();
    // `cur` was reached by taking f[seg.0..] down to f[seg.1] = cur.
    let mut seg: Option<(usize, usize)>;
    // The outermost-first run of previous frames the kept frames end in:
    // its top (memo index) and the memo index of the last kept frame.
    let (mut run_top, mut prev_idx) = (0usize, usize::MAX);
    // How the walk ends: (len, truncated, shared), the memo's prefix
    // f[b..=k] (if any) kept before the scratch, its ending.
    let (len, truncated, shared, prefix, term, kept0);
    'walk: loop {
        seg = None;
        if n == d {
            // The depth limit, with `cur` beyond it (its step not taken).
            match s.get_mut(ns) {
                Some(x) => {
                    *x = frame_of(&cur, S_OPAQUE);
                    ns += 1;
                }
                None => overflow = true,
            }
            (len, truncated, shared, prefix) = (n, true, 0, None);
            (term, kept0) = (Term::default(), false);
            break 'walk;
        }
        {
            if let Some(o) = out.get_mut(n) {
                *o = cur.pc;
            }
            n += 1;
            // The previous walk: a frame in the same state?
            while c > 0 && f.get(c - 1).is_some_and(|o| o.sp < cur.sp) {
                c -= 1;
            }
            let j = c.wrapping_sub(1);
            // The same frame (address, stack pointer, kind) as f[j]...
            let same = f.get(j).is_some_and(|o| {
                o.sp == cur.sp && o.ra == cur.pc && (o.flags & F_IP != 0) == cur.ip
            });
            // ...in the same state, as far as the steps from it can tell.
            let hit = same
                && f.get(j)
                    .is_some_and(|o| o.flags & F_DEP == 0 || o.bp == cur.bp);
            if same && !hit {
                // Walked, not taken (its rbp differs and a step further out
                // uses rbp); if a later match joins it, it is the previous
                // walk's frame too.
                if prev_idx != j.wrapping_add(1) {
                    run_top = j;
                }
                prev_idx = j;
            } else if !hit {
                prev_idx = usize::MAX;
            } else {
                // A live step from f[j + 1] that gave f[j]'s state continues
                // the run of previous frames.
                if prev_idx != j.wrapping_add(1) {
                    run_top = j;
                }
                // From f[j] on the previous walk is a function of the words
                // its steps read: read them again, from j out to the first
                // step it cannot check (or its ending).
                let lim = f.get(j).map_or(NO_LIM, |o| o.lim);
                let lo_t = if lim == NO_LIM { 1 } else { lim as usize + 1 };
                let mut acc = check_span(checks_of(ck, ck_end, lo_t, j));
                let ends = lim == NO_LIM;
                if ends && old_term.at != 0 {
                    // SAFETY: as above (read by the ending step of f[0]).
                    acc |= unsafe { load(old_term.at) };
                }
                // The frames f[j - 1..=low] hold; `all`: and the ending.
                let (mut low, mut all) = (if ends { 0 } else { lim as usize }, ends);
                if acc != 0 {
                    all = false;
                    low = if ends { 0 } else { lim as usize };
                    for t in (lo_t..=j).rev() {
                        if check_span(checks_of(ck, ck_end, t, t)) != 0 {
                            low = t;
                            break;
                        }
                    }
                }
                let avail = j - low;
                let room = d - n;
                let take = avail.min(room);
                // f[j - 1], ..., f[j - take]: ra_rev[CAP - j..][..take].
                if let (Some(dst), Some(src)) = (
                    out.get_mut(n..n + take),
                    ra_rev.get((CAP - j)..(CAP - j + take)),
                ) {
                    copy_words(dst, src);
                }
                n += take;
                if avail > room {
                    // A frame that held lies beyond the depth limit.
                    let b = j - 1 - room;
                    let sh = if b == 0 && !old_kept0 && old_truncated {
                        run_top
                    } else {
                        0
                    };
                    (len, truncated, shared, prefix) = (n, true, sh, Some((b, j)));
                    (term, kept0) = (Term::default(), false);
                    break 'walk;
                }
                if all {
                    (len, truncated, shared, prefix) =
                        (n, old_truncated, run_top + 1, Some((0, j)));
                    (term, kept0) = (old_term, old_kept0);
                    break 'walk;
                }
                // Resume from f[low], the last frame that held: the frames
                // taken go to the scratch (with their rbp computed again:
                // where the match ignored rbp, the memo's may be stale).
                let mut bp = cur.bp;
                for t in (low + 1..=j).rev() {
                    let Some(&me) = f.get(t) else {
                        break;
                    };
                    match s.get_mut(ns) {
                        Some(x) => {
                            *x = MFrame { bp, ..me };
                            ns += 1;
                        }
                        None => overflow = true,
                    }
                    bp = match kind_of(&me) {
                        S_PASS => bp,
                        // SAFETY: as above (the slot this step read).
                        _ => unsafe { load(me.slot) },
                    };
                }
                if let Some(l) = f.get(low) {
                    cur = Regs {
                        pc: l.ra,
                        sp: l.sp,
                        bp,
                        ip: l.flags & F_IP != 0,
                    };
                }
                c = low;
                seg = Some((j, low));
                prev_idx = low;
                // The step from f[low], below.
            }
        }
        // A step from `cur`.
        let top = ns;
        match s.get_mut(ns) {
            Some(x) => {
                *x = frame_of(&cur, S_OPAQUE);
                ns += 1;
            }
            None => overflow = true,
        }
        steps = steps.wrapping_add(1);
        let st = step(Mode::Compact, unwinder, cache, &mut cur, fence, &mut rec);
        if let (false, Some(x)) = (overflow, s.get_mut(top)) {
            note_step(x, &rec);
        }
        match st {
            Step::Ret => continue 'walk,
            Step::End | Step::Fail => {
                let fail = st == Step::Fail;
                let t = if fail {
                    Term::default()
                } else {
                    match rec.kind {
                        S_END_RULE => Term {
                            ok: true,
                            at: 0,
                            dep: false,
                        },
                        S_END_BP0 => Term {
                            ok: true,
                            at: 0,
                            dep: true,
                        },
                        S_PASS | S_SLOT | S_FP if rec.ra_at != 0 => Term {
                            ok: true,
                            at: rec.ra_at,
                            dep: rec.kind == S_FP,
                        },
                        _ => Term::default(),
                    }
                };
                // The walk ended right after frames taken down to f[0]:
                // they are the previous walk's outermost frames.
                let sh = match seg {
                    Some((_, 0)) if old_kept0 && fail == old_truncated => run_top + 1,
                    _ => 0,
                };
                (len, truncated, shared, prefix) = (n, fail, sh, None);
                (term, kept0) = (t, true);
                break 'walk;
            }
        }
    }
    // The new memo: f[b..=k] (moved to the front), then the scratch,
    // outermost first.
    let (b, k1) = prefix.map_or((0, 0), |(b, k)| (b, k + 1));
    let keep = k1 - b;
    if overflow || keep + ns > CAP {
        memo.len = 0;
    } else {
        if b > 0 {
            f.copy_within(b..k1, 0);
        }
        for (dst, src) in f
            .get_mut(keep..keep + ns)
            .unwrap_or_default()
            .iter_mut()
            .zip(s.get(..ns).unwrap_or_default().iter().rev())
        {
            *dst = *src;
        }
        let same_end = b == 0 && prefix.is_some() && term == old_term && kept0 == old_kept0;
        let from = if same_end { keep } else { 0 };
        let total = keep + ns;
        fix(
            f.get_mut(..total).unwrap_or_default(),
            ck,
            ck_end,
            ra_rev,
            from,
            term,
        );
        memo.len = total;
        memo.kept0 = kept0;
        memo.truncated = truncated;
        memo.term = term;
        memo.unwinder = unwinder.id;
        memo.hi = fence.hi;
    }
    memo.steps = steps;
    let shared = if truncated == old_truncated {
        shared
    } else {
        0
    };
    MemoWalk {
        len,
        truncated,
        shared,
    }
}

/// Records in the scratch frame `x` what its step read (`rec`): the
/// step's kind (an ending counts as a step the memo cannot re-check) and
/// the rbp slot.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
pub(super) fn note_step(x: &mut MFrame, rec: &Rec) {
    let k = if rec.kind <= S_OPAQUE {
        rec.kind
    } else {
        S_OPAQUE
    };
    x.flags = (x.flags & F_IP) | u32::from(k) << 1;
    x.slot = rec.slot;
}

/// A memo frame for state `r` whose step is `kind` (for now).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
pub(super) fn frame_of(r: &Regs, kind: u8) -> MFrame {
    MFrame {
        ra: r.pc,
        sp: r.sp,
        bp: r.bp,
        slot: 0,
        flags: u32::from(r.ip) | u32::from(kind) << 1,
        lim: NO_LIM,
    }
}
