//! `StackBounds::from_maps` against `StackBounds::current` on the main
//! thread (this file has no test harness, so `main` runs on the process's
//! main thread) and on a spawned thread; captures with either bounds agree.

mod common;

use alloctrace_unwind::{capture_dwarf, DwarfCache, DwarfUnwinder, Modules, StackBounds};
use common::*;

fn sp() -> u64 {
    let probe = 0u64;
    std::hint::black_box(&probe as *const u64 as u64)
}

/// Checks this thread's bounds both ways; returns (maps, glibc) as (lo, hi).
fn check_this_thread(unwinder: &DwarfUnwinder, main: bool) -> ((u64, u64), (u64, u64)) {
    let maps = StackBounds::from_maps().expect("from_maps");
    let glibc = StackBounds::current().expect("current");
    let here = sp();
    assert!(maps.lo() <= here && here < maps.hi(), "{maps:x?} {here:#x}");
    if main {
        // glibc stops at the page above __libc_stack_end; the [stack]
        // mapping goes on above it (arguments, environment, auxv).
        assert!(maps.hi() >= glibc.hi(), "{maps:x?} {glibc:x?}");
        assert!(maps.hi() - glibc.hi() < 1 << 20, "{maps:x?} {glibc:x?}");
        // Both go down to where the stack may grow (RLIMIT_STACK or the
        // mapping below), computed the same way.
        assert_eq!(maps.lo(), glibc.lo(), "{maps:x?} {glibc:x?}");
    } else {
        assert_eq!((maps.lo(), maps.hi()), (glibc.lo(), glibc.hi()));
    }
    // A capture with either bounds gives the same stack (every frame lies
    // between the stack pointer and glibc's hi).
    let mut cache = DwarfCache::new();
    let (mut a, mut b) = ([0u64; 128], [0u64; 128]);
    let (mut wa, mut wb) = Default::default();
    through_c(
        || {
            wa = capture_dwarf(0, &maps, unwinder, &mut cache, &mut a);
            wb = capture_dwarf(0, &glibc, unwinder, &mut cache, &mut b);
        },
        // SAFETY: the chain calls the callback once.
        |cb, ctx| unsafe { unwt_fp_level(5, cb, ctx) },
    );
    assert_eq!(wa, wb);
    assert!(wa.len > 8 && !wa.truncated, "{wa:?}");
    assert_eq!(a[1..wa.len], b[1..wb.len]);
    ((maps.lo(), maps.hi()), (glibc.lo(), glibc.hi()))
}

fn main() {
    // SAFETY: nothing is unloaded while it is in use.
    let unwinder = unsafe { DwarfUnwinder::from_modules(&Modules::snapshot()) };
    // errno is kept.
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() = libc::EXDEV };
    let before = StackBounds::from_maps();
    // SAFETY: as above.
    assert_eq!(unsafe { *libc::__errno_location() }, libc::EXDEV);
    assert!(before.is_some());
    let (maps, glibc) = check_this_thread(&unwinder, true);
    println!("main thread:    from_maps {maps:x?}, current {glibc:x?}");
    // A deeper capture later, with the stack grown far below where the
    // [stack] mapping started when from_maps read it (the kernel maps
    // 132 KiB at exec), is still inside the bounds.
    let bounds = StackBounds::from_maps().unwrap();
    let top = sp();
    let mut deepest = 0;
    let w = deep(256, &mut || {
        deepest = sp();
        let mut out = [0u64; 16];
        let mut cache = DwarfCache::new();
        capture_dwarf(0, &bounds, &unwinder, &mut cache, &mut out)
    });
    assert!(top - deepest > 1 << 20, "{top:#x} {deepest:#x}");
    assert_eq!(w.len, 16, "{w:?}");
    std::thread::scope(|s| {
        s.spawn(|| {
            let (maps, glibc) = check_this_thread(&unwinder, false);
            println!("spawned thread: from_maps {maps:x?}, current {glibc:x?}");
        });
        s.spawn(|| {
            let _ = std::hint::black_box([0u8; 4096]);
            check_this_thread(&unwinder, false);
        });
    });
    println!("bounds_main: ok");
}

/// `n` frames of at least 4 KiB each, then `f`.
#[inline(never)]
fn deep(n: u32, f: &mut dyn FnMut() -> alloctrace_unwind::Walk) -> alloctrace_unwind::Walk {
    let pad = std::hint::black_box([0u8; 4096]);
    let w = if n == 0 { f() } else { deep(n - 1, f) };
    std::hint::black_box(pad);
    w
}
