//! Shared by the integration tests: the C call chains (tests/c/, built by
//! build.rs) and the oracle (the `backtrace` crate, outside any malloc).
#![allow(dead_code)]

use core::ffi::{c_int, c_void};

pub type Cb = unsafe extern "C" fn(*mut c_void);

extern "C" {
    /// n + 1 frames with frame pointers (-O0), then cb(ctx).
    pub fn unwt_fp_level(n: c_int, cb: Cb, ctx: *mut c_void);
    /// n_fp + 1 frames with frame pointers, then n_nofp + 1 without, then cb.
    pub fn unwt_fp_mixed(n_fp: c_int, n_nofp: c_int, cb: Cb, ctx: *mut c_void);
    /// n + 1 frames without frame pointers (-O2 -fomit-frame-pointer), then cb.
    pub fn unwt_nofp_level(n: c_int, cb: Cb, ctx: *mut c_void);
    /// Calls cb(ctx) with rbp = garbage (with CFI saying where rbp was saved).
    pub fn unwt_garbage_rbp(garbage: u64, cb: Cb, ctx: *mut c_void);
    /// cb(ctx) under unwt_yz_y, then under unwt_yz_z (frame pointers): both
    /// call unwt_yz_x, which calls cb; Y and Z have frames of equal size.
    pub fn unwt_y_then_z(cb: Cb, ctx: *mut c_void);
    /// The same without frame pointers (-O2).
    pub fn unwt_nofp_y_then_z(cb: Cb, ctx: *mut c_void);
    /// Executes one of two int3 instructions (SIGTRAP), by `which`.
    pub fn unwt_trap(which: c_int);
    /// A chain callback (C, with a frame record) that runs the FpJob `ctx`.
    pub fn unwt_capture_leaf(ctx: *mut c_void);
}

/// `struct unwt_fp_job` of tests/c/fp_chain.c: a frame-pointer capture
/// made from a C frame (so no Rust frame lies between the chain and the
/// walk, whatever the Rust code's frame-pointer use), then `then(then_ctx)`.
#[repr(C)]
pub struct FpJob {
    pub capture: unsafe extern "sysv64" fn(usize, u64, u64, *mut u64, usize) -> u64,
    pub skip: usize,
    pub lo: u64,
    pub hi: u64,
    pub out: *mut u64,
    pub len: usize,
    pub result: u64,
    pub then: Option<Cb>,
    pub then_ctx: *mut c_void,
}

/// Runs `chain(unwt_capture_leaf, job)`: the FP capture from C into a
/// buffer of `depth`, then the oracle. Returns (addresses, walk, oracle).
pub fn fp_capture_from_c(
    bounds: &alloctrace_unwind::StackBounds,
    depth: usize,
    chain: impl FnOnce(Cb, *mut c_void),
) -> (Vec<u64>, alloctrace_unwind::Walk, Vec<u64>) {
    let mut out = vec![0u64; depth];
    let mut reference = Vec::new();
    let mut take_oracle = || reference = oracle();
    let mut job = FpJob {
        capture: alloctrace_unwind::capture_fp_raw,
        skip: 0,
        lo: bounds.lo(),
        hi: bounds.hi(),
        out: out.as_mut_ptr(),
        len: out.len(),
        result: 0,
        then: Some(trampoline_for(&take_oracle)),
        then_ctx: (&mut take_oracle as *mut _ as *mut c_void),
    };
    chain(unwt_capture_leaf, (&mut job as *mut FpJob).cast());
    let walk = alloctrace_unwind::Walk {
        len: (job.result & !alloctrace_unwind::TRUNCATED_BIT) as usize,
        truncated: job.result & alloctrace_unwind::TRUNCATED_BIT != 0,
    };
    out.truncate(walk.len);
    (out, walk, reference)
}

/// The trampoline for a closure of type F (the argument only names F).
pub fn trampoline_for<F: FnMut()>(_: &F) -> Cb {
    trampoline::<F>
}

extern "C" fn trampoline<F: FnMut()>(ctx: *mut c_void) {
    // SAFETY: ctx is the &mut F passed by `through_c` below, alive for the call.
    let f = unsafe { &mut *ctx.cast::<F>() };
    f();
}

/// Runs `f` as the callback of a C chain: `chain(cb, ctx)` calls one of the
/// unwt_* functions above with the given arguments.
pub fn through_c<F: FnMut()>(mut f: F, chain: impl FnOnce(Cb, *mut c_void)) {
    chain(trampoline::<F>, (&mut f as *mut F).cast());
}

/// The oracle: return addresses by libgcc's unwinder, innermost first
/// (the first entries are backtrace's own frames and the caller's pc).
#[inline(never)]
pub fn oracle() -> Vec<u64> {
    let mut v = Vec::new();
    backtrace::trace(|frame| {
        // libgcc reports the outermost frame (under clone3 or _start) with
        // ip 0: not a return address.
        if !frame.ip().is_null() {
            v.push(frame.ip() as u64);
        }
        true
    });
    v
}

/// The symbol name (demangled, without hash) of the function holding return address `addr`.
pub fn symbol(addr: u64) -> String {
    let mut name = String::new();
    backtrace::resolve(addr.wrapping_sub(1) as *mut c_void, |sym| {
        if name.is_empty() {
            if let Some(n) = sym.name() {
                name = format!("{n:#}");
            }
        }
    });
    name
}

/// How many of `addrs` are return addresses into a function named `name`.
pub fn count_in(addrs: &[u64], name: &str) -> usize {
    addrs.iter().filter(|&&a| symbol(a) == name).count()
}

/// Checks that `ours[1..]` (`ours[0]` is the return address into the
/// function that captured, which the oracle sees at another pc) equals the
/// oracle's list from where `ours[1]` appears in it, for as long as both
/// go on. Returns the number of frames compared.
pub fn assert_matches_oracle(ours: &[u64], oracle: &[u64]) -> usize {
    assert!(ours.len() >= 2, "capture too short: {ours:x?}");
    let p = oracle
        .iter()
        .position(|&a| a == ours[1])
        .unwrap_or_else(|| panic!("{:#x} not in the oracle's stack", ours[1]));
    let k = (ours.len() - 1).min(oracle.len() - p);
    let names = |v: &[u64]| {
        v.iter()
            .map(|&a| format!("{a:#x} {}", symbol(a)))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(&ours[1..1 + k]),
        names(&oracle[p..p + k]),
        "capture and oracle differ"
    );
    k
}

/// Whether `sub` appears in `full` in order (not necessarily contiguously).
pub fn is_subsequence(sub: &[u64], full: &[u64]) -> bool {
    let mut it = full.iter();
    sub.iter().all(|a| it.any(|b| b == a))
}
