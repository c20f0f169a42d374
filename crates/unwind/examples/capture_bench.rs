//! Micro-benchmark of the two captures (one run, plain std::time; not a
//! test): ns per capture and per frame for the frame-pointer walk and the
//! cached DWARF walk, with the capture made at the end of a C call chain of
//! 10, 30 and 60 frames (frame pointers on: both walks see every frame;
//! and, for DWARF, the same chain built without frame pointers).
//!
//! `RUSTFLAGS="-C force-frame-pointers=yes" cargo run --release
//! --target-dir target/fpbench -p alloctrace-unwind --example capture_bench`
//!
//! The memo rows time `capture_dwarf_memo` against the plain capture at the end of 40- and 60-frame chains, with
//! consecutive captures from one site ("same") or alternating between two
//! sites (two functions that call the capture: the innermost frames differ,
//! the chain is shared); "shared" is the mean of `MemoWalk::shared`.
//!
//! The rbp rows time the DWARF captures from one site under
//! `unwt_rbp_levels(value, inner - 1)` (tests/c/nofp_chain.c: `inner` C
//! frames without frame pointers that pass rbp through, with rbp = a
//! counter that changes every capture, as a caller that keeps its loop
//! counter in rbp leaves it), itself at the end of an `outer`-frame C chain
//! ("steps": the mean number of unwinding steps the memo took).
//!
//! Without frame pointers in the Rust code between the C chain and the
//! capture (the trampoline and this file's closures), optimised Rust uses
//! rbp as an ordinary register and the frame-pointer walk stops after the
//! first frame; the program says so. The same holds for any caller of
//! `capture_fp` (see the crate docs).

use core::ffi::{c_int, c_void};
use std::time::Instant;

use alloctrace_unwind::{
    capture_dwarf, capture_dwarf_memo, capture_fp, capture_from, capture_from_compact,
    capture_from_framehop, DwarfCache, DwarfUnwinder, MemoWalk, Modules, StackBounds, StartRegs,
    Walk, WalkMemo,
};

type Cb = extern "C" fn(*mut c_void);

extern "C" {
    fn unwt_fp_level(n: c_int, cb: Cb, ctx: *mut c_void);
    fn unwt_nofp_level(n: c_int, cb: Cb, ctx: *mut c_void);
    fn unwt_rbp_levels(value: u64, n: c_int, cb: Cb, ctx: *mut c_void);
}

extern "C" fn trampoline<F: FnMut()>(ctx: *mut c_void) {
    // SAFETY: ctx is the &mut F passed by `through_c`, alive for the call.
    let f = unsafe { &mut *ctx.cast::<F>() };
    f();
}

fn through_c<F: FnMut()>(mut f: F, fp: bool, levels: c_int) {
    let ctx = (&mut f as *mut F).cast();
    // SAFETY: the chain calls trampoline::<F>(ctx) once, at its end.
    unsafe {
        if fp {
            unwt_fp_level(levels, trampoline::<F>, ctx)
        } else {
            unwt_nofp_level(levels, trampoline::<F>, ctx)
        }
    }
}

const ROUNDS: u32 = 200_000;

/// (ns per capture, frames per capture)
fn time(mut capture: impl FnMut() -> Walk) -> (f64, usize) {
    let w = capture(); // warm-up (fills the DWARF rule cache)
    let t = Instant::now();
    for _ in 0..ROUNDS {
        std::hint::black_box(capture());
    }
    (t.elapsed().as_nanos() as f64 / f64::from(ROUNDS), w.len)
}

/// The two capture sites of the memo rows.
/// (Different bodies: the linker must not fold them into one function.)
#[inline(never)]
fn site_a(f: &mut dyn FnMut() -> MemoWalk) -> MemoWalk {
    let w = f();
    std::hint::black_box(1u8);
    w
}

#[inline(never)]
fn site_b(f: &mut dyn FnMut() -> MemoWalk) -> MemoWalk {
    let w = f();
    std::hint::black_box(2u16);
    w
}

/// (ns per capture (the fastest of 5 batches), frames per capture, mean
/// shared) of `capture` called from site_a only, or from site_a and site_b
/// in turn.
fn time_sites(mut capture: impl FnMut() -> MemoWalk, alternate: bool) -> (f64, usize, f64) {
    let mut run = |i: u32| {
        if alternate && i % 2 == 1 {
            site_b(&mut capture)
        } else {
            site_a(&mut capture)
        }
    };
    let w = run(0);
    run(1);
    // The fastest of 5 batches: the machine may be shared.
    let batch = ROUNDS / 5;
    let mut best = f64::MAX;
    let mut shared = 0usize;
    for _ in 0..5 {
        let t = Instant::now();
        for i in 0..batch {
            shared += run(i).shared;
        }
        best = best.min(t.elapsed().as_nanos() as f64 / f64::from(batch));
    }
    (best, w.len, shared as f64 / f64::from(batch * 5))
}

/// The memo rows: plain and memoized DWARF captures, at the end of
/// a chain of `depth` frames, from one site or two.
fn memo_rows(bounds: &StackBounds, unwinder: &DwarfUnwinder, cache: &mut DwarfCache) {
    let mut memo = Box::new(WalkMemo::new());
    let mut out = [0u64; 128];
    println!();
    println!(
        "memo ({} bytes per WalkMemo)         chain  frames  ns/capture  shared",
        core::mem::size_of::<WalkMemo>()
    );
    for depth in [40, 60] {
        for (fp, chain) in [(false, "no-fp"), (true, "fp")] {
            let mut rows = Vec::new();
            through_c(
                || {
                    for alternate in [false, true] {
                        let sites = if alternate { "alternating" } else { "same" };
                        let plain = |w: Walk| MemoWalk {
                            len: w.len,
                            truncated: w.truncated,
                            shared: 0,
                        };
                        rows.push((
                            format!("dwarf plain, {chain}, {sites}"),
                            time_sites(
                                || plain(capture_dwarf(0, bounds, unwinder, cache, &mut out)),
                                alternate,
                            ),
                        ));
                        rows.push((
                            format!("dwarf memo, {chain}, {sites}"),
                            time_sites(
                                || {
                                    capture_dwarf_memo(
                                        0, bounds, unwinder, cache, &mut memo, &mut out,
                                    )
                                },
                                alternate,
                            ),
                        ));
                    }
                },
                fp,
                depth - 1,
            );
            for (name, (ns, frames, shared)) in rows {
                println!("{name:<36} {depth:>5}  {frames:>6}  {ns:>10.1}  {shared:>6.1}");
            }
        }
    }
}

/// One call of `f` under `unwt_rbp_levels(value, inner - 1)` (not
/// inlined: every call from one site).
#[inline(never)]
fn under_rbp<F: FnMut()>(f: &mut F, value: u64, inner: c_int) {
    // SAFETY: the chain calls trampoline::<F>(ctx) once, at its end, and
    // restores rbp.
    unsafe { unwt_rbp_levels(value, inner - 1, trampoline::<F>, (f as *mut F).cast()) }
}

/// (ns per capture (the fastest of 5 batches), frames, mean shared, mean
/// steps) of `capture` under `unwt_rbp_levels` with rbp = a counter.
fn time_rbp(inner: c_int, mut capture: impl FnMut() -> (MemoWalk, u32)) -> (f64, usize, f64, f64) {
    let last = std::cell::Cell::new((MemoWalk::default(), 0));
    let mut f = || last.set(capture());
    let mut value = 0x1000u64;
    for _ in 0..2 {
        under_rbp(&mut f, value, inner);
        value += 8;
    }
    let batch = ROUNDS / 5;
    let (mut best, mut shared, mut steps) = (f64::MAX, 0usize, 0u64);
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..batch {
            under_rbp(&mut f, value, inner);
            value += 8;
            let (w, n) = last.get();
            shared += w.shared;
            steps += u64::from(n);
        }
        best = best.min(t.elapsed().as_nanos() as f64 / f64::from(batch));
    }
    let n = f64::from(batch * 5);
    (best, last.get().0.len, shared as f64 / n, steps as f64 / n)
}

/// The rbp rows: plain and memoized DWARF captures with an rbp that
/// changes every capture and passes through the `inner` frames.
fn rbp_rows(bounds: &StackBounds, unwinder: &DwarfUnwinder, cache: &mut DwarfCache) {
    let mut memo = Box::new(WalkMemo::new());
    let mut out = [0u64; 128];
    println!();
    println!("rbp varying per capture        outer  inner  frames  ns/capture  shared   steps");
    for (outer, inner) in [(10, 10), (30, 10), (30, 30)] {
        let mut rows = Vec::new();
        through_c(
            || {
                let plain = time_rbp(inner, || {
                    let w = capture_dwarf(0, bounds, unwinder, cache, &mut out);
                    let w = MemoWalk {
                        len: w.len,
                        truncated: w.truncated,
                        shared: 0,
                    };
                    (w, 0)
                });
                rows.push(("dwarf plain", plain));
                memo.clear();
                let memoized = time_rbp(inner, || {
                    let w = capture_dwarf_memo(0, bounds, unwinder, cache, &mut memo, &mut out);
                    (w, memo.steps_walked())
                });
                rows.push(("dwarf memo", memoized));
            },
            false,
            outer - 1,
        );
        for (name, (ns, frames, shared, steps)) in rows {
            println!(
                "{name:<30} {outer:>5}  {inner:>5}  {frames:>6}  {ns:>10.1}  {shared:>6.1}  {steps:>6.1}"
            );
        }
    }
}

/// A naked entry, as the shim's malloc: calls `entry_body(ctx, [rsp],
/// rsp + 8, rbp)` by a tail jump, leaving no frame of its own.
#[unsafe(naked)]
extern "sysv64" fn entry(_ctx: *mut c_void) {
    core::arch::naked_asm!(
        "mov rsi, [rsp]",
        "lea rdx, [rsp + 8]",
        "mov rcx, rbp",
        "jmp {body}",
        body = sym entry_body,
    )
}

extern "sysv64" fn entry_body(ctx: *mut c_void, ra: u64, sp: u64, bp: u64) {
    // SAFETY: ctx is the `&mut &mut dyn FnMut` `entry_a`/`entry_b` pass.
    let f = unsafe { &mut *ctx.cast::<&mut dyn FnMut(StartRegs)>() };
    f(StartRegs { ra, sp, bp });
}

/// Two call sites of the naked entry (the innermost frame differs).
#[inline(never)]
fn entry_a(mut f: &mut dyn FnMut(StartRegs)) {
    entry((&mut f as *mut &mut dyn FnMut(StartRegs)).cast());
    std::hint::black_box(1u8);
}

#[inline(never)]
fn entry_b(mut f: &mut dyn FnMut(StartRegs)) {
    entry((&mut f as *mut &mut dyn FnMut(StartRegs)).cast());
    std::hint::black_box(2u16);
}

/// `capture_bench instr KIND N`: N captures of one kind from the program
/// frame of a naked entry at the end of a 30-frame C chain without frame
/// pointers, nothing else, for callgrind (run with two N and take the
/// difference of the instruction counts per capture). KIND: `same` (memo,
/// one site), `alt` (memo, two sites in turn), `compact`, `framehop`.
fn instr(kind: &str, n: u64) {
    let bounds = StackBounds::current().expect("stack bounds");
    // SAFETY: nothing is loaded or unloaded while the benchmark runs.
    let unwinder = unsafe { DwarfUnwinder::from_modules(&Modules::snapshot()) };
    let mut cache = DwarfCache::new();
    let mut memo = Box::new(WalkMemo::new());
    let mut out = [0u64; 64];
    let mut frames = 0usize;
    through_c(
        || {
            let mut f = |start: StartRegs| {
                let (b, u, c, o) = (&bounds, &unwinder, &mut cache, &mut out);
                frames = match kind {
                    "same" | "alt" => capture_from(start, b, u, c, &mut memo, o).len,
                    "compact" => capture_from_compact(start, b, u, c, o).len,
                    _ => capture_from_framehop(start, b, u, c, o).len,
                };
            };
            for i in 0..n {
                if kind == "alt" && i % 2 == 1 {
                    entry_b(&mut f)
                } else {
                    entry_a(&mut f)
                }
            }
        },
        false,
        29,
    );
    println!("{kind}: {n} captures of {frames} frames");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("instr") {
        let kind = args.get(2).map_or("same", String::as_str);
        let n = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(1000);
        return instr(kind, n);
    }
    let bounds = StackBounds::current().expect("stack bounds");
    let modules = Modules::snapshot();
    // SAFETY: nothing is loaded or unloaded while the benchmark runs.
    let unwinder = unsafe { DwarfUnwinder::from_modules(&modules) };
    let mut cache = DwarfCache::new();
    let mut out = [0u64; 128];
    println!("walk                       chain  frames  ns/capture  ns/frame");
    for depth in [10, 30, 60] {
        let levels = depth - 1; // unwt_*_level(n) makes n + 1 frames
        let mut rows = Vec::new();
        through_c(
            || {
                rows.push(("fp", time(|| capture_fp(0, &bounds, &mut out))));
                rows.push((
                    "dwarf (cached), fp chain",
                    time(|| capture_dwarf(0, &bounds, &unwinder, &mut cache, &mut out)),
                ));
            },
            true,
            levels,
        );
        through_c(
            || {
                rows.push((
                    "dwarf (cached), no-fp",
                    time(|| capture_dwarf(0, &bounds, &unwinder, &mut cache, &mut out)),
                ));
            },
            false,
            levels,
        );
        if rows[0].1 .1 < depth as usize {
            println!(
                "note: the fp walk saw {} of {depth} frames: build with -C force-frame-pointers=yes",
                rows[0].1 .1
            );
        }
        for (name, (ns, frames)) in rows {
            println!(
                "{name:<26} {depth:>5}  {frames:>6}  {ns:>10.1}  {:>8.2}",
                ns / frames.max(1) as f64
            );
        }
    }
    memo_rows(&bounds, &unwinder, &mut cache);
    rbp_rows(&bounds, &unwinder, &mut cache);
    let (rows, bytes, per) = unwinder.table_stats();
    println!();
    println!(
        "compact tables: {rows} rows, {bytes} bytes; the threads' shared rule cache {} bytes",
        unwinder.shared_cache_bytes()
    );
    for (start, rows) in per {
        let name = modules
            .find(start)
            .map(|m| m.path_lossy())
            .unwrap_or_default();
        println!("  {rows:>7} rows {:>8} bytes  {name}", rows * 8);
    }
    println!(
        "per thread: DwarfCache {} bytes, WalkMemo {} bytes (no heap)",
        core::mem::size_of::<DwarfCache>(),
        core::mem::size_of::<WalkMemo>()
    );
    let (hits, misses) = cache.hits_and_misses();
    println!("DWARF rule cache: {hits} hits, {misses} misses");
}
