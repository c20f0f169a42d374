//! Stepping the frames a memo does not hold: the cached compact step, the
//! steps down to a memo frame, and appending new frames to the memo.
use super::*;

/// A compact step from `cur` with its rule from the thread's cache (a
/// miss out of line, `hits` counts the hits): the caller's frame, the
/// step's kind and the rbp slot it read.
///
/// # Safety
/// As [`compact_step`]: `cur.sp` 8-byte aligned, within the fence (`lo <=
/// sp <= hi`).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
pub(super) unsafe fn cached_step(
    cur: &Regs,
    hi: u64,
    unwinder: &DwarfUnwinder,
    rules: &mut RuleCache,
    hits: &mut u64,
) -> Option<(Regs, u8, u64)> {
    let key = rule_key(cur.pc, cur.ip);
    let i = RuleCache::slot(key);
    let rule = match (rules.keys.get(i), rules.rules.get(i)) {
        (Some(&k), Some(&r)) if k == key && k != 0 => {
            *hits += 1;
            r
        }
        _ => rule_miss(unwinder, rules, key),
    };
    // SAFETY: the caller's contract.
    unsafe { compact_step(rule, cur, hi) }
}

/// [`walk_to_match`]'s steps: from `cur`, compact steps (each frame to
/// `out` and to the scratch) until a frame equals a memo frame whose walk
/// can be re-checked; `(n, j)`: `n` frames stepped, the next equals
/// `f[j]`. `None` as `walk_to_match` says. `hits`: rule-cache hits.
// Must not allocate, lock, make a system call or panic: runs inside malloc.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
pub(super) fn steps_to_match(
    mut cur: Regs,
    hi: u64,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    memo: &mut WalkMemo,
    out: &mut [u64],
    hits: &mut u64,
) -> Option<(usize, usize)> {
    let d = out.len().min(CAP);
    let f = &memo.f;
    let s = &mut memo.s;
    let rules = &mut cache.rules;
    // Candidates for a match: f[..c], f[c - 1] the innermost left.
    let mut c = memo.len.min(CAP);
    let mut n = 0usize;
    loop {
        // `n` frames stepped (in `out` and the scratch), `cur` the next.
        if n >= d {
            return None;
        }
        if let Some(o) = out.get_mut(n) {
            *o = cur.pc;
        }
        while let Some(o) = f.get(c.wrapping_sub(1)) {
            if o.sp >= cur.sp {
                break;
            }
            c -= 1;
        }
        // Opaque to the optimiser: the scan above then keeps one counter,
        // not one per later use of `c` (measured: 12 instructions a frame
        // passed, 7 with this).
        c = core::hint::black_box(c);
        if let Some(o) = f.get(c.wrapping_sub(1)) {
            if o.sp == cur.sp && o.ra == cur.pc && (o.flags & F_IP != 0) == cur.ip {
                if o.flags & F_DEP != 0 && o.bp != cur.bp {
                    return None;
                }
                return Some((n, c - 1));
            }
        }
        let sp = cur.sp;
        // SAFETY: lo <= sp <= hi and sp is 8-byte aligned: checked before
        // the first step, and a compact step keeps it so.
        let (next, kind, slot) = unsafe { cached_step(&cur, hi, unwinder, rules, hits) }?;
        if let Some(x) = s.get_mut(n) {
            *x = MFrame {
                ra: cur.pc,
                sp,
                bp: cur.bp,
                slot,
                flags: u32::from(cur.ip) | u32::from(kind) << 1,
                lim: NO_LIM,
            };
        }
        cur = next;
        n += 1;
    }
}

/// Appends the new frames `new` (innermost first, each a compact step:
/// `S_PASS`, `S_SLOT` or `S_FP`) after `f[j]`, with what [`fix`] would
/// compute for them from `f[j]` outward: the same frames, flags, limits
/// (`f[j]`'s), checks and addresses, in one pass and without `fix`'s
/// copies of the outer frame. False, with nothing written, when the
/// frames or their checks would not fit (never, for a memo's own frames:
/// at most two checks a step); the caller then empties the memo. Out of
/// line: inlined into `walk_to_match` its loop kept its values on the
/// stack, which cost more instructions a frame than the call does.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(never)]
pub(super) fn append(
    f: &mut [MFrame; CAP],
    ck: &mut [Check; CHECKS],
    ck_end: &mut [u8; CAP],
    ra_rev: &mut [u64; CAP],
    j: usize,
    new: &[MFrame],
) -> bool {
    let n = new.len();
    let end = j + 1 + n;
    let Some(&o) = f.get(j) else {
        return false;
    };
    let mut e = ck_end.get(j).map_or(0, |&e| usize::from(e));
    // Every index below is in bounds: frames j + 1..end <= CAP, and at
    // most two checks a frame from e on.
    if end > CAP || e + 2 * n > CHECKS {
        return false;
    }
    let (mut o_ra, mut o_sp, mut o_bp) = (o.ra, o.sp, o.bp);
    let mut o_dep = o.flags & F_DEP != 0;
    let lim = o.lim;
    let (fp, ckp, endp, rap, newp) = (
        f.as_mut_ptr(),
        ck.as_mut_ptr(),
        ck_end.as_mut_ptr(),
        ra_rev.as_mut_ptr(),
        new.as_ptr(),
    );
    for i in 0..n {
        let at = j + 1 + i;
        // SAFETY: i < n, at < end <= CAP, e + 1 < e_start + 2 * n <=
        // CHECKS (checked above): every pointer stays in its array.
        unsafe {
            let me = *newp.add(n - 1 - i);
            let k = kind_of(&me);
            *ckp.add(e) = Check {
                at: o_sp.wrapping_sub(8),
                want: o_ra,
            };
            e += 1;
            if k != S_PASS && o_dep {
                *ckp.add(e) = Check {
                    at: me.slot,
                    want: o_bp,
                };
                e += 1;
            }
            let dep = k == S_FP || (k == S_PASS && o_dep);
            *fp.add(at) = MFrame {
                flags: (me.flags & !F_DEP) | if dep { F_DEP } else { 0 },
                lim,
                ..me
            };
            // At most 2 * CAP (< 256) checks.
            *endp.add(at) = e as u8;
            *rap.add(CAP - 1 - at) = me.ra;
            (o_ra, o_sp, o_bp, o_dep) = (me.ra, me.sp, me.bp, dep);
        }
    }
    true
}
