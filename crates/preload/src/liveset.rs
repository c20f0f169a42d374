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
//! The set is the writer's [`AddressSet`] (lock-free, in memory of its
//! own), reserved for [`SLOTS`] addresses. An insert that finds no free
//! slot within [`MAX_PROBE`] leaves the object untracked: its free then
//! shows as a call and the object as live at the end (a leak in the trace,
//! never an anomaly).

use alloctrace_writer::AddressSet;

/// Capacity: 4 Mi addresses (32 MiB reserved).
pub const SLOTS: usize = 1 << 22;
/// Longest probe sequence before giving up.
pub const MAX_PROBE: usize = 1 << 12;

static SET: AddressSet<SLOTS, MAX_PROBE, 0> = AddressSet::new();

/// Maps a fresh, empty set. `unmap_old` releases the previous one: only
/// when no other thread can be using it (in a forked child, with one
/// thread); otherwise it is left mapped.
pub fn reset(unmap_old: bool) -> bool {
    SET.reset(unmap_old)
}

/// Adds `addr`. False when the set is missing or too full around `addr`.
///
/// Must not allocate or lock: runs inside malloc.
#[inline]
pub fn insert(addr: usize) -> bool {
    SET.insert(addr as u64)
}

/// Removes `addr`; true if it was there.
///
/// Must not allocate or lock: runs inside free.
#[inline]
pub fn remove(addr: usize) -> bool {
    SET.remove(addr as u64)
}
