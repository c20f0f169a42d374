//! Estimates from a sampled trace (format version 6, `sample_bytes` > 0):
//! what each recorded heap-object allocation stands for.
//!
//! A sampling writer records an allocation of `s` bytes with probability
//! `p = 1 - exp(-s / sample_bytes)`; weighing each recorded one by `1 / p`
//! (Go pprof's unsampling) makes every sum over allocations (a site's
//! count and bytes, the live bytes at a moment, a size histogram) an
//! unbiased estimate of the sum over all of them. Spans and thread stacks
//! are recorded in full and weigh 1.
//!
//! The consumers (profile, timeline, summary) keep their integer counts:
//! an allocation's estimated bytes are `round(s / p)`, its estimated
//! count is `floor(1 / p)` plus one with probability the fraction (drawn
//! from a hash of its address, so its free takes off what its alloc
//! added).

use crate::pass::{Alloc, Memory};

/// What one recorded allocation stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Estimate {
    pub count: u64,
    pub bytes: u64,
}

/// The estimate of `alloc` in a generation sampled every `sample_bytes`
/// bytes (0: not sampled, the allocation itself).
#[inline]
pub fn estimate(alloc: &Alloc, sample_bytes: u64) -> Estimate {
    if sample_bytes == 0 || alloc.memory != Memory::Heap {
        return Estimate {
            count: 1,
            bytes: alloc.size,
        };
    }
    weighed(alloc.size, alloc.addr, sample_bytes)
}

#[cold]
fn weighed(size: u64, addr: u64, sample_bytes: u64) -> Estimate {
    let w = alloctrace_reader::sample_weight(size, sample_bytes);
    let whole = w.floor();
    // A uniform draw in [0, 1) from the address (splitmix64's finalizer).
    let mut z = addr.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    let u = (z >> 11) as f64 / (1u64 << 53) as f64;
    let count = whole as u64 + u64::from(u < w - whole);
    Estimate {
        count,
        bytes: (w * size as f64).round() as u64,
    }
}

/// The sampling parameter a pass saw: the largest `sample_bytes` of its
/// generations (0: every allocation recorded), for the reports to say
/// that they show estimates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sampling {
    pub sample_bytes: u64,
}

impl Sampling {
    /// Notes a generation's `sample_bytes`.
    pub fn note(&mut self, sample_bytes: u64) {
        self.sample_bytes = self.sample_bytes.max(sample_bytes);
    }

    /// Whether the numbers are estimates.
    pub fn estimated(&self) -> bool {
        self.sample_bytes != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsampled_allocations_are_themselves() {
        let a = crate::testing::alloc(1, 0x1000, 100, 0);
        assert_eq!(
            estimate(&a, 0),
            Estimate {
                count: 1,
                bytes: 100
            }
        );
    }

    #[test]
    fn counts_average_to_the_weight() {
        // 64-byte objects at 4 KiB: each weighs about 64.5.
        let w = alloctrace_reader::sample_weight(64, 4096);
        let n = 100_000u64;
        let (mut count, mut bytes) = (0u64, 0u64);
        for i in 0..n {
            let a = crate::testing::alloc(1, 0x10_0000 + i * 64, 64, 0);
            let e = estimate(&a, 4096);
            assert!(e.count == w.floor() as u64 || e.count == w.ceil() as u64);
            count += e.count;
            bytes += e.bytes;
        }
        assert!(
            (count as f64 / (n as f64 * w) - 1.0).abs() < 0.01,
            "{count}"
        );
        assert!((bytes as f64 / (n as f64 * w * 64.0) - 1.0).abs() < 0.01);
        // Large objects weigh 1.
        let big = crate::testing::alloc(1, 0x1000, 1 << 30, 0);
        assert_eq!(estimate(&big, 4096).count, 1);
    }
}
