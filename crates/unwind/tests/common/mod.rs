//! Shared by the integration tests: the C call chains (tests/c/, built by
//! build.rs) and the oracle (the `backtrace` crate, outside any malloc).
#![allow(dead_code)]

use core::ffi::{c_int, c_void};

pub type Cb = extern "C" fn(*mut c_void);

extern "C" {
    /// n + 1 frames with frame pointers (-O0), then cb(ctx).
    pub fn unwt_fp_level(n: c_int, cb: Cb, ctx: *mut c_void);
    /// n_fp + 1 frames with frame pointers, then n_nofp + 1 without, then cb.
    pub fn unwt_fp_mixed(n_fp: c_int, n_nofp: c_int, cb: Cb, ctx: *mut c_void);
    /// n + 1 frames without frame pointers (-O2 -fomit-frame-pointer), then cb.
    pub fn unwt_nofp_level(n: c_int, cb: Cb, ctx: *mut c_void);
    /// Calls cb(ctx) with rbp = garbage (with CFI saying where rbp was saved).
    pub fn unwt_garbage_rbp(garbage: u64, cb: Cb, ctx: *mut c_void);
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
