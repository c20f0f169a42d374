//! A capture inside a signal handler (on the thread's own stack): what a
//! shim sees when a handler allocates.

mod common;

use std::sync::atomic::{AtomicPtr, Ordering};

use alloctrace_unwind::{
    capture_dwarf, capture_fp, DwarfCache, DwarfUnwinder, Modules, StackBounds, Walk,
};
use common::*;

struct State {
    bounds: StackBounds,
    unwinder: DwarfUnwinder,
    cache: DwarfCache,
    dwarf: [u64; 128],
    fp: [u64; 128],
    walks: (Walk, Walk),
    oracle: Vec<u64>,
}

static STATE: AtomicPtr<State> = AtomicPtr::new(core::ptr::null_mut());

extern "C" fn handler(_: libc::c_int) {
    // SAFETY: the test sets STATE before raising the signal and reads it
    // only after raise returns; the handler runs on the same thread.
    let s = unsafe { &mut *STATE.load(Ordering::SeqCst) };
    let d = capture_dwarf(0, &s.bounds, &s.unwinder, &mut s.cache, &mut s.dwarf);
    let f = capture_fp(0, &s.bounds, &mut s.fp);
    s.walks = (d, f);
    // The oracle allocates: acceptable in this test's handler (the signal is
    // raised synchronously from plain Rust code, not from inside malloc).
    s.oracle = oracle();
}

#[inline(never)]
fn raise_here() {
    // SAFETY: raising a signal whose handler is installed.
    unsafe { libc::raise(libc::SIGUSR1) };
    std::hint::black_box(());
}

#[test]
fn dwarf_walk_crosses_the_signal_frame() {
    let mut state = Box::new(State {
        bounds: StackBounds::current().unwrap(),
        // SAFETY: nothing is unloaded during the test.
        unwinder: unsafe { DwarfUnwinder::from_modules(&Modules::snapshot()) },
        cache: DwarfCache::new(),
        dwarf: [0; 128],
        fp: [0; 128],
        walks: (Walk::default(), Walk::default()),
        oracle: Vec::new(),
    });
    STATE.store(&mut *state, Ordering::SeqCst);
    // SAFETY: installs a plain handler for SIGUSR1 (no one else uses it in
    // this test binary).
    unsafe { libc::signal(libc::SIGUSR1, handler as *const () as libc::sighandler_t) };
    raise_here();
    let (d, f) = state.walks;
    let names: Vec<String> = state.dwarf[..d.len].iter().map(|&a| symbol(a)).collect();
    // The DWARF walk goes through the kernel's signal frame (libc's
    // __restore_rt; the interrupted registers come from the ucontext) back
    // into the code that raised the signal, and on to the thread's start,
    // exactly as the oracle (taken in the same handler) does.
    assert!(
        names.iter().any(|n| n == "signal::raise_here"),
        "{d:?} {names:?}"
    );
    assert!(!d.truncated);
    assert_matches_oracle(&state.dwarf[..d.len], &state.oracle);
    // The frame-pointer walk never faults; what it gives is whatever
    // records it finds.
    assert!(f.len <= 128);
}
