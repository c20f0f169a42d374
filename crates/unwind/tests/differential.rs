//! Differential tests of the walks that start in the program's frame: the
//! memoized walk (`capture_from`) equals the full compact walk
//! (`capture_from_compact`), which equals the framehop walk
//! (`capture_from_framehop`), frame for frame, with the same truncation;
//! `shared` is sound against the previous capture of the same memo.
//!
//! The captures start as the shim's naked malloc entry starts them: `entry`
//! (below) hands `[rsp]`, `rsp + 8` and `rbp` to a body that captures.

mod common;

use core::ffi::c_void;
use std::sync::atomic::{AtomicPtr, Ordering};

use alloctrace_unwind::{
    capture_dwarf, capture_from, capture_from_compact, capture_from_framehop, capture_from_lazy,
    capture_here, DwarfCache, DwarfUnwinder, MemoWalk, Modules, StackBounds, StartRegs, Walk,
    WalkMemo, MEMO_DEPTH,
};
use common::*;

/// A naked entry, as the shim's malloc: calls `body(ctx, [rsp], rsp + 8,
/// rbp)` by a tail jump, leaving no frame of its own.
#[unsafe(naked)]
extern "sysv64" fn entry(_ctx: *mut c_void) {
    core::arch::naked_asm!(
        "mov rsi, [rsp]",
        "lea rdx, [rsp + 8]",
        "mov rcx, rbp",
        "jmp {body}",
        body = sym body,
    )
}

extern "sysv64" fn body(ctx: *mut c_void, ra: u64, sp: u64, bp: u64) {
    // SAFETY: ctx is the `&mut &mut dyn FnMut` `at_entry` passes.
    let f = unsafe { &mut *ctx.cast::<&mut dyn FnMut(StartRegs)>() };
    f(StartRegs { ra, sp, bp });
}

/// Calls `f` with the registers of this function's frame as a naked
/// malloc entry called from here would see them.
#[inline(never)]
fn at_entry(mut f: &mut dyn FnMut(StartRegs)) {
    entry((&mut f as *mut &mut dyn FnMut(StartRegs)).cast());
    std::hint::black_box(());
}

/// One thread's walking state and the previous memoized capture.
struct Cx {
    bounds: StackBounds,
    unwinder: DwarfUnwinder,
    cache: DwarfCache,
    memo: Box<WalkMemo>,
    prev: Option<(Vec<u64>, bool)>,
    /// Captures, frames, shared frames, captures whose memo took frames;
    /// of consecutive captures not truncated: the outermost addresses they
    /// have in common, and `shared`; lazy captures that left addresses
    /// unwritten.
    stats: [usize; 8],
}

impl Cx {
    /// Boxed: the walks over hand-built stacks may read anywhere above
    /// them, and the state the walks change must not be there.
    fn new() -> Box<Cx> {
        Box::new(Cx {
            bounds: StackBounds::current().expect("stack bounds"),
            // SAFETY: the tests unload nothing while it is in use.
            unwinder: unsafe { DwarfUnwinder::from_modules(&Modules::snapshot()) },
            cache: DwarfCache::new(),
            memo: Box::new(WalkMemo::new()),
            prev: None,
            stats: [0; 8],
        })
    }

    /// The three walks from `start` with depth limit `depth`: checks they
    /// agree and that `shared` is sound; returns the memoized one. Every
    /// other capture is the lazy one, its unwritten addresses filled in
    /// from the memo before the comparison.
    fn check(&mut self, start: StartRegs, depth: usize) -> (Vec<u64>, MemoWalk) {
        const UNWRITTEN: u64 = 0xdead_beef;
        let (mut a, mut b, mut c) = (vec![UNWRITTEN; depth], vec![0u64; depth], vec![0u64; depth]);
        let lazy = self.stats[0] % 2 == 1;
        let (bounds, unwinder) = (&self.bounds, &self.unwinder);
        let (cache, memo) = (&mut self.cache, &mut self.memo);
        let wm = if lazy {
            capture_from_lazy(start, bounds, unwinder, cache, memo, &mut a)
        } else {
            capture_from(start, bounds, unwinder, cache, memo, &mut a)
        };
        let unfilled = self.memo.unfilled();
        assert!(
            unfilled == 0 || lazy,
            "only a lazy capture leaves addresses"
        );
        assert!(unfilled <= wm.len);
        if unfilled > 0 {
            let outermost = self.memo.outermost();
            assert!(a[wm.len - unfilled..wm.len].iter().all(|&w| w == UNWRITTEN));
            self.memo.fill(&mut a, wm.len);
            assert_eq!(self.memo.unfilled(), 0);
            assert_eq!(outermost, a.get(wm.len - 1).copied());
            self.stats[6] += 1;
        }
        let wc = capture_from_compact(start, &self.bounds, &self.unwinder, &mut self.cache, &mut b);
        let wf =
            capture_from_framehop(start, &self.bounds, &self.unwinder, &mut self.cache, &mut c);
        a.truncate(wm.len);
        b.truncate(wc.len);
        c.truncate(wf.len);
        assert_eq!(
            (wc.len, wc.truncated),
            (wf.len, wf.truncated),
            "compact and framehop: {start:x?}"
        );
        assert_eq!(b, c, "compact and framehop: {start:x?}");
        assert_eq!(
            (wm.len, wm.truncated),
            (wc.len, wc.truncated),
            "memo and compact: {start:x?}"
        );
        assert_eq!(a, b, "memo and compact: {start:x?}");
        assert!(wm.shared <= wm.len);
        if wm.shared > 0 {
            let (prev, prev_truncated) = self.prev.as_ref().expect("a previous capture");
            assert!(wm.shared <= prev.len());
            assert_eq!(a[a.len() - wm.shared..], prev[prev.len() - wm.shared..]);
            assert_eq!(*prev_truncated, wm.truncated);
        }
        self.stats[0] += 1;
        self.stats[1] += wm.len;
        self.stats[2] += wm.shared;
        if (self.memo.steps_walked() as usize) < wm.len {
            self.stats[3] += 1;
        }
        if self.memo.took_alt() {
            self.stats[7] += 1;
        }
        if !wm.truncated {
            if let Some((prev, false)) = &self.prev {
                let common = prev
                    .iter()
                    .rev()
                    .zip(a.iter().rev())
                    .take_while(|(x, y)| x == y)
                    .count();
                self.stats[4] += common;
                self.stats[5] += wm.shared;
            }
        }
        self.prev = Some((a.clone(), wm.truncated));
        (a, wm)
    }
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) % n.max(1)
    }
}

/// Inner frames: `depth` levels of two kinds by the bits of `pattern`,
/// then the capture at a naked entry.
#[inline(never)]
fn inner(pattern: u32, depth: u32, f: &mut dyn FnMut(StartRegs)) {
    if depth == 0 {
        at_entry(f)
    } else if pattern & 1 == 0 {
        inner_small(pattern >> 1, depth - 1, f)
    } else {
        inner_big(pattern >> 1, depth - 1, f)
    }
    std::hint::black_box(());
}

#[inline(never)]
fn inner_small(pattern: u32, depth: u32, f: &mut dyn FnMut(StartRegs)) {
    inner(pattern, depth, f);
    std::hint::black_box(1u8);
}

#[inline(never)]
fn inner_big(pattern: u32, depth: u32, f: &mut dyn FnMut(StartRegs)) {
    // A larger frame, with words the walk must not mistake for anything.
    let pad = std::hint::black_box([pattern as u64; 6]);
    inner(pattern, depth, f);
    std::hint::black_box(pad);
}

/// Runs `f` at the end of outer chain `chain` (C frames with and without
/// frame pointers, an rbp-based CFA, rbp passed through).
fn outer(chain: u64, a: i32, f: &mut dyn FnMut()) {
    match chain {
        // SAFETY: the chain calls the callback once, with ctx.
        0 => through_c(f, |cb, ctx| unsafe { unwt_fp_level(a, cb, ctx) }),
        // SAFETY: as above.
        1 => through_c(f, |cb, ctx| unsafe { unwt_nofp_level(a, cb, ctx) }),
        // SAFETY: as above.
        2 => through_c(f, |cb, ctx| unsafe { unwt_fp_mixed(a, 3, cb, ctx) }),
        // SAFETY: as above; rbp is restored.
        3 => through_c(f, |cb, ctx| unsafe {
            unwt_rbp_levels(0x1000 + 8 * a as u64, a, cb, ctx)
        }),
        // SAFETY: as above (a null record: the frame's own).
        _ => through_c(f, |cb, ctx| unsafe {
            unwt_bp_cfa_levels(std::ptr::null(), a, cb, ctx)
        }),
    }
}

extern "C" {
    fn unwt_rbp_levels(value: u64, n: i32, cb: Cb, ctx: *mut c_void);
    fn unwt_bp_cfa_levels(rec: *const u64, n: i32, cb: Cb, ctx: *mut c_void);
}

#[test]
fn memo_equals_compact_equals_framehop_over_alternating_inner_paths() {
    let mut cx = Cx::new();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for round in 0..60 {
        let chain = rng.below(5);
        let a = rng.below(12) as i32;
        // One depth limit per round but for a few captures.
        let limit = [8, 30, 64, MEMO_DEPTH, 200][rng.below(5) as usize];
        let seeds: Vec<(u32, u32, usize)> = (0..40)
            .map(|_| {
                let depth = 1 + rng.below(16) as u32;
                let pattern = rng.below(1 << 16) as u32;
                let limit = if rng.below(8) == 0 { 16 } else { limit };
                (pattern, depth, limit)
            })
            .collect();
        outer(chain, a, &mut || {
            for &(pattern, depth, limit) in &seeds {
                inner(pattern, depth, &mut |start| {
                    cx.check(start, limit);
                });
            }
        });
        let _ = round;
    }
    let [n, frames, shared, took, whole, whole_shared, lazy, alt] = cx.stats;
    println!("{n} captures, {frames} frames, {shared} shared, {took} took frames from the memo; untruncated pairs: {whole} common, {whole_shared} shared; {lazy} lazy; {alt} from a branch");
    // Half the captures are lazy: many of them take addresses from the
    // memo without writing them.
    assert!(lazy * 8 > n, "{:?}", cx.stats);
    // What consecutive untruncated captures have in common is found (a
    // truncated walk's outermost frames move with its inner depth).
    assert!(whole_shared * 10 >= whole * 9, "{:?}", cx.stats);
    assert!(took * 2 > n, "{:?}", cx.stats);
}

#[test]
fn recursions_crossing_the_depth_limit_walk_as_the_full_walks() {
    // Captures deeper and shallower than the limit in turn, under the
    // same outer frames: the memo's windows, and walks that come back up
    // past its frame beyond the limit (out to the end of the stack, or to
    // the limit again further out), each equal to the full walks.
    let mut cx = Cx::new();
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for round in 0..24 {
        let chain = rng.below(5);
        let a = rng.below(6) as i32;
        let limit = [24, 40, 56][round % 3];
        let seeds: Vec<(u32, u32)> = (0..60)
            .map(|_| (rng.below(1 << 16) as u32, rng.below(36) as u32))
            .collect();
        outer(chain, a, &mut || {
            for &(pattern, depth) in &seeds {
                inner(pattern, depth, &mut |start| {
                    cx.check(start, limit);
                });
            }
        });
    }
    let [n, frames, shared, took, ..] = cx.stats;
    println!("{n} captures, {frames} frames, {shared} shared, {took} took frames from the memo");
    // The memo's paths ran: many captures took frames from it (about two
    // in three in a release build, fewer in a debug build, whose deeper
    // frames bring more captures to the limit).
    assert!(took * 3 > n, "{:?}", cx.stats);
}

#[test]
fn the_same_leaf_from_different_callers_is_not_taken() {
    // Y and Z call X with equal frames: X's frames match under Z at the
    // same addresses with the same return addresses; only the word above
    // (the return address into Y or Z) differs.
    for chain in 0..2 {
        let mut cx = Cx::new();
        let mut seen: Vec<(Vec<u64>, MemoWalk)> = Vec::new();
        let mut f = || at_entry(&mut |start| seen.push(cx.check(start, 64)));
        if chain == 0 {
            // SAFETY: calls the callback twice, with ctx.
            through_c(&mut f, |cb, ctx| unsafe { unwt_y_then_z(cb, ctx) });
        } else {
            // SAFETY: as above.
            through_c(&mut f, |cb, ctx| unsafe { unwt_nofp_y_then_z(cb, ctx) });
        }
        assert_eq!(seen.len(), 2);
        let names = |v: &[u64]| v.iter().map(|&a| symbol(a)).collect::<Vec<_>>();
        let (ny, nz) = (names(&seen[0].0), names(&seen[1].0));
        let (y, z) = [
            ("unwt_yz_y", "unwt_yz_z"),
            ("unwt_nofp_yz_y", "unwt_nofp_yz_z"),
        ][chain];
        assert!(
            ny.iter().any(|n| n == y) && !ny.iter().any(|n| n == z),
            "{ny:?}"
        );
        assert!(
            nz.iter().any(|n| n == z) && !nz.iter().any(|n| n == y),
            "{nz:?}"
        );
        let x = ny.iter().position(|n| n == y).unwrap();
        // The trap is set: the same addresses up to X's caller.
        assert_eq!(seen[0].0[..x], seen[1].0[..x]);
        // Shared: the frames above Y/Z only.
        let common = seen[0]
            .0
            .iter()
            .rev()
            .zip(seen[1].0.iter().rev())
            .take_while(|(a, b)| a == b)
            .count();
        assert!(common < seen[1].0.len() - x);
        assert_eq!(seen[1].1.shared, common);
    }
}

struct SigState {
    cx: Box<Cx>,
    seen: Vec<(Vec<u64>, MemoWalk)>,
}

static SIG: AtomicPtr<SigState> = AtomicPtr::new(core::ptr::null_mut());

extern "C" fn handler(_: libc::c_int) {
    // SAFETY: the test sets SIG before raising and reads the state only
    // after raise returns, on this thread.
    let s = unsafe { &mut *SIG.load(Ordering::SeqCst) };
    at_entry(&mut |start| {
        let r = s.cx.check(start, 128);
        s.seen.push(r);
    });
}

#[inline(never)]
fn raise_here(k: u8) {
    // SAFETY: raising a signal whose handler is installed.
    unsafe { libc::raise(libc::SIGUSR1) };
    std::hint::black_box(k);
}

#[test]
fn across_a_signal_frame() {
    let mut state = Box::new(SigState {
        cx: Cx::new(),
        seen: Vec::new(),
    });
    SIG.store(&mut *state, Ordering::SeqCst);
    // SAFETY: a plain handler for SIGUSR1, used by no other test here.
    unsafe { libc::signal(libc::SIGUSR1, handler as *const () as libc::sighandler_t) };
    // Opaque to the optimiser: an unrolled loop would make several sites.
    for &k in std::hint::black_box(&[0u8, 0, 1, 0, 1, 1]) {
        inner(k as u32 * 5, 1 + k as u32, &mut |_| raise_here(k));
    }
    let seen = &state.seen;
    assert_eq!(seen.len(), 6);
    let names: Vec<String> = seen[0].0.iter().map(|&a| symbol(a)).collect();
    assert!(
        names.iter().any(|n| n == "differential::raise_here"),
        "{names:?}"
    );
    assert!(!seen[0].1.truncated);
    // The same raise again: `shared` is everything the two stacks have in
    // common, through the signal frame (check() proved the frames).
    let common = seen[0]
        .0
        .iter()
        .rev()
        .zip(seen[1].0.iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    assert!(seen[1].1.shared > 0);
    assert_eq!(
        seen[1].1.shared, common,
        "{:x?} {:x?}",
        seen[0].0, seen[1].0
    );
}

/// Return addresses with known rules, found in real walks: a frame-pointer
/// frame's (-O0), a frame's without frame pointers (-O2), and the outermost
/// frame's of this thread (its step ends the walk).
struct Known {
    fp: u64,
    nofp: u64,
    end: u64,
    /// The CFA offset of `nofp`'s frame, in words.
    k: u64,
}

fn known(cx: &mut Cx) -> Known {
    let mut out = vec![0u64; 256];
    let mut w = Walk::default();
    through_c(
        || w = capture_dwarf(0, &cx.bounds, &cx.unwinder, &mut cx.cache, &mut out),
        // SAFETY: calls the callback once, with ctx.
        |cb, ctx| unsafe { unwt_fp_mixed(3, 3, cb, ctx) },
    );
    assert!(!w.truncated);
    let out = &out[..w.len];
    let find = |name: &str| {
        let v: Vec<u64> = out.iter().copied().filter(|&a| symbol(a) == name).collect();
        // The recursive call's return address (it repeats).
        *v.iter()
            .find(|&&a| v.iter().filter(|&&b| b == a).count() > 1)
            .unwrap()
    };
    let (fp, nofp, end) = (
        find("unwt_fp_mixed"),
        find("unwt_nofp_level"),
        out[w.len - 1],
    );
    // The frame size of `nofp`: where its step reads the return address.
    let mut words = [0u64; 32];
    let base = words.as_mut_ptr() as u64;
    let mut k = 0;
    for i in 0..16 {
        words.fill(0);
        words[i] = end;
        std::hint::black_box(&mut words);
        let mut o = [0u64; 4];
        let start = StartRegs {
            ra: nofp,
            sp: base,
            bp: 0,
        };
        if capture_from_compact(start, &cx.bounds, &cx.unwinder, &mut cx.cache, &mut o).len == 2 {
            k = i as u64 + 1;
            break;
        }
    }
    assert!(k > 0);
    Known { fp, nofp, end, k }
}

const WORDS: usize = 384;

/// Builds a synthetic stack in `words` (at address `base`): a chain of
/// frames of the known kinds, frame-pointer frames' records chained, then
/// an ending (the outermost frame, a zero return address or garbage).
fn build(rng: &mut Rng, kn: &Known, words: &mut [u64; WORDS], base: u64) -> StartRegs {
    words.fill(0);
    for w in words.iter_mut() {
        if rng.below(4) == 0 {
            *w = rng.below(1 << 40);
        }
    }
    let at = |i: usize| base + 8 * i as u64;
    let mut sp = rng.below(4) as usize;
    let sp0 = sp;
    // Where the current rbp value is decided: the start (None) or a slot.
    let mut bp_src: Option<usize> = None;
    let mut start_bp = rng.below(1 << 40);
    let pick = |rng: &mut Rng| if rng.below(2) == 0 { kn.fp } else { kn.nofp };
    let mut pc = pick(rng);
    let start_ra = pc;
    let frames = 1 + rng.below(40);
    for f in 0..frames {
        let (ra_slot, new_sp) = if pc == kn.nofp {
            (sp + kn.k as usize - 1, sp + kn.k as usize)
        } else {
            let bp = sp + rng.below(3) as usize;
            match bp_src {
                None => start_bp = at(bp),
                Some(i) => words[i] = at(bp),
            }
            bp_src = Some(bp);
            (bp + 1, bp + 2)
        };
        if new_sp + 8 >= WORDS {
            break;
        }
        let last = f + 1 == frames;
        let next = if last {
            [kn.end, 0, rng.below(1 << 40)][rng.below(3) as usize]
        } else {
            pick(rng)
        };
        words[ra_slot] = next;
        sp = new_sp;
        pc = next;
        if last {
            break;
        }
    }
    // The last rbp: 0, garbage, or a word of the stack.
    let v = [0, rng.below(1 << 40), at(rng.below(WORDS as u64) as usize)][rng.below(3) as usize];
    match bp_src {
        None => start_bp = v,
        Some(i) => words[i] = v,
    }
    StartRegs {
        ra: start_ra,
        sp: at(sp0),
        bp: start_bp,
    }
}

/// The state of the frame a compact step from `start` (a frame of `kn`'s
/// kinds on the hand-built stack `local`, at `base`) returns to, as the
/// words now hold it; `None` where that step would not return a frame.
fn caller_of(start: StartRegs, kn: &Known, local: &[u64; WORDS], base: u64) -> Option<StartRegs> {
    let word = |at: u64| {
        let i = at.checked_sub(base)? / 8;
        at.is_multiple_of(8).then_some(())?;
        local.get(i as usize).copied()
    };
    let next = if start.ra == kn.nofp {
        let sp = start.sp + 8 * kn.k;
        StartRegs {
            ra: word(sp - 8)?,
            sp,
            bp: start.bp,
        }
    } else if start.ra == kn.fp && start.bp >= start.sp {
        StartRegs {
            ra: word(start.bp + 8)?,
            sp: start.bp + 16,
            bp: word(start.bp)?,
        }
    } else {
        return None;
    };
    (next.ra != 0 && next.ra != kn.end && word(next.sp).is_some()).then_some(next)
}

/// Captures over a hand-built stack changed a word (or the start) at a
/// time between captures (each time from the start and then from as many
/// of its callers' frames as `sites` says, call sites in turn): every
/// capture's memoized walk must equal the full ones; the stats.
fn mutated_synthetic_stacks(sites: usize) -> [usize; 8] {
    let mut cx = Cx::new();
    let kn = known(&mut cx);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut words = Box::new([0u64; WORDS]);
    // The stack words live on this thread's stack (the walks read only
    // there): in this frame, above the captures'.
    let mut local = [0u64; WORDS];
    let base = local.as_mut_ptr() as u64;
    let mut start = StartRegs::default();
    let mut depth = 64;
    for i in 0..4000 {
        let what = if i == 0 { 0 } else { rng.below(10) };
        match what {
            0 => {
                start = build(&mut rng, &kn, &mut words, base);
                depth = [4, 16, 64, MEMO_DEPTH, 100][rng.below(5) as usize];
            }
            1 => {
                start.bp = [0, base + 8 * rng.below(WORDS as u64), rng.below(1 << 40)]
                    [rng.below(3) as usize]
            }
            2 => depth = [4, 16, 64, MEMO_DEPTH, 100][rng.below(5) as usize],
            _ => {
                let j = rng.below(WORDS as u64) as usize;
                words[j] = [
                    kn.fp,
                    kn.nofp,
                    kn.end,
                    0,
                    base + 8 * rng.below(WORDS as u64),
                    rng.below(1 << 40),
                    words[j] ^ 8,
                ][rng.below(7) as usize];
            }
        }
        local.copy_from_slice(&words[..]);
        std::hint::black_box(&mut local);
        cx.check(start, depth);
        let mut from = start;
        for _ in 1..sites {
            let Some(caller) = caller_of(from, &kn, &local, base) else {
                break;
            };
            cx.check(caller, depth);
            from = caller;
        }
    }
    cx.stats
}

#[test]
fn memo_over_mutated_synthetic_stacks() {
    // Frames of known kinds on a hand-built stack, changed a word (or the
    // start) at a time between captures: every capture's memoized walk must
    // equal the full ones, whatever changed (a return address, a saved
    // rbp, the word an ending read, rbp at the start).
    let stats = mutated_synthetic_stacks(1);
    let [n, frames, shared, took, .., lazy, alt] = stats;
    println!("{n} captures, {frames} frames, {shared} shared, {took} took frames from the memo, {lazy} lazy, {alt} from a branch");
    assert!(frames > 4 * n, "{stats:?}");
    assert!(took * 4 > n, "{stats:?}");
    assert!(lazy > 0, "{stats:?}");
}

#[test]
fn memo_over_mutated_synthetic_stacks_from_two_frames_in_turn() {
    // The same, capturing each time from the start and from its callers'
    // frames (two or three call sites in turn): a branch of the memo (the
    // inner frames of an earlier capture) is taken only when every word
    // holds.
    for sites in [2, 3] {
        let stats = mutated_synthetic_stacks(sites);
        let [n, frames, shared, took, .., lazy, alt] = stats;
        println!("{sites} sites: {n} captures, {frames} frames, {shared} shared, {took} took frames from the memo, {lazy} lazy, {alt} from a branch");
        assert!(frames > 4 * n, "{stats:?}");
        assert!(alt * 8 > n, "{stats:?}");
    }
}

#[test]
fn compact_rows_equal_framehop_over_the_loaded_objects() {
    // Every rule kind of libc, the loader and this executable: one walk
    // from each sampled address over a stack of pointers into itself,
    // return addresses and garbage, by the compact rows and by framehop.
    let mut cx = Cx::new();
    let kn = known(&mut cx);
    let modules = Modules::snapshot();
    let mut rng = Rng(7);
    // Big enough that the walks (at most 6 steps from its first words)
    // read nothing else, which might change between the two.
    let mut local = [0u64; 16 * 1024];
    let base = local.as_mut_ptr() as u64;
    for (i, w) in local.iter_mut().enumerate() {
        *w = match i % 5 {
            0 => base + 8 * ((i as u64 * 7 + 3) % 64),
            _ if i >= 64 => 0x1234_5678 + i as u64,
            1 => kn.nofp,
            2 => 0,
            3 => kn.fp,
            _ => 0x1234_5678 + i as u64,
        };
    }
    std::hint::black_box(&mut local);
    let mut walks = 0;
    let (mut o1, mut o2) = (vec![0u64; 6], vec![0u64; 6]);
    for m in modules.modules() {
        let path = m.path_lossy();
        if !(path.contains("libc.so") || path.contains("ld-linux") || m.contains(kn.fp)) {
            continue;
        }
        for seg in m.segments.iter().filter(|s| s.flags & 1 != 0) {
            let mut a = seg.start + 1;
            while a < seg.end {
                let start = Box::new(StartRegs {
                    ra: a,
                    sp: base + 8 * rng.below(8),
                    bp: base + 8 * rng.below(64),
                });
                let (w1, w2) = compare(&start, &mut cx, &mut o1, &mut o2);
                assert_eq!(
                    (w1, &o1[..w1.len]),
                    (w2, &o2[..w2.len]),
                    "{start:x?} in {path} ({:#x} from {:#x}, rule {:#x})",
                    a - m.start,
                    m.start,
                    cx.unwinder.compact_rule(a - 1),
                );
                walks += 1;
                a += 1 + rng.below(23);
            }
        }
    }
    let (rows, bytes, _) = cx.unwinder.table_stats();
    println!("{walks} walks compared; {rows} rows ({bytes} bytes) over all modules");
    assert!(walks > 10_000);
}

/// The compact and the framehop walk from `start` (a frame below the
/// stack they read: nothing there changes between the two).
#[inline(never)]
fn compare(start: &StartRegs, cx: &mut Cx, o1: &mut [u64], o2: &mut [u64]) -> (Walk, Walk) {
    let w1 = capture_from_compact(*start, &cx.bounds, &cx.unwinder, &mut cx.cache, o1);
    let w2 = capture_from_framehop(*start, &cx.bounds, &cx.unwinder, &mut cx.cache, o2);
    (w1, w2)
}

#[test]
fn capture_here_skips_the_callers_frames() {
    let mut cx = Cx::new();
    let mut memo = Box::new(WalkMemo::new());
    let mut results = Vec::new();
    through_c(
        || {
            // Opaque to the optimiser: an unrolled loop would make 3 sites.
            for _ in 0..std::hint::black_box(3) {
                results.push(here_and_plain(&mut cx, &mut memo));
            }
        },
        // SAFETY: calls the callback once, with ctx.
        |cb, ctx| unsafe { unwt_fp_mixed(2, 2, cb, ctx) },
    );
    for (out, wm, plain, wp) in &results {
        // skip 1: the first kept address is the caller's caller's, the
        // plain walk's second.
        assert!(wp.len > 5 && !wp.truncated);
        assert_eq!((wm.len, wm.truncated), (wp.len - 1, wp.truncated));
        assert_eq!(out[..wm.len], plain[1..wp.len]);
    }
    assert_eq!(results[2].1.shared, results[2].1.len);
}

/// capture_here(1) (the first address kept: this function's caller's) and
/// capture_dwarf(0) from here.
#[inline(never)]
fn here_and_plain(cx: &mut Cx, memo: &mut WalkMemo) -> (Vec<u64>, MemoWalk, Vec<u64>, Walk) {
    let mut out = vec![0u64; 64];
    let mut plain = vec![0u64; 65];
    let wm = capture_here(1, &cx.bounds, &cx.unwinder, &mut cx.cache, memo, &mut out);
    let wp = capture_dwarf(0, &cx.bounds, &cx.unwinder, &mut cx.cache, &mut plain);
    std::hint::black_box(());
    (out, wm, plain, wp)
}

#[test]
fn sizes_per_thread_fit_the_budget() {
    let cache = core::mem::size_of::<DwarfCache>();
    let memo = core::mem::size_of::<WalkMemo>();
    println!("DwarfCache {cache} bytes (no heap), WalkMemo {memo} bytes (no heap)");
    assert!(cache + memo <= 12 * 1024, "{cache} + {memo}");
}

#[test]
fn an_unwinder_built_reusing_tables_walks_the_same() {
    let mut cx = Cx::new();
    let modules = Modules::snapshot();
    // SAFETY: nothing is unloaded while they are in use.
    let reused = unsafe { DwarfUnwinder::from_modules_reusing(&modules, Some(&cx.unwinder)) };
    assert_eq!(reused.table_stats(), cx.unwinder.table_stats());
    let mut walks = Vec::new();
    through_c(
        || {
            at_entry(&mut |start| {
                let mut a = [0u64; 64];
                let w =
                    capture_from_compact(start, &cx.bounds, &cx.unwinder, &mut cx.cache, &mut a);
                let mut b = [0u64; 64];
                let v = capture_from_compact(start, &cx.bounds, &reused, &mut cx.cache, &mut b);
                walks.push((w, a, v, b));
            })
        },
        // SAFETY: calls the callback once, with ctx.
        |cb, ctx| unsafe { unwt_fp_mixed(2, 2, cb, ctx) },
    );
    let (w, a, v, b) = &walks[0];
    assert!(w.len > 8 && !w.truncated);
    assert_eq!((w, &a[..w.len]), (v, &b[..v.len]));
}
