//! Heap statistics of the running trace, counted by [`TracingAlloc`] for
//! tests that assert on heap use (as dhat's testing mode does).
//!
//! ## Design
//!
//! Six process-wide atomic counters, reset by [`Tracer::start`] and
//! counted by [`TracingAlloc`] while tracing is on, on the same calls
//! whose events it records: an allocation adds to the totals and to the
//! live counts, and raises the peaks; a free takes its block out of the
//! live counts. The tracer's own threads are not counted (their events
//! are not recorded either).
//!
//! ## Invariants
//!
//! 1. The counters move only while tracing is on, and only for calls
//!    whose events are recorded, so a trace and the `HeapStats` of its
//!    session count the same allocations.
//! 2. Live counts never go below zero as read: a free of a block
//!    allocated before tracing started (which the trace counts as a free
//!    of an unknown block) takes away what it can, and reads clamp at 0.
//!
//! ## Corner cases
//!
//! - With several threads each counter is exact; `peak_blocks` is the live
//!   block count at one moment when `peak_bytes` was reached, as in dhat.
//! - In sampling mode the counts are of every allocation, not the sampled
//!   ones (the trace's exact totals count the same).
//!
//! [`TracingAlloc`]: crate::TracingAlloc
//! [`Tracer::start`]: crate::Tracer::start

use core::sync::atomic::{AtomicI64, AtomicU64, Ordering};

static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
static LIVE_BLOCKS: AtomicI64 = AtomicI64::new(0);
static PEAK_BYTES: AtomicU64 = AtomicU64::new(0);
static PEAK_BLOCKS: AtomicU64 = AtomicU64::new(0);
static TOTAL_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static TOTAL_BYTES: AtomicU64 = AtomicU64::new(0);

/// The heap's use since [`Tracer::start`](crate::Tracer::start), as
/// counted by [`TracingAlloc`](crate::TracingAlloc): a snapshot of the
/// counters. Without a `TracingAlloc` as the global allocator every field
/// is 0.
///
/// ```
/// #[global_allocator]
/// static ALLOC: alloctrace::TracingAlloc<std::alloc::System> =
///     alloctrace::TracingAlloc::new(std::alloc::System);
///
/// # fn main() -> Result<(), alloctrace::Error> {
/// # let path = std::env::temp_dir().join(format!("heap-stats-doc-{}.trace", std::process::id()));
/// let guard = alloctrace::Tracer::new().path(&path).start()?;
/// let v = vec![0u8; 1000];
/// let s = alloctrace::HeapStats::now();
/// assert!(s.live_bytes >= 1000);
/// assert!(s.total_allocations >= 1);
/// drop(v);
/// assert!(alloctrace::HeapStats::now().live_bytes < s.live_bytes);
/// guard.stop()?;
/// # std::fs::remove_file(&path).ok();
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// Bytes in blocks allocated and not yet freed.
    pub live_bytes: u64,
    /// Blocks allocated and not yet freed.
    pub live_blocks: u64,
    /// The most `live_bytes` ever were.
    pub peak_bytes: u64,
    /// `live_blocks` when `live_bytes` was at its peak.
    pub peak_blocks: u64,
    /// Allocations so far (a reallocation counts as one).
    pub total_allocations: u64,
    /// Bytes allocated so far.
    pub total_bytes: u64,
}

impl HeapStats {
    /// The counters now (all 0 without a `TracingAlloc` or a trace).
    ///
    /// ```
    /// let s = alloctrace::HeapStats::now();
    /// assert!(s.peak_bytes >= s.live_bytes);
    /// ```
    pub fn now() -> HeapStats {
        HeapStats {
            live_bytes: LIVE_BYTES.load(Ordering::Relaxed).max(0) as u64,
            live_blocks: LIVE_BLOCKS.load(Ordering::Relaxed).max(0) as u64,
            peak_bytes: PEAK_BYTES.load(Ordering::Relaxed),
            peak_blocks: PEAK_BLOCKS.load(Ordering::Relaxed),
            total_allocations: TOTAL_ALLOCATIONS.load(Ordering::Relaxed),
            total_bytes: TOTAL_BYTES.load(Ordering::Relaxed),
        }
    }
}

/// Zeroes every counter (a session's start, before tracing is on).
pub(crate) fn reset() {
    for c in [&LIVE_BYTES, &LIVE_BLOCKS] {
        c.store(0, Ordering::Relaxed);
    }
    for c in [&PEAK_BYTES, &PEAK_BLOCKS, &TOTAL_ALLOCATIONS, &TOTAL_BYTES] {
        c.store(0, Ordering::Relaxed);
    }
}

/// Counts an allocation of `size` bytes. Never allocates nor locks.
#[inline]
pub(crate) fn count_alloc(size: u64) {
    TOTAL_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    TOTAL_BYTES.fetch_add(size, Ordering::Relaxed);
    let blocks = LIVE_BLOCKS.fetch_add(1, Ordering::Relaxed) + 1;
    let bytes = LIVE_BYTES.fetch_add(size as i64, Ordering::Relaxed) + size as i64;
    let bytes = bytes.max(0) as u64;
    if bytes > PEAK_BYTES.load(Ordering::Relaxed)
        && PEAK_BYTES.fetch_max(bytes, Ordering::Relaxed) < bytes
    {
        PEAK_BLOCKS.store(blocks.max(0) as u64, Ordering::Relaxed);
    }
}

/// Counts the free of a block of `size` bytes (invariant 2).
#[inline]
pub(crate) fn count_free(size: u64) {
    LIVE_BLOCKS.fetch_sub(1, Ordering::Relaxed);
    LIVE_BYTES.fetch_sub(size as i64, Ordering::Relaxed);
}
