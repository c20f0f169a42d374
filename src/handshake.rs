//! The generation-advance handshake, on its own so loom can check it
//! (tests/loom_handshake.rs runs this very code with loom's atomics).
//!
//! A writer brackets every event with [`SeqLock::begin`] and
//! [`SeqLock::end`], reading the generation in between. An advance stores
//! the new generation and then calls [`SeqLock::wait_quiescent`] on every
//! thread's lock. When that returns, the thread is not inside an event that
//! could have read the old generation, so its old-generation buffers can be
//! taken.
//!
//! Why it holds: `begin`'s increment, the writer's generation load, the
//! advance's generation store and `wait_quiescent`'s loads are all SeqCst.
//! If the writer's load saw the old generation, it came before the store in
//! the single total order, so `begin` did too, and the advancer's first load
//! of the lock sees the odd value (or a later one) and waits for it to move.

use crate::sync::{spin_yield, AtomicU64, Ordering};

/// A per-thread sequence counter, odd while its owner writes an event.
pub(crate) struct SeqLock {
    seq: AtomicU64,
}

impl SeqLock {
    #[cfg(not(loom))]
    pub(crate) const fn new() -> SeqLock {
        SeqLock { seq: AtomicU64::new(0) }
    }

    #[cfg(loom)]
    pub(crate) fn new() -> SeqLock {
        SeqLock { seq: AtomicU64::new(0) }
    }

    /// Owner: an event starts. Only the owner writes the counter.
    #[inline(always)]
    pub(crate) fn begin(&self) {
        self.seq.fetch_add(1, Ordering::SeqCst);
    }

    /// Owner: the event is complete.
    #[inline(always)]
    pub(crate) fn end(&self) {
        self.seq.fetch_add(1, Ordering::SeqCst);
    }

    /// Advancer: returns once the owner is outside any event that began
    /// before this call. Spins, then yields: an event is a few ns unless the
    /// owner is waiting for a free buffer.
    pub(crate) fn wait_quiescent(&self) {
        let seen = self.seq.load(Ordering::SeqCst);
        if seen & 1 == 0 {
            return;
        }
        let mut spins = 0u32;
        while self.seq.load(Ordering::SeqCst) == seen {
            if spins < 100 {
                spins += 1;
                core::hint::spin_loop();
            } else {
                spin_yield();
            }
        }
    }
}
