//! Heap calls made before the constructor runs.
//!
//! ld.so runs the constructors of a program's libraries before the shim's
//! (an LD_PRELOAD library is initialised after the libraries it does not
//! depend on), and those constructors allocate: libselinux's, for one,
//! which every `ls` loads. Blocks they allocate and the program frees later
//! would show as unknown frees. So until the constructor starts the first
//! session, the wrappers log allocations and frees in a fixed table
//! ([`CAPACITY`] records, in .bss), and the session's snapshot replays the
//! log: every block still live becomes a heap-object "exists" event.
//!
//! Past the table's capacity nothing more is logged (a later free of such a
//! block is an unknown free, as without the log).

use core::sync::atomic::{AtomicUsize, Ordering};

use crate::state;

/// Records the log holds.
pub const CAPACITY: usize = 16384;

/// A free, in a record's size field.
const FREED: usize = usize::MAX;

struct Record {
    addr: AtomicUsize,
    /// The requested size, or [`FREED`].
    size: AtomicUsize,
}

static LOG: [Record; CAPACITY] = [const {
    Record {
        addr: AtomicUsize::new(0),
        size: AtomicUsize::new(0),
    }
}; CAPACITY];
/// Records claimed (may exceed CAPACITY; the excess is not stored).
static NEXT: AtomicUsize = AtomicUsize::new(0);
/// Records fully written, in claim order.
static DONE: AtomicUsize = AtomicUsize::new(0);

/// Whether heap calls are logged: before the constructor has decided.
#[inline(always)]
pub fn active() -> bool {
    state::LIFECYCLE.load(Ordering::Relaxed) == state::UNINIT
        && crate::reentrancy::get() != crate::reentrancy::OWN
}

fn log(addr: usize, size: usize) {
    if addr == 0 {
        return;
    }
    let i = NEXT.fetch_add(1, Ordering::Relaxed);
    if i >= CAPACITY {
        return;
    }
    LOG[i].addr.store(addr, Ordering::Relaxed);
    LOG[i].size.store(size, Ordering::Release);
    DONE.fetch_add(1, Ordering::Release);
}

/// `size` bytes were allocated at `addr` (0: the call failed).
///
/// Must not allocate or lock: runs inside malloc.
pub fn alloc(addr: usize, size: usize) {
    log(addr, size.min(FREED - 1));
}

/// The block at `addr` was freed.
///
/// Must not allocate or lock: runs inside free.
pub fn free(addr: usize) {
    log(addr, FREED);
}

/// Calls `exists(addr, size)` for every logged block still live, in address
/// order. Runs as the shim's own code (it allocates).
pub fn replay(mut exists: impl FnMut(usize, usize)) {
    let n = DONE.load(Ordering::Acquire).min(CAPACITY);
    let mut records: Vec<(usize, usize, usize)> = (0..n)
        .map(|i| {
            (
                LOG[i].addr.load(Ordering::Relaxed),
                i,
                LOG[i].size.load(Ordering::Acquire),
            )
        })
        .collect();
    // By address, then in log order: the last record of an address says
    // whether its block is live.
    records.sort_unstable();
    for (k, &(addr, _, size)) in records.iter().enumerate() {
        let last_of_addr = records.get(k + 1).is_none_or(|next| next.0 != addr);
        if last_of_addr && size != FREED && addr != 0 {
            exists(addr, size);
        }
    }
}
