//! Sampling by bytes: which allocations a sampling session records (issue
//! 22), by one countdown per thread.
//!
//! Every byte allocated is a trial with probability 1 / mean, as Go's
//! `MemProfileRate`, tcmalloc and heapprofd sample
//! (../shared/research/production.md): a thread counts down an
//! exponentially distributed number of bytes, and the allocation that
//! takes the count to zero or below is sampled. The probability that an
//! allocation of `size` bytes is sampled is then 1 - exp(-size / mean),
//! whatever came before it (the draws are memoryless): the weight a reader
//! divides by. The frees a sampling session records are those of the
//! sampled addresses, which it keeps in an [`AddressSet`](crate::AddressSet).
//!
//! The event path's part ([`sample_alloc`], [`sample_free`]): a thread's
//! countdown and exact counts live in sampling.rs's table beside its slot,
//! the countdown carried by the byte count (`next - bytes`). An
//! interposer's fast path ([`Unsampled`]) decides first and only counts
//! what is not sampled: an allocation adds to two counters, a free to one
//! after one load of the set's filter (loads and stores, no locked
//! instruction).

use core::sync::atomic::Ordering;

use crate::sampling::{self, ThreadCounts, OVERFLOW, REFUSE_INSERTS, SAMPLED, SAMPLE_BYTES};
use crate::thread::{self, ThreadSlot};
use crate::tls::{self, Word};

/// One thread's countdown to its next sampled allocation.
#[derive(Debug)]
pub(crate) struct Sampler {
    /// Bytes left before the next sample; 0 before the first draw.
    left: i64,
    /// The thread's random state (xorshift64*; never 0 once seeded).
    rng: u64,
}

impl Sampler {
    /// A countdown not yet drawn: the first call draws it from `seed`.
    #[cfg(test)]
    pub(crate) const fn new() -> Sampler {
        Sampler { left: 0, rng: 0 }
    }

    /// Whether the allocation of `size` bytes is sampled, with `mean`
    /// bytes between samples on average (not 0). Common case: a
    /// subtraction and a branch.
    // The event path runs the same steps on sampling.rs's table
    // (`countdown`, then `crossed`).
    #[cfg(test)]
    pub(crate) fn take(&mut self, size: u64, mean: u64, seed: u64) -> bool {
        self.left = self.left.wrapping_sub(size.min(i64::MAX as u64 / 2) as i64);
        if self.left > 0 {
            return false;
        }
        self.crossed(size, mean, seed)
    }

    /// The countdown reached zero (or was never drawn): `take`'s slow
    /// part, after its subtraction.
    #[cold]
    #[inline(never)]
    fn crossed(&mut self, size: u64, mean: u64, seed: u64) -> bool {
        if self.rng == 0 {
            // The first allocation of the thread: draw the countdown as if
            // it had started before it, then count this allocation.
            self.rng = seed | 1;
            self.left = self
                .draw(mean)
                .wrapping_sub(size.min(i64::MAX as u64 / 2) as i64);
            if self.left > 0 {
                return false;
            }
        }
        // Memoryless: the bytes to the next sample, counted from the end
        // of this allocation, are a fresh draw.
        self.left = self.draw(mean);
        true
    }

    /// An exponentially distributed count of bytes with mean `mean`, at
    /// least 1.
    fn draw(&mut self, mean: u64) -> i64 {
        // xorshift64*: 53 bits of it, a uniform u in [0, 1).
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        let bits = x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
        let u = bits as f64 * (1.0 / (1u64 << 53) as f64);
        // -ln(1 - u) is exponential with mean 1 (1 - u is in (0, 1]).
        let n = -ln(1.0 - u) * mean as f64;
        (n.min(i64::MAX as f64 / 4.0) as i64).max(1)
    }
}

/// The natural logarithm of `x`, a positive normal number, to about
/// 1e-12 relative: the tracer's own, so that the shim does not link
/// libm (a program that dlopens libm would then find it loaded, and make
/// other calls than without tracing). `x = m * 2^e` with `m` in
/// [sqrt(1/2), sqrt(2)); `ln m = 2 atanh(s)`, `s = (m - 1) / (m + 1)`,
/// |s| < 0.172, summed to s^15.
fn ln(x: f64) -> f64 {
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & ((1u64 << 52) - 1)) | (1023u64 << 52));
    if m > core::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let mut sum = 0.0;
    let mut k = 15.0;
    while k > 0.0 {
        sum = sum * s2 + 1.0 / k;
        k -= 2.0;
    }
    e as f64 * core::f64::consts::LN_2 + 2.0 * s * sum
}

/// The largest size a countdown subtracts (so it never wraps).
const MAX_STEP: u64 = i64::MAX as u64 / 2;

/// Sampling mode's fast path for an interposer: the calling thread's
/// countdown and counts, with which it decides an allocation or a free
/// before anything else and, when neither is sampled, only counts it.
/// Everything else (the thread's first event, which claims its slot; an
/// allocation the countdown samples; a free whose address may be sampled)
/// goes the ordinary way (`sample_alloc`, `sample_free`), which decides
/// the same.
#[derive(Clone, Copy, Debug)]
pub struct Unsampled(&'static ThreadCounts);

/// [`Unsampled`], for a caller that saw sampling on (`calls::sampling`),
/// when the session records, the calling thread has its slot and the
/// client's TLS word (`tls::Word::Client`) is below `client_below`; `None`
/// otherwise (the ordinary path). The sampling switch is not loaded again:
/// a session that stops and a full one that starts between the caller's
/// load and the count would count the call instead of recording it, as
/// any check of the switch before an event races a stop.
// Runs inside malloc and free: no allocation, no lock, no panic, no
// system call.
#[inline(always)]
pub(crate) fn unsampled(client_below: usize) -> Option<Unsampled> {
    if !crate::event::emit::enabled() {
        return None;
    }
    let (counts, client) = tls::get_pair(Word::Counts, Word::Client);
    if counts == 0 || client >= client_below {
        return None;
    }
    // SAFETY: the counts word holds 0 or the address of an entry of
    // sampling.rs's static table (thread.rs, `set_current`).
    Some(Unsampled(unsafe { &*(counts as *const ThreadCounts) }))
}

impl Unsampled {
    /// Whether an allocation of `size` bytes is not sampled (the thread's
    /// countdown does not expire). Nothing is counted: [`alloc`](Self::alloc)
    /// counts it once it succeeded; when false, `sample_alloc` decides
    /// (the same) and counts. (A size above `i64::MAX / 2`, whose wrapped
    /// sum may say either, never succeeds, so it is never counted here.)
    #[inline(always)]
    pub fn skips(self, size: usize) -> bool {
        let c = self.0;
        let bytes = c.bytes.load(Ordering::Relaxed).wrapping_add(size as u64);
        c.next.load(Ordering::Relaxed).wrapping_sub(bytes) as i64 > 0
    }

    /// Counts an allocation of `size` bytes, not sampled: one that
    /// [`skips`](Self::skips) let through and that succeeded, or a block
    /// counted back (its free was counted, and it stays).
    #[inline(always)]
    pub fn alloc(self, size: usize) {
        sampling::bump(&self.0.bytes, size as u64);
        sampling::bump(&self.0.allocs, 1);
    }

    /// Whether the free of `addr` (not null) needs no event: its address is
    /// certainly not sampled (one load of the set's filter). Nothing is
    /// counted: [`free`](Self::free) counts it; when false,
    /// `sample_free` decides and counts.
    #[inline(always)]
    pub fn free_skips(self, addr: usize) -> bool {
        SAMPLED.surely_absent(addr as u64)
    }

    /// Counts a free that [`free_skips`](Self::free_skips) let through.
    #[inline(always)]
    pub fn free(self) {
        sampling::bump(&self.0.frees, 1);
    }
}

/// Whether the heap-object allocation of `size` bytes at `addr` is
/// recorded: always outside sampling mode; in sampling mode, counted in
/// the thread's exact totals and recorded when the thread's countdown
/// crosses zero, its address then put in the sampled set (a full set
/// counts an overflow; the allocation is recorded all the same).
// Runs inside malloc: no allocation, no lock, no panic; no system call but
// the thread's first (its slot's claim).
#[inline(always)]
pub(crate) fn sample_alloc(addr: u64, size: u64) -> bool {
    let mean = SAMPLE_BYTES.load(Ordering::Relaxed);
    if mean == 0 {
        return true;
    }
    countdown(addr, size, mean, true)
}

/// [`sample_alloc`] with the session's mean already loaded (`mean`, not
/// 0), for a caller that checked the switch itself.
#[inline(always)]
pub(crate) fn sample_alloc_at(mean: u64, addr: u64, size: u64) -> bool {
    countdown(addr, size, mean, true)
}

/// [`sample_alloc`] for an object that existed when tracing started: the
/// same draw, not counted as an allocation.
#[inline(always)]
pub(crate) fn sample_exists(addr: u64, size: u64) -> bool {
    let mean = SAMPLE_BYTES.load(Ordering::Relaxed);
    if mean == 0 {
        return true;
    }
    countdown(addr, size, mean, false)
}

/// Whether the free of the heap object at `addr` is recorded: always
/// outside sampling mode; in sampling mode, counted, and recorded when
/// `addr` was sampled (taken out of the set).
// Runs inside free: no allocation, no lock, no panic.
#[inline(always)]
pub(crate) fn sample_free(addr: u64) -> bool {
    if SAMPLE_BYTES.load(Ordering::Relaxed) == 0 {
        return true;
    }
    if let Some(c) = thread::current_or_claim().and_then(sampling::counts_of) {
        sampling::bump(&c.frees, 1);
    }
    SAMPLED.remove(addr)
}

#[inline(always)]
fn countdown(addr: u64, size: u64, mean: u64, count: bool) -> bool {
    let Some(slot) = thread::current_or_claim() else {
        return false;
    };
    let Some(c) = sampling::counts_of(slot) else {
        return false;
    };
    // An allocation counts its bytes, which takes the countdown down with
    // them; an object that existed only takes the countdown down.
    let left = if count {
        sampling::bump(&c.allocs, 1);
        let bytes = c.bytes.load(Ordering::Relaxed).wrapping_add(size);
        c.bytes.store(bytes, Ordering::Relaxed);
        c.next.load(Ordering::Relaxed).wrapping_sub(bytes)
    } else {
        let next = c
            .next
            .load(Ordering::Relaxed)
            .wrapping_sub(size.min(MAX_STEP));
        c.next.store(next, Ordering::Relaxed);
        next.wrapping_sub(c.bytes.load(Ordering::Relaxed))
    };
    if left as i64 > 0 && size <= MAX_STEP {
        return false;
    }
    sampled(slot, c, addr, size, mean)
}

/// The countdown crossed zero: draws the next one and puts `addr` in the
/// sampled set.
#[cold]
#[inline(never)]
fn sampled(slot: &ThreadSlot, c: &ThreadCounts, addr: u64, size: u64, mean: u64) -> bool {
    let id = slot.id.load(Ordering::Relaxed);
    let mut rng = c.rng.load(Ordering::Relaxed);
    if c.seeded_for.load(Ordering::Relaxed) != id {
        // A new owner of the slot, or a new session: its own draws.
        rng = 0;
        c.seeded_for.store(id, Ordering::Relaxed);
    }
    let bytes = c.bytes.load(Ordering::Relaxed);
    let mut s = Sampler {
        left: c.next.load(Ordering::Relaxed).wrapping_sub(bytes) as i64,
        rng,
    };
    let seed = thread_seed(sampling::SAMPLE_SEED.load(Ordering::Relaxed), id);
    let taken = s.crossed(size, mean, seed);
    c.next
        .store(bytes.wrapping_add(s.left as u64), Ordering::Relaxed);
    c.rng.store(s.rng, Ordering::Relaxed);
    if !taken {
        return false;
    }
    // Tracing not on yet (a start between sampling's set-up and its first
    // generation) or any more: the allocation will not be recorded, so its
    // address must not enter the set (its free would be recorded alone).
    if !crate::event::emit::enabled() {
        return false;
    }
    let refuse = REFUSE_INSERTS.load(Ordering::Relaxed) > 0
        && REFUSE_INSERTS.fetch_sub(1, Ordering::Relaxed) > 0;
    if refuse || !SAMPLED.insert(addr) {
        OVERFLOW.fetch_add(1, Ordering::Relaxed);
    }
    true
}

/// A per-thread seed from the session's `seed` and the thread's index
/// (splitmix64: neighbouring indexes give unrelated seeds).
pub(crate) fn thread_seed(seed: u64, thread: u64) -> u64 {
    let mut z = seed.wrapping_add(thread.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    #[test]
    fn ln_is_the_natural_logarithm() {
        let mut x = 1e-16f64;
        while x <= 1.0 {
            let want = x.ln();
            let got = super::ln(x);
            assert!(
                (got - want).abs() <= 1e-12 * want.abs().max(1.0),
                "ln({x}) = {got}, want {want}"
            );
            x *= 1.37;
        }
        assert_eq!(super::ln(1.0), 0.0);
    }

    use super::*;

    #[test]
    fn sampled_counts_follow_the_byte_rate() {
        // 10^6 allocations of 64 bytes at a mean of 4 KiB: about 15,625
        // samples, and each allocation's chance is 1 - exp(-64/4096).
        let mean = 4096;
        let mut s = Sampler::new();
        let n = 1_000_000u64;
        let taken = (0..n).filter(|_| s.take(64, mean, 42)).count() as f64;
        let p = 1.0 - (-64.0f64 / mean as f64).exp();
        let want = n as f64 * p;
        let sd = (n as f64 * p * (1.0 - p)).sqrt();
        assert!(
            (taken - want).abs() < 5.0 * sd,
            "taken {taken}, want {want} ± {sd}"
        );
        // The weighted estimate of the bytes is unbiased.
        let est = taken * 64.0 / p;
        assert!((est / (n * 64) as f64 - 1.0).abs() < 0.05, "estimate {est}");
    }

    #[test]
    fn large_allocations_are_always_sampled_and_small_ones_rarely() {
        let mut s = Sampler::new();
        let big = (0..1000).filter(|_| s.take(64 << 20, 512 << 10, 7)).count();
        assert_eq!(big, 1000);
        let mut s = Sampler::new();
        let small = (0..1000).filter(|_| s.take(8, 512 << 10, 7)).count();
        assert!(small <= 2, "{small}");
    }

    #[test]
    fn the_same_seed_samples_the_same_allocations() {
        let run = |seed| {
            let mut s = Sampler::new();
            (0..100_000u64)
                .filter(|&i| s.take(16 + i % 200, 8192, seed))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(thread_seed(5, 0)), run(thread_seed(5, 0)));
        assert_ne!(run(thread_seed(5, 0)), run(thread_seed(5, 1)));
    }
}
