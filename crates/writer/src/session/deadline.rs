//! The deadline of a fatal-signal flush (crash.rs), on the thread that
//! flushes: a leaf, so that the tracer's own batches (meta.rs) and the
//! event path (emit.rs), which crash.rs calls, can hand [`past_deadline`]
//! to `BufferPool::take` without importing crash.rs.

use std::cell::Cell;

thread_local! {
    /// While this thread flushes: when its waits for a free buffer give up
    /// (CLOCK_MONOTONIC ns; 0 for never). Read by BufferPool::take.
    static DEADLINE_NS: Cell<u64> = const { Cell::new(0) };
}

/// Sets this thread's deadline (CLOCK_MONOTONIC ns; 0 for never).
/// Async-signal-safe.
pub(crate) fn set(ns: u64) {
    DEADLINE_NS.with(|c| c.set(ns));
}

/// CLOCK_MONOTONIC in ns. Async-signal-safe.
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; clock_gettime is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    // Wrapping: never panics, even in a debug build (a monotonic clock
    // reaches 2^64 ns after 584 years).
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// For BufferPool::take: whether this thread is flushing past its deadline,
/// so a wait for a free buffer must give up.
#[inline]
pub(crate) fn past_deadline() -> bool {
    let d = DEADLINE_NS.with(|c| c.get());
    d != 0 && now_ns() >= d
}
