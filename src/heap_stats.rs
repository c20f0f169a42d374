//! Heap statistics of the running trace, counted by [`TracingAlloc`] for
//! tests that assert on heap use (as dhat's testing mode does).
//!
//! ## Design
//!
//! Counted by [`TracingAlloc`] while tracing is on, on the same calls
//! whose events it records, reset by [`Tracer::start`]; the tracer's own
//! threads are not counted (their events are not recorded either). Made
//! so that an allocation costs one atomic read-modify-write on shared
//! memory and a free one:
//!
//! - **Totals per thread**: each thread adds its allocations and their
//!   bytes to an entry of its own in [`TOTALS`] (a load and a store, no
//!   locked instruction: only it writes there); [`HeapStats::now`] sums
//!   the entries. An entry is claimed at the thread's first count and kept
//!   for its life; threads beyond the table's size share its last entry,
//!   with atomic adds.
//! - **Live counts as one pair**: live bytes and live blocks are one
//!   16-byte word, [`live::LIVE`], moved by one `lock cmpxchg16b` per
//!   allocation and free, so every change of the one is seen with the
//!   other's value at that moment. The peak pair, [`live::PEAK`], is
//!   raised the same way when an allocation's live bytes exceed it (a
//!   plain load first: no write unless it does). Where `cmpxchg16b` is
//!   missing (checked at start) or on other architectures, two atomic
//!   adds and an atomic maximum instead.
//!
//! ## Invariants
//!
//! 1. The counters move only while tracing is on, and only for calls
//!    whose events are recorded, so a trace and the `HeapStats` of its
//!    session count the same allocations.
//! 2. Live counts never go below zero as read: a free of a block
//!    allocated before tracing started (which the trace counts as a free
//!    of an unknown block) takes away what it can, and reads clamp at 0.
//! 3. An entry of [`TOTALS`] other than the last is written only by the
//!    thread that claimed it (load then store: two writers would lose
//!    counts). Otherwise its counts could be lost.
//! 4. On the 16-byte path, `PEAK` holds a pair `LIVE` held: the live
//!    bytes and blocks of one moment. Otherwise `peak_blocks` would not
//!    be `live_blocks` when `live_bytes` was at its peak.
//!
//! ## Corner cases
//!
//! - With several threads each counter is exact; `peak_blocks` is the live
//!   block count at one moment when `peak_bytes` was reached, as in dhat
//!   (on the fallback path, the count its allocation's add saw).
//! - In sampling mode the counts are of every allocation, not the sampled
//!   ones (the trace's exact totals count the same).
//!
//! [`TracingAlloc`]: crate::TracingAlloc
//! [`Tracer::start`]: crate::Tracer::start

use core::cell::Cell;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// One thread's totals (invariant 3), a cache line each.
#[repr(C, align(64))]
struct Totals {
    allocations: AtomicU64,
    bytes: AtomicU64,
}

impl Totals {
    #[allow(clippy::declare_interior_mutable_const)]
    const NEW: Totals = Totals {
        allocations: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
    };
}

/// Threads with an entry of their own; the last entry is shared.
const ENTRIES: usize = 256;
/// Each thread's totals, by its index in [`INDEX`].
static TOTALS: [Totals; ENTRIES] = [Totals::NEW; ENTRIES];
/// Entries handed out so far (may pass [`ENTRIES`]).
static CLAIMED: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's entry in [`TOTALS`] plus 1, 0 before its first
    /// count. Const initialised and without a destructor: usable in any
    /// thread state.
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

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
        let (allocations, bytes) = totals();
        let (live_bytes, live_blocks) = live::load(&live::LIVE);
        let (peak_bytes, peak_blocks) = live::load(&live::PEAK);
        HeapStats {
            live_bytes: (live_bytes as i64).max(0) as u64,
            live_blocks: (live_blocks as i64).max(0) as u64,
            peak_bytes,
            peak_blocks,
            total_allocations: allocations,
            total_bytes: bytes,
        }
    }
}
/// Zeroes every counter (a session's start, before tracing is on).
pub(crate) fn reset() {
    live::reset();
    let claimed = CLAIMED.load(Ordering::Relaxed).min(ENTRIES - 1);
    for t in TOTALS.iter().take(claimed).chain(TOTALS.last()) {
        t.allocations.store(0, Ordering::Relaxed);
        t.bytes.store(0, Ordering::Relaxed);
    }
}

/// The sums of every thread's totals: allocations and bytes.
fn totals() -> (u64, u64) {
    let claimed = CLAIMED.load(Ordering::Relaxed).min(ENTRIES - 1);
    let mut sum = (0u64, 0u64);
    for t in TOTALS.iter().take(claimed).chain(TOTALS.last()) {
        sum.0 = sum.0.wrapping_add(t.allocations.load(Ordering::Relaxed));
        sum.1 = sum.1.wrapping_add(t.bytes.load(Ordering::Relaxed));
    }
    sum
}

/// Adds one allocation of `size` bytes to the calling thread's totals.
#[inline(always)]
fn add_total(size: u64) {
    let mut index = INDEX.with(Cell::get);
    if index == 0 {
        index = claim();
    }
    match TOTALS.get(index - 1) {
        Some(t) if index < ENTRIES => {
            // Only this thread writes here (invariant 3).
            t.allocations.store(
                t.allocations.load(Ordering::Relaxed).wrapping_add(1),
                Ordering::Relaxed,
            );
            t.bytes.store(
                t.bytes.load(Ordering::Relaxed).wrapping_add(size),
                Ordering::Relaxed,
            );
        }
        Some(t) => {
            t.allocations.fetch_add(1, Ordering::Relaxed);
            t.bytes.fetch_add(size, Ordering::Relaxed);
        }
        None => {}
    }
}

/// Claims the calling thread's entry: its index plus 1.
#[cold]
#[inline(never)]
fn claim() -> usize {
    let index = CLAIMED.fetch_add(1, Ordering::Relaxed).min(ENTRIES - 1) + 1;
    INDEX.with(|i| i.set(index));
    index
}

/// Counts an allocation of `size` bytes. Never allocates nor locks.
#[inline]
pub(crate) fn count_alloc(size: u64) {
    add_total(size);
    live::add(size, 1);
}

/// Counts the free of a block of `size` bytes (invariant 2).
#[inline]
pub(crate) fn count_free(size: u64) {
    live::add(size.wrapping_neg(), 1u64.wrapping_neg());
}

/// The live pair and the peak pair, each (bytes, blocks): the live ones
/// are i64 values stored as u64 (a free of a block from before the start
/// may take them below 0), the peak ones at least 0.
mod live {
    use core::sync::atomic::{AtomicU64, Ordering};

    /// A pair of counters, 16-byte aligned for `cmpxchg16b`: bytes, then
    /// blocks.
    #[repr(C, align(16))]
    pub(super) struct Pair([AtomicU64; 2]);

    pub(super) static LIVE: Pair = Pair([AtomicU64::new(0), AtomicU64::new(0)]);
    pub(super) static PEAK: Pair = Pair([AtomicU64::new(0), AtomicU64::new(0)]);

    /// Whether this CPU has `cmpxchg16b` (set at start; until then the
    /// two-add path, which is right on every CPU).
    #[cfg(target_arch = "x86_64")]
    static PAIRED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

    pub(super) fn reset() {
        for p in [&LIVE, &PEAK] {
            p.0[0].store(0, Ordering::Relaxed);
            p.0[1].store(0, Ordering::Relaxed);
        }
        #[cfg(target_arch = "x86_64")]
        PAIRED.store(
            std::arch::is_x86_feature_detected!("cmpxchg16b"),
            Ordering::Relaxed,
        );
    }

    /// The pair `p` (from one moment on the 16-byte path).
    pub(super) fn load(p: &Pair) -> (u64, u64) {
        #[cfg(target_arch = "x86_64")]
        if PAIRED.load(Ordering::Relaxed) {
            // Exchanges (0, 0) for (0, 0) or fails: either way the pair.
            // SAFETY: `p` is 16-byte aligned, live for the program, and
            // only ever accessed atomically.
            return unsafe { cas(p, (0, 0), (0, 0)) }.0;
        }
        (
            p.0[0].load(Ordering::Relaxed),
            p.0[1].load(Ordering::Relaxed),
        )
    }

    /// Adds (`bytes`, `blocks`) to the live pair (wrapping: a free adds
    /// their negations) and, when that raises the live bytes above the
    /// peak's, makes the new pair the peak.
    #[inline(always)]
    pub(super) fn add(bytes: u64, blocks: u64) {
        #[cfg(target_arch = "x86_64")]
        if PAIRED.load(Ordering::Relaxed) {
            // A first guess, read without care: a wrong one only fails the
            // exchange, which returns the pair.
            let mut cur = (
                LIVE.0[0].load(Ordering::Relaxed),
                LIVE.0[1].load(Ordering::Relaxed),
            );
            let new = loop {
                let new = (cur.0.wrapping_add(bytes), cur.1.wrapping_add(blocks));
                // SAFETY: as in `load`.
                match unsafe { cas(&LIVE, cur, new) } {
                    (_, true) => break new,
                    (now, false) => cur = now,
                }
            };
            // Only an allocation raises the peak (blocks is 1).
            if blocks == 1 {
                raise_peak(new);
            }
            return;
        }
        let b = LIVE.0[0]
            .fetch_add(bytes, Ordering::Relaxed)
            .wrapping_add(bytes);
        let n = LIVE.0[1]
            .fetch_add(blocks, Ordering::Relaxed)
            .wrapping_add(blocks);
        if blocks == 1 {
            let b = (b as i64).max(0) as u64;
            if b > PEAK.0[0].load(Ordering::Relaxed)
                && PEAK.0[0].fetch_max(b, Ordering::Relaxed) < b
            {
                PEAK.0[1].store((n as i64).max(0) as u64, Ordering::Relaxed);
            }
        }
    }

    /// Makes the live pair `live` the peak if its bytes exceed the peak's
    /// (invariant 4).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn raise_peak(live: (u64, u64)) {
        let bytes = (live.0 as i64).max(0) as u64;
        let mut cur = (
            PEAK.0[0].load(Ordering::Relaxed),
            PEAK.0[1].load(Ordering::Relaxed),
        );
        while bytes > cur.0 {
            let new = (bytes, (live.1 as i64).max(0) as u64);
            // SAFETY: as in `load`.
            match unsafe { cas(&PEAK, cur, new) } {
                (_, true) => return,
                (now, false) => cur = now,
            }
        }
    }

    /// `lock cmpxchg16b` on `p`: replaces `old` with `new` if `p` holds
    /// `old`; returns what `p` held and whether it was replaced.
    ///
    /// # Safety
    /// The CPU has `cmpxchg16b`; `p` is only ever accessed atomically.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn cas(p: &Pair, old: (u64, u64), new: (u64, u64)) -> ((u64, u64), bool) {
        let (lo, hi): (u64, u64);
        let ok: u8;
        // SAFETY: `p` is 16-byte aligned (repr) and valid; rbx, which the
        // instruction needs and LLVM reserves, is swapped in and restored.
        unsafe {
            core::arch::asm!(
                "xchg {new_lo}, rbx",
                "lock cmpxchg16b xmmword ptr [{p}]",
                "sete {ok}",
                "mov rbx, {new_lo}",
                p = in(reg) p as *const Pair,
                new_lo = inout(reg) new.0 => _,
                ok = out(reg_byte) ok,
                in("rcx") new.1,
                inout("rax") old.0 => lo,
                inout("rdx") old.1 => hi,
                options(nostack),
            );
        }
        ((lo, hi), ok != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counters alone (no trace, no TracingAlloc: the test's own
    /// allocations are not counted): exact totals over more threads than
    /// the table has entries, and peaks that are pairs of one moment.
    #[test]
    fn counts_are_exact_across_threads_and_peaks_are_pairs() {
        reset();
        count_alloc(100);
        count_alloc(50);
        count_free(100);
        count_alloc(10);
        let s = HeapStats::now();
        assert_eq!((s.live_bytes, s.live_blocks), (60, 2));
        assert_eq!((s.peak_bytes, s.peak_blocks), (150, 2));
        assert_eq!((s.total_allocations, s.total_bytes), (3, 160));

        // A free of a block from before the start: reads clamp at 0.
        reset();
        count_free(64);
        let s = HeapStats::now();
        assert_eq!((s.live_bytes, s.live_blocks, s.peak_bytes), (0, 0, 0));

        // More threads than entries: the last ones share one.
        reset();
        let threads = ENTRIES + 44;
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                std::thread::spawn(move || {
                    for i in 0..100u64 {
                        count_alloc(t as u64 + i);
                        if i % 2 == 1 {
                            count_free(t as u64 + i);
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let s = HeapStats::now();
        let per_thread: u64 = (0..100).sum();
        let total_bytes: u64 = (0..threads as u64).map(|t| t * 100 + per_thread).sum();
        let live_bytes: u64 = (0..threads as u64)
            .map(|t| (0..100).step_by(2).map(|i| t + i).sum::<u64>())
            .sum();
        assert_eq!(s.total_allocations, threads as u64 * 100);
        assert_eq!(s.total_bytes, total_bytes);
        assert_eq!(
            (s.live_bytes, s.live_blocks),
            (live_bytes, threads as u64 * 50)
        );
        assert!(s.peak_bytes >= s.live_bytes && s.peak_bytes <= total_bytes);
        assert!(s.peak_blocks >= 1 && s.peak_blocks <= threads as u64 * 51);
        reset();
        assert_eq!(HeapStats::now(), HeapStats::default());
    }
}
