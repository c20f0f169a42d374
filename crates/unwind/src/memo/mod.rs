//! The memoized walk: a walk that stops at the first frame the previous
//! capture of the same thread is proven to share with it, and takes the
//! rest of that capture after re-reading, branch-free, the stack words its
//! steps read (docs/STACKS.md, "Flat re-validation memo").

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

/// The most inner frames an [`Alt`] holds.
const ALT: usize = 8;

/// Branches a memo keeps ([`Alt`]): with the memo's walk, the last three
/// walks of a loop allocating from three places in turn.
const ALTS: usize = 2;

/// Walks with new frames a branch taken keeps the memo keeping branches
/// for (`WalkMemo::alt_credit`; a new memo starts with it): where none is
/// taken (a Python interpreter's captures, whose inner frames seldom come
/// back as they were), keeping them costs each such walk a copy of its
/// displaced frames for nothing, so the memo then keeps them for
/// `ALTS + 1` walks in a row (enough to find three places in turn) every
/// `ALT_PROBE`-th walk only.
const ALT_CREDIT: u32 = 4;
const ALT_PROBE: u32 = 32;

/// A branch: the inner frames of an earlier walk of the memo, innermost
/// first, exactly as the memo held them (state, kind, slot, `F_DEP`),
/// called from the memo's frame `f[j]`. Kept when a walk displaced them
/// (appending its own inner frames after `f[j]` or further out: a loop
/// allocating from two or three places in turn, a key then a value).
/// While `f[..=j]`, their checks and the ending stay as they were, `f[..=j]`
/// with the branch is a memo of that earlier walk, as valid as the memo:
/// its checks are those `append` computes from the frames (the
/// return-address slot of each frame's caller, and its rbp slot where the
/// caller's `F_DEP` says so), so they are not kept. A walk that replaces
/// `f[j' + 1..]` for `j' < j` moves the branch onto `f[j']`, taking the
/// memo's frames `f[j' + 1..=j]` into it (forgotten when they do not fit);
/// every other write to the memo's frames forgets every branch. The next
/// walk in the state of a branch's innermost frame takes it
/// ([`take_alt`](walk::take_alt)) after its checks and the memo's from
/// `f[j]` outward, and the memo's inner frames become a branch in its
/// place.
#[derive(Clone, Copy, Debug)]
struct Alt {
    /// The frames, innermost first (at `f[j + m]`, ..., `f[j + 1]` of the
    /// memo they belong to).
    f: [MFrame; ALT],
    /// Frames held (0: none).
    m: usize,
    /// The memo frame they were called from.
    j: usize,
    /// The [`WalkMemo::tag`] of the walk they belong to.
    tag: u64,
}

const NO_ALT: Alt = Alt {
    f: [NO_FRAME; ALT],
    m: 0,
    j: 0,
    tag: 0,
};

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
/// Fixed size (about 9 KiB: [`MEMO_DEPTH`] frames of the previous walk,
/// outermost first, the flat list of the words their steps read, their
/// addresses in the order a capture writes them, as many frames of
/// scratch for the frames a walk finds new, and a few inner frames of two
/// earlier walks, the branches), no heap. Owned by one thread and passed `&mut` to
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
    /// The inner frames of earlier walks that later ones displaced.
    alts: [Alt; ALTS],
    /// The branch the next displaced frames go to when none is free.
    alt_next: usize,
    /// How many more walks with new frames keep their displaced frames as
    /// a branch ([`ALT_CREDIT`] after a branch taken); at 0, only
    /// `ALTS + 1` in a row every [`ALT_PROBE`]-th (`alt_probe` counts
    /// them).
    alt_credit: u32,
    alt_probe: u32,
    /// The last capture took a branch ([`WalkMemo::took_alt`]).
    took_alt: bool,
    /// The caller's word for the memo's walk ([`WalkMemo::tag`]).
    tag: u64,
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
            alts: [NO_ALT; ALTS],
            alt_next: 0,
            alt_credit: ALT_CREDIT,
            alt_probe: 0,
            took_alt: false,
            tag: 0,
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
        self.forget_alts();
        self.tag = 0;
    }

    /// Forgets every branch ([`Alt`]).
    pub(crate) fn forget_alts(&mut self) {
        for a in &mut self.alts {
            a.m = 0;
        }
    }

    /// The last memoized capture with this memo was, frame for frame
    /// and with its ending, an earlier capture whose inner frames the memo
    /// kept aside (a loop allocating from two or three places in turn):
    /// its stack is that capture's. False after any other capture.
    pub fn took_alt(&self) -> bool {
        self.took_alt
    }

    /// The word the caller attached to the memo's walk with
    /// [`set_tag`](Self::set_tag) (say, the ID it gave that walk's stack),
    /// 0 when none. It stays while the memo's walk is proven the same (a
    /// capture that takes the whole memo) and moves with the inner frames
    /// of a branch: after a capture that [`took_alt`](Self::took_alt),
    /// it is the word given to that earlier walk. Any other capture (a walk
    /// with new or changed frames) and [`clear`](Self::clear) make it 0.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// Attaches `tag` to the memo's walk, the last capture's (see
    /// [`tag`](Self::tag)).
    pub fn set_tag(&mut self, tag: u64) {
        self.tag = tag;
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

    /// Forgets that the last capture left addresses unwritten and that it
    /// took a branch (a capture that returns before walking does
    /// neither).
    pub(crate) fn clear_unfilled(&mut self) {
        self.unfilled = 0;
        self.took_alt = false;
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

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod extend;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod full;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod resume;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod walk;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) use full::memo_walk;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) use walk::walk;

#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
mod tests {
    use super::extend::append;
    use super::full::fix;
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
