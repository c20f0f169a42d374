//! No allocation during capture: a counting global allocator, and counting
//! `malloc`/`calloc`/`realloc`/`free` of the C library (this test binary
//! defines them, over glibc's `__libc_*`), see none across 10,000 captures
//! of each kind, after set-up, nor in `StackBounds::from_maps`.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use alloctrace_unwind::{
    capture_dwarf, capture_dwarf_memo, capture_fp, capture_from, capture_from_compact,
    capture_from_framehop, capture_here, DwarfCache, DwarfUnwinder, MemoWalk, Modules, StackBounds,
    StartRegs, Walk, WalkMemo,
};
use common::*;

struct Counting;

thread_local! {
    /// Whether this thread counts its allocations now (const-initialised:
    /// reading it never allocates).
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    if COUNTING.with(Cell::get) {
        COUNT.with(|c| c.set(c.get() + 1));
    }
}

// SAFETY: forwards to System, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: as the caller's contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: as the caller's contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: as the caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note();
        // SAFETY: as the caller's contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

extern "C" {
    fn __libc_malloc(size: usize) -> *mut libc::c_void;
    fn __libc_calloc(n: usize, size: usize) -> *mut libc::c_void;
    fn __libc_realloc(p: *mut libc::c_void, size: usize) -> *mut libc::c_void;
    fn __libc_free(p: *mut libc::c_void);
}

// The C library's allocator, counted: the executable's definitions take
// precedence over libc's for every caller in the process (glibc's own
// internal calls, fopen's or pthread_getattr_np's, included).

/// # Safety
/// As malloc.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut libc::c_void {
    note();
    // SAFETY: forwards to glibc's allocator.
    unsafe { __libc_malloc(size) }
}

/// # Safety
/// As calloc.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut libc::c_void {
    note();
    // SAFETY: forwards to glibc's allocator.
    unsafe { __libc_calloc(n, size) }
}

/// # Safety
/// As realloc.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut libc::c_void, size: usize) -> *mut libc::c_void {
    note();
    // SAFETY: forwards to glibc's allocator.
    unsafe { __libc_realloc(p, size) }
}

/// # Safety
/// As free.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut libc::c_void) {
    if !p.is_null() {
        note();
    }
    // SAFETY: forwards to glibc's allocator.
    unsafe { __libc_free(p) }
}

/// Runs `f` and returns how many allocator calls this thread made in it.
fn allocations_in(f: impl FnOnce()) -> u64 {
    COUNT.with(|c| c.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    COUNT.with(Cell::get)
}

#[test]
fn captures_never_allocate() {
    // Set-up: may allocate.
    let bounds = StackBounds::current().unwrap();
    // SAFETY: nothing is unloaded during the test.
    let unwinder = unsafe { DwarfUnwinder::from_modules(&Modules::snapshot()) };
    let mut cache = DwarfCache::new();
    let mut out = [0u64; 64];
    // The counter works: a Vec counts (Rust's allocator, then libc's).
    assert_eq!(
        allocations_in(|| drop(std::hint::black_box(vec![1u8; 10]))),
        4
    );
    let (mut fp_allocs, mut dwarf_allocs) = (u64::MAX, u64::MAX);
    let mut frames = (0, 0);
    through_c(
        || {
            let mut last = Walk::default();
            fp_allocs = allocations_in(|| {
                for _ in 0..10_000 {
                    last = std::hint::black_box(capture_fp(0, &bounds, &mut out));
                }
            });
            frames.0 = last.len;
            dwarf_allocs = allocations_in(|| {
                for _ in 0..10_000 {
                    last = std::hint::black_box(capture_dwarf(
                        0, &bounds, &unwinder, &mut cache, &mut out,
                    ));
                }
            });
            frames.1 = last.len;
        },
        // SAFETY: as in common.
        |cb, ctx| unsafe { unwt_fp_mixed(3, 4, cb, ctx) },
    );
    assert_eq!((fp_allocs, dwarf_allocs), (0, 0));
    // The captures did walk (through C frames with and without frame
    // pointers; the frame-pointer walk from this Rust callback may stop at
    // the first frame in an optimised build).
    assert!(frames.0 >= 1 && frames.1 >= 12, "{frames:?}");
}

#[test]
fn memoized_captures_never_allocate() {
    let bounds = StackBounds::current().unwrap();
    // SAFETY: nothing is unloaded during the test.
    let unwinder = unsafe { DwarfUnwinder::from_modules(&Modules::snapshot()) };
    let mut cache = DwarfCache::new();
    let mut memo = Box::new(WalkMemo::new());
    let mut out = [0u64; 64];
    let mut allocs = u64::MAX;
    let mut last = MemoWalk::default();
    // Alternating between two call sites (a walk that copies part of the
    // memo and walks the rest) and repeating one (a walk that copies all).
    #[inline(never)]
    fn site_a(f: &mut dyn FnMut() -> MemoWalk) -> MemoWalk {
        std::hint::black_box(f())
    }
    #[inline(never)]
    fn site_b(f: &mut dyn FnMut() -> MemoWalk) -> MemoWalk {
        std::hint::black_box(f())
    }
    through_c(
        || {
            let mut capture =
                || capture_dwarf_memo(0, &bounds, &unwinder, &mut cache, &mut memo, &mut out);
            allocs = allocations_in(|| {
                for i in 0..10_000 {
                    last = if i % 3 == 1 {
                        site_a(&mut capture)
                    } else {
                        site_b(&mut capture)
                    };
                }
            });
        },
        // SAFETY: as in common.
        |cb, ctx| unsafe { unwt_fp_mixed(3, 4, cb, ctx) },
    );
    assert_eq!(allocs, 0);
    // It walked, and the last (a repeat of site_b) shared its frames.
    assert!(last.len >= 12 && last.shared == last.len, "{last:?}");
}

#[test]
fn stack_bounds_from_maps_never_allocate() {
    let mut found = None;
    let allocs = allocations_in(|| found = StackBounds::from_maps());
    assert_eq!(allocs, 0);
    // It found this (spawned test) thread's stack, as glibc does, which
    // calls malloc (the counter sees it) and, on the main thread, fopen.
    let found = found.expect("from_maps");
    let mut glibc = None;
    assert!(allocations_in(|| glibc = StackBounds::current()) > 0);
    assert_eq!(Some(found), glibc);
}

/// A naked entry, as the shim's malloc: calls `entry_body(ctx, [rsp],
/// rsp + 8, rbp)` by a tail jump, leaving no frame of its own.
#[unsafe(naked)]
extern "sysv64" fn entry(_ctx: *mut libc::c_void) {
    core::arch::naked_asm!(
        "mov rsi, [rsp]",
        "lea rdx, [rsp + 8]",
        "mov rcx, rbp",
        "jmp {body}",
        body = sym entry_body,
    )
}

extern "sysv64" fn entry_body(ctx: *mut libc::c_void, ra: u64, sp: u64, bp: u64) {
    // SAFETY: ctx is the `&mut &mut dyn FnMut` `at_entry` passes.
    let f = unsafe { &mut *ctx.cast::<&mut dyn FnMut(StartRegs)>() };
    f(StartRegs { ra, sp, bp });
}

/// `f` at a naked entry called from here (two sites: `at_entry_a`/`_b`).
#[inline(never)]
fn at_entry_a(mut f: &mut dyn FnMut(StartRegs)) {
    entry((&mut f as *mut &mut dyn FnMut(StartRegs)).cast());
    std::hint::black_box(1u8);
}

#[inline(never)]
fn at_entry_b(mut f: &mut dyn FnMut(StartRegs)) {
    entry((&mut f as *mut &mut dyn FnMut(StartRegs)).cast());
    std::hint::black_box(2u16);
}

#[test]
fn walks_from_the_program_frame_never_allocate() {
    let bounds = StackBounds::current().unwrap();
    // SAFETY: nothing is unloaded during the test.
    let unwinder = unsafe { DwarfUnwinder::from_modules(&Modules::snapshot()) };
    let mut cache = DwarfCache::new();
    let mut memo = Box::new(WalkMemo::new());
    let mut out = [0u64; 64];
    let mut allocs = [u64::MAX; 4];
    let mut last = [MemoWalk::default(); 4];
    through_c(
        || {
            for kind in 0..4 {
                let mut capture = |start: StartRegs| {
                    let (b, u, c, m, o) = (&bounds, &unwinder, &mut cache, &mut memo, &mut out);
                    last[kind] = match kind {
                        0 => capture_from(start, b, u, c, m, o),
                        1 => {
                            let w = capture_from_compact(start, b, u, c, o);
                            MemoWalk {
                                len: w.len,
                                truncated: w.truncated,
                                shared: 0,
                            }
                        }
                        2 => {
                            let w = capture_from_framehop(start, b, u, c, o);
                            MemoWalk {
                                len: w.len,
                                truncated: w.truncated,
                                shared: 0,
                            }
                        }
                        _ => capture_here(0, b, u, c, m, o),
                    };
                };
                allocs[kind] = allocations_in(|| {
                    for i in 0..10_000 {
                        if i % 3 == 1 {
                            at_entry_a(&mut capture)
                        } else {
                            at_entry_b(&mut capture)
                        }
                    }
                });
            }
        },
        // SAFETY: as in common.
        |cb, ctx| unsafe { unwt_fp_mixed(3, 4, cb, ctx) },
    );
    assert_eq!(allocs, [0; 4]);
    assert!(last.iter().all(|w| w.len >= 12), "{last:?}");
    // The last memoized ones (a repeat of site b) shared every frame.
    assert_eq!(last[0].shared, last[0].len);
    assert_eq!(last[3].shared, last[3].len);
}
