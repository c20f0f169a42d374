//! Heap statistics of the running trace, counted by [`TracingAlloc`] for
//! tests that assert on heap use (as dhat's testing mode does).
//!
//! ## Design
//!
//! Counted by [`TracingAlloc`] while tracing is on, on the same calls
//! whose events it records, reset by [`Tracer::start`]; the tracer's own
//! threads are not counted (their events are not recorded either). Made
//! so that a program whose allocations come from one thread counts with
//! loads and stores only, and others with one atomic read-modify-write on
//! shared memory per allocation and per free:
//!
//! - **Totals per thread**: each thread adds its allocations and their
//!   bytes to an entry of its own in [`TOTALS`] (a load and a store, no
//!   locked instruction: only it writes there); [`HeapStats::now`] sums
//!   the entries. An entry is claimed at the thread's first count and kept
//!   for its life; threads beyond the table's size share its last entry,
//!   with atomic adds.
//! - **Live counts as one pair**: live bytes and live blocks are one
//!   16-byte word, [`live::LIVE`], and the peak another, [`live::PEAK`],
//!   raised when an allocation's live bytes exceed it (a plain load
//!   first: no write unless they do), so that the peak's blocks are the
//!   live blocks of the moment its bytes were reached.
//! - **A single counter**: the first thread to count in a session owns
//!   the pairs and moves them with loads and stores; the first count of a
//!   second thread takes them over (the `owner` module: the event path's
//!   asymmetric handshake, one membarrier a session), and from then on
//!   every thread moves them with one `lock cmpxchg16b` each. Where
//!   `cmpxchg16b` is missing (checked at start) or on other architectures,
//!   two atomic adds and an atomic maximum instead; without membarrier, no
//!   owner.
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
//! - Read from another thread while one thread owns the pairs, live bytes
//!   and blocks may be of two moments a few instructions apart; on the
//!   counting thread, and once a second thread counted, they are of one.
//! - The switch to shared counting waits for the owner to leave an update
//!   of a few instructions (longer only if it is descheduled there).
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
    owner::reset();
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
    owner::add(size, 1);
}

/// Counts the free of a block of `size` bytes (invariant 2).
#[inline]
pub(crate) fn count_free(size: u64) {
    owner::add(size.wrapping_neg(), 1u64.wrapping_neg());
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

    /// [`add`] by the owner (the `owner` module), the one thread that
    /// counts: loads and stores, no atomic read-modify-write.
    #[inline(always)]
    pub(super) fn add_owned(bytes: u64, blocks: u64) {
        let b = LIVE.0[0].load(Ordering::Relaxed).wrapping_add(bytes);
        let n = LIVE.0[1].load(Ordering::Relaxed).wrapping_add(blocks);
        LIVE.0[0].store(b, Ordering::Relaxed);
        LIVE.0[1].store(n, Ordering::Relaxed);
        if blocks == 1 {
            let b = (b as i64).max(0) as u64;
            if b > PEAK.0[0].load(Ordering::Relaxed) {
                PEAK.0[0].store(b, Ordering::Relaxed);
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

        // In a session (the writer's asymmetric fences on): the first
        // thread to count owns the pairs; a second takes them over, and
        // nothing the owner counted is lost.
        let path =
            std::env::temp_dir().join(format!("heap-stats-unit-{}.trace", std::process::id()));
        let guard = crate::Tracer::new()
            .path(&path)
            .stacks(false)
            .start()
            .unwrap();
        count_alloc(1000);
        count_alloc(24);
        count_free(1000);
        if alloctrace_writer::asymmetric_fences() {
            assert!(owner::mine());
        }
        let s = HeapStats::now();
        assert_eq!((s.live_bytes, s.live_blocks), (24, 1));
        assert_eq!((s.peak_bytes, s.peak_blocks), (1024, 2));
        let go = std::sync::Arc::new(std::sync::Barrier::new(3));
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let go = go.clone();
                std::thread::spawn(move || {
                    go.wait();
                    for _ in 0..10_000 {
                        count_alloc(8);
                        count_free(8);
                    }
                    count_alloc(2000);
                })
            })
            .collect();
        go.wait();
        for _ in 0..10_000 {
            count_alloc(16);
            count_free(16);
        }
        for h in handles {
            h.join().unwrap();
        }
        assert!(owner::shared());
        let s = HeapStats::now();
        assert_eq!((s.live_bytes, s.live_blocks), (4024, 3));
        assert_eq!(s.total_allocations, 2 + 3 * 10_000 + 2);
        assert_eq!(s.total_bytes, 1024 + 10_000 * (16 + 8 + 8) + 2 * 2000);
        assert!(s.peak_bytes >= 4024 && s.peak_bytes <= 4024 + 16 + 8 + 8);
        guard.stop().unwrap();
        std::fs::remove_file(&path).ok();
    }
}

/// Who moves the pairs of [`live`]: the one thread that counts (the
/// owner) with loads and stores, until a second thread counts; from then
/// on every thread, with atomic read-modify-writes (the Design's
/// "single counter").
///
/// The switch is the event path's handshake (the writer's handshake.rs):
/// the owner marks its update in [`SEQ`] (odd) with only a compiler
/// fence before it looks at [`STATE`]; the second thread sets `STATE` to
/// `SWITCHING`, makes every thread pass a full barrier (membarrier), waits
/// for `SEQ` to be even and sets `STATE` to `SHARED`. Either the owner's
/// odd `SEQ` is seen by the waiter, or the owner's look at `STATE` comes
/// after the barrier and sees `SWITCHING` (then it leaves without an
/// update and counts as the others do). Without the writer's asymmetric
/// fences (no membarrier) no thread owns: `SHARED` from the first count.
mod owner {
    use core::sync::atomic::{compiler_fence, AtomicU64, AtomicUsize, Ordering};

    use super::live;

    /// No thread counted yet in this session.
    const FREE: usize = 0;
    /// A second thread is taking the pairs from the owner.
    const SWITCHING: usize = usize::MAX - 1;
    /// Every thread counts with atomic read-modify-writes.
    const SHARED: usize = usize::MAX;

    /// [`FREE`], the owner's ID ([`me`]), [`SWITCHING`] or [`SHARED`].
    static STATE: AtomicUsize = AtomicUsize::new(FREE);
    /// Odd while the owner updates the pairs. Written only by the owner.
    static SEQ: AtomicU64 = AtomicU64::new(0);

    thread_local! {
        /// Its address is the calling thread's ID: unique among running
        /// threads (a thread that reuses an exited owner's becomes the
        /// owner, which the exited one can never race with). Const, no
        /// destructor.
        static ID: u8 = const { 0 };
    }

    /// The calling thread's ID (not [`FREE`], [`SWITCHING`] or [`SHARED`]:
    /// an address of its TLS block).
    #[inline(always)]
    fn me() -> usize {
        ID.with(|b| b as *const u8 as usize)
    }

    /// Whether the calling thread is the owner (tests).
    #[cfg(test)]
    pub(super) fn mine() -> bool {
        STATE.load(Ordering::Relaxed) == me()
    }

    /// Whether every thread counts with atomic read-modify-writes (tests).
    #[cfg(test)]
    pub(super) fn shared() -> bool {
        STATE.load(Ordering::Relaxed) == SHARED
    }

    /// A session's start: no owner yet (before tracing is on).
    pub(super) fn reset() {
        STATE.store(FREE, Ordering::Relaxed);
    }

    /// [`live::add`], by the owner's loads and stores when the calling
    /// thread is the owner. Never allocates nor locks; the switch to
    /// `SHARED` (once a session) makes one system call and waits for the
    /// owner to leave an update of a few instructions.
    #[inline(always)]
    pub(super) fn add(bytes: u64, blocks: u64) {
        let me = me();
        loop {
            // Acquire: after the switch, the owner's last stores (released
            // by SEQ to the switching thread, then by STATE).
            let state = STATE.load(Ordering::Acquire);
            if state == me {
                // An odd value whatever an exited thread with this ID left.
                let s = SEQ.load(Ordering::Relaxed) & !1;
                SEQ.store(s + 1, Ordering::Relaxed);
                compiler_fence(Ordering::SeqCst);
                let still = STATE.load(Ordering::Relaxed) == me;
                if still {
                    live::add_owned(bytes, blocks);
                }
                SEQ.store(s + 2, Ordering::Release);
                if still {
                    return;
                }
            } else if state == SHARED {
                live::add(bytes, blocks);
                return;
            } else {
                not_mine(state, me);
            }
        }
    }

    /// `STATE` is `state`, neither the caller's (`me`) nor `SHARED`: claim
    /// a free one, take it from its owner, or wait for the switch.
    #[cold]
    #[inline(never)]
    fn not_mine(state: usize, me: usize) {
        match state {
            FREE => {
                let to = if alloctrace_writer::asymmetric_fences() {
                    me
                } else {
                    SHARED
                };
                let _ = STATE.compare_exchange(FREE, to, Ordering::Relaxed, Ordering::Relaxed);
            }
            SWITCHING => core::hint::spin_loop(),
            owner => {
                if STATE
                    .compare_exchange(owner, SWITCHING, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
                {
                    alloctrace_writer::heavy_barrier();
                    while SEQ.load(Ordering::Acquire) & 1 == 1 {
                        core::hint::spin_loop();
                    }
                    STATE.store(SHARED, Ordering::Release);
                }
            }
        }
    }
}
