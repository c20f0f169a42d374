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
//!
//! When membarrier fails at run time. Registration succeeded, so the
//! kernel has the command, but a call can still fail (ENOMEM: the kernel
//! could not allocate its CPU mask). By then writers use compiler fences
//! only, so a `fence(SeqCst)` on the advancer's side alone pairs with
//! nothing: a writer's counter store may still sit in its store buffer
//! while its generation load has already returned the old generation, and
//! the advancer would take a buffer that writer is filling (the loom test
//! `a_lone_advancer_fence_does_not_pair_with_a_compiler_fence` shows that
//! interleaving). Switching writers to real fences cannot repair it either:
//! a writer already past its compiler fence has made its load, and only a
//! barrier run on its own CPU orders it, which is what failed. So
//! [`heavy_barrier`]:
//! - retries, [`MEMBARRIER_ATTEMPTS`] times with a doubling sleep from 1 ms
//!   up to 64 ms between tries (about 2.2 s in all): ENOMEM is transient
//!   memory pressure, and a retry that succeeds is a full barrier like any
//!   other, so the proof above holds unchanged;
//! - if every try fails, writes one line to stderr saying so and aborts the
//!   process. Corrupting the trace's buffers (or a thread's memory) silently
//!   would be worse than stopping a process that the kernel cannot give a
//!   few bytes to. The fatal-signal flush (crash.rs), which must not sleep
//!   for seconds nor change how the process dies, uses
//!   [`heavy_barrier_within`] instead and, when it fails, takes no thread's
//!   buffers, as it does for a thread stuck mid-event.
//!
//! Invariants:
//! - `ASYMMETRIC` is set once, before any writer can read it as set, and is
//!   never cleared: a writer that saw it set may be mid-event at any later
//!   advance, so every later advance must be a process-wide barrier or not
//!   take buffers at all.
//! - [`heavy_barrier`] returns only after a barrier that pairs with every
//!   writer's [`light_barrier`]; it never falls back to a one-sided fence
//!   while `ASYMMETRIC` is set.

use crate::sync::{fence, spin_yield, AtomicU64, Ordering};

#[cfg(not(loom))]
use core::sync::atomic::{compiler_fence, AtomicBool, AtomicU32};

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
    let rc = unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
            0,
        )
    };
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

/// How many times `heavy_barrier` calls membarrier before it gives up.
#[cfg(not(loom))]
pub const MEMBARRIER_ATTEMPTS: u32 = 40;

/// Test hook: membarrier calls still to fail (with ENOMEM) before the real
/// call is made. Zero outside tests.
#[cfg(not(loom))]
static INJECTED_FAILURES: AtomicU32 = AtomicU32::new(0);

/// Test hook: makes the next `n` membarrier calls of [`heavy_barrier`] and
/// [`heavy_barrier_within`] fail as if the kernel returned ENOMEM.
#[cfg(not(loom))]
#[doc(hidden)]
pub fn inject_membarrier_failures(n: u32) {
    INJECTED_FAILURES.store(n, Ordering::SeqCst);
}

/// Whether writers use compiler fences (membarrier registered).
#[cfg(not(loom))]
#[doc(hidden)]
pub fn asymmetric_fences() -> bool {
    ASYMMETRIC.load(Ordering::Relaxed)
}

/// One expedited membarrier: `Err(errno)` when it (or the test hook) fails.
#[cfg(not(loom))]
fn expedited_membarrier() -> Result<(), i32> {
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    let injected = INJECTED_FAILURES.load(Ordering::Relaxed);
    if injected > 0 {
        INJECTED_FAILURES.store(injected - 1, Ordering::Relaxed);
        return Err(libc::ENOMEM);
    }
    // SAFETY: membarrier takes two integer arguments and no pointers.
    let rc = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) };
    if rc == 0 {
        Ok(())
    } else {
        // SAFETY: this thread's errno, just set by the failed call.
        Err(unsafe { *libc::__errno_location() })
    }
}

/// The advancer's side: call once after storing the new generation and
/// before `SeqLock::wait_quiescent` on the slots.
///
/// With membarrier registered, retries a failing call and aborts the
/// process if it never succeeds (see the module docs: a one-sided fence
/// would not exclude a writer mid-event). Without it, a SeqCst fence.
pub fn heavy_barrier() {
    #[cfg(not(loom))]
    {
        if ASYMMETRIC.load(Ordering::Relaxed) {
            let mut last = 0;
            let mut delay_ms = 1u64;
            for attempt in 0..MEMBARRIER_ATTEMPTS {
                match expedited_membarrier() {
                    Ok(()) => return,
                    Err(e) => last = e,
                }
                if attempt + 1 < MEMBARRIER_ATTEMPTS {
                    std::thread::sleep(std::time::Duration::from_millis(delay_ms));
                    delay_ms = (delay_ms * 2).min(64);
                }
            }
            membarrier_failed(last);
        }
    }
    fence(Ordering::SeqCst);
}

/// [`heavy_barrier`] for the fatal-signal flush: tries membarrier until
/// `expired` says so, without sleeping; returns whether the barrier holds.
/// `false` means no thread's buffers may be taken.
#[cfg(not(loom))]
pub fn heavy_barrier_within(mut expired: impl FnMut() -> bool) -> bool {
    if ASYMMETRIC.load(Ordering::Relaxed) {
        loop {
            if expedited_membarrier().is_ok() {
                return true;
            }
            if expired() {
                return false;
            }
            spin_yield();
        }
    }
    fence(Ordering::SeqCst);
    true
}

/// Says on stderr why the process stops, then aborts. Allocates nothing:
/// the message is built on the stack.
#[cfg(not(loom))]
#[cold]
fn membarrier_failed(errno: i32) -> ! {
    let mut msg = [0u8; 256];
    let mut n = 0;
    let mut put = |bytes: &[u8]| {
        for &b in bytes {
            if n < msg.len() {
                msg[n] = b;
                n += 1;
            }
        }
    };
    let mut digits = [0u8; 20];
    put(b"alloctrace: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) failed ");
    put(decimal(u64::from(MEMBARRIER_ATTEMPTS), &mut digits));
    put(b" times (last errno ");
    put(decimal(u64::from(errno.unsigned_abs()), &mut digits));
    put(b"); without it a thread could still be writing a buffer the tracer takes: aborting\n");
    // SAFETY: msg holds n initialised bytes; fd 2 may be closed, which
    // write reports and we ignore.
    unsafe { libc::write(2, msg.as_ptr().cast(), n) };
    // SAFETY: abort has no preconditions.
    unsafe { libc::abort() }
}

/// The decimal digits of `v`, written at the end of `buf`, without
/// allocating. 20 digits hold any u64, so the index never underflows.
#[cfg(not(loom))]
fn decimal(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &buf[i..];
        }
    }
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
        SeqLock {
            seq: AtomicU64::new(0),
        }
    }

    #[cfg(loom)]
    pub fn new() -> SeqLock {
        SeqLock {
            seq: AtomicU64::new(0),
        }
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
