//! The live set of a session that starts with a heap it did not see: the
//! session a forked child starts (the parent's objects are live in the
//! child, but its trace never saw them allocated) and the session that
//! resumes after a failed exec.
//!
//! In such a session the shim records the free of an object only if the
//! object was allocated in the session; the free of an inherited object is
//! recorded as a call event (it still counts as a call of `free`), so the
//! child's trace has no unknown frees. The first session of a process image
//! does not use the set: only memory allocated before the shim loaded can
//! be freed unseen there, and the hot path stays free of it.
//!
//! The set is a lock-free open-addressing hash set of addresses (linear
//! probing, tombstones) in memory mapped with a raw system call, reserved
//! (MAP_NORESERVE) for [`SLOTS`] addresses and touched only where used. An
//! insert that finds no free slot within [`MAX_PROBE`] leaves the object
//! untracked: its free then shows as a call and the object as live at the
//! end (a leak in the trace, never an anomaly).

use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// Capacity: 4 Mi addresses (32 MiB reserved).
pub const SLOTS: usize = 1 << 22;
/// Longest probe sequence before giving up.
pub const MAX_PROBE: usize = 1 << 12;

const EMPTY: usize = 0;
/// A removed address. Heap addresses are never 1.
const TOMBSTONE: usize = 1;

static TABLE: AtomicPtr<AtomicUsize> = AtomicPtr::new(core::ptr::null_mut());

/// Maps a fresh, empty set. `unmap_old` releases the previous one: only
/// when no other thread can be using it (in a forked child, with one
/// thread); otherwise it is left mapped.
pub fn reset(unmap_old: bool) -> bool {
    let bytes = SLOTS * core::mem::size_of::<usize>();
    // SAFETY: a fresh anonymous mapping, zero-filled (all slots EMPTY).
    let p = unsafe {
        crate::real::sys_mmap(
            core::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return false;
    }
    let old = TABLE.swap(p.cast(), Ordering::AcqRel);
    if unmap_old && !old.is_null() {
        // SAFETY: the caller guarantees no thread uses the old set.
        unsafe { crate::real::sys_munmap(old.cast(), bytes) };
    }
    true
}

#[inline(always)]
fn home(addr: usize) -> usize {
    (addr >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (usize::BITS - SLOTS.trailing_zeros())
}

#[inline(always)]
fn slot(table: *mut AtomicUsize, i: usize) -> &'static AtomicUsize {
    // SAFETY: the table has SLOTS entries and is never unmapped while in
    // use; i is reduced modulo SLOTS.
    unsafe { &*table.add(i & (SLOTS - 1)) }
}

/// Adds `addr`. False when the set is missing or too full around `addr`.
///
/// Must not allocate or lock: runs inside malloc.
pub fn insert(addr: usize) -> bool {
    let table = TABLE.load(Ordering::Acquire);
    if table.is_null() || addr <= TOMBSTONE {
        return false;
    }
    let h = home(addr);
    let mut i = 0;
    while i < MAX_PROBE {
        let s = slot(table, h + i);
        let v = s.load(Ordering::Relaxed);
        if v == addr {
            return true;
        }
        // Reusing a tombstone is safe: the address cannot be further along
        // (malloc never hands out a live address twice).
        if (v == EMPTY || v == TOMBSTONE)
            && s.compare_exchange(v, addr, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return true;
        }
        if v == EMPTY || v == TOMBSTONE {
            continue; // lost a race for this slot: look at it again
        }
        i += 1;
    }
    false
}

/// Removes `addr`; true if it was there.
///
/// Must not allocate or lock: runs inside free.
pub fn remove(addr: usize) -> bool {
    let table = TABLE.load(Ordering::Acquire);
    if table.is_null() || addr <= TOMBSTONE {
        return false;
    }
    let h = home(addr);
    for i in 0..MAX_PROBE {
        let s = slot(table, h + i);
        let v = s.load(Ordering::Relaxed);
        if v == EMPTY {
            return false;
        }
        if v == addr {
            return s
                .compare_exchange(addr, TOMBSTONE, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_reuse() {
        assert!(reset(true));
        assert!(!remove(0x1000));
        for k in 1..10_000usize {
            assert!(insert(k * 16));
        }
        for k in (1..10_000usize).step_by(2) {
            assert!(remove(k * 16));
            assert!(!remove(k * 16));
        }
        for k in 1..10_000usize {
            assert_eq!(remove(k * 16), k % 2 == 0, "{k}");
        }
        assert!(reset(true));
        assert!(!remove(16));
    }
}
