//! Memoized captures: at every capture point the memoized capture equals
//! the plain one exactly, and `shared` is sound (those outermost addresses
//! are the previous capture's) and as large as expected.

mod common;

use std::sync::atomic::{AtomicPtr, Ordering};

use alloctrace_unwind::{
    capture_dwarf, capture_dwarf_memo, DwarfCache, DwarfUnwinder, MemoWalk, Modules, StackBounds,
    Walk, WalkMemo, MEMO_DEPTH,
};
use common::*;

/// One thread's capture state, a memo, and the previous capture (to check
/// `shared` against).
struct Cx {
    bounds: StackBounds,
    unwinder: DwarfUnwinder,
    cache: DwarfCache,
    memo: Box<WalkMemo>,
    prev: Option<(Vec<u64>, bool)>,
    /// Captures made, frames reported shared, and frames.
    stats: (usize, usize, usize),
    /// For `capture_point0`: its memo, previous capture and the return
    /// address its memoized captures start with.
    memo0: Box<WalkMemo>,
    prev0: Option<(Vec<u64>, bool)>,
    ra0: Option<u64>,
}

impl Cx {
    fn new() -> Cx {
        Cx {
            bounds: StackBounds::current().expect("stack bounds"),
            // SAFETY: the tests load and unload nothing while it is in use.
            unwinder: unsafe { DwarfUnwinder::from_modules(&Modules::snapshot()) },
            cache: DwarfCache::new(),
            memo: Box::new(WalkMemo::new()),
            prev: None,
            stats: (0, 0, 0),
            memo0: Box::new(WalkMemo::new()),
            prev0: None,
            ra0: None,
        }
    }
}

/// What one capture point saw: the memoized capture's addresses, the plain
/// walk and the memoized one.
type Seen = (Vec<u64>, Walk, MemoWalk);

/// One capture point: the plain and the memoized DWARF capture, with the
/// same skip and depth limit, from this one frame; checks they are equal
/// and that `shared` is sound.
#[inline(never)]
fn capture_point(cx: &mut Cx, depth: usize) -> Seen {
    let mut plain = vec![0u64; depth];
    let mut memo_out = vec![0u64; depth];
    let wp = capture_dwarf(1, &cx.bounds, &cx.unwinder, &mut cx.cache, &mut plain);
    let wm = capture_dwarf_memo(
        1,
        &cx.bounds,
        &cx.unwinder,
        &mut cx.cache,
        &mut cx.memo,
        &mut memo_out,
    );
    plain.truncate(wp.len);
    memo_out.truncate(wm.len);
    assert_eq!(
        (wm.len, wm.truncated),
        (wp.len, wp.truncated),
        "memo {wm:?} plain {wp:?}"
    );
    assert_eq!(memo_out, plain);
    // Sound: the shared outermost addresses are the previous capture's,
    // and so is the truncation.
    assert!(wm.shared <= wm.len, "{wm:?}");
    if wm.shared > 0 {
        let (prev, prev_truncated) = cx.prev.as_ref().expect("a previous capture");
        assert!(wm.shared <= prev.len());
        assert_eq!(
            plain[plain.len() - wm.shared..],
            prev[prev.len() - wm.shared..],
            "shared {} of {wm:?}",
            wm.shared
        );
        assert_eq!(*prev_truncated, wm.truncated);
    }
    let s = &mut cx.stats;
    s.0 += 1;
    s.1 += wm.shared;
    s.2 += wm.len;
    cx.prev = Some((plain, wp.truncated));
    (memo_out, wp, wm)
}

/// A capture point for DWARF captures that skip nothing (as the writer's
/// are: the memo then matches the walk's starting state, before any step):
/// the plain and the memoized capture from this frame are equal but for
/// their first address (each call's own return address; the memoized
/// one's is the same at every call); `shared` is sound. Returns the plain
/// capture, the memoized walk and the unwinding steps it took.
#[inline(never)]
fn capture_point0(cx: &mut Cx, depth: usize) -> (Vec<u64>, Walk, MemoWalk, u32) {
    let mut plain = vec![0u64; depth];
    let mut memo_out = vec![0u64; depth];
    let wp = capture_dwarf(0, &cx.bounds, &cx.unwinder, &mut cx.cache, &mut plain);
    let wm = capture_dwarf_memo(
        0,
        &cx.bounds,
        &cx.unwinder,
        &mut cx.cache,
        &mut cx.memo0,
        &mut memo_out,
    );
    plain.truncate(wp.len);
    memo_out.truncate(wm.len);
    assert_eq!(
        (wm.len, wm.truncated),
        (wp.len, wp.truncated),
        "{wm:?} {wp:?}"
    );
    assert_eq!(memo_out.get(1..), plain.get(1..));
    if let Some(&ra) = memo_out.first() {
        let first = *cx.ra0.get_or_insert(ra);
        assert_eq!(ra, first);
    }
    assert!(wm.shared <= wm.len);
    if wm.shared > 0 {
        let (prev, prev_truncated) = cx.prev0.as_ref().expect("a previous capture");
        assert_eq!(
            memo_out[memo_out.len() - wm.shared..],
            prev[prev.len() - wm.shared..]
        );
        assert_eq!(*prev_truncated, wm.truncated);
    }
    cx.prev0 = Some((memo_out, wm.truncated));
    (plain, wp, wm, cx.memo0.steps_walked())
}

/// The longest common outermost run of two captures (an upper bound of
/// `shared`), 0 when their truncation differs.
fn common_suffix(a: &[u64], at: bool, b: &[u64], bt: bool) -> usize {
    if at != bt {
        return 0;
    }
    a.iter()
        .rev()
        .zip(b.iter().rev())
        .take_while(|(x, y)| x == y)
        .count()
}

#[inline(never)]
fn rust_levels(n: u32, f: &mut dyn FnMut()) {
    if n == 0 {
        f()
    } else {
        rust_levels(n - 1, f)
    }
    std::hint::black_box(());
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) % n
    }
}

/// Runs `f` (a capture point) at the end of call chain `chain` with
/// parameters `a`, `b` (chains 4 and 5, Y then Z, run it twice; 6: rbp =
/// a value from `b` through `a` levels; 7: the same under an rbp-based
/// CFA frame whose record is its own or a zero one, by `b`).
fn run_chain(chain: u64, a: i32, b: i32, f: &mut dyn FnMut()) {
    let fp_level = |n: i32, f: &mut dyn FnMut()| {
        // SAFETY: the chain calls the callback once, with ctx.
        through_c(f, |cb, ctx| unsafe { unwt_fp_level(n, cb, ctx) })
    };
    match chain {
        0 => fp_level(a, f),
        // SAFETY: as above.
        1 => through_c(f, |cb, ctx| unsafe { unwt_nofp_level(a, cb, ctx) }),
        // SAFETY: as above.
        2 => through_c(f, |cb, ctx| unsafe { unwt_fp_mixed(a, b, cb, ctx) }),
        3 => rust_levels(a as u32, &mut || fp_level(b, &mut *f)),
        // SAFETY: the chain calls the callback twice, with ctx.
        4 => through_c(f, |cb, ctx| unsafe { unwt_y_then_z(cb, ctx) }),
        // SAFETY: as above.
        5 => through_c(f, |cb, ctx| unsafe { unwt_nofp_y_then_z(cb, ctx) }),
        // SAFETY: the chain calls the callback once, with ctx.
        6 => through_c(f, |cb, ctx| unsafe {
            unwt_rbp_levels(0x1000 + 8 * b as u64, a, cb, ctx)
        }),
        _ => {
            let rec = std::hint::black_box([0u64; 2]);
            let at = if b % 2 == 0 {
                std::ptr::null()
            } else {
                rec.as_ptr()
            };
            // SAFETY: as above; `rec` outlives the call.
            through_c(f, |cb, ctx| unsafe { unwt_bp_cfa_levels(at, a, cb, ctx) })
        }
    }
}

#[test]
fn memo_captures_equal_plain_ones_over_random_call_patterns() {
    let mut cx = Cx::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // (same-site repeats checked, same-chain fp captures checked)
    let mut repeats = 0;
    let mut fp_checked = 0;
    for _ in 0..400 {
        let chain = rng.below(8);
        let (a, b) = (rng.below(40) as i32, rng.below(12) as i32);
        let depth = [4, 16, 30, 64, MEMO_DEPTH][rng.below(5) as usize];
        let times = 1 + rng.below(3);
        // The captures of each call of the callback (Y/Z chains call it twice).
        let mut calls: Vec<Vec<Seen>> = Vec::new();
        run_chain(chain, a, b, &mut || {
            calls.push(
                (0..times)
                    .map(|_| {
                        capture_point0(&mut cx, depth);
                        capture_point(&mut cx, depth)
                    })
                    .collect(),
            );
        });
        // Consecutive captures from one capture point (same stack, same
        // depth limit) share everything: the whole capture is copied.
        for call in &calls {
            for pair in call.windows(2) {
                let (before, after) = (&pair[0], &pair[1]);
                let (_, wp, wm) = after;
                assert_eq!(before.0, after.0);
                assert_eq!(wm.shared, wp.len, "chain {chain} {wm:?}");
                repeats += 1;
            }
        }
    }
    // Frame-pointer C chains: everything the two stacks have in common is
    // found (checked in a second pass with a fixed depth, below).
    for _ in 0..100 {
        let a = rng.below(30) as i32;
        let mut prev: Option<(Vec<u64>, Walk)> = None;
        for delta in [0, 3, -2, 5, 0] {
            let mut seen = None;
            run_chain(0, (a + delta).max(0), 0, &mut || {
                seen = Some(capture_point(&mut cx, 128))
            });
            let (addrs, wp, wm) = seen.unwrap();
            if let Some((p, pw)) = &prev {
                let expect = common_suffix(p, pw.truncated, &addrs, wp.truncated);
                assert_eq!(wm.shared, expect, "fp chain {a}+{delta}");
                fp_checked += 1;
            }
            prev = Some((addrs, wp));
        }
    }
    let d = cx.stats;
    println!("{d:?} (captures, shared frames, frames); {repeats} repeats, {fp_checked} fp pairs");
    assert!(repeats >= 100 && fp_checked == 400);
}

#[test]
fn y_and_z_give_distinct_outer_frames() {
    // The trap: unwt_yz_x's frames are at the same addresses with the same
    // return addresses under Y and under Z; only the word above differs.
    for (chain, y, z) in [
        (4, "unwt_yz_y", "unwt_yz_z"),
        (5, "unwt_nofp_yz_y", "unwt_nofp_yz_z"),
    ] {
        let mut cx = Cx::new();
        let mut seen = Vec::new();
        run_chain(chain, 0, 0, &mut || seen.push(capture_point(&mut cx, 64)));
        assert_eq!(seen.len(), 2);
        let ((under_y, _, wy), (under_z, _, wz)) = (&seen[0], &seen[1]);
        let names = |v: &[u64]| v.iter().map(|&a| symbol(a)).collect::<Vec<_>>();
        let (ny, nz) = (names(under_y), names(under_z));
        assert!(
            ny.iter().any(|n| n == y) && !ny.iter().any(|n| n == z),
            "{ny:?}"
        );
        assert!(
            nz.iter().any(|n| n == z) && !nz.iter().any(|n| n == y),
            "{nz:?}"
        );
        // The trap is set: the same addresses up to X's caller.
        let x = ny.iter().position(|n| n == y).unwrap();
        assert_eq!(under_y[..x], under_z[..x], "chain {chain}");
        // What is shared is from above the driver's frame: the frames
        // the two stacks have in common, not X's.
        assert_eq!(wy.shared, 0);
        let expect = common_suffix(under_y, wy.truncated, under_z, wz.truncated);
        assert!(expect > 0 && expect < under_z.len() - x);
        assert_eq!(wz.shared, expect, "chain {chain}");
    }
}

#[test]
fn depth_limit_reached_in_one_walk_and_not_the_other() {
    let mut cx = Cx::new();
    // The full stack from this test's capture point, to pick limits around.
    let mut full = 0;
    run_chain(0, 10, 0, &mut || {
        full = capture_point(&mut cx, MEMO_DEPTH).1.len
    });
    assert!(full > 20, "{full}");
    let mut checks = 0;
    for (levels, depth) in [
        // One more or one fewer frame than the limit, and exactly it.
        (10, full - 1),
        (10, full),
        (10, full + 1),
        (9, full - 1),
        (11, full - 1),
        (11, full),
        (10, full - 1),
        (10, full - 5),
        (14, full - 5),
        (10, full - 5),
        (7, full - 5),
        (10, full),
        (10, full),
    ] {
        let mut seen = None;
        run_chain(0, levels, 0, &mut || {
            seen = Some(capture_point(&mut cx, depth))
        });
        let (_, wp, wm) = seen.unwrap();
        // Plain truncation as the limit says (capture_point checked the
        // memoized one equals it).
        let stack = full as i64 + levels as i64 - 10;
        assert_eq!(wp.truncated, stack > depth as i64, "{levels} {depth}");
        assert!(wm.shared <= wm.len);
        checks += 1;
    }
    assert_eq!(checks, 13);
    // Repeats at the limit share the whole (truncated) capture.
    let mut seen = Vec::new();
    run_chain(0, 10, 0, &mut || seen = repeat(&mut cx, full - 3, 2));
    let (_, wp, wm) = &seen[1];
    assert!(wp.truncated);
    assert_eq!(wm.shared, wp.len);
}

/// `times` captures from one call site (a loop the optimiser cannot
/// unroll into several call sites).
#[inline(never)]
fn repeat(cx: &mut Cx, depth: usize, times: usize) -> Vec<Seen> {
    let mut seen = Vec::new();
    for _ in 0..std::hint::black_box(times) {
        seen.push(capture_point(cx, depth));
    }
    seen
}

struct SigState {
    cx: Cx,
    seen: Vec<Seen>,
}

static SIG: AtomicPtr<SigState> = AtomicPtr::new(core::ptr::null_mut());

extern "C" fn handler(_: libc::c_int) {
    // SAFETY: the test sets SIG before raising the signal and reads it only
    // after raise returns; the handler runs on the raising thread.
    let s = unsafe { &mut *SIG.load(Ordering::SeqCst) };
    // capture_point allocates: acceptable here (the signal is raised from
    // plain test code, never inside malloc).
    let seen = capture_point(&mut s.cx, 128);
    s.seen.push(seen);
}

#[inline(never)]
fn raise_at_a() {
    // SAFETY: raising a signal whose handler is installed.
    unsafe { libc::raise(libc::SIGUSR2) };
    std::hint::black_box(());
}

#[inline(never)]
fn raise_at_b() {
    // SAFETY: as above.
    unsafe { libc::raise(libc::SIGUSR2) };
    std::hint::black_box(1);
}

/// Calls each of `raises` from one call site (see `repeat`).
#[inline(never)]
fn raise_each(raises: &[fn()]) {
    for f in std::hint::black_box(raises) {
        f();
    }
}

#[test]
fn captures_in_a_signal_handler() {
    let mut state = Box::new(SigState {
        cx: Cx::new(),
        seen: Vec::new(),
    });
    SIG.store(&mut *state, Ordering::SeqCst);
    // SAFETY: a plain handler for SIGUSR2, used by no other test.
    unsafe { libc::signal(libc::SIGUSR2, handler as *const () as libc::sighandler_t) };
    raise_each(&[raise_at_a, raise_at_a, raise_at_b, raise_at_a]);
    let (a0, a1, b, a2) = (
        &state.seen[0],
        &state.seen[1],
        &state.seen[2],
        &state.seen[3],
    );
    let names: Vec<String> = a0.0.iter().map(|&a| symbol(a)).collect();
    // The walk crossed the signal frame into the raising function.
    assert!(names.iter().any(|n| n == "memo::raise_at_a"), "{names:?}");
    assert!(!a0.1.truncated);
    // The same raise again: the signal frame's words (checked through the
    // ucontext) and everything above are shared.
    assert_eq!(a1.2.shared, a1.1.len);
    // Another raise site: its frames differ from the interrupted one up.
    let expect = common_suffix(&a1.0, false, &b.0, b.1.truncated);
    assert!(expect < b.1.len);
    assert_eq!(b.2.shared, expect);
    let expect = common_suffix(&b.0, false, &a2.0, a2.1.truncated);
    assert_eq!(a2.2.shared, expect);
}

static TRAP: AtomicPtr<SigState> = AtomicPtr::new(core::ptr::null_mut());

extern "C" fn trap_handler(_: libc::c_int) {
    // SAFETY: as `handler`, for SIGTRAP and TRAP.
    let s = unsafe { &mut *TRAP.load(Ordering::SeqCst) };
    let seen = capture_point(&mut s.cx, 128);
    s.seen.push(seen);
}

/// Traps at each of `which` from one call site (see `repeat`).
#[inline(never)]
fn trap_each(which: &[i32]) {
    for &w in std::hint::black_box(which) {
        // SAFETY: executes an int3, whose SIGTRAP handler is installed.
        unsafe { unwt_trap(w) };
    }
}

#[test]
fn the_interrupted_pc_is_checked_through_the_signal_frame() {
    // Two traps in one C frame: the handler's frames, and the kernel's
    // signal frame, are at the same addresses with the same return
    // addresses; only the pc saved in the ucontext differs. The memo
    // matches in the handler and must not take the previous pc.
    let mut state = Box::new(SigState {
        cx: Cx::new(),
        seen: Vec::new(),
    });
    TRAP.store(&mut *state, Ordering::SeqCst);
    // SAFETY: a plain handler for SIGTRAP, used by no other test.
    unsafe {
        libc::signal(
            libc::SIGTRAP,
            trap_handler as *const () as libc::sighandler_t,
        )
    };
    trap_each(&[0, 1, 1, 0]);
    let seen: Vec<&Seen> = state.seen.iter().collect();
    assert_eq!(seen.len(), 4);
    let at = |s: &(Vec<u64>, Walk, MemoWalk)| {
        s.0.iter()
            .position(|&a| symbol(a) == "unwt_trap")
            .expect("the interrupted frame")
    };
    let (p0, p1) = (at(seen[0]), at(seen[1]));
    // The same frames up to the interrupted one, another pc there.
    assert_eq!(p0, p1);
    assert_eq!(seen[0].0[..p0], seen[1].0[..p1]);
    assert_ne!(seen[0].0[p0], seen[1].0[p1]);
    // Shared: above the interrupted frame only, then all of a repeat.
    assert_eq!(seen[1].2.shared, seen[1].1.len - p1 - 1);
    assert_eq!(seen[2].2.shared, seen[2].1.len);
    assert_eq!(seen[3].2.shared, seen[3].1.len - p0 - 1);
}

#[test]
fn another_unwinder_or_a_cleared_memo_shares_nothing() {
    let mut cx = Cx::new();
    let mut seen = Vec::new();
    run_chain(0, 5, 0, &mut || {
        seen.push(capture_point(&mut cx, 64));
        seen.push(capture_point(&mut cx, 64));
        // SAFETY: nothing is unloaded during the test.
        cx.unwinder = unsafe { DwarfUnwinder::from_modules(&Modules::snapshot()) };
        seen.push(capture_point(&mut cx, 64));
        cx.memo.clear();
        seen.push(capture_point(&mut cx, 64));
        seen.push(capture_point(&mut cx, 64));
    });
    let shared: Vec<bool> = seen.iter().map(|s| s.2.shared > 0).collect();
    assert_eq!(shared, [false, true, false, false, true]);
    // A new memo shares nothing.
    let mut memo = WalkMemo::new();
    let mut out = [0u64; 64];
    let (b, u, c) = (&cx.bounds, &cx.unwinder, &mut cx.cache);
    let w1 = capture_dwarf_memo(0, b, u, c, &mut memo, &mut out);
    assert!(w1.len > 0);
    assert_eq!(w1.shared, 0);
    memo.clear();
    // Deeper than the memo: plain walk, memo cleared.
    let (mut big, mut plain) = (vec![0u64; MEMO_DEPTH + 1], vec![0u64; MEMO_DEPTH + 1]);
    let w3 = capture_dwarf_memo(0, b, u, c, &mut memo, &mut big);
    let wp = capture_dwarf(0, b, u, c, &mut plain);
    let w4 = capture_dwarf_memo(0, b, u, c, &mut memo, &mut out);
    // (A stack this shallow fits the memo whatever the limit.)
    assert!(w3.len > 0 && w3.shared == 0 && w4.shared <= w4.len);
    // The same walk as the plain capture (from the next address on: the
    // first is each call's own return address).
    assert_eq!((w3.len, w3.truncated), (wp.len, wp.truncated));
    assert_eq!(big[1..w3.len], plain[1..wp.len]);
}

extern "C" {
    /// unwt_nofp_level(n, cb, ctx) with rbp = value, passed through its
    /// n + 1 frames (tests/c/nofp_chain.c).
    fn unwt_rbp_levels(value: u64, n: i32, cb: Cb, ctx: *mut std::ffi::c_void);
    /// unwt_nofp_level(n, cb, ctx) from a frame whose CFA is rbp + 16, with
    /// rbp = its own frame record (rec null) or rec.
    fn unwt_bp_cfa_levels(rec: *const u64, n: i32, cb: Cb, ctx: *mut std::ffi::c_void);
}

/// Captures (checked by `capture_point`) from one site under
/// `unwt_rbp_levels(value, n)` for each value: what each saw, and the
/// unwinding steps the DWARF memo took.
fn rbp_site(cx: &mut Cx, n: i32, values: &[u64]) -> Vec<(Seen, u32, u32)> {
    // Opaque to the optimiser: an unrolled loop would make several sites.
    let values = std::hint::black_box(values);
    let mut seen = Vec::new();
    for &v in values {
        seen.push(rbp_once(cx, n, v));
    }
    seen
}

/// One capture of `rbp_site` (not inlined: one call site for all).
#[inline(never)]
fn rbp_once(cx: &mut Cx, n: i32, value: u64) -> (Seen, u32, u32) {
    let mut seen = None;
    through_c(
        || {
            let (.., steps0) = capture_point0(cx, 64);
            seen = Some((capture_point(cx, 64), cx.memo.steps_walked(), steps0))
        },
        // SAFETY: calls the callback once, with ctx; rbp is restored.
        |cb, ctx| unsafe { unwt_rbp_levels(value, n, cb, ctx) },
    );
    seen.unwrap()
}

/// One capture under `unwt_bp_cfa_levels(rec, 6)` (not inlined: one call
/// site for all), and the unwinding steps the DWARF memo took.
#[inline(never)]
fn bp_cfa_once(cx: &mut Cx, rec: *const u64) -> (Seen, u32, u32) {
    let mut seen = None;
    through_c(
        || {
            let (.., steps0) = capture_point0(cx, 64);
            seen = Some((capture_point(cx, 64), cx.memo.steps_walked(), steps0))
        },
        // SAFETY: calls the callback once, with ctx; rbp is restored.
        |cb, ctx| unsafe { unwt_bp_cfa_levels(rec, 6, cb, ctx) },
    );
    seen.unwrap()
}

#[test]
fn an_rbp_passed_through_does_not_keep_the_memo_from_matching() {
    // A caller keeps a loop counter in rbp: every capture from the site has
    // another rbp in the frames below it, which no step uses before the
    // caller's frame restores it. From the second capture on, the memo
    // knows those steps pass rbp through: the walk stops at the first
    // frame below them (the ones above the C levels are walked, their rbp
    // is read from the stack) whatever the number of levels.
    let mut cx = Cx::new();
    let values: Vec<u64> = (0..6).map(|i| 0x1000 + 8 * i).collect();
    let mut steady = Vec::new();
    for n in [2, 16] {
        cx.memo.clear();
        let seen = rbp_site(&mut cx, n, &values);
        let first = seen[0].1;
        for (i, ((_, wp, wm), steps, steps0)) in seen.iter().enumerate() {
            assert!(wp.len > n as usize + 2 && !wp.truncated, "{wp:?}");
            if i >= 1 {
                assert_eq!(wm.shared, wm.len, "capture {i} of {n} levels: {wm:?}");
                // No step of the levels uses rbp (their rules are
                // rsp-based): the memo matches at the first frame whatever
                // rbp holds, and takes every frame.
                assert_eq!((*steps, *steps0), (0, 0), "{n}: of {first}");
            }
        }
        let last = seen.last().unwrap();
        steady.push((last.1, last.2));
    }
    assert_eq!(steady[0], steady[1], "steps with 2 and 16 levels");
}

#[test]
fn an_rbp_that_a_later_step_uses_is_compared() {
    // The same site under a frame whose CFA is rbp-based, reached through
    // levels that pass rbp through: with its own frame record the walk goes
    // on to its callers, with the record `rec` (a zero return address) it
    // ends there. The memo matches at the levels (only rbp differs) but
    // must walk the rbp-based step again: copying the previous walk's
    // outcome (its words still hold) would be wrong every other time.
    let mut cx = Cx::new();
    let rec = std::hint::black_box([0u64; 2]);
    let mut lens = [Vec::new(), Vec::new()];
    // Opaque to the optimiser: an unrolled loop would make several sites.
    for i in 0..std::hint::black_box(8) {
        let own = i % 2 == 0;
        let at = if own { std::ptr::null() } else { rec.as_ptr() };
        let ((addrs, wp, wm), steps, steps0) = bp_cfa_once(&mut cx, at);
        if !own {
            assert_eq!(symbol(addrs[wp.len - 1]), "unwt_bp_cfa_levels");
            assert!(!wp.truncated);
        }
        // The levels pass rbp to the rbp-based frame, whose step uses it:
        // a frame whose rbp differs from the previous walk's is not matched
        // there (capture_point checked the result equals the plain walk).
        let _ = (wm, steps, steps0);
        lens[usize::from(own)].push(wp.len);
    }
    assert!(lens[1].iter().all(|&l| l > lens[0][0] + 1), "{lens:?}");
}

extern "C" {
    /// cb(ctx) n times from one call instruction, rbp untouched.
    fn unwt_call_n(n: i32, cb: Cb, ctx: *mut std::ffi::c_void);
}

/// A memoized capture skipping nothing, into `out`, that allocates
/// nothing: called again in the same state, its registers are the same.
#[inline(never)]
fn capture0_fixed(cx: &mut Cx, out: &mut [u64; 64]) -> (MemoWalk, u32) {
    let w = capture_dwarf_memo(
        0,
        &cx.bounds,
        &cx.unwinder,
        &mut cx.cache,
        &mut cx.memo0,
        out,
    );
    (w, cx.memo0.steps_walked())
}

#[test]
fn a_capture_in_the_same_state_takes_no_step() {
    // The same call in the same state (registers and stack): the memo
    // matches the walk's starting state (the capture function's own rip,
    // rsp and rbp), so the first step, from the capture's own frame, is
    // checked by re-reading its words instead of unwinding it.
    let mut cx = Cx::new();
    let mut out = [0u64; 64];
    let mut seen = Vec::new();
    let mut f = || {
        let (w, steps) = capture0_fixed(&mut cx, &mut out);
        seen.push((out[..w.len].to_vec(), w, steps));
    };
    through_c(
        &mut f,
        // SAFETY: calls the callback 4 times, with ctx.
        |cb, ctx| unsafe { unwt_call_n(4, cb, ctx) },
    );
    let (first, w0, steps0) = &seen[0];
    assert!(w0.len > 3 && *steps0 as usize >= w0.len, "{w0:?} {steps0}");
    for (addrs, w, steps) in &seen[1..] {
        assert_eq!(
            (addrs, w.len, w.truncated, w.shared),
            (first, w0.len, w0.truncated, w0.len)
        );
        assert_eq!(*steps, 0);
    }
}

/// A capture point one frame below `capture_point0`'s caller.
#[inline(never)]
fn one_level_down(cx: &mut Cx) -> (Vec<u64>, Walk, MemoWalk, u32) {
    let r = capture_point0(cx, 64);
    std::hint::black_box(());
    r
}

#[test]
fn two_call_sites_in_turn_take_the_other_branch() {
    // A loop allocating from two places in turn (a key, then a value):
    // from the third capture on, each is the capture before the previous
    // one, taken from the memo's other branch with no step, and equal to
    // the plain capture (capture_point0 compares them).
    let mut cx = Cx::new();
    let mut seen = Vec::new();
    for i in 0..8 {
        let (plain, _, w, steps) = if i % 2 == 0 {
            capture_point0(&mut cx, 64)
        } else {
            one_level_down(&mut cx)
        };
        let took = cx.memo0.took_alt();
        // The caller's tag moves with the walk: the site's when its walk
        // is taken from the branch, none for a walk with new frames.
        let site_tag = 100 + i as u64 % 2;
        if took {
            assert_eq!(cx.memo0.tag(), site_tag, "capture {i}");
        } else if steps > 0 {
            assert_eq!(cx.memo0.tag(), 0, "capture {i}");
        }
        cx.memo0.set_tag(site_tag);
        seen.push((plain, w, steps, took));
    }
    for (i, (plain, w, steps, took)) in seen.iter().enumerate().skip(2) {
        let (before, ..) = &seen[i - 2];
        assert_eq!(plain.get(1..), before.get(1..), "capture {i}");
        assert!(w.shared > 0 && w.shared < w.len, "capture {i}: {w:?}");
        assert!(*took && *steps == 0, "capture {i}: {w:?} {steps}");
    }
}

#[test]
fn the_other_branch_is_re_checked_to_the_end() {
    // The Y/Z trap with a capture from elsewhere between: under Y, a
    // capture one frame down (the other branch, once the next capture
    // displaces it), then one from the callback itself; under Z, the
    // capture one frame down again, in the same state as the one under Y
    // (same addresses, same return addresses) up to the word holding
    // X's return address. It must not be taken from the branch.
    for chain in [4, 5] {
        let mut cx = Cx::new();
        let mut seen = Vec::new();
        run_chain(chain, 0, 0, &mut || {
            let (down, _, wd, _) = one_level_down(&mut cx);
            let took = cx.memo0.took_alt();
            let _ = capture_point0(&mut cx, 64);
            seen.push((down, wd, took));
        });
        assert_eq!(seen.len(), 2);
        let ((under_y, ..), (under_z, _, took_z)) = (&seen[0], &seen[1]);
        assert_ne!(under_y, under_z, "chain {chain}");
        assert!(!took_z, "chain {chain}");
    }
}

/// A capture point two frames below `capture_point0`'s caller.
#[inline(never)]
fn two_levels_down(cx: &mut Cx) -> (Vec<u64>, Walk, MemoWalk, u32) {
    let r = one_level_down(cx);
    std::hint::black_box(());
    r
}

#[test]
fn three_call_sites_in_turn_take_their_branches() {
    // Three places in turn (a key, its growth, a value): from the fourth
    // capture on, each is the capture three before, taken from a branch
    // with no step, equal to the plain capture.
    let mut cx = Cx::new();
    let mut seen = Vec::new();
    for i in 0..12 {
        let (plain, _, w, steps) = match i % 3 {
            0 => capture_point0(&mut cx, 64),
            1 => one_level_down(&mut cx),
            _ => two_levels_down(&mut cx),
        };
        seen.push((plain, w, steps, cx.memo0.took_alt()));
    }
    for (i, (plain, w, steps, took)) in seen.iter().enumerate().skip(3) {
        let (before, ..) = &seen[i - 3];
        assert_eq!(plain.get(1..), before.get(1..), "capture {i}");
        assert!(*took && *steps == 0, "capture {i}: {w:?} {steps}");
    }
}
