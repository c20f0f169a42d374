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
//! Why it holds (a Dekker pattern through SeqCst fences):
//! 1. The writer increments its counter to odd, then runs a SeqCst fence,
//!    then loads the generation.
//! 2. The advancer stores the new generation, then runs a SeqCst fence,
//!    then loads the counter.
//! 3. The two fences are ordered one way or the other. If the writer's
//!    comes first, the advancer's load sees the odd counter (or a later
//!    value) and waits for it to move. If the advancer's comes first, the
//!    writer's load sees the new generation and never touches the old one.
//! 4. `end` stores with Release and the advancer loads with Acquire, so once
//!    the advancer sees the counter move, every byte the writer wrote into
//!    its old buffers is visible to it.

use crate::sync::{fence, spin_yield, AtomicU64, Ordering};

/// A per-thread sequence counter, odd while its owner writes an event.
pub struct SeqLock {
    seq: AtomicU64,
}

impl SeqLock {
    #[cfg(not(loom))]
    pub const fn new() -> SeqLock {
        SeqLock { seq: AtomicU64::new(0) }
    }

    #[cfg(loom)]
    pub fn new() -> SeqLock {
        SeqLock { seq: AtomicU64::new(0) }
    }

    /// Owner: an event starts; load the generation after this. Only the
    /// owner writes the counter, so a plain load and store suffice (a signal
    /// handler on the same thread never gets here mid-event: the slot's busy
    /// flag turns it away).
    #[inline(always)]
    pub fn begin(&self) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Owner: the event is complete; its writes are published.
    #[inline(always)]
    pub fn end(&self) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Release);
    }

    /// In a forked child: the owner may have been another thread, caught
    /// mid-event by the fork; it does not exist here, so its event never
    /// ends. Only the fork handler calls this, with one thread running.
    pub fn reset_after_fork(&self) {
        self.seq.store(0, Ordering::Relaxed);
    }

    /// Advancer: returns once the owner is outside any event that began
    /// before this call. Spins, then yields: an event is a few ns unless the
    /// owner is waiting for a free buffer.
    /// Call after storing the new generation.
    pub fn wait_quiescent(&self) {
        fence(Ordering::SeqCst);
        let seen = self.seq.load(Ordering::Acquire);
        if seen & 1 == 0 {
            return;
        }
        let mut spins = 0u32;
        while self.seq.load(Ordering::Acquire) == seen {
            if spins < 100 && !cfg!(loom) {
                spins += 1;
                core::hint::spin_loop();
            } else {
                spin_yield();
            }
        }
    }
}
