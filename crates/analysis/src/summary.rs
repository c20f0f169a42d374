//! Allocations broken down by size and lifetime, and the facts of each
//! run (pid, start, duration).
//!
//! [`Summary`] is a [`Visitor`]. Sizes and lifetimes go to power-of-two
//! buckets ([`log2_bucket`]): constant memory whatever the trace. (Per
//! thread and per type: [`Profile`](crate::profile::Profile)'s
//! breakdowns.)

use crate::pass::GenerationView;

use crate::pass::{Alloc, Free, Live, Visitor};
use crate::stacks::StackTable;

/// Buckets of a [`Histogram`]: 0, then one per power of two up to 2^63.
pub const LOG2_BUCKETS: usize = 65;

/// Bucket of `value`: 0 for 0, else `k` for `2^(k-1) <= value < 2^k`.
#[inline]
pub fn log2_bucket(value: u64) -> usize {
    (u64::BITS - value.leading_zeros()) as usize
}

/// The smallest value of bucket `k` (0 for bucket 0).
pub fn log2_bucket_min(k: usize) -> u64 {
    if k == 0 {
        0
    } else {
        1u64 << (k - 1)
    }
}

/// Counts and bytes per power-of-two bucket of some value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Histogram {
    pub counts: [u64; LOG2_BUCKETS],
    pub bytes: [u64; LOG2_BUCKETS],
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: [0; LOG2_BUCKETS],
            bytes: [0; LOG2_BUCKETS],
        }
    }
}

impl Histogram {
    #[inline]
    fn add(&mut self, value: u64, count: u64, bytes: u64) {
        let k = log2_bucket(value);
        self.counts[k] += count;
        self.bytes[k] = self.bytes[k].saturating_add(bytes);
    }

    /// The non-empty buckets' range (`None` when empty).
    pub fn used(&self) -> Option<std::ops::RangeInclusive<usize>> {
        let first = self.counts.iter().position(|&c| c != 0)?;
        let last = self.counts.iter().rposition(|&c| c != 0)?;
        Some(first..=last)
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// One trace's facts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunFacts {
    /// The traced process's ID (0: no info batch).
    pub pid: u64,
    /// Wall-clock start of the first generation, ns since the Unix epoch.
    pub start_wall_ns: u64,
    /// Monotonic start of the first generation (event times count from
    /// it), ns.
    pub start_mono_ns: u64,
    /// Time of the last allocation or free, ns since the start.
    pub duration_ns: u64,
    pub generations: u64,
    /// The traced command line, when the trace records it.
    pub command: Option<Vec<String>>,
}

/// Sizes, lifetimes and run facts of a pass.
#[derive(Default)]
pub struct Summary {
    /// Allocation sizes per [`Memory`](crate::pass::Memory) kind (indexed by `Memory as usize`):
    /// counts and bytes.
    pub sizes: [Histogram; 3],
    /// Freed allocations by lifetime in ns (bucket of the lifetime), with
    /// their bytes; memory that existed before tracing started is left out.
    pub lifetimes: Histogram,
    /// One per trace of the pass (its duration set at its end).
    pub runs: Vec<RunFacts>,
    /// The current trace's last allocation or free.
    last_ns: u64,
    /// The current generation's `sample_bytes` (0: not sampled).
    sample_bytes: u64,
}

impl Summary {
    pub fn new() -> Summary {
        Summary::default()
    }
}

impl Visitor for Summary {
    fn trace_end(&mut self, _live: &Live) {
        if let Some(run) = self.runs.last_mut() {
            run.duration_ns = self.last_ns;
        }
    }

    fn trace_start(&mut self, _index: usize) {
        self.last_ns = 0;
        self.runs.push(RunFacts::default());
    }

    fn generation(&mut self, reader: &GenerationView, _stacks: &StackTable) {
        if self.runs.is_empty() {
            self.runs.push(RunFacts::default());
        }
        let run = self.runs.last_mut().expect("a run per trace");
        run.generations += 1;
        if run.command.is_none() {
            run.command = reader.command_line().map(<[String]>::to_vec);
        }
        self.sample_bytes = reader.info().map_or(0, |i| i.sample_bytes);
        if let Some(info) = reader.info() {
            if run.generations == 1 || run.pid == 0 {
                run.pid = info.pid;
                run.start_wall_ns = info.start_wall_ns;
                run.start_mono_ns = info.start_mono_ns;
            }
        }
    }

    #[inline]
    fn alloc(&mut self, alloc: &Alloc) {
        // A sampled trace: estimated counts and bytes (crate::sampling).
        let est = crate::sampling::estimate(alloc, self.sample_bytes);
        self.sizes[alloc.memory as usize].add(alloc.size, est.count, est.bytes);
        self.last_ns = self.last_ns.max(alloc.time_ns);
    }

    #[inline]
    fn free(&mut self, alloc: &Alloc, free: &Free) {
        if !alloc.existed {
            let lifetime = free.time_ns.saturating_sub(alloc.time_ns);
            let est = crate::sampling::estimate(alloc, self.sample_bytes);
            self.lifetimes.add(lifetime, est.count, est.bytes);
        }
        self.last_ns = self.last_ns.max(free.time_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pass::Memory;

    fn alloc(time_ns: u64, thread: u64, size: u64, type_id: u64) -> Alloc {
        Alloc {
            thread,
            type_id,
            ..crate::testing::alloc(time_ns, time_ns, size, 0)
        }
    }

    fn free(time_ns: u64) -> Free {
        crate::testing::free(time_ns, 99)
    }

    #[test]
    fn buckets_are_powers_of_two() {
        assert_eq!(log2_bucket(0), 0);
        assert_eq!(log2_bucket(1), 1);
        assert_eq!(log2_bucket(2), 2);
        assert_eq!(log2_bucket(3), 2);
        assert_eq!(log2_bucket(4), 3);
        assert_eq!(log2_bucket(u64::MAX), 64);
        for k in 1..LOG2_BUCKETS {
            assert_eq!(log2_bucket(log2_bucket_min(k)), k);
            assert_eq!(log2_bucket(log2_bucket_min(k) - 1), k - 1);
        }
    }

    #[test]
    fn sizes_and_lifetimes_add_up() {
        let mut b = Summary::new();
        b.trace_start(0);
        let a1 = alloc(0, 1, 16, 0);
        let a2 = alloc(10, 2, 1000, 5);
        let a3 = alloc(20, 1, 40, 5);
        b.alloc(&a1);
        b.alloc(&a2);
        b.alloc(&a3);
        b.free(&a1, &free(1_000_020));
        b.free(&a2, &free(14));
        let mut existed = alloc(30, 1, 8, 0);
        existed.existed = true;
        b.alloc(&existed);
        b.free(&existed, &free(40));
        b.trace_end(&Live::default());
        let heap = &b.sizes[Memory::Heap as usize];
        assert_eq!(heap.counts[log2_bucket(16)], 1);
        assert_eq!(heap.counts[log2_bucket(40)], 1);
        assert_eq!(heap.bytes[log2_bucket(1000)], 1000);
        assert_eq!(heap.total(), 4);
        assert_eq!(heap.used(), Some(4..=10));
        assert_eq!(b.sizes[Memory::Span as usize].used(), None);
        // Lifetimes 4 and 1_000_020 ns; the memory that existed before
        // tracing has none.
        assert_eq!(b.lifetimes.counts[log2_bucket(4)], 1);
        assert_eq!(b.lifetimes.bytes[log2_bucket(4)], 1000);
        assert_eq!(b.lifetimes.counts[log2_bucket(1_000_020)], 1);
        assert_eq!(b.lifetimes.total(), 2);
        assert_eq!(b.runs.len(), 1);
        assert_eq!(b.runs[0].duration_ns, 1_000_020);
    }

    #[test]
    fn each_trace_has_its_run() {
        let mut b = Summary::new();
        b.trace_start(0);
        b.alloc(&alloc(5, 7, 8, 0));
        b.trace_end(&Live::default());
        b.trace_start(1);
        b.alloc(&alloc(9, 7, 8, 0));
        b.alloc(&alloc(12, 7, 8, 0));
        b.trace_end(&Live::default());
        assert_eq!(b.runs.len(), 2);
        assert_eq!(b.runs[0].duration_ns, 5);
        assert_eq!(b.runs[1].duration_ns, 12);
    }
}
