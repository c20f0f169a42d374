//! The memoized walk: a walk that stops at the first frame the previous
//! capture of the same thread is proven to share with it, and takes the
//! rest of that capture after re-reading, branch-free, the stack words its
//! steps read (docs/STACKS.md, "Flat re-validation memo").

use crate::bounds::StackBounds;
use crate::dwarf::{DwarfCache, DwarfUnwinder};
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
use crate::{
    bounds::Fence,
    step::{
        compact_step, rule_key, rule_miss, step, Mode, Rec, Regs, Step, S_END_BP0, S_END_RULE,
        S_FP, S_OPAQUE, S_PASS, S_SLOT,
    },
    table::RuleCache,
};

/// The most frames a [`WalkMemo`] remembers (64, the default depth limit,
/// and a few of a caller's spare frames). A walk that keeps more frames
/// than this (a depth limit above it, on a deeper stack) is not memoized:
/// it is walked in full (exactly as a plain walk) and leaves the memo
/// empty, so the next capture walks in full too.
pub const MEMO_DEPTH: usize = 68;

/// Frames a memo holds: `MEMO_DEPTH` kept ones and the one beyond a depth
/// limit of `MEMO_DEPTH`.
const CAP: usize = MEMO_DEPTH + 1;

/// One frame of the previous walk: its unwinding state (address, stack
/// pointer, frame pointer, kind) and what the step from it to its caller
/// read. Kept outermost first.
#[derive(Clone, Copy, Debug)]
struct MFrame {
    ra: u64,
    sp: u64,
    bp: u64,
    /// The address the step read the caller's rbp from (`S_SLOT`, `S_FP`).
    slot: u64,
    /// `F_IP`, the step's kind (`S_*` << 1), `F_DEP`.
    flags: u32,
    /// The largest index at or below this one whose step the memo cannot
    /// re-check (framehop, a signal frame, a frame beyond the depth limit,
    /// an ending it cannot check again), or `NO_LIM`.
    lim: u32,
}

/// `ra` is an instruction pointer (a frame a signal interrupted).
const F_IP: u32 = 1;
/// Some re-checked step from this frame outward uses its rbp (as a base of
/// an address): a match needs the same rbp.
const F_DEP: u32 = 1 << 3;
const NO_LIM: u32 = u32::MAX;

const NO_FRAME: MFrame = MFrame {
    ra: 0,
    sp: 0,
    bp: 0,
    slot: 0,
    flags: 0,
    lim: NO_LIM,
};

/// One word a step of the previous walk read, and what it read there.
#[derive(Clone, Copy, Debug)]
struct Check {
    at: u64,
    want: u64,
}

const NO_CHECK: Check = Check { at: 0, want: 0 };

/// Checks a memo holds: at most two per step (the return-address slot and
/// the rbp slot), for the steps of `f[1..]`.
const CHECKS: usize = 2 * CAP;

/// How the previous walk ended after its outermost frame, when it can be
/// checked again: an end-of-stack rule (nothing read), or a zero return
/// address read at `at`; `dep`: the ending used that frame's rbp.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Term {
    ok: bool,
    at: u64,
    dep: bool,
}

/// One thread's memory of its previous memoized capture.
///
/// Fixed size (about 8.4 KiB: [`MEMO_DEPTH`] frames of the previous walk,
/// outermost first, the flat list of the words their steps read, their
/// addresses in the order a capture writes them, and as many frames of
/// scratch for the frames a walk finds new), no heap. Owned by one thread and passed `&mut` to
/// [`capture_from`](crate::capture_from) or
/// [`capture_here`](crate::capture_here). Tied to the unwinder and the
/// stack bounds it was filled with; a memo moved to another thread is not
/// unsound (every reuse is re-read from the current stack) but is useless.
#[derive(Clone)]
pub struct WalkMemo {
    f: [MFrame; CAP],
    /// The words the steps of `f[1..len]` read, in frame order: the step
    /// from `f[i]` read `ck[ck_end[i - 1]..ck_end[i]]` (`ck_end[0]` is 0:
    /// `f[0]`'s step is the walk's ending, `term`). None for a step the
    /// memo cannot re-check (`lim`).
    ck: [Check; CHECKS],
    ck_end: [u8; CAP],
    /// `f[i].ra` at `ra_rev[CAP - 1 - i]`: the frames' addresses innermost
    /// first, as a capture writes them, so that taking frames is a copy.
    ra_rev: [u64; CAP],
    s: [MFrame; CAP],
    /// Frames in `f` (0: nothing to reuse).
    len: usize,
    /// `f[0]` was a kept frame of the previous walk (else the frame beyond
    /// its depth limit).
    kept0: bool,
    truncated: bool,
    term: Term,
    unwinder: u64,
    hi: u64,
    steps: u32,
    /// How many outermost addresses of the last capture's `out[..len]`
    /// were left unwritten (a lazy capture that took them from this memo:
    /// [`WalkMemo::fill`] writes them); 0 otherwise.
    unfilled: usize,
}

impl WalkMemo {
    /// An empty memo: the next capture with it walks every frame.
    pub const fn new() -> WalkMemo {
        WalkMemo {
            f: [NO_FRAME; CAP],
            ck: [NO_CHECK; CHECKS],
            ck_end: [0; CAP],
            ra_rev: [0; CAP],
            s: [NO_FRAME; CAP],
            len: 0,
            kept0: false,
            truncated: false,
            term: Term {
                ok: false,
                at: 0,
                dep: false,
            },
            unwinder: 0,
            hi: 0,
            steps: 0,
            unfilled: 0,
        }
    }

    /// Forgets the previous capture (the next one walks every frame and
    /// reports `shared == 0`).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// How many unwinding steps the last memoized capture with this memo
    /// took (the frames it did not take from the memo). For tests and
    /// benchmarks.
    #[doc(hidden)]
    pub fn steps_walked(&self) -> u32 {
        self.steps
    }

    /// How many outermost addresses of the last capture's `out[..len]`
    /// it left unwritten: 0 but after
    /// [`capture_from_lazy`](crate::capture_from_lazy), which takes a
    /// shared frame's address from the memo without copying it.
    pub fn unfilled(&self) -> usize {
        self.unfilled
    }

    /// The last capture's outermost address when [`unfilled`](Self::unfilled)
    /// is not 0 (then `out[len - 1]` is not written); `None` otherwise.
    pub fn outermost(&self) -> Option<u64> {
        if self.unfilled == 0 {
            return None;
        }
        self.ra_rev.last().copied()
    }

    /// Forgets that the last capture left addresses unwritten (a capture
    /// that returns before walking writes none it would leave).
    pub(crate) fn clear_unfilled(&mut self) {
        self.unfilled = 0;
    }

    /// Writes the addresses the last capture left unwritten into `out`,
    /// its `out[..len]` (`len` as it returned): afterwards `out[..len]` is
    /// exactly what [`capture_from`](crate::capture_from) would have
    /// written. Must be called before the memo's next capture.
    pub fn fill(&mut self, out: &mut [u64], len: usize) {
        let u = self.unfilled.min(len).min(CAP);
        if let (Some(dst), Some(src)) = (out.get_mut(len - u..len), self.ra_rev.get(CAP - u..)) {
            dst.copy_from_slice(src);
        }
        self.unfilled = 0;
    }
}

impl Default for WalkMemo {
    fn default() -> Self {
        Self::new()
    }
}

impl core::fmt::Debug for WalkMemo {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("WalkMemo")
            .field("len", &self.len)
            .field("truncated", &self.truncated)
            .finish_non_exhaustive()
    }
}

/// The result of a memoized capture: `len` and `truncated` as [`Walk`](crate::Walk)
/// (exactly what the plain capture gives), and `shared`: the outermost
/// `shared` addresses of `out[..len]` are the previous capture's outermost
/// `shared` addresses, of the same frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoWalk {
    /// Addresses written, innermost first.
    pub len: usize,
    /// The stack goes on beyond the last address (or could not be followed).
    pub truncated: bool,
    /// How many outermost addresses are proven to be the previous
    /// capture's outermost ones (0 when nothing is proven: first capture,
    /// a cleared memo, another unwinder, no match). When nonzero,
    /// `truncated` equals the previous capture's: a caller that interned
    /// the previous stack outermost-first reuses the IDs of its `shared`
    /// outermost nodes and interns `out[..len - shared]`.
    pub shared: usize,
}

/// [`capture_dwarf`](crate::capture_dwarf), memoized: the same `out[..len]`
/// and `truncated` as `capture_dwarf(skip, ...)` called at this point (its
/// `out[0]` is the return address into this function's caller), plus
/// `shared` (see [`MemoWalk`]). The same walk as
/// [`capture_here`](crate::capture_here).
#[inline(never)]
pub fn capture_dwarf_memo(
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
        crate::walker::here(regs, skip, bounds, unwinder, cache, memo, out)
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let _ = (skip, bounds, unwinder, cache, memo, out);
        MemoWalk {
            len: 0,
            truncated: true,
            shared: 0,
        }
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
fn kind_of(f: &MFrame) -> u8 {
    (f.flags >> 1 & 3) as u8
}

/// The word at `addr`, which a previous walk read through its fence.
///
/// # Safety
/// `addr` is 8-byte aligned, at or above the current walk's fence `lo` and
/// below its `hi` (see `memo_walk` for why every address it passes is).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
unsafe fn load(addr: u64) -> u64 {
    // SAFETY: the caller's contract: a mapped word of this thread's stack,
    // above the current stack pointer (StackBounds' guarantee).
    unsafe { core::ptr::read_volatile(addr as *const u64) }
}

/// Re-reads the words of `ck` (a span of a memo's checks): zero when
/// every one holds. Branch-free, four at a time.
///
/// Every address was read by a compact step of a frame at or above the
/// current walk's stack pointer through a fence with its `hi` (the
/// caller's, `memo_walk`'s, contract).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
fn check_span(ck: &[Check]) -> u64 {
    let mut acc = 0u64;
    if ck.len() < 8 {
        // A short span (a loop allocating from one place): no set-up.
        for c in ck {
            // SAFETY: as below.
            acc |= unsafe { load(c.at) ^ c.want };
        }
        return acc;
    }
    let mut quads = ck.chunks_exact(4);
    for q in &mut quads {
        if let [a, b, c, d] = q {
            // SAFETY: every address loaded was read by a compact step of a
            // frame at or above cur.sp (see this function's docs).
            acc |= unsafe {
                (load(a.at) ^ a.want)
                    | (load(b.at) ^ b.want)
                    | (load(c.at) ^ c.want)
                    | (load(d.at) ^ d.want)
            };
        }
    }
    for c in quads.remainder() {
        // SAFETY: as above.
        acc |= unsafe { load(c.at) ^ c.want };
    }
    acc
}

/// Re-reads every word the memo's walk read from `f[j]` outward (the steps
/// of `f[1..=j]`) and the word its ending read (`term`): zero when every
/// one holds. The caller's frame is in `f[j]`'s state, so every address is
/// at or above its stack pointer (see `memo_walk`'s docs for why no read
/// needs a bounds check).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
fn changed_to_end(ck: &[Check], ck_end: &[u8], term: Term, j: usize) -> u64 {
    let mut acc = check_span(checks_of(ck, ck_end, 1, j));
    if term.at != 0 {
        // SAFETY: read by the ending step of f[0] through a fence with
        // this `hi`, above f[0].sp >= the caller's sp (memo_walk's docs).
        acc |= unsafe { load(term.at) };
    }
    acc
}

/// Copies `src` to `dst` (as many words as the shorter holds): a loop for
/// the few words of a shallow stack, `memcpy` for more.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
fn copy_words(dst: &mut [u64], src: &[u64]) {
    let n = dst.len().min(src.len());
    if n <= 8 {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = *s;
        }
    } else {
        // SAFETY: both hold at least `n` words, and a `&mut` and a `&`
        // slice never overlap.
        unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr(), n) };
    }
}

/// The checks of the steps from `f[lo..=hi]` (`lo >= 1`).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
fn checks_of<'a>(ck: &'a [Check], ck_end: &[u8], lo: usize, hi: usize) -> &'a [Check] {
    let a = ck_end
        .get(lo.wrapping_sub(1))
        .map_or(0, |&e| usize::from(e));
    let b = ck_end.get(hi).map_or(0, |&e| usize::from(e));
    ck.get(a..b).unwrap_or_default()
}

/// Recomputes `dep`, `lim`, the checks and the addresses of
/// `f[from..len]` from their outer neighbours (`term` for `f[0]`); the
/// frames below `from` are left as they are.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn fix(
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
fn walk_to_match<const LAZY: bool>(
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

/// A compact step from `cur` with its rule from the thread's cache (a
/// miss out of line, `hits` counts the hits): the caller's frame, the
/// step's kind and the rbp slot it read.
///
/// # Safety
/// As [`compact_step`]: `cur.sp` 8-byte aligned, within the fence (`lo <=
/// sp <= hi`).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
unsafe fn cached_step(
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

/// The rbp of `f[low]` in this walk, whose `n` new frames (in the
/// scratch `s`, from a first frame with rbp `bp0`) reached `f[j]` and
/// whose steps from `f[j]` down to `f[low + 1]` hold: read by the
/// outermost of those steps that read rbp (`S_SLOT`, `S_FP`: at its
/// slot), else passed through from the walk's rbp at `f[j]` (the one its
/// last step gave). One read, where a frame's rbp in the memo may be
/// stale (a match ignores it where no step further out uses it).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
fn rbp_at(f: &[MFrame; CAP], s: &[MFrame; CAP], low: usize, j: usize, n: usize, bp0: u64) -> u64 {
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
/// the cache written. Out of line: rare (2,992 of a python deep-stack
/// run's captures, all in its first rounds).
// Must not allocate, lock, make a system call or panic: runs inside malloc.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn resume(
    memo: &mut WalkMemo,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    hi: u64,
    out: &mut [u64],
    n: usize,
    j: usize,
    bp0: u64,
) -> Option<MemoWalk> {
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
fn rewrite(
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
fn window(memo: &mut WalkMemo, out: &mut [u64], n: usize, j: usize, lim: u32) -> Option<MemoWalk> {
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

/// [`walk_to_match`]'s steps: from `cur`, compact steps (each frame to
/// `out` and to the scratch) until a frame equals a memo frame whose walk
/// can be re-checked; `(n, j)`: `n` frames stepped, the next equals
/// `f[j]`. `None` as `walk_to_match` says. `hits`: rule-cache hits.
// Must not allocate, lock, make a system call or panic: runs inside malloc.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
fn steps_to_match(
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
/// stack (about 48 instructions a frame; 40 here).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(never)]
fn append(
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
fn note_step(x: &mut MFrame, rec: &Rec) {
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
fn frame_of(r: &Regs, kind: u8) -> MFrame {
    MFrame {
        ra: r.pc,
        sp: r.sp,
        bp: r.bp,
        slot: 0,
        flags: u32::from(r.ip) | u32::from(kind) << 1,
        lim: NO_LIM,
    }
}

#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
mod tests {
    use super::*;
    use crate::modules::Modules;

    /// A memo of a two-frame walk (`work`, then a frame whose end-of-stack
    /// rule ends it, as `set_walk_end` makes the shim's thread trampoline),
    /// over the words of `stack`.
    fn two_frame_memo(stack: &[u64; 4], unwinder: &DwarfUnwinder, fence: &Fence) -> WalkMemo {
        let base = stack.as_ptr() as u64;
        let mut memo = WalkMemo::new();
        // `work` at base: an rsp-based step that read its return address
        // at base + 8 (stack[1]); the trampoline's frame at base + 16,
        // ended by a rule (nothing read).
        memo.f[0] = MFrame {
            ra: stack[1],
            sp: base + 16,
            bp: 7,
            flags: u32::from(S_OPAQUE) << 1,
            ..NO_FRAME
        };
        memo.f[1] = MFrame {
            ra: 0x2222,
            sp: base,
            bp: 5,
            flags: u32::from(S_SLOT) << 1,
            slot: base,
            ..NO_FRAME
        };
        let term = Term {
            ok: true,
            at: 0,
            dep: false,
        };
        fix(
            &mut memo.f[..2],
            &mut memo.ck,
            &mut memo.ck_end,
            &mut memo.ra_rev,
            0,
            term,
        );
        memo.len = 2;
        memo.kept0 = true;
        memo.truncated = false;
        memo.term = term;
        memo.unwinder = unwinder.id;
        memo.hi = fence.hi;
        memo
    }

    /// Appending new frames after a kept prefix leaves the memo exactly as
    /// recomputing every frame with `fix` does (flags, limits, checks and
    /// addresses), for every mix of compact step kinds and rbp
    /// dependencies (the new frames are compact steps, as `walk_to_match`
    /// takes them).
    #[test]
    fn append_equals_fix_from_the_start() {
        let mut tried = 0;
        let kinds = [S_PASS, S_SLOT, S_FP, S_OPAQUE];
        let terms = [
            Term {
                ok: true,
                at: 0,
                dep: false,
            },
            Term {
                ok: true,
                at: 0x7000,
                dep: true,
            },
            Term::default(),
        ];
        for seed in 0u32..400 {
            let len = 2 + (seed % 11) as usize;
            let frames: Vec<MFrame> = (0..len)
                .map(|i| {
                    let k = kinds[((seed >> (i % 5)) as usize + i * 3) % 4];
                    MFrame {
                        ra: 0x1000 + i as u64 * 16 + u64::from(seed),
                        sp: 0x9000 - i as u64 * 64,
                        bp: 0x5000 + i as u64,
                        slot: 0x9000 - i as u64 * 64 - 16,
                        flags: u32::from(i % 7 == 3) | u32::from(k) << 1,
                        lim: NO_LIM,
                    }
                })
                .collect();
            let term = terms[(seed % 3) as usize];
            for j in 0..len - 1 {
                let mut a = WalkMemo::new();
                a.f[..len].copy_from_slice(&frames);
                fix(
                    &mut a.f[..len],
                    &mut a.ck,
                    &mut a.ck_end,
                    &mut a.ra_rev,
                    0,
                    term,
                );
                let mut b = WalkMemo::new();
                b.f[..=j].copy_from_slice(&frames[..=j]);
                fix(
                    &mut b.f[..=j],
                    &mut b.ck,
                    &mut b.ck_end,
                    &mut b.ra_rev,
                    0,
                    term,
                );
                let new: Vec<MFrame> = frames[j + 1..].iter().rev().copied().collect();
                if new.iter().any(|me| kind_of(me) == S_OPAQUE) {
                    continue;
                }
                tried += 1;
                assert!(append(
                    &mut b.f,
                    &mut b.ck,
                    &mut b.ck_end,
                    &mut b.ra_rev,
                    j,
                    &new
                ));
                for i in 0..len {
                    let (x, y) = (a.f[i], b.f[i]);
                    assert_eq!(
                        (x.ra, x.sp, x.bp, x.slot, x.flags, x.lim),
                        (y.ra, y.sp, y.bp, y.slot, y.flags, y.lim),
                        "seed {seed} j {j} frame {i}"
                    );
                    assert_eq!(a.ck_end[i], b.ck_end[i], "seed {seed} j {j} frame {i}");
                    assert_eq!(a.ra_rev[CAP - 1 - i], b.ra_rev[CAP - 1 - i]);
                }
                let n = usize::from(a.ck_end[len - 1]);
                for c in 0..n {
                    assert_eq!(
                        (a.ck[c].at, a.ck[c].want),
                        (b.ck[c].at, b.ck[c].want),
                        "seed {seed} j {j} check {c}"
                    );
                }
            }
        }
        assert!(tried > 100, "{tried} cases");
    }

    #[test]
    fn the_same_two_frame_state_again_takes_no_step() {
        let mut stack = [5u64, 0x1111, 0, 0];
        let base = stack.as_ptr() as u64;
        // SAFETY: nothing is unloaded while it is in use.
        let unwinder = unsafe { DwarfUnwinder::from_modules_without_tables(&Modules::snapshot()) };
        let fence = Fence {
            lo: base,
            hi: base + 32,
        };
        let mut memo = two_frame_memo(&stack, &unwinder, &fence);
        let mut cache = DwarfCache::new();
        let mut out = [0u64; 64];
        // rbp differs: the step from `work` read its rbp, it does not use it.
        let cur = Regs {
            pc: 0x2222,
            sp: base,
            bp: 9,
            ip: false,
        };
        for _ in 0..3 {
            out.fill(0);
            let w = walk::<false>(cur, &fence, &unwinder, &mut cache, &mut memo, &mut out);
            assert_eq!(
                w,
                MemoWalk {
                    len: 2,
                    truncated: false,
                    shared: 2
                }
            );
            assert_eq!(out[..3], [0x2222, 0x1111, 0]);
            assert_eq!(memo.steps_walked(), 0);
            assert_eq!(memo.len, 2);
        }
        // An instruction pointer at the same address is another frame.
        let ip = Regs { ip: true, ..cur };
        let _ = walk::<false>(ip, &fence, &unwinder, &mut cache, &mut memo, &mut out);
        assert!(memo.steps_walked() >= 1);
        // The return address word changed: walked again, not taken.
        let mut memo = two_frame_memo(&stack, &unwinder, &fence);
        stack[1] = 0x3333;
        // (The memo re-reads it volatile.)
        core::hint::black_box(&mut stack);
        let w = walk::<false>(cur, &fence, &unwinder, &mut cache, &mut memo, &mut out);
        assert!(memo.steps_walked() >= 1);
        assert_eq!(out[0], 0x2222);
        assert!(w.len < 2 || out[1] != 0x1111);
        // The depth limit below the memo's length: the general path.
        let mut memo = two_frame_memo(&stack, &unwinder, &fence);
        let w = walk::<false>(cur, &fence, &unwinder, &mut cache, &mut memo, &mut out[..1]);
        assert_eq!((w.len, w.truncated), (1, true));
    }
}
