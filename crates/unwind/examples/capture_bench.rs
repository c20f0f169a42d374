//! Micro-benchmark of the two captures (one run, plain std::time; not a
//! test): ns per capture and per frame for the frame-pointer walk and the
//! cached DWARF walk, with the capture made at the end of a C call chain of
//! 10, 30 and 60 frames (frame pointers on: both walks see every frame;
//! and, for DWARF, the same chain built without frame pointers).
//!
//! `RUSTFLAGS="-C force-frame-pointers=yes" cargo run --release
//! --target-dir target/fpbench -p alloctrace-unwind --example capture_bench`
//!
//! `capture_mixed` skips the Rust frames above the C chain by CFI (the
//! number is found once with a DWARF capture and the `backtrace` crate's
//! symbols) and walks frame pointers from the first C frame.
//!
//! Without frame pointers in the Rust code between the C chain and the
//! capture (the trampoline and this file's closures), optimised Rust uses
//! rbp as an ordinary register and the frame-pointer walk stops after the
//! first frame; the program says so. The same holds for any caller of
//! `capture_fp` (see the crate docs).

use core::ffi::{c_int, c_void};
use std::time::Instant;

use alloctrace_unwind::{
    capture_dwarf, capture_fp, capture_mixed, DwarfCache, DwarfUnwinder, Modules, StackBounds, Walk,
};

type Cb = extern "C" fn(*mut c_void);

extern "C" {
    fn unwt_fp_level(n: c_int, cb: Cb, ctx: *mut c_void);
    fn unwt_nofp_level(n: c_int, cb: Cb, ctx: *mut c_void);
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

/// The demangled name (without hash) of the function holding `addr`.
fn symbol(addr: u64) -> String {
    let mut name = String::new();
    backtrace::resolve(addr.wrapping_sub(1) as *mut c_void, |sym| {
        if let (true, Some(n)) = (name.is_empty(), sym.name()) {
            name = format!("{n:#}");
        }
    });
    name
}

/// (ns per capture, frames per capture)
fn time(mut capture: impl FnMut() -> Walk) -> (f64, usize) {
    let w = capture(); // warm-up (fills the DWARF rule cache)
    let t = Instant::now();
    for _ in 0..ROUNDS {
        std::hint::black_box(capture());
    }
    (t.elapsed().as_nanos() as f64 / f64::from(ROUNDS), w.len)
}

fn main() {
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
                let w = capture_dwarf(0, &bounds, &unwinder, &mut cache, &mut out);
                let skip = out[..w.len]
                    .iter()
                    .position(|&a| symbol(a) == "unwt_fp_level")
                    .unwrap_or(0);
                rows.push(("fp", time(|| capture_fp(0, &bounds, &mut out))));
                rows.push((
                    "mixed (cfi skip, then fp)",
                    time(|| capture_mixed(skip, &bounds, &unwinder, &mut cache, &mut out)),
                ));
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
    let (hits, misses) = cache.hits_and_misses();
    println!("DWARF rule cache: {hits} hits, {misses} misses");
}
