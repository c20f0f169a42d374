//! The malloc family. Each wrapper is: the real call (the *next*
//! allocator's: glibc's, or the jemalloc, tcmalloc or mimalloc the program
//! links or preloads, or a second interposer; real.rs), then, when tracing,
//! one tagged event (FORMAT.md section 3):
//!
//! | call | events (T = tagged with the entry point) |
//! |---|---|
//! | allocation that succeeds | T heap alloc (requested size) |
//! | allocation that fails, `free(NULL)` | T call |
//! | `free(p)` | T heap free, recorded *before* the real free |
//! | `realloc(NULL, n)` | as malloc |
//! | `realloc(p, 0)` (glibc frees p) | T heap free (then a heap alloc if the allocator returns a block) |
//! | `realloc(p, n)` | heap free of p (before the call), then T heap alloc of the result |
//! | `realloc(p, n)` that fails | heap free of p, heap alloc of p again (its usable size), T call |
//! | `reallocarray` | as realloc; an overflow is a T call (errno ENOMEM) |
//!
//! A free is recorded before the block goes back to the allocator: once it is back,
//! another thread may get the same address from malloc and record its
//! allocation, which must come after the free in the trace.
//!
//! In a session that starts with an inherited heap (session.rs; state.rs's FILTER) an
//! object's free is recorded only if the object is in the live set; the
//! free of an inherited object is a T call.
//!
//! In sampling mode (`ALLOCTRACE_SAMPLE_BYTES`, the writer's
//! `events::sample_alloc`) an allocation is recorded, with its call stack,
//! only when the thread's countdown samples it, decided before the stack
//! is walked; a free only when its address was sampled (`sample_free`,
//! before the real free); a realloc is a free and an allocation, each
//! decided so. No call events are written then: the exact counts of
//! allocations, bytes and frees go in each generation's end instead.
//!
//! Sampling mode's fast path: malloc, calloc, realloc and free check the
//! sampling switch first and, when it is on, go to their `*_sampling`
//! function, which decides before anything else (`unsampled`: the session
//! records the heap, the thread's state is below OWN, its countdown and
//! counts are at hand in one TLS word). An allocation the countdown does
//! not sample is the next allocator's call and two counts; a free whose
//! address is certainly not sampled (one load of the set's filter) one
//! count and the call; a realloc of such a block to a size not sampled
//! both. Nothing there walks the call stack, enters the boundary or saves
//! more than two registers: the register capture's values are only
//! passed on. Everything else (the thread's first call, a sampled
//! allocation, a free that may be of a sampled object, state OWN or
//! DISABLED, `realloc(NULL, n)`, `realloc(p, 0)`) takes the traced path
//! (`*_traced`, out of line), which decides the same. The other modes pay
//! the switch's load and a jump.
//!
//! The arguments go to the next allocator unchanged and its answer (result,
//! errno, posix_memalign's code) comes back unchanged: the shim checks
//! nothing the allocator checks, so the program behaves as without it.
//! Blocks of the shim's private heap (private_heap.rs) never reach the allocator: free
//! and realloc recognise them by address; calls in state OWN are served
//! from that heap.
//!
//! Each wrapper states only what is its own (the private heap's answer in
//! state OWN, the next allocator's call, the entry point); the branch they
//! share is written once: [`account`] (record when the session records the
//! heap, log before the constructor, nothing otherwise), with
//! [`trace_alloc`] and [`allocate`] for the allocating calls (the same
//! branch, with the call stack: each condition checked once, the events
//! out of line in [`record_alloc`] with their arguments in registers).
//! realloc and reallocarray ([`reallocate`]) record a free before the call
//! and an allocation after it, so they take that branch around the call.
//!
//! Hot path: a relaxed load (sampling?), a relaxed load (tracing on?), the
//! real call (a relaxed load of a cached function pointer and an indirect
//! call), a thread-local state check and the event; no allocation, no
//! lock, no system call.
//!
//! The recording runs inside boundary.rs's `event` (no cost unless it
//! panics): a panic in it never reaches the program, and turns the
//! thread's tracing off for good; [`record_or_lost`] then counts each of
//! its calls as a lost event.

use core::ffi::{c_int, c_void};
use core::sync::atomic::Ordering;

use alloctrace_writer::capture::{self, StackMode, StartRegs};
use alloctrace_writer::events::{self, tagged, EntryPoint};

use crate::{boundary, early, late, liveset, private_heap, real, reentrancy, state};

/// memalign's alignment rule, for the shim's private heap: rounded up to a
/// power of two, at least 16.
fn private_align(align: usize) -> usize {
    align
        .checked_next_power_of_two()
        .unwrap_or(usize::MAX / 2 + 1)
        .max(16)
}

#[inline(always)]
fn recording() -> bool {
    alloctrace_writer::enabled() && state::HEAP.load(Ordering::Relaxed)
}

#[inline(always)]
fn filtering() -> bool {
    state::FILTER.load(Ordering::Relaxed)
}

/// Sampling mode's fast path, once `events::sampling()` said the session
/// samples: the thread's countdown and counts when the session records
/// the heap and the thread's events are recorded
/// (`reentrancy::get() < OWN`: never in state OWN, whose calls the private
/// heap serves, nor DISABLED, whose calls count as lost), else `None`.
#[inline(always)]
fn unsampled() -> Option<events::Unsampled> {
    let c = events::unsampled(reentrancy::OWN as usize)?;
    state::HEAP.load(Ordering::Relaxed).then_some(c)
}

/// Sampling mode's fast allocation: `next()`, the next allocator's call
/// for `size` bytes, only counted (when it succeeds), when the thread's
/// countdown does not sample it: decided before the call, with nothing of
/// the traced path (register capture's use, boundary, call stack).
/// `None`: the caller takes the traced path, which decides the same.
#[inline(always)]
fn allocate_unsampled(size: usize, next: impl FnOnce() -> *mut c_void) -> Option<*mut c_void> {
    let c = unsampled().filter(|c| c.skips(size))?;
    let p = next();
    if !p.is_null() {
        c.alloc(size);
    }
    Some(p)
}

/// The call stack of the allocation `p` (null: none was made) when the
/// session captures native stacks, else 0: the walk starts at `start`, the
/// program's frame as the naked entry saw it. The caller has checked that
/// the session records the heap and that the thread's events are recorded
/// (`reentrancy::get() < OWN`).
#[inline(always)]
fn call_stack(p: *mut c_void, start: StartRegs) -> u64 {
    if !p.is_null() && capture::mode() != StackMode::None {
        capture::capture_stack_from(start)
    } else {
        0
    }
}

/// Runs `record` (a call's events) when the thread's events are recorded
/// (`reentrancy::get() < OWN`); when a panic turned the thread's tracing
/// off (boundary.rs, `event`), counts the call's event as lost instead.
/// Must be called once per call, inside the call's first boundary.
#[inline(always)]
fn record_or_lost(entry: EntryPoint, record: impl FnOnce()) {
    let state = reentrancy::get();
    if state < reentrancy::OWN {
        boundary::test_point(entry as u8);
        record();
    } else if state == reentrancy::DISABLED {
        events::lost();
    }
}

/// Turns the entry's registers into where the walk starts.
#[inline(always)]
fn regs(ra: u64, sp: u64, bp: u64) -> StartRegs {
    StartRegs { ra, sp, bp }
}

/// An exported entry point `$name($args) -> $ret` whose body is
/// `$body($args, ra, sp, bp)`. On x86_64 Linux the entry is naked: it
/// loads the return address (`[rsp]`), the stack pointer the program has
/// once it returns (`rsp + 8`) and rbp into the argument registers after
/// the real arguments (`$ra`, `$sp`, `$bp`) and jumps to the body, whose
/// return goes straight back to the program. No frame of the tracer's is
/// ever on the stack below the program's: a walk starts in the program's
/// frame, with nothing to skip. Elsewhere a plain wrapper (no stacks).
macro_rules! entry {
    (
        $(#[$meta:meta])*
        fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $body:ident;
        $ra:literal, $sp:literal, $bp:literal
    ) => {
        $(#[$meta])*
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            core::arch::naked_asm!(
                concat!("mov ", $ra, ", qword ptr [rsp]"),
                concat!("lea ", $sp, ", [rsp + 8]"),
                concat!("mov ", $bp, ", rbp"),
                "jmp {body}",
                body = sym $body,
            )
        }

        $(#[$meta])*
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: the caller's arguments, forwarded.
            unsafe { $body($($arg,)* 0, 0, 0) }
        }
    };
}

/// Records an allocation's outcome, without a call stack: alloc of `p`
/// when sampled, or a call when it failed. (An allocation with a call
/// stack goes through [`trace_alloc`], which walks it only once the
/// allocation is sampled.)
#[inline(always)]
fn allocated(entry: EntryPoint, p: *mut c_void, size: usize) {
    record_or_lost(entry, || {
        if p.is_null() || events::sample_alloc(p as usize, size as u64) {
            record_alloc(entry, p, size, 0)
        }
    });
}

/// A call that changed no memory (`free(NULL)`, a failed allocation): a T
/// call event, but in sampling mode, which records only sampled objects.
#[inline(always)]
fn call_event(entry: EntryPoint) {
    if !events::sampling() {
        tagged::call(entry);
    }
}

/// [`allocated`]'s events, out of line with its arguments in registers
/// (a closure's would be built in memory on every call). A non-null `p`
/// was sampled (`events::sample_alloc`).
#[inline(never)]
fn record_alloc(entry: EntryPoint, p: *mut c_void, size: usize, stack: u64) {
    if p.is_null() {
        call_event(entry);
    } else {
        if filtering() {
            liveset::insert(p as usize);
        }
        if stack != 0 {
            tagged::heap_object_alloc_stack(entry, p as usize, size as u64, stack);
        } else {
            tagged::heap_object_alloc(entry, p as usize, size as u64);
        }
    }
}

/// An allocating call's tracing part, after the call (the allocation `p`,
/// null when it failed, of `size` bytes; its stack walked from `start`):
/// [`account_alloc`] with the call stack, each condition checked once
/// (the session records the heap, the thread's events are recorded).
#[inline(always)]
fn trace_alloc(entry: EntryPoint, p: *mut c_void, size: usize, start: StartRegs) {
    if recording() {
        // Sampling mode: an allocation not sampled is only counted, before
        // the boundary and any stack walk (sample_alloc_at never panics;
        // the thread's state is checked first, as record_or_lost would). A
        // session recording everything pays one load of the sampling
        // switch and a branch here; a sampling one loads it once.
        let mean = events::sample_bytes();
        if mean != 0
            && !p.is_null()
            && reentrancy::get() < reentrancy::OWN
            && !events::sample_alloc_at(mean, p as usize, size as u64)
        {
            return;
        }
        boundary::event(|| {
            record_or_lost(entry, || {
                let stack = call_stack(p, start);
                record_alloc(entry, p, size, stack);
            })
        });
    } else if early::active() {
        boundary::event(|| early::alloc(p as usize, size));
    } else {
        late::note(&state::HEAP);
    }
}

/// Records `entry` freeing `p` (before the real free): in sampling mode
/// only when `p` was sampled.
#[inline(always)]
fn freed(entry: EntryPoint, p: *mut c_void) {
    if !p.is_null() && !events::sample_free(p as usize) {
        return;
    }
    if p.is_null() || (filtering() && !liveset::remove(p as usize)) {
        call_event(entry);
    } else {
        tagged::heap_object_free(entry, p as usize);
    }
}

/// The branch every wrapper takes for its call: `trace` (the events) when
/// the session records the heap, `log` (early.rs) before the constructor
/// has decided, nothing otherwise. Inline, so the hot path stays a relaxed
/// load and a branch before the events.
#[inline(always)]
fn account(trace: impl FnOnce(), log: impl FnOnce()) {
    if recording() {
        trace();
    } else if early::active() {
        log();
    } else {
        late::note(&state::HEAP);
    }
}

/// [`account`] for an allocation's outcome, without a call stack: `p`
/// from a call asking for `size` bytes (null: the call failed).
#[inline(always)]
fn account_alloc(entry: EntryPoint, p: *mut c_void, size: usize) {
    account(
        || allocated(entry, p, size),
        || early::alloc(p as usize, size),
    );
}

/// A wrapper that allocates `size` bytes: in state OWN the shim's private
/// heap (`private`), otherwise the next allocator's call (`next`), then
/// the call accounted for (its stack walked from `start`).
#[inline(always)]
fn allocate(
    entry: EntryPoint,
    size: usize,
    start: StartRegs,
    private: impl FnOnce() -> *mut c_void,
    next: impl FnOnce() -> *mut c_void,
) -> *mut c_void {
    if reentrancy::get() == reentrancy::OWN {
        return private();
    }
    let p = next();
    trace_alloc(entry, p, size, start);
    p
}

entry! {
    /// Interposed malloc(3).
    ///
    /// # Safety
    /// As malloc(3).
    fn malloc(size: usize) -> *mut c_void = malloc_body;
    "rsi", "rdx", "rcx"
}

unsafe extern "C" fn malloc_body(size: usize, ra: u64, sp: u64, bp: u64) -> *mut c_void {
    if events::sampling() {
        // SAFETY: the caller's arguments, forwarded.
        return unsafe { malloc_sampling(size, ra, sp, bp) };
    }
    // SAFETY: the caller's arguments, forwarded.
    unsafe { malloc_traced(size, ra, sp, bp) }
}

/// malloc in sampling mode: the fast path, else the traced one. The entry
/// only dispatches, and each path is out of line: the fast path saves few
/// registers, and the traced path's saves come after the dispatch.
#[inline(never)]
unsafe extern "C" fn malloc_sampling(size: usize, ra: u64, sp: u64, bp: u64) -> *mut c_void {
    // SAFETY: forwarded.
    if let Some(p) = allocate_unsampled(size, || unsafe { real::malloc(size) }) {
        return p;
    }
    // SAFETY: the caller's arguments, forwarded.
    unsafe { malloc_traced(size, ra, sp, bp) }
}

/// malloc's traced path.
#[inline(never)]
unsafe extern "C" fn malloc_traced(size: usize, ra: u64, sp: u64, bp: u64) -> *mut c_void {
    allocate(
        EntryPoint::Malloc,
        size,
        regs(ra, sp, bp),
        || private_heap::alloc(size, 16),
        // SAFETY: forwarded.
        || unsafe { real::malloc(size) },
    )
}

entry! {
    /// Interposed calloc(3).
    ///
    /// # Safety
    /// As calloc(3).
    fn calloc(n: usize, size: usize) -> *mut c_void = calloc_body;
    "rdx", "rcx", "r8"
}

unsafe extern "C" fn calloc_body(n: usize, size: usize, ra: u64, sp: u64, bp: u64) -> *mut c_void {
    if events::sampling() {
        // SAFETY: the caller's arguments, forwarded.
        return unsafe { calloc_sampling(n, size, ra, sp, bp) };
    }
    // SAFETY: the caller's arguments, forwarded.
    unsafe { calloc_traced(n, size, ra, sp, bp) }
}

/// calloc in sampling mode (out of line, as malloc's).
#[inline(never)]
unsafe extern "C" fn calloc_sampling(
    n: usize,
    size: usize,
    ra: u64,
    sp: u64,
    bp: u64,
) -> *mut c_void {
    // SAFETY: forwarded (an n * size that overflows fails, uncounted).
    if let Some(p) = allocate_unsampled(n.wrapping_mul(size), || unsafe { real::calloc(n, size) }) {
        return p;
    }
    // SAFETY: the caller's arguments, forwarded.
    unsafe { calloc_traced(n, size, ra, sp, bp) }
}

/// calloc's traced path.
#[inline(never)]
unsafe extern "C" fn calloc_traced(
    n: usize,
    size: usize,
    ra: u64,
    sp: u64,
    bp: u64,
) -> *mut c_void {
    allocate(
        EntryPoint::Calloc,
        n.wrapping_mul(size),
        regs(ra, sp, bp),
        || private_heap::calloc(n, size),
        // SAFETY: forwarded (the allocator checks n * size for overflow).
        || unsafe { real::calloc(n, size) },
    )
}

/// Interposed free(3).
///
/// # Safety
/// As free(3).
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if private_heap::contains(p) {
        // SAFETY: a block of the shim's private heap.
        return unsafe { free_private(p) };
    }
    if !p.is_null() && events::sampling() {
        // SAFETY: forwarded.
        return unsafe { free_sampling(p) };
    }
    // SAFETY: forwarded.
    unsafe { free_traced(p) }
}

/// free in sampling mode (out of line, as malloc's): the free of an object
/// certainly not sampled is only counted, before anything else (nothing
/// in it panics); the others take the traced path. `p` is not null nor a
/// block of the private heap.
#[inline(never)]
unsafe extern "C" fn free_sampling(p: *mut c_void) {
    if let Some(c) = unsampled().filter(|c| c.free_skips(p as usize)) {
        c.free();
        // SAFETY: forwarded.
        return unsafe { real::free(p) };
    }
    // SAFETY: forwarded.
    unsafe { free_traced(p) }
}

/// free of a block of the shim's private heap (out of line, as the
/// traced path).
#[cold]
#[inline(never)]
unsafe extern "C" fn free_private(p: *mut c_void) {
    // SAFETY: as the caller's.
    unsafe { private_heap::free(p) }
}

/// free's traced path: `p` is not a block of the private heap.
#[inline(never)]
unsafe extern "C" fn free_traced(p: *mut c_void) {
    if p.is_null() && reentrancy::get() == reentrancy::OWN {
        // The shim's own free(NULL) (glibc makes two when one of the
        // tracer's threads exits): a no-op, kept from the next allocator
        // (an interposer after the shim counts only the program's calls).
        return;
    }
    boundary::event(|| {
        account(
            || record_or_lost(EntryPoint::Free, || freed(EntryPoint::Free, p)),
            || early::free(p as usize),
        )
    });
    // SAFETY: forwarded.
    unsafe { real::free(p) }
}

/// Sampling mode's fast realloc: `call(p)`, the next allocator's realloc
/// of `p` to `size` bytes, only counted (a free and an allocation, when
/// it succeeds; nothing when it fails and `p` stays), when `p` is
/// certainly not sampled and the thread's countdown does not sample the
/// new block. `None`: the caller takes the traced path ([`reallocate`]),
/// as for `realloc(NULL, n)`, `realloc(p, 0)` and the private heap's
/// blocks.
#[inline(always)]
fn reallocate_unsampled(
    p: *mut c_void,
    size: usize,
    call: impl FnOnce(*mut c_void) -> *mut c_void,
) -> Option<*mut c_void> {
    if p.is_null() || size == 0 || private_heap::contains(p) {
        return None;
    }
    let c = unsampled().filter(|c| c.skips(size) && c.free_skips(p as usize))?;
    let r = call(p);
    if !r.is_null() {
        c.free();
        c.alloc(size);
    }
    Some(r)
}

/// realloc and reallocarray once the size is known: `call(p)` is the next
/// allocator's realloc(p, size) or reallocarray(p, n, m); the new block's
/// stack is walked from `start`.
#[inline(always)]
unsafe fn reallocate(
    entry: EntryPoint,
    p: *mut c_void,
    size: usize,
    start: StartRegs,
    call: impl Fn(*mut c_void) -> *mut c_void,
) -> *mut c_void {
    if private_heap::contains(p) {
        // SAFETY: a block of the shim's private heap.
        return unsafe { private_heap::realloc(p, size) };
    }
    if p.is_null() && reentrancy::get() == reentrancy::OWN {
        return private_heap::alloc(size, 16);
    }
    if !recording() || reentrancy::get() == reentrancy::OWN {
        let log = early::active();
        if !log {
            late::note(&state::HEAP);
        }
        let r = call(p);
        if log && (!r.is_null() || size == 0) {
            early::free(p as usize);
            early::alloc(r as usize, size);
        }
        return r;
    }
    if reentrancy::get() == reentrancy::DISABLED {
        // A panic turned the thread's tracing off (boundary.rs).
        events::lost();
        return call(p);
    }
    // The thread's events are recorded from here on, unless a panic in
    // the call's first boundary turns its tracing off: the later ones
    // then record nothing (the call's event is counted lost once).
    if p.is_null() {
        let r = call(p);
        boundary::event(|| {
            boundary::test_point(entry as u8);
            if r.is_null() || events::sample_alloc(r as usize, size as u64) {
                let stack = call_stack(r, start);
                record_alloc(entry, r, size, stack);
            }
        });
        return r;
    }
    if size == 0 {
        // glibc frees p and returns NULL.
        boundary::event(|| {
            boundary::test_point(entry as u8);
            freed(entry, p);
        });
        let r = call(p);
        if !r.is_null() {
            // Another allocator's realloc(p, 0) may return a new block.
            boundary::event(|| {
                reentrancy::event(|| {
                    if !events::sample_alloc(r as usize, 0) {
                        return;
                    }
                    if filtering() {
                        liveset::insert(r as usize);
                    }
                    events::sampled::heap_object_alloc(r as usize, 0, 0);
                })
            });
        }
        return r;
    }
    let mut tracked = true;
    boundary::event(|| {
        boundary::test_point(entry as u8);
        tracked = events::sample_free(p as usize) && (!filtering() || liveset::remove(p as usize));
        if tracked {
            events::sampled::heap_object_free(p as usize);
        }
    });
    let r = call(p);
    boundary::event(|| {
        let recorded = reentrancy::get() < reentrancy::OWN
            && !r.is_null()
            && events::sample_alloc(r as usize, size as u64);
        let stack = if recorded { call_stack(r, start) } else { 0 };
        reentrancy::event(|| {
            if r.is_null() {
                // p is still allocated: live again in the trace (in
                // sampling mode, when drawn again).
                if tracked {
                    // SAFETY: p is a live block of the next allocator's.
                    let usable = unsafe { real::malloc_usable_size(p) };
                    if events::sample_alloc(p as usize, usable as u64) {
                        if filtering() {
                            liveset::insert(p as usize);
                        }
                        events::sampled::heap_object_alloc(p as usize, usable as u64, 0);
                    }
                } else if let Some(c) = events::sampling().then(unsampled).flatten() {
                    // Sampling mode, p not sampled: its free was counted
                    // (sample_free), and p stays: counted back, as the
                    // allocation the trace of a sampled p records, so the
                    // totals stay exact. Not drawn: p stays unsampled.
                    // SAFETY: p is a live block of the next allocator's.
                    c.alloc(unsafe { real::malloc_usable_size(p) });
                }
                call_event(entry);
            } else if recorded {
                if filtering() {
                    liveset::insert(r as usize);
                }
                if stack != 0 {
                    tagged::heap_object_alloc_stack(entry, r as usize, size as u64, stack);
                } else {
                    tagged::heap_object_alloc(entry, r as usize, size as u64);
                }
            }
        })
    });
    r
}

entry! {
    /// Interposed realloc(3).
    ///
    /// # Safety
    /// As realloc(3).
    fn realloc(p: *mut c_void, size: usize) -> *mut c_void = realloc_body;
    "rdx", "rcx", "r8"
}

unsafe extern "C" fn realloc_body(
    p: *mut c_void,
    size: usize,
    ra: u64,
    sp: u64,
    bp: u64,
) -> *mut c_void {
    if events::sampling() {
        // SAFETY: the caller's arguments, forwarded.
        return unsafe { realloc_sampling(p, size, ra, sp, bp) };
    }
    // SAFETY: the caller's arguments, forwarded.
    unsafe { realloc_traced(p, size, ra, sp, bp) }
}

/// realloc in sampling mode (out of line, as malloc's).
#[inline(never)]
unsafe extern "C" fn realloc_sampling(
    p: *mut c_void,
    size: usize,
    ra: u64,
    sp: u64,
    bp: u64,
) -> *mut c_void {
    // SAFETY: forwarded.
    if let Some(r) = reallocate_unsampled(p, size, |p| unsafe { real::realloc(p, size) }) {
        return r;
    }
    // SAFETY: the caller's arguments, forwarded.
    unsafe { realloc_traced(p, size, ra, sp, bp) }
}

/// realloc's traced path.
#[inline(never)]
unsafe extern "C" fn realloc_traced(
    p: *mut c_void,
    size: usize,
    ra: u64,
    sp: u64,
    bp: u64,
) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe {
        reallocate(EntryPoint::Realloc, p, size, regs(ra, sp, bp), |p| {
            real::realloc(p, size)
        })
    }
}

entry! {
    /// Interposed reallocarray(3): the next reallocarray (when that is
    /// glibc's, its overflow check and the next realloc: real.rs). Its
    /// events are realloc's of n * size bytes; an overflow (ENOMEM) is a T
    /// call.
    ///
    /// # Safety
    /// As reallocarray(3).
    fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void = reallocarray_body;
    "rcx", "r8", "r9"
}

unsafe extern "C" fn reallocarray_body(
    p: *mut c_void,
    n: usize,
    size: usize,
    ra: u64,
    sp: u64,
    bp: u64,
) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: forwarded.
        Some(bytes) => unsafe {
            reallocate(EntryPoint::Reallocarray, p, bytes, regs(ra, sp, bp), |p| {
                real::reallocarray(p, n, size)
            })
        },
        None if private_heap::contains(p) || reentrancy::get() == reentrancy::OWN => {
            real::set_errno(libc::ENOMEM);
            core::ptr::null_mut()
        }
        None => {
            // SAFETY: forwarded: the allocator's answer and errno.
            let r = unsafe { real::reallocarray(p, n, size) };
            boundary::event(|| account_alloc(EntryPoint::Reallocarray, r, n.wrapping_mul(size)));
            r
        }
    }
}

entry! {
    /// Interposed posix_memalign(3): the next posix_memalign, which checks
    /// the alignment (EINVAL) and writes `*out` only on success. The shim's
    /// own heap (state OWN) applies glibc's rule: a power of two multiple
    /// of sizeof(void *).
    ///
    /// # Safety
    /// As posix_memalign(3).
    fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int =
        posix_memalign_body;
    "rcx", "r8", "r9"
}

unsafe extern "C" fn posix_memalign_body(
    out: *mut *mut c_void,
    align: usize,
    size: usize,
    ra: u64,
    sp: u64,
    bp: u64,
) -> c_int {
    if reentrancy::get() == reentrancy::OWN {
        let word = core::mem::size_of::<*mut c_void>();
        if !align.is_multiple_of(word) || !(align / word).is_power_of_two() {
            return libc::EINVAL;
        }
        let p = private_heap::alloc(size, align);
        if p.is_null() {
            return libc::ENOMEM;
        }
        // SAFETY: the caller passes a valid out-pointer.
        unsafe { *out = p };
        return 0;
    }
    // SAFETY: forwarded.
    let rc = unsafe { real::posix_memalign(out, align, size) };
    let p = if rc == 0 {
        // SAFETY: the allocator wrote *out, as it succeeded.
        unsafe { *out }
    } else {
        core::ptr::null_mut()
    };
    trace_alloc(EntryPoint::PosixMemalign, p, size, regs(ra, sp, bp));
    rc
}

entry! {
    /// Interposed aligned_alloc(3): the next aligned_alloc, whatever it
    /// does with an odd alignment (glibc 2.36 rounds it up, as memalign;
    /// 2.38 refuses it). The shim's private heap rounds it up.
    ///
    /// # Safety
    /// As aligned_alloc(3).
    fn aligned_alloc(align: usize, size: usize) -> *mut c_void = aligned_alloc_body;
    "rdx", "rcx", "r8"
}

unsafe extern "C" fn aligned_alloc_body(
    align: usize,
    size: usize,
    ra: u64,
    sp: u64,
    bp: u64,
) -> *mut c_void {
    allocate(
        EntryPoint::AlignedAlloc,
        size,
        regs(ra, sp, bp),
        || private_heap::alloc(size, private_align(align)),
        // SAFETY: forwarded.
        || unsafe { real::aligned_alloc(align, size) },
    )
}

entry! {
    /// Interposed memalign(3).
    ///
    /// # Safety
    /// As memalign(3).
    fn memalign(align: usize, size: usize) -> *mut c_void = memalign_body;
    "rdx", "rcx", "r8"
}

unsafe extern "C" fn memalign_body(
    align: usize,
    size: usize,
    ra: u64,
    sp: u64,
    bp: u64,
) -> *mut c_void {
    allocate(
        EntryPoint::Memalign,
        size,
        regs(ra, sp, bp),
        || private_heap::alloc(size, private_align(align)),
        // SAFETY: forwarded.
        || unsafe { real::memalign(align, size) },
    )
}

entry! {
    /// Interposed valloc(3).
    ///
    /// # Safety
    /// As valloc(3).
    fn valloc(size: usize) -> *mut c_void = valloc_body;
    "rsi", "rdx", "rcx"
}

unsafe extern "C" fn valloc_body(size: usize, ra: u64, sp: u64, bp: u64) -> *mut c_void {
    allocate(
        EntryPoint::Valloc,
        size,
        regs(ra, sp, bp),
        || private_heap::alloc(size, state::page_size()),
        // SAFETY: forwarded.
        || unsafe { real::valloc(size) },
    )
}

entry! {
    /// Interposed pvalloc(3). The recorded size is the requested one
    /// (glibc rounds the block up to whole pages).
    ///
    /// # Safety
    /// As pvalloc(3).
    fn pvalloc(size: usize) -> *mut c_void = pvalloc_body;
    "rsi", "rdx", "rcx"
}

unsafe extern "C" fn pvalloc_body(size: usize, ra: u64, sp: u64, bp: u64) -> *mut c_void {
    allocate(
        EntryPoint::Pvalloc,
        size,
        regs(ra, sp, bp),
        || {
            let page = state::page_size();
            private_heap::alloc(size.div_ceil(page).max(1) * page, page)
        },
        // SAFETY: forwarded.
        || unsafe { real::pvalloc(size) },
    )
}
