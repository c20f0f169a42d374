//! Sampling mode's state (issue 22), a leaf of the machinery: the session's
//! mean and seed, each thread's countdown and exact counts, and the set of
//! sampled addresses. The event path (event/sample.rs) samples with them;
//! the session sets them up at start and writes their totals into each
//! generation-end batch (session/meta.rs).
//!
//! ## Design
//!
//! A thread's countdown and counts sit in [`COUNTS`], a table beside the
//! thread table (thread.rs), at its slot's index: the slot itself has no
//! room left in its two cache lines, and the header mirrors its first half.
//! The counts only grow, from owner to owner of a slot; a generation's end
//! sums them over the slots ever used and writes the difference from the
//! sum at the previous end ([`take_generation_totals`]).
//!
//! ## Invariants
//!
//! 1. Only a slot's owner writes its entry of [`COUNTS`] (plain loads and
//!    stores: no read-modify-write on the event path); the generation's end
//!    only reads. Otherwise two writers would lose counts.
//! 2. [`SAMPLE_BYTES`] is non-zero only while a sampling session runs:
//!    start stores it before the first generation, stop clears it after
//!    the last. Otherwise an event between sessions would be counted in no
//!    generation, or the set filled for nobody.
//! 3. An address enters [`SAMPLED`] before its allocation event is written
//!    and leaves it before its free's (address_set.rs invariant 2), so a
//!    free is recorded exactly when its allocation was.
//!
//! ## Corner cases
//!
//! - A thread's exit leaves its counts in the table (the next owner of the
//!   slot adds to them); its sampled objects stay in the set, where the
//!   threads that free them find them.
//! - fork: the child's next session empties its copy of the set
//!   ([`start_session`]): the parent's objects are not its trace's.

use core::sync::atomic::{AtomicU64, Ordering};

use crate::address_set::AddressSet;
use crate::thread::{self, ThreadSlot};

/// The running session's mean bytes between sampled allocations; 0 when
/// every allocation is recorded (invariant 2).
pub(crate) static SAMPLE_BYTES: AtomicU64 = AtomicU64::new(0);

/// The running session's seed: each thread's countdown draws from
/// `thread_seed(SAMPLE_SEED, its thread ID)`.
pub(crate) static SAMPLE_SEED: AtomicU64 = AtomicU64::new(0);

/// Capacity of the sampled set: 4 Mi live sampled objects (32 MiB
/// reserved, touched only where used). At 512 KiB between samples that is
/// 2 TiB of live heap.
pub(crate) const SET_SLOTS: usize = 1 << 22;
/// Longest probe of an insert before the set refuses it (counted).
pub(crate) const SET_PROBES: usize = 64;
/// The filter in front of the set, so that the free of an object that was
/// not sampled is one load: 64 Ki counters, 256 KiB, small enough to stay
/// in the caches that the frees go through (a free whose counter is not
/// 0, about one in 64 Ki / live sampled objects, probes the table).
pub(crate) const SET_COUNTERS: usize = 1 << 16;

/// The addresses of the live sampled objects.
pub(crate) static SAMPLED: AddressSet<SET_SLOTS, SET_PROBES, SET_COUNTERS> = AddressSet::new();

/// Sampled allocations the set refused, since the process started.
pub(crate) static OVERFLOW: AtomicU64 = AtomicU64::new(0);

/// Inserts into the set refused on purpose: a test hook
/// ([`inject_overflow`]), 0 otherwise.
pub(crate) static REFUSE_INSERTS: AtomicU64 = AtomicU64::new(0);

pub(crate) use crate::thread_counts::ThreadCounts;

/// The sums at the last generation's end (or the session's start):
/// allocations, bytes, frees, overflows. Under CONTROL.
static LAST: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

/// The counts of `slot`'s owner.
#[inline(always)]
pub(crate) fn counts_of(slot: &ThreadSlot) -> Option<&'static ThreadCounts> {
    crate::thread_counts::counts_at(thread::index_of(slot))
}

/// Adds `n` to a counter only its owner writes (invariant 1): a load and a
/// store, no locked instruction.
#[inline(always)]
pub(crate) fn bump(counter: &AtomicU64, n: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

/// The sums over every slot ever used, and the overflows.
fn sums() -> [u64; 4] {
    let mut s = [0u64; 4];
    for slot in thread::used_slots() {
        if let Some(c) = counts_of(slot) {
            s[0] = s[0].wrapping_add(c.allocs.load(Ordering::Relaxed));
            s[1] = s[1].wrapping_add(c.bytes.load(Ordering::Relaxed));
            s[2] = s[2].wrapping_add(c.frees.load(Ordering::Relaxed));
        }
    }
    s[3] = OVERFLOW.load(Ordering::Relaxed);
    s
}

/// Sets sampling up for a session with `sample_bytes` between samples (0:
/// off) and `seed`, before its first generation (under CONTROL). False
/// when the set could not be mapped.
pub(crate) fn start_session(sample_bytes: u64, seed: u64) -> bool {
    if sample_bytes != 0 {
        if !SAMPLED.clear() {
            return false;
        }
        // Every thread draws anew from the session's seed.
        for slot in thread::used_slots() {
            if let Some(c) = counts_of(slot) {
                c.seeded_for.store(0, Ordering::Relaxed);
                // Expired: the thread's next allocation draws.
                c.next
                    .store(c.bytes.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        }
    }
    for (last, now) in LAST.iter().zip(sums()) {
        last.store(now, Ordering::Relaxed);
    }
    SAMPLE_SEED.store(seed, Ordering::Relaxed);
    SAMPLE_BYTES.store(sample_bytes, Ordering::Relaxed);
    true
}

/// Turns sampling off, after the session's last generation.
pub(crate) fn stop_session() {
    SAMPLE_BYTES.store(0, Ordering::Relaxed);
}

/// The generation's totals for its generation-end batch (under CONTROL):
/// allocations, bytes, frees and overflows counted since the last call.
/// All 0 unless sampling.
pub(crate) fn take_generation_totals() -> [u64; 4] {
    let now = sums();
    let mut delta = [0u64; 4];
    for i in 0..4 {
        delta[i] = now[i].wrapping_sub(LAST[i].swap(now[i], Ordering::Relaxed));
    }
    delta
}

/// Test hook: the sampled set refuses the next `n` inserts, as if full.
pub fn inject_overflow(n: u64) {
    REFUSE_INSERTS.store(n, Ordering::Relaxed);
}
