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
//! 2. The advancer stores the new generation, then runs a SeqCst fence
//!    ([`heavy_barrier`]), then loads every counter.
//! 3. The two fences are ordered one way or the other. If the writer's
//!    comes first, the advancer's load sees the odd counter (or a later
//!    value) and waits for it to move. If the advancer's comes first, the
//!    writer's load sees the new generation and never touches the old one.
//! 4. `end` stores with Release and the advancer loads with Acquire, so once
//!    the advancer sees the counter move, every byte the writer wrote into
//!    its old buffers is visible to it.
//!
//! Asymmetric fences: the writer's fence runs on every event, the
//! advancer's once per advance. Where the kernel offers
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, the writer's fence is only
//! a compiler fence and the advancer's is that syscall, which makes every
//! running thread of the process execute a full barrier: any writer is then
//! either past its counter store (visible to the advancer) or not yet at its
//! generation load (which will see the new generation), as in step 3. Where
//! membarrier is missing (old kernels, seccomp), both sides use real fences.

use crate::sync::{fence, spin_yield, AtomicU64, Ordering};

#[cfg(not(loom))]
use core::sync::atomic::{compiler_fence, AtomicBool};

/// Whether membarrier is registered, so writers may use compiler fences.
/// Set once, before the first generation of the first session; never
/// cleared (the registration lasts for the process).
#[cfg(not(loom))]
static ASYMMETRIC: AtomicBool = AtomicBool::new(false);

/// Registers this process for expedited private membarrier, enabling
/// asymmetric fences. Call before tracing turns on (the writer side reads
/// the flag on every event). Returns whether it is enabled.
#[cfg(not(loom))]
pub fn enable_asymmetric_fences() -> bool {
    const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;
    if ASYMMETRIC.load(Ordering::Relaxed) {
        return true;
    }
    if std::env::var_os("ALLOCTRACE_NO_MEMBARRIER").is_some() {
        return false;
    }
    // SAFETY: membarrier takes two integer arguments and no pointers.
    let rc = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0) };
    if rc == 0 {
        ASYMMETRIC.store(true, Ordering::SeqCst);
    }
    rc == 0
}

/// The writer's side of the Dekker pattern.
#[inline(always)]
fn light_barrier() {
    #[cfg(not(loom))]
    {
        if ASYMMETRIC.load(Ordering::Relaxed) {
            compiler_fence(Ordering::SeqCst);
            return;
        }
    }
    fence(Ordering::SeqCst);
}

/// The advancer's side: call once after storing the new generation and
/// before [`SeqLock::wait_quiescent`] on the slots.
pub fn heavy_barrier() {
    #[cfg(not(loom))]
    {
        const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
        if ASYMMETRIC.load(Ordering::Relaxed) {
            // SAFETY: membarrier takes two integer arguments and no pointers.
            let rc = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) };
            if rc == 0 {
                return;
            }
        }
    }
    fence(Ordering::SeqCst);
}

/// A per-thread sequence counter, odd while its owner writes an event.
/// One u64 in memory (the header's inline path uses it as one).
#[repr(transparent)]
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

    /// Owner: an event starts; load the generation after this. Returns
    /// false, changing nothing, when the owner is already inside an event: a
    /// signal handler interrupted it on the same thread, and must not write
    /// into its half-written buffer.
    ///
    /// Only the owner writes the counter, so a plain load and store suffice.
    /// A handler that runs a whole event between the two leaves the counter
    /// even and two higher; the store then moves it back by one, to odd, and
    /// `end` makes it even again. An advancer waiting for "a value other
    /// than the odd one it saw" still waits for this event to end.
    #[inline(always)]
    pub fn try_begin(&self) -> bool {
        let s = self.seq.load(Ordering::Relaxed);
        if s & 1 != 0 {
            return false;
        }
        // Keep the load above and the store below in this order, as seen by
        // a signal handler on this thread.
        #[cfg(not(loom))]
        compiler_fence(Ordering::SeqCst);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        light_barrier();
        true
    }

    /// Owner, on the fast path: [`SeqLock::try_begin`] when the advancer is
    /// known to use membarrier (so the writer's side is a compiler fence).
    /// Returns the even value it found, for [`SeqLock::end_from`].
    #[cfg(not(loom))]
    #[inline(always)]
    pub fn try_begin_asymmetric(&self) -> Option<u64> {
        let s = self.seq.load(Ordering::Relaxed);
        if s & 1 != 0 {
            return None;
        }
        compiler_fence(Ordering::SeqCst);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
        Some(s)
    }

    /// Owner: ends the event [`SeqLock::try_begin_asymmetric`] began at `s`.
    #[cfg(not(loom))]
    #[inline(always)]
    pub fn end_from(&self, s: u64) {
        self.seq.store(s.wrapping_add(2), Ordering::Release);
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

    /// [`SeqLock::wait_quiescent`] that gives up once `expired` says so:
    /// returns whether the owner is outside any event that began before
    /// this call. For a fatal-signal flush (crash.rs), which must not wait
    /// for a thread that never leaves its event.
    #[cfg(not(loom))]
    pub fn wait_quiescent_bounded(&self, mut expired: impl FnMut() -> bool) -> bool {
        let seen = self.seq.load(Ordering::Acquire);
        if seen & 1 == 0 {
            return true;
        }
        while self.seq.load(Ordering::Acquire) == seen {
            if expired() {
                return false;
            }
            spin_yield();
        }
        true
    }

    /// Whether the owner is inside an event now.
    #[cfg(not(loom))]
    pub fn is_odd(&self) -> bool {
        self.seq.load(Ordering::Relaxed) & 1 != 0
    }

    /// Advancer: returns once the owner is outside any event that began
    /// before this call. Spins, then yields: an event is a few ns unless the
    /// owner is waiting for a free buffer.
    /// Call after storing the new generation and [`heavy_barrier`].
    pub fn wait_quiescent(&self) {
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
