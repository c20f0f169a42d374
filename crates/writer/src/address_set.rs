//! A lock-free set of addresses in memory of its own: the shim's live set
//! (the objects a forked child's session allocated itself) and a sampling
//! session's set of sampled objects (issue 22) are both one.
//!
//! The table is open-addressed (linear probing, tombstones) in a mapping
//! made with a raw system call, reserved (MAP_NORESERVE) for `SLOTS`
//! addresses and touched only where used. With `COUNTERS` > 0 a filter of
//! counters stands in front of it, indexed by the address's low bits
//! with its page number folded in (neighbouring blocks, neighbouring
//! counters: the frees of a working set touch few cache lines): a remove
//! of an address whose counter is 0 (the common free of an object that is
//! not in the set) is one load, however many tombstones the table holds.
//!
//! ## Invariants
//!
//! 1. A slot goes from EMPTY to an address, from an address to TOMB, and
//!    from TOMB to an address; it never becomes EMPTY again while the
//!    table is in use. A probe for an address therefore never stops before
//!    the slot the address was put in: every slot between its hash and
//!    that slot was not EMPTY when it was put there, and stays so.
//! 2. An address is put in the set (its counter raised first) before the
//!    allocation is returned to the program, and taken out (its counter
//!    lowered after) before the memory is handed back to the allocator.
//!    The program orders a free after its allocation (it had to get the
//!    pointer), so the free's probe sees both.
//! 3. Probes are bounded (`PROBES` slots): an insert that finds no free
//!    slot within them is refused (the caller counts it), so a remove that
//!    looks that far and finds nothing knows the address is not there.
//! 4. `reset` publishes a fresh table with a Release store; users load it
//!    with Acquire. The old table is unmapped only when the caller knows
//!    no other thread can use it (a forked child, with one thread).

use core::ptr;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use crate::reserved::{discard, map_reserved, unmap};

/// A slot never used.
const EMPTY: u64 = 0;
/// A slot whose address was removed (invariant 1). Heap addresses are
/// never 0 or 1.
const TOMB: u64 = 1;

/// A set of `SLOTS` addresses at most (a power of two), found within
/// `PROBES` slots of their hash, behind a filter of `COUNTERS` counters
/// (0: none; else a power of two).
pub struct AddressSet<const SLOTS: usize, const PROBES: usize, const COUNTERS: usize> {
    table: AtomicPtr<AtomicU64>,
    filter: AtomicPtr<AtomicU32>,
}

impl<const SLOTS: usize, const PROBES: usize, const COUNTERS: usize>
    AddressSet<SLOTS, PROBES, COUNTERS>
{
    /// An unmapped set: inserts are refused and removes find nothing until
    /// [`reset`](Self::reset).
    pub const fn new() -> Self {
        AddressSet {
            table: AtomicPtr::new(ptr::null_mut()),
            filter: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// Maps a fresh, empty set; false when the kernel refused (the old one,
    /// if any, stays). `unmap_old` releases the previous one: only when no
    /// other thread can be using it (invariant 4); otherwise it is left
    /// mapped.
    pub fn reset(&self, unmap_old: bool) -> bool {
        let table = map_reserved(SLOTS * 8);
        if table.is_null() {
            return false;
        }
        let filter = if COUNTERS > 0 {
            let f = map_reserved(COUNTERS * 4);
            if f.is_null() {
                unmap(table, SLOTS * 8);
                return false;
            }
            f
        } else {
            ptr::null_mut()
        };
        // The filter first: a user that sees the new table sees its filter.
        let old_filter = self.filter.swap(filter.cast(), Ordering::AcqRel);
        let old_table = self.table.swap(table.cast(), Ordering::AcqRel);
        if unmap_old {
            if !old_table.is_null() {
                unmap(old_table.cast(), SLOTS * 8);
            }
            if !old_filter.is_null() {
                unmap(old_filter.cast(), COUNTERS * 4);
            }
        }
        true
    }

    /// Empties the set in place when it is mapped (its pages go back to
    /// the kernel and read as EMPTY), else maps one; false when the kernel
    /// refused. For a new session, when no thread inserts: a remove racing
    /// it finds the address or not.
    pub fn clear(&self) -> bool {
        let table = self.table.load(Ordering::Acquire);
        if table.is_null() {
            return self.reset(false);
        }
        let filter = self.filter.load(Ordering::Acquire);
        if !filter.is_null() {
            discard(filter.cast(), COUNTERS * 4);
        }
        discard(table.cast(), SLOTS * 8);
        true
    }

    fn slot_of(addr: u64) -> usize {
        ((addr >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SLOTS.trailing_zeros())) as usize
    }

    /// The counter of `addr`: neighbouring blocks (16 bytes apart, as
    /// malloc aligns them) get neighbouring counters, so the frees of a
    /// program's working set touch few cache lines of the filter; the
    /// page number folded in spreads page-aligned blocks over it.
    fn counter_of(addr: u64) -> usize {
        ((addr >> 4) ^ (addr >> 12)) as usize & (COUNTERS - 1)
    }

    /// The table's slot `i` (modulo SLOTS).
    fn slot(table: *mut AtomicU64, i: usize) -> &'static AtomicU64 {
        // SAFETY: the table has SLOTS entries and is never unmapped while
        // in use (invariant 4); i is reduced modulo SLOTS.
        unsafe { &*table.add(i & (SLOTS - 1)) }
    }

    /// The counter of `addr`, or `None` without a filter.
    fn counter(&self, addr: u64) -> Option<&'static AtomicU32> {
        let filter = self.filter.load(Ordering::Acquire);
        if COUNTERS == 0 || filter.is_null() {
            return None;
        }
        // SAFETY: as `slot`, for the filter's COUNTERS entries.
        Some(unsafe { &*filter.add(Self::counter_of(addr) & (COUNTERS - 1)) })
    }

    /// Adds `addr` (already there: true). False when the set is not mapped,
    /// `addr` is 0 or 1, or no slot was free within `PROBES`: the caller
    /// counts it.
    // Runs inside malloc: no allocation, no lock, no panic.
    pub fn insert(&self, addr: u64) -> bool {
        let table = self.table.load(Ordering::Acquire);
        if table.is_null() || addr <= TOMB {
            return false;
        }
        let counter = self.counter(addr);
        if let Some(c) = counter {
            c.fetch_add(1, Ordering::Relaxed);
        }
        let h = Self::slot_of(addr);
        let mut i = 0;
        while i < PROBES {
            let s = Self::slot(table, h + i);
            let v = s.load(Ordering::Relaxed);
            if v == addr {
                // Already there (its free was not seen): one entry, one
                // count.
                if let Some(c) = counter {
                    c.fetch_sub(1, Ordering::Relaxed);
                }
                return true;
            }
            if v == EMPTY || v == TOMB {
                // Reusing a tombstone is safe: the address cannot be further
                // along (malloc never hands out a live address twice).
                if s.compare_exchange(v, addr, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
                {
                    return true;
                }
                continue; // lost a race for this slot: look at it again
            }
            i += 1;
        }
        if let Some(c) = counter {
            c.fetch_sub(1, Ordering::Relaxed);
        }
        false
    }

    /// Removes `addr`; true if it was there. Behind a filter, the common
    /// case (not there) is one load.
    // Runs inside free: no allocation, no lock, no panic, no system call.
    #[inline]
    pub fn remove(&self, addr: u64) -> bool {
        let table = self.table.load(Ordering::Acquire);
        if table.is_null() || addr <= TOMB {
            return false;
        }
        let counter = self.counter(addr);
        if counter.is_some_and(|c| c.load(Ordering::Relaxed) == 0) {
            return false;
        }
        self.remove_probing(table, counter, addr)
    }

    /// Whether `addr` is certainly not in the set: its counter is 0 (one
    /// load). False without a filter, or when it may be there.
    // Runs inside free: no allocation, no lock, no panic, no system call.
    #[inline]
    pub fn surely_absent(&self, addr: u64) -> bool {
        self.counter(addr)
            .is_some_and(|c| c.load(Ordering::Relaxed) == 0)
    }

    #[inline(never)]
    fn remove_probing(
        &self,
        table: *mut AtomicU64,
        counter: Option<&AtomicU32>,
        addr: u64,
    ) -> bool {
        let h = Self::slot_of(addr);
        for i in 0..PROBES {
            let s = Self::slot(table, h + i);
            let v = s.load(Ordering::Relaxed);
            if v == EMPTY {
                return false;
            }
            if v == addr {
                let taken = s
                    .compare_exchange(addr, TOMB, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok();
                if taken {
                    if let Some(c) = counter {
                        c.fetch_sub(1, Ordering::Relaxed);
                    }
                }
                // Lost: another free of the same address won (a double free).
                return taken;
            }
        }
        false
    }
}

impl<const SLOTS: usize, const PROBES: usize, const COUNTERS: usize> Default
    for AddressSet<SLOTS, PROBES, COUNTERS>
{
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Plain = AddressSet<{ 1 << 16 }, 64, 0>;
    type Filtered = AddressSet<{ 1 << 12 }, 32, { 1 << 12 }>;

    #[test]
    fn insert_remove_reuse() {
        let set = Plain::new();
        assert!(!set.insert(0x1000), "unmapped: refused");
        assert!(set.reset(true));
        assert!(!set.remove(0x1000));
        for k in 1..10_000u64 {
            assert!(set.insert(k * 16));
        }
        for k in (1..10_000u64).step_by(2) {
            assert!(set.remove(k * 16));
            assert!(!set.remove(k * 16));
        }
        for k in 1..10_000u64 {
            assert_eq!(set.remove(k * 16), k % 2 == 0, "{k}");
        }
        assert!(set.reset(true));
        assert!(!set.remove(16));
        assert!(!set.insert(0) && !set.insert(1) && !set.remove(0) && !set.remove(1));
    }

    #[test]
    fn clear_empties_the_set() {
        let set = Filtered::new();
        assert!(set.clear(), "an unmapped set is mapped");
        for k in 1..100u64 {
            assert!(set.insert(k * 16));
        }
        assert!(set.clear());
        for k in 1..100u64 {
            assert!(!set.remove(k * 16), "{k}");
        }
        assert!(set.insert(16) && set.remove(16));
    }

    #[test]
    fn the_filter_answers_as_the_table_does() {
        // Many more removes of absent addresses than present ones, with
        // tombstones left everywhere: every answer equals the plain set's.
        let (f, p) = (Filtered::new(), Plain::new());
        assert!(f.reset(true) && p.reset(true));
        for round in 0..20u64 {
            for k in 0..1000u64 {
                let a = 0x7f00_0000_0000 + (round * 1000 + k) * 48;
                assert_eq!(f.insert(a), p.insert(a));
            }
            // The round's span at every 16 bytes: its 1000 addresses and
            // 2000 that were never put in.
            for k in 0..3000u64 {
                let a = 0x7f00_0000_0000 + round * 1000 * 48 + k * 16;
                assert_eq!(f.remove(a), p.remove(a), "{a:#x}");
            }
        }
    }

    #[test]
    fn a_full_neighbourhood_refuses_and_loses_nothing() {
        // Addresses of one home slot: PROBES of them fit, the next is
        // refused, and each one put in is found again, once.
        let set = Filtered::new();
        assert!(set.reset(true));
        let home = Filtered::slot_of(0x1000);
        let same: Vec<u64> = (0x100..)
            .map(|k: u64| k * 16)
            .filter(|&a| Filtered::slot_of(a) == home)
            .take(33)
            .collect();
        let put: Vec<bool> = same.iter().map(|&a| set.insert(a)).collect();
        assert_eq!(put.iter().filter(|&&b| b).count(), 32);
        assert!(!put[32]);
        for (&a, &was) in same.iter().zip(&put) {
            assert_eq!(set.remove(a), was, "{a:#x}");
        }
    }

    #[test]
    fn frees_from_other_threads_find_every_address() {
        static SET: AddressSet<{ 1 << 16 }, 32, { 1 << 16 }> = AddressSet::new();
        assert!(SET.reset(false));
        let (tx, rx) = std::sync::mpsc::channel::<Vec<u64>>();
        let freer = std::thread::spawn(move || {
            let mut n = 0;
            for batch in rx {
                n += batch.iter().filter(|&&a| SET.remove(a)).count();
            }
            n
        });
        let mut total = 0;
        for round in 0..50u64 {
            let batch: Vec<u64> = (0..64)
                .map(|i| 0x7c00_0000_0000 + (round * 64 + i) * 64)
                .collect();
            total += batch.iter().filter(|&&a| SET.insert(a)).count();
            tx.send(batch).unwrap();
        }
        drop(tx);
        assert_eq!(freer.join().unwrap(), total);
        assert_eq!(total, 50 * 64);
    }
}
