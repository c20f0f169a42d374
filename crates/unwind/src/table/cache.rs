//! The rule caches: a thread's own direct-mapped cache and the second
//! level every thread of an unwinder shares.

use std::sync::atomic::{AtomicU64, Ordering};

/// Entries of an unwinder's shared rule cache (512 KiB).
const SHARED_SLOTS: usize = 1 << 16;

/// The second level of the threads' rule caches: one per unwinder, shared
/// by every thread, direct-mapped, filled by the threads' misses. A
/// thread's own cache ([`RuleCache`]) holds 256 rules, fewer than a deep
/// program steps through (python's deep-stack loop missed it on one
/// lookup in nine, and a miss searches the module's rows); a miss there
/// that this cache holds costs one load (bench/README.md has the figures).
///
/// Each entry is one word, written and read whole (relaxed: the rule is
/// in the word itself, and every rule of an unwinder is fixed): the key's
/// upper 32 bits (of the 48 a key packs into: the address, below 2^47,
/// and the instruction-pointer flag) above the rule, at a slot the key's
/// bits name. Slot and upper bits give the key back, so a hit is exact.
/// Zero is empty (an upper part of zero is never stored).
pub(crate) struct SharedRules {
    slots: Box<[AtomicU64]>,
}

impl SharedRules {
    /// A cache with room (`on`), or none (an unwinder without tables).
    pub(crate) fn new(on: bool) -> SharedRules {
        let n = if on { SHARED_SLOTS } else { 0 };
        SharedRules {
            slots: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The slot of `key` and the upper half its entry has; `None` for a
    /// key this cache does not hold.
    #[inline(always)]
    pub(super) fn place(key: u64) -> Option<(usize, u64)> {
        let addr = key & !(1 << 63);
        if addr >> 47 != 0 {
            return None;
        }
        let packed = addr | (key >> 63) << 47;
        let upper = packed >> 16;
        if upper == 0 {
            return None;
        }
        let slot = ((packed ^ packed >> 16 ^ packed >> 32) & 0xffff) as usize;
        Some((slot, upper << 32))
    }

    /// The rule this cache holds for `key`.
    // Runs inside malloc: no allocation, no lock, no panic.
    #[inline(always)]
    pub(crate) fn get(&self, key: u64) -> Option<u32> {
        let (slot, upper) = Self::place(key)?;
        let e = self.slots.get(slot)?.load(Ordering::Relaxed);
        (e & !0xffff_ffff == upper).then_some(e as u32)
    }

    /// Holds `rule` for `key` (replacing the slot's entry).
    // Runs inside malloc: no allocation, no lock, no panic.
    #[inline(always)]
    pub(crate) fn put(&self, key: u64, rule: u32) {
        if let Some((slot, upper)) = Self::place(key) {
            if let Some(s) = self.slots.get(slot) {
                s.store(upper | u64::from(rule), Ordering::Relaxed);
            }
        }
    }

    /// Its bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.slots.len() * 8
    }
}

impl core::fmt::Debug for SharedRules {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SharedRules")
            .field("slots", &self.slots.len())
            .finish()
    }
}

/// Entries of a thread's rule cache.
pub(crate) const CACHE_SLOTS: usize = 256;

/// A thread's direct-mapped cache of rules, keyed by lookup address (the
/// return address minus 1, or an interrupted pc with bit 63 set), valid
/// for one unwinder (`id`).
#[derive(Clone)]
pub(crate) struct RuleCache {
    pub(crate) id: u64,
    pub(crate) keys: [u64; CACHE_SLOTS],
    pub(crate) rules: [u32; CACHE_SLOTS],
    pub(crate) hits: u64,
    pub(crate) misses: u64,
}

impl RuleCache {
    pub(crate) const fn new() -> RuleCache {
        RuleCache {
            id: 0,
            keys: [0; CACHE_SLOTS],
            rules: [0; CACHE_SLOTS],
            hits: 0,
            misses: 0,
        }
    }

    /// The slot of `key`.
    #[inline(always)]
    pub(crate) fn slot(key: u64) -> usize {
        ((key ^ key >> 8 ^ key >> 16) as usize) % CACHE_SLOTS
    }
}
