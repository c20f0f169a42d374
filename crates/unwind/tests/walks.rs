//! Corrupt frame-pointer chains, the depth limit, threads and the module
//! snapshot.

mod common;

use alloctrace_unwind::{
    capture_dwarf, capture_fp, walk_fp_chain, DwarfCache, DwarfUnwinder, Modules, StackBounds, Walk,
};
use common::*;

fn unwinder() -> DwarfUnwinder {
    // SAFETY: these tests unload nothing while an unwinder is in use.
    unsafe { DwarfUnwinder::from_modules(&Modules::snapshot()) }
}

/// Captures (FP, DWARF and the oracle) from a callback that C calls with
/// rbp = `garbage`.
type Captures = (Vec<u64>, Walk, Vec<u64>, Walk, Vec<u64>);

fn capture_under_garbage_rbp(garbage: u64) -> Captures {
    let bounds = StackBounds::current().unwrap();
    let unwinder = unwinder();
    let mut cache = DwarfCache::new();
    let (mut fp, mut dw) = (vec![0u64; 128], vec![0u64; 128]);
    let (mut wf, mut wd, mut reference) = (Walk::default(), Walk::default(), Vec::new());
    through_c(
        || {
            wf = capture_fp(0, &bounds, &mut fp);
            wd = capture_dwarf(0, &bounds, &unwinder, &mut cache, &mut dw);
            reference = oracle();
        },
        // SAFETY: calls the callback once with rbp = garbage.
        |cb, ctx| unsafe { unwt_garbage_rbp(garbage, cb, ctx) },
    );
    fp.truncate(wf.len);
    dw.truncate(wd.len);
    (fp, wf, dw, wd, reference)
}

#[test]
fn garbage_frame_pointer_ends_the_fp_walk_truncated_and_dwarf_goes_through() {
    let here = &0u8 as *const u8 as u64;
    let bounds = StackBounds::current().unwrap();
    let cases = [
        ("outside the stack", 0xdead_beef_0000),
        ("kernel address", 0xffff_8000_0000_0000),
        ("misaligned, on the stack", (here & !7) + 3),
        ("below the capture (backwards)", bounds.lo() + 64),
        ("one past the top", bounds.hi()),
    ];
    for (what, garbage) in cases {
        let (fp, wf, dw, wd, reference) = capture_under_garbage_rbp(garbage);
        // The FP walk reaches the garbage (the Rust callback frames keep no
        // records) and stops there: at most the callback's own address.
        assert!(wf.truncated, "{what}: {wf:?} {fp:x?}");
        assert!(wf.len <= 2, "{what}: {wf:?}");
        assert!(is_subsequence(&fp[1..], &reference), "{what}");
        // DWARF restores rbp from the CFI and never uses the garbage.
        assert_matches_oracle(&dw, &reference);
        assert!(!wd.truncated, "{what}: {wd:?}");
        assert_eq!(count_in(&dw, "unwt_garbage_rbp"), 1, "{what}");
    }
}

#[test]
fn hand_built_chains_end_truncated_without_faulting() {
    let bounds = StackBounds::current().unwrap();
    // Records live in this frame's array, which is on the stack.
    let mut chain = [0u64; 16];
    let base = chain.as_ptr() as u64;
    let at = |i: usize| base + 8 * i as u64;
    let mut out = [0u64; 8];
    let run = |chain: &mut [u64; 16], next1: u64, skip: usize, out: &mut [u64]| {
        chain[0] = at(4); // record 0 -> record 1 (at index 4)
        chain[1] = 0x1111;
        chain[4] = next1;
        chain[5] = 0x2222;
        // The walk reads the array through integer addresses: keep the
        // stores.
        std::hint::black_box(&mut *chain);
        // SAFETY: the bounds are this thread's own.
        unsafe { walk_fp_chain(at(0), &bounds, skip, out) }
    };
    let done = |len, truncated| Walk { len, truncated };
    // A chain ending in 0 is complete.
    assert_eq!(run(&mut chain, 0, 0, &mut out), done(2, false));
    assert_eq!(out[..2], [0x1111, 0x2222]);
    // Outside the stack, backwards, a self-loop, misaligned: truncated.
    assert_eq!(run(&mut chain, 0x10, 0, &mut out), done(2, true));
    assert_eq!(
        run(&mut chain, 0xdead_beef_0000, 0, &mut out),
        done(2, true)
    );
    assert_eq!(run(&mut chain, at(0), 0, &mut out), done(2, true));
    assert_eq!(run(&mut chain, at(4), 0, &mut out), done(2, true));
    assert_eq!(run(&mut chain, at(8) + 3, 0, &mut out), done(2, true));
    assert_eq!(run(&mut chain, bounds.hi() - 8, 0, &mut out), done(2, true));
    // Skip and depth limit.
    assert_eq!(run(&mut chain, 0, 1, &mut out), done(1, false));
    assert_eq!(out[0], 0x2222);
    assert_eq!(run(&mut chain, 0, 0, &mut out[..1]), done(1, true));
    assert_eq!(run(&mut chain, 0, 0, &mut out[..0]), done(0, true));
    // A record whose return-address word crosses the top of the bounds.
    // SAFETY: a sub-range of this thread's stack.
    let short = unsafe { StackBounds::from_raw(bounds.lo(), at(5)) };
    chain[0] = at(4);
    std::hint::black_box(&mut chain);
    // SAFETY: as above.
    let w = unsafe { walk_fp_chain(at(0), &short, 0, &mut out) };
    assert_eq!(w, done(1, true));
    // A start outside the bounds reads nothing.
    // SAFETY: as above.
    let w = unsafe { walk_fp_chain(0x1000, &bounds, 0, &mut out) };
    assert_eq!(w, done(0, true));
}

#[test]
fn depth_limit_gives_exactly_the_limit_truncated() {
    let bounds = StackBounds::current().unwrap();
    let unwinder = unwinder();
    let mut cache = DwarfCache::new();
    let mut fp = [0u64; 64];
    let mut dw = [0u64; 64];
    let (mut wf, mut wd, mut wd_nofp) = (Walk::default(), Walk::default(), Walk::default());
    through_c(
        || {
            wf = capture_fp(0, &bounds, &mut fp);
            wd = capture_dwarf(0, &bounds, &unwinder, &mut cache, &mut dw);
        },
        // SAFETY: as in common.
        |cb, ctx| unsafe { unwt_fp_level(199, cb, ctx) },
    );
    through_c(
        || wd_nofp = capture_dwarf(0, &bounds, &unwinder, &mut cache, &mut dw),
        // SAFETY: as in common.
        |cb, ctx| unsafe { unwt_nofp_level(199, cb, ctx) },
    );
    let full = Walk {
        len: 64,
        truncated: true,
    };
    // The frame-pointer walk from the Rust callback depends on the Rust
    // code's use of rbp; from a C frame it does not.
    assert!(wf.len <= 64);
    // SAFETY: as in common.
    let (_, wf_c, _) = fp_capture_from_c(&bounds, 64, |cb, ctx| unsafe {
        unwt_fp_level(199, cb, ctx)
    });
    assert_eq!((wf_c, wd, wd_nofp), (full, full, full));
    // 200 Rust frames, DWARF only (Rust code has no frame records here).
    let mut out = [0u64; 50];
    let w = recurse(200, &mut || {
        capture_dwarf(0, &bounds, &unwinder, &mut cache, &mut out)
    });
    assert_eq!(
        w,
        Walk {
            len: 50,
            truncated: true
        }
    );
    assert!(out[2..].iter().all(|&a| symbol(a) == "walks::recurse"));
}

#[inline(never)]
fn recurse(n: u32, f: &mut dyn FnMut() -> Walk) -> Walk {
    let w = if n == 0 { f() } else { recurse(n - 1, f) };
    std::hint::black_box(w)
}

#[test]
fn a_spawned_thread_uses_its_own_stack_bounds() {
    let main = StackBounds::current().unwrap();
    let (main_lo, main_hi) = (main.lo(), main.hi());
    let unwinder = unwinder();
    std::thread::scope(|s| {
        s.spawn(|| {
            let bounds = StackBounds::current().unwrap();
            let local = 0u64;
            assert!(bounds.contains(&local as *const u64 as u64));
            assert!(bounds.hi() <= main_lo || bounds.lo() >= main_hi);
            let mut cache = DwarfCache::new();
            let mut fp = [0u64; 64];
            let mut dw = [0u64; 64];
            let (mut wf, mut wd, mut reference) = (Walk::default(), Walk::default(), Vec::new());
            through_c(
                || {
                    wf = capture_fp(0, &bounds, &mut fp);
                    wd = capture_dwarf(0, &bounds, &unwinder, &mut cache, &mut dw);
                    reference = oracle();
                },
                // SAFETY: as in common.
                |cb, ctx| unsafe { unwt_fp_level(3, cb, ctx) },
            );
            // Whole stack of this thread, down to clone3.
            assert!(!wd.truncated);
            assert_matches_oracle(&dw[..wd.len], &reference);
            assert!(symbol(dw[wd.len - 1]).contains("clone"));
            assert!(wf.len <= fp.len());
            // SAFETY: as in common.
            let (fp_c, wf_c, _) =
                fp_capture_from_c(&bounds, 64, |cb, ctx| unsafe { unwt_fp_level(3, cb, ctx) });
            // The C chain's four frame records, in a row from the leaf. (Past
            // them the walk follows the Rust frames' rbp, which may point at
            // stale records of the first chain: only the leading run counts.)
            let run = fp_c
                .iter()
                .skip_while(|&&a| symbol(a) != "unwt_fp_level")
                .take_while(|&&a| symbol(a) == "unwt_fp_level")
                .count();
            assert_eq!(run, 4, "{wf_c:?}");
            // The other thread's bounds do not hold this stack pointer:
            // nothing is read.
            // SAFETY: the main thread's range; the walk reads nothing of it.
            let other = unsafe { StackBounds::from_raw(main_lo, main_hi) };
            let none = Walk {
                len: 0,
                truncated: true,
            };
            assert_eq!(capture_fp(0, &other, &mut fp), none);
            assert_eq!(
                capture_dwarf(0, &other, &unwinder, &mut cache, &mut dw),
                none
            );
        });
    });
}

#[test]
fn module_snapshot_describes_the_loaded_objects() {
    let modules = Modules::snapshot();
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let code = module_snapshot_describes_the_loaded_objects as *const () as u64;
    let main = modules.find(code).expect("module of this test's code");
    assert_eq!(main.path, exe.as_os_str().as_encoded_bytes());
    assert!(main.contains(code));
    for m in modules.modules() {
        assert!(m.start < m.end);
        assert!(m
            .segments
            .iter()
            .all(|s| s.start >= m.start && s.end <= m.end));
        if m.eh_frame_hdr != 0 {
            assert!(m.contains(m.eh_frame_hdr));
            assert!(m.eh_frame == 0 || m.contains(m.eh_frame + m.eh_frame_len - 1));
        }
    }
    // The executable and libc have unwind tables and build IDs equal to
    // those in their files (read with the object crate).
    let libc_addr = libc::malloc as *const () as u64;
    let libc_mod = modules.find(libc_addr).expect("libc's module");
    assert!(String::from_utf8_lossy(&libc_mod.path).contains("libc.so"));
    for m in [main, libc_mod] {
        assert_ne!(m.eh_frame_hdr, 0);
        assert_ne!(m.eh_frame, 0);
        let file = std::fs::read(std::str::from_utf8(&m.path).unwrap()).unwrap();
        let obj = object::File::parse(&*file).unwrap();
        use object::Object;
        let id = obj
            .build_id()
            .unwrap()
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        assert_eq!(m.build_id, id, "{}", m.path_lossy());
        // The bias maps the file's entry-less addresses: a symbol's file
        // address plus the bias is where it is in memory.
        let seg = obj.segments().next().unwrap();
        use object::ObjectSegment;
        assert!(m.contains(m.bias + seg.address()));
    }
    assert!(
        !libc_mod.build_id.is_empty(),
        "Debian's libc has a build ID"
    );
    // SAFETY: nothing is unloaded while it exists.
    let unwinder = unsafe { DwarfUnwinder::from_modules(&modules) };
    assert!(unwinder.module_count() >= 3);
}

#[test]
fn a_snapshot_after_dlopen_and_dlclose_sees_the_change() {
    let before = Modules::snapshot();
    let name = c"libresolv.so.2";
    let has = |m: &Modules| {
        m.modules()
            .iter()
            .any(|m| String::from_utf8_lossy(&m.path).contains("libresolv.so"))
    };
    if has(&before) {
        return; // already loaded by something else: nothing to observe
    }
    // SAFETY: dlopen/dlclose of a system library with no constructors that matter.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null(), "libresolv.so.2 not found");
    let loaded = Modules::snapshot();
    assert!(has(&loaded));
    assert!(loaded.load_counters().0 > before.load_counters().0);
    // SAFETY: h came from dlopen above and nothing of it is in use.
    assert_eq!(unsafe { libc::dlclose(h) }, 0);
    let after = Modules::snapshot();
    assert!(!has(&after));
    assert!(after.load_counters().1 > loaded.load_counters().1);
}
