//! Each thread slot's sampling countdown and exact counts (sampling.rs has
//! the design and invariants), in a table beside the thread table: a leaf
//! that thread.rs (which points a TLS word at a slot's entry) and
//! sampling.rs both use, so neither uses the other for it.

use core::sync::atomic::AtomicU64;

use crate::limits::MAX_THREADS;

/// One slot's countdown and counts. Written by the slot's owner only
/// (invariant 1).
///
/// The countdown carries the byte count: it is `next - bytes` (wrapping),
/// the bytes left before the next sample (event/sample.rs `Sampler`), so
/// that an allocation not sampled adds its size to `bytes` and its 1 to
/// `allocs`, and nothing else.
#[derive(Debug)]
#[repr(C, align(64))]
pub(crate) struct ThreadCounts {
    /// Heap-object allocations counted, sampled or not, and their bytes.
    pub(crate) bytes: AtomicU64,
    pub(crate) allocs: AtomicU64,
    /// The value of `bytes` at which the next sample falls (`next - bytes`,
    /// as i64, at most 0: the countdown has expired).
    pub(crate) next: AtomicU64,
    /// Heap-object frees counted.
    pub(crate) frees: AtomicU64,
    /// The countdown's random state; 0 before its first draw.
    pub(crate) rng: AtomicU64,
    /// The thread ID `rng` was seeded for: a new owner of the slot seeds
    /// its own.
    pub(crate) seeded_for: AtomicU64,
}

impl ThreadCounts {
    #[allow(clippy::declare_interior_mutable_const)]
    const NEW: ThreadCounts = ThreadCounts {
        bytes: AtomicU64::new(0),
        allocs: AtomicU64::new(0),
        next: AtomicU64::new(0),
        frees: AtomicU64::new(0),
        rng: AtomicU64::new(0),
        seeded_for: AtomicU64::new(0),
    };
}

/// Per slot (thread.rs's index), 1 MiB of bss touched only where used.
pub(crate) static COUNTS: [ThreadCounts; MAX_THREADS] = [ThreadCounts::NEW; MAX_THREADS];

/// The entry of the thread slot at `index` (thread.rs `index_of`).
#[inline(always)]
pub(crate) fn counts_at(index: usize) -> Option<&'static ThreadCounts> {
    COUNTS.get(index)
}
