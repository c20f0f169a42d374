//! Captures against the oracle (the `backtrace` crate, libgcc's DWARF
//! unwinder) through C frames with and without frame pointers.

mod common;

use alloctrace_unwind::{
    capture_dwarf, capture_fp, DwarfCache, DwarfUnwinder, Modules, StackBounds,
};
use common::*;

const DEPTH: usize = 256;

struct Setup {
    bounds: StackBounds,
    unwinder: DwarfUnwinder,
    /// Boxed: a frame-pointer walk that follows the garbage rbp of the
    /// Rust frames above the C chain may land in this frame, and the cache's
    /// words (lookup addresses) look like return addresses.
    cache: Box<DwarfCache>,
}

fn setup() -> Setup {
    let modules = Modules::snapshot();
    Setup {
        bounds: StackBounds::current().expect("thread stack bounds"),
        // SAFETY: the test loads nothing and unloads nothing while it runs.
        unwinder: unsafe { DwarfUnwinder::from_modules(&modules) },
        cache: Box::new(DwarfCache::new()),
    }
}

#[test]
fn dwarf_walk_equals_oracle_through_c_frames_without_frame_pointers() {
    let mut s = setup();
    let (n_fp, n_nofp) = (3, 4);
    let mut ours = vec![0u64; DEPTH];
    let mut walk = None;
    let mut reference = Vec::new();
    through_c(
        || {
            walk = Some(capture_dwarf(
                0,
                &s.bounds,
                &s.unwinder,
                &mut s.cache,
                &mut ours,
            ));
            reference = oracle();
        },
        // SAFETY: the C chain calls the callback with ctx, nothing else.
        |cb, ctx| unsafe { unwt_fp_mixed(n_fp, n_nofp, cb, ctx) },
    );
    let walk = walk.unwrap();
    ours.truncate(walk.len);
    let k = assert_matches_oracle(&ours, &reference);
    assert_eq!(count_in(&ours, "unwt_nofp_level"), n_nofp as usize + 1);
    assert_eq!(count_in(&ours, "unwt_fp_mixed"), n_fp as usize + 1);
    // The walk reached the end of the thread's stack, as the oracle did.
    assert!(!walk.truncated, "{walk:?}");
    assert_eq!(
        k,
        reference.len() - reference.iter().position(|&a| a == ours[1]).unwrap()
    );
}

#[test]
fn dwarf_walk_equals_oracle_through_rust_frames() {
    let mut s = setup();
    let mut ours = vec![0u64; DEPTH];
    let mut reference = Vec::new();
    let walk = rust_chain(5, &mut || {
        let w = capture_dwarf(0, &s.bounds, &s.unwinder, &mut s.cache, &mut ours);
        reference = oracle();
        w
    });
    ours.truncate(walk.len);
    assert_matches_oracle(&ours, &reference);
    // Six calls; an optimised build may fold some levels (the oracle sees
    // the same frames: checked above).
    let frames = count_in(&ours, "oracle::rust_chain");
    assert_eq!(frames, count_in(&reference, "oracle::rust_chain"));
    assert!(frames >= 2, "{frames}");
    assert!(!walk.truncated);
}

#[inline(never)]
fn rust_chain(n: u32, f: &mut dyn FnMut() -> alloctrace_unwind::Walk) -> alloctrace_unwind::Walk {
    let w = if n == 0 { f() } else { rust_chain(n - 1, f) };
    std::hint::black_box(w)
}

#[test]
fn fp_walk_equals_oracle_where_frame_pointers_exist() {
    let s = setup();
    let n = 5;
    // The capture is made from a C frame (unwt_capture_leaf, -O0 with
    // frame pointers) at the end of n + 1 unwt_fp_level frames.
    // SAFETY: the chain calls the leaf with the job, nothing else.
    let (ours, walk, reference) = fp_capture_from_c(&s.bounds, DEPTH, |cb, ctx| unsafe {
        unwt_fp_level(n, cb, ctx)
    });
    // ours[0] is the return into the leaf after its capture call (the
    // oracle's is after its other call); from there on the walk and the
    // oracle agree on every C frame and on the return into the Rust caller
    // of the chain, which the outermost C frame's record holds.
    assert_eq!(symbol(ours[0]), "unwt_capture_leaf");
    let c = n as usize + 1;
    let p = reference.iter().position(|&a| a == ours[1]).unwrap();
    assert_eq!(ours[1..=c + 1], reference[p..=p + c], "{walk:?}");
    assert!(ours[1..=c].iter().all(|&a| symbol(a) == "unwt_fp_level"));
    assert!(
        symbol(ours[c + 1]).starts_with("oracle::"),
        "{}",
        symbol(ours[c + 1])
    );
    // Beyond that the Rust frames decide: with frame pointers (debug
    // builds, std) the walk goes on; where optimised Rust used rbp as an
    // ordinary register it follows that value while it stays on the stack
    // and increases, and stops at the first one that does not.
}

#[test]
fn fp_walk_skips_frames_without_frame_pointers() {
    let s = setup();
    let (n_fp, n_nofp) = (3, 4);
    // SAFETY: as above.
    let (ours, walk, reference) = fp_capture_from_c(&s.bounds, DEPTH, |cb, ctx| unsafe {
        unwt_fp_mixed(n_fp, n_nofp, cb, ctx)
    });
    // The -O2 -fomit-frame-pointer frames leave rbp alone (it still holds
    // the innermost unwt_fp_mixed's record). The leaf's own record holds
    // the return into the innermost unwt_nofp_level; from there the walk
    // jumps to unwt_fp_mixed's record: it misses the other n_nofp
    // unwt_nofp_level frames and the return into the innermost
    // unwt_fp_mixed (stored by its call, in no record), then goes on
    // through the other frame-pointer frames into the Rust caller, without
    // knowing it skipped anything (not truncated on that account).
    let f = n_fp as usize;
    let prefix = &ours[1..=f + 2];
    assert_eq!(symbol(prefix[0]), "unwt_nofp_level", "{walk:?}");
    assert!(prefix[1..=f].iter().all(|&a| symbol(a) == "unwt_fp_mixed"));
    assert!(symbol(prefix[f + 1]).starts_with("oracle::"));
    assert!(is_subsequence(prefix, &reference));
    assert_eq!(count_in(&reference, "unwt_nofp_level"), n_nofp as usize + 1);
    assert_eq!(count_in(&reference, "unwt_fp_mixed"), f + 1);
}

/// The frame-pointer walk from a Rust callback at the end of a C chain
/// with frame pointers (no skip: its skip counts records, not frames).
#[test]
fn fp_walk_from_a_rust_callback_misses_the_innermost_c_frame() {
    let n = 5;
    let s = setup();
    let mut fp_only = vec![0u64; DEPTH];
    let mut fp_walk = None;
    through_c(
        || fp_walk = Some(capture_fp(0, &s.bounds, &mut fp_only)),
        // SAFETY: as above.
        |cb, ctx| unsafe { unwt_fp_level(n, cb, ctx) },
    );
    fp_only.truncate(fp_walk.unwrap().len);
    // It lost at least the innermost C frame: its return address is in no
    // frame record (the Rust callback keeps none), and in an optimised
    // build the callback's rbp may be anything.
    assert!(count_in(&fp_only, "unwt_fp_level") <= n as usize);
}
