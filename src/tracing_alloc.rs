//! [`TracingAlloc`]: a `#[global_allocator]` wrapper that records every
//! allocation and free of a Rust program, for programs that cannot use
//! the LD_PRELOAD shim (static musl binaries, programs with the
//! jemallocator or mimalloc crates).
//!
//! ## Design
//!
//! Each call forwards to the wrapped allocator and, while tracing is on,
//! records the event on the same path as the shim: the sampling decision
//! first (one load outside sampling mode), then the call stack from the
//! calling frame (the shim's walk, which never allocates: on x86_64 Linux
//! the recording function's naked entry hands it the caller's registers,
//! so no frame of the tracer's is walked), then the event into the
//! thread's buffer by the event path's fast path. Outside a session a
//! call is the inner allocator's plus one load.
//!
//! ## Invariants
//!
//! 1. A free is recorded before the block goes back to the inner
//!    allocator, an allocation after it came out: otherwise another
//!    thread could be handed the same address and record its allocation
//!    before this free.
//! 2. A thread already inside a recording (an allocation made by the
//!    tracer's code on the program's thread) forwards only: [`ENTERED`].
//!    The tracer's own threads are never recorded (their events have no
//!    thread slot) nor counted in [`HeapStats`](crate::HeapStats).
//!
//! ## Corner cases
//!
//! - A failed reallocation leaves the old block live: its free, recorded
//!   first (invariant 1), is followed by its allocation again.
//! - Blocks allocated before `start` and freed during the session are
//!   frees of unknown blocks in the trace (`check` counts them apart).

use core::alloc::{GlobalAlloc, Layout};
use core::cell::Cell;

use alloctrace_writer::capture::{self, StackMode};
use alloctrace_writer::events;

use crate::heap_stats;

thread_local! {
    /// Set while this thread records an event (invariant 2). Const
    /// initialised and without a destructor: usable in any thread state,
    /// also while its thread-locals are torn down.
    static ENTERED: Cell<bool> = const { Cell::new(false) };
}

/// A global allocator that forwards to `A` and records each call in the
/// running trace, with its call stack. Before [`Tracer::start`] and after
/// its guard drops it only forwards.
///
/// ```
/// use std::alloc::System;
///
/// #[global_allocator]
/// static ALLOC: alloctrace::TracingAlloc<System> = alloctrace::TracingAlloc::new(System);
///
/// # fn main() -> Result<(), alloctrace::Error> {
/// # let path = std::env::temp_dir().join(format!("tracing-alloc-doc-{}.trace", std::process::id()));
/// let guard = alloctrace::Tracer::new().path(&path).start()?;
/// let words: Vec<String> = (0..100).map(|i| i.to_string()).collect();
/// assert_eq!(words.len(), 100);
/// drop(guard); // stops tracing and flushes the trace
/// assert!(std::fs::metadata(&path).unwrap().len() > 0);
/// # std::fs::remove_file(&path).ok();
/// # Ok(())
/// # }
/// ```
///
/// [`Tracer::start`]: crate::Tracer::start
pub struct TracingAlloc<A> {
    inner: A,
}

impl<A> TracingAlloc<A> {
    /// Wraps `inner`; `const`, for a `static`.
    ///
    /// ```
    /// static ALLOC: alloctrace::TracingAlloc<std::alloc::System> =
    ///     alloctrace::TracingAlloc::new(std::alloc::System);
    /// ```
    pub const fn new(inner: A) -> TracingAlloc<A> {
        TracingAlloc { inner }
    }

    /// The wrapped allocator.
    ///
    /// ```
    /// let alloc = alloctrace::TracingAlloc::new(std::alloc::System);
    /// let _system: &std::alloc::System = alloc.inner();
    /// ```
    pub const fn inner(&self) -> &A {
        &self.inner
    }
}

/// Runs `f` unless this thread is already recording (invariant 2).
#[inline(always)]
fn once_per_thread(f: impl FnOnce()) {
    let entered = ENTERED.with(|e| e.replace(true));
    if !entered {
        f();
        ENTERED.with(|e| e.set(false));
    }
}

/// Records the allocation of `size` bytes at `ptr`, with the call stack
/// from the frame this call returns to: the `GlobalAlloc` method's, or with
/// inlining (release builds, LTO) `__rust_alloc`'s or the allocating
/// function's. On x86_64 Linux a naked entry, as the shim's malloc: it
/// hands the caller's return address, stack pointer after the return and
/// rbp to [`record_alloc_at`] and jumps there, so the walk starts in the
/// caller's frame (the shim's walk, with its memo and its shortcut for the
/// same walk again), with no frame of the tracer's to walk and drop.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[unsafe(naked)]
extern "C" fn record_alloc(ptr: *mut u8, size: usize) {
    core::arch::naked_asm!(
        "mov rdx, qword ptr [rsp]",
        "lea rcx, [rsp + 8]",
        "mov r8, rbp",
        "jmp {body}",
        body = sym record_alloc_at,
    )
}

/// [`record_alloc`]'s body, the caller's registers (`ra`, `sp`, `bp`) as
/// its naked entry saw them.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
extern "C" fn record_alloc_at(ptr: *mut u8, size: usize, ra: u64, sp: u64, bp: u64) {
    record_alloc_with(ptr, size, || {
        capture::capture_stack_from(capture::StartRegs { ra, sp, bp })
    });
}

/// Elsewhere: the C API's capture, which walks this function's frame and
/// drops it.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
#[inline(never)]
fn record_alloc(ptr: *mut u8, size: usize) {
    // From this function's caller (see above). A fixed deeper skip would
    // drop the program's own frame where the allocator's are inlined.
    record_alloc_with(ptr, size, || capture::capture_stack_or_lost(1));
}

/// The recording of an allocation, its call stack from `stack` (a stack
/// ID, or `LOST_STACK`), called only once the allocation is sampled and
/// stacks are on.
#[inline(always)]
fn record_alloc_with(ptr: *mut u8, size: usize, stack: impl FnOnce() -> u64) {
    if !alloctrace_writer::enabled() || alloctrace_writer::on_internal_thread() {
        return;
    }
    once_per_thread(|| {
        heap_stats::count_alloc(size as u64);
        let addr = ptr as usize;
        // In sampling mode an allocation not sampled costs no capture.
        if !events::sample_alloc(addr, size as u64) {
            return;
        }
        if capture::mode() != StackMode::None {
            events::sampled::heap_object_alloc_stack(addr, size as u64, 0, stack());
        } else {
            events::sampled::heap_object_alloc(addr, size as u64, 0);
        }
    });
}

/// Records the free of the block of `size` bytes at `ptr`.
#[inline(never)]
fn record_free(ptr: *mut u8, size: usize) {
    if !alloctrace_writer::enabled() || alloctrace_writer::on_internal_thread() {
        return;
    }
    once_per_thread(|| {
        heap_stats::count_free(size as u64);
        events::heap_object_free(ptr as usize);
    });
}

// SAFETY: every method forwards to `inner` with the caller's arguments,
// so the contract of GlobalAlloc holds as it holds for `A`; the recording
// around the calls never allocates through this allocator (invariant 2)
// and never unwinds.
unsafe impl<A: GlobalAlloc> GlobalAlloc for TracingAlloc<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let ptr = unsafe { self.inner.alloc(layout) };
        if !ptr.is_null() {
            record_alloc(ptr, layout.size());
        }
        ptr
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let ptr = unsafe { self.inner.alloc_zeroed(layout) };
        if !ptr.is_null() {
            record_alloc(ptr, layout.size());
        }
        ptr
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        record_free(ptr, layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record_free(ptr, layout.size());
        // SAFETY: the caller's contract, passed on.
        let new = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if new.is_null() {
            // The old block stays (corner cases).
            record_alloc(ptr, layout.size());
        } else {
            record_alloc(new, new_size);
        }
        new
    }
}
