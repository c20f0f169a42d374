//! The trace clock: `rdtsc` ticks on x86-64, `CLOCK_MONOTONIC` nanoseconds
//! elsewhere, and the clock pairs that let the reader convert ticks to ns.

/// Reads the trace clock.
///
/// Must not allocate or make a syscall: runs on the event path, inside the
/// host's malloc. (`clock_gettime` is served by the vDSO.)
#[inline(always)]
pub(crate) fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions on x86-64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        mono_ns()
    }
}

fn read_clock(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer; clock_gettime only writes it.
    unsafe { libc::clock_gettime(id, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// `CLOCK_MONOTONIC` in nanoseconds.
pub(crate) fn mono_ns() -> u64 {
    read_clock(libc::CLOCK_MONOTONIC)
}

/// `CLOCK_REALTIME` in nanoseconds since the Unix epoch.
pub(crate) fn wall_ns() -> u64 {
    read_clock(libc::CLOCK_REALTIME)
}

/// A tick count and the monotonic time read together.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClockPair {
    pub ticks: u64,
    pub mono_ns: u64,
}

impl ClockPair {
    /// Reads both clocks, taking the tightest of a few tries so the pair is
    /// within a few tens of ns of simultaneous.
    pub(crate) fn now() -> ClockPair {
        let mut best = ClockPair {
            ticks: 0,
            mono_ns: 0,
        };
        let mut best_width = u64::MAX;
        for _ in 0..3 {
            let t0 = ticks();
            let ns = mono_ns();
            let t1 = ticks();
            if t1.wrapping_sub(t0) < best_width {
                best_width = t1.wrapping_sub(t0);
                best = ClockPair {
                    ticks: t0 / 2 + t1 / 2,
                    mono_ns: ns,
                };
            }
        }
        best
    }
}

/// The clock's rate in ticks per second, measured once per process over
/// about a millisecond (exactly 1e9 where ticks are nanoseconds). The reader
/// prefers each generation's own start and end pairs; this estimate is only
/// used for a generation cut short before its end.
pub(crate) fn ticks_per_sec() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static RATE: AtomicU64 = AtomicU64::new(0);
    if !cfg!(target_arch = "x86_64") {
        return 1_000_000_000;
    }
    let cached = RATE.load(Ordering::Relaxed);
    if cached != 0 {
        return cached;
    }
    let a = ClockPair::now();
    let mut b = ClockPair::now();
    while b.mono_ns.wrapping_sub(a.mono_ns) < 1_000_000 {
        std::hint::spin_loop();
        b = ClockPair::now();
    }
    let dt = b.ticks.wrapping_sub(a.ticks) as u128;
    let dns = b.mono_ns.wrapping_sub(a.mono_ns).max(1) as u128;
    let rate = ((dt * 1_000_000_000) / dns).clamp(1, u64::MAX as u128) as u64;
    RATE.store(rate, Ordering::Relaxed);
    rate
}

/// Which clock stamps events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ClockKind {
    /// Read the clock (`rdtsc`) at every event.
    #[default]
    Precise,
    /// Never read the clock on the event path: stamp each event with the
    /// time the tracer's advancer thread publishes every [`COARSE_PERIOD`]
    /// (and every advance publishes before the new generation starts). Times
    /// never go down within a thread, and a thread's events with equal times
    /// keep their order in the trace (the reader orders ties by thread, then
    /// by file order), so each thread's order is exact. Times lag the truth
    /// by up to one period, so events of different threads closer than that
    /// may be ordered wrongly.
    Coarse,
}

/// How often the coarse clock is published.
pub const COARSE_PERIOD: std::time::Duration = std::time::Duration::from_micros(250);

/// Whether the running session uses the coarse clock. Set by start before
/// the first generation.
pub(crate) static COARSE: core::sync::atomic::AtomicBool =
    core::sync::atomic::AtomicBool::new(false);

/// Publishes the current time for coarse-clock events. The published time
/// never goes down, even with two publishers (the advancer's period and an
/// advance on another thread): an event's time is never below one its
/// thread stamped before.
pub(crate) fn publish() {
    crate::shared::SHARED
        .published_ticks
        .fetch_max(ticks(), core::sync::atomic::Ordering::Relaxed);
}
