//! Allocations broken down by size, lifetime, thread and type, and the
//! facts of each run (pid, start, duration).
//!
//! [`Breakdown`] is a [`Visitor`]. Sizes and lifetimes go to power-of-two
//! buckets ([`log2_bucket`]): constant memory whatever the trace. Threads
//! and types are keyed per trace (one process's thread 7 is not
//! another's), memory per distinct thread and type.

use std::io::Read;

use alloctrace_reader::TraceReader;
use rustc_hash::FxHashMap;

use crate::pass::{Alloc, Free, Visitor};
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
    fn add(&mut self, value: u64, bytes: u64) {
        let k = log2_bucket(value);
        self.counts[k] += 1;
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

/// Allocations of one thread or one type.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub allocations: u64,
    pub bytes: u64,
    pub frees: u64,
    /// Live now (at the end of the pass: leaked).
    pub live_objects: u64,
    pub live_bytes: u64,
    /// The largest `live_bytes` ever (its own peak, not at the program's).
    pub peak_bytes: u64,
}

impl Usage {
    #[inline]
    fn alloc(&mut self, size: u64) {
        self.allocations += 1;
        self.bytes = self.bytes.saturating_add(size);
        self.live_objects += 1;
        self.live_bytes = self.live_bytes.saturating_add(size);
        self.peak_bytes = self.peak_bytes.max(self.live_bytes);
    }

    #[inline]
    fn free(&mut self, size: u64) {
        self.frees += 1;
        self.live_objects = self.live_objects.saturating_sub(1);
        self.live_bytes = self.live_bytes.saturating_sub(size);
    }
}

/// A thread's allocations (by the allocating thread: a free counts
/// against the thread that made the allocation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadUsage {
    /// Index of the trace in the pass.
    pub trace: usize,
    pub thread: u64,
    pub usage: Usage,
}

/// A type's heap objects (C-API traces register types).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeUsage {
    pub trace: usize,
    pub type_id: u64,
    /// The registered name (`None`: the type table never named it).
    pub name: Option<String>,
    /// The registered size of one object.
    pub size: u64,
    pub usage: Usage,
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

/// Sizes, lifetimes, threads, types and run facts of a pass.
#[derive(Default)]
pub struct Breakdown {
    /// Allocation sizes per [`Memory`](crate::pass::Memory) kind (indexed by `Memory as usize`):
    /// counts and bytes.
    pub sizes: [Histogram; 3],
    /// Freed allocations by lifetime in ns (bucket of the lifetime), with
    /// their bytes; memory that existed before tracing started is left out.
    pub lifetimes: Histogram,
    /// One per trace of the pass.
    pub runs: Vec<RunFacts>,
    threads: Vec<ThreadUsage>,
    thread_index: FxHashMap<(usize, u64), u32>,
    types: Vec<TypeUsage>,
    type_index: FxHashMap<(usize, u64), u32>,
    trace: usize,
    /// The last thread looked up (allocations come in runs per thread).
    last_thread: Option<(u64, u32)>,
}

impl Breakdown {
    pub fn new() -> Breakdown {
        Breakdown::default()
    }

    /// Every thread that allocated, in order of first allocation.
    pub fn threads(&self) -> &[ThreadUsage] {
        &self.threads
    }

    /// Every type of heap object allocated (type ID not 0), in order of
    /// first allocation.
    pub fn types(&self) -> &[TypeUsage] {
        &self.types
    }

    #[inline]
    fn thread(&mut self, thread: u64) -> &mut Usage {
        let i = match self.last_thread {
            Some((t, i)) if t == thread => i,
            _ => {
                let next = self.threads.len() as u32;
                let trace = self.trace;
                let i = *self.thread_index.entry((trace, thread)).or_insert_with(|| {
                    self.threads.push(ThreadUsage {
                        trace,
                        thread,
                        usage: Usage::default(),
                    });
                    next
                });
                self.last_thread = Some((thread, i));
                i
            }
        };
        &mut self.threads[i as usize].usage
    }

    fn type_usage(&mut self, type_id: u64) -> &mut Usage {
        let next = self.types.len() as u32;
        let trace = self.trace;
        let i = *self.type_index.entry((trace, type_id)).or_insert_with(|| {
            self.types.push(TypeUsage {
                trace,
                type_id,
                name: None,
                size: 0,
                usage: Usage::default(),
            });
            next
        });
        &mut self.types[i as usize].usage
    }
}

impl Visitor for Breakdown {
    fn trace_start(&mut self, index: usize) {
        self.trace = index;
        self.last_thread = None;
        self.runs.push(RunFacts::default());
    }

    fn generation<R: Read>(&mut self, reader: &TraceReader<R>, _stacks: &StackTable) {
        if self.runs.is_empty() {
            self.runs.push(RunFacts::default());
        }
        let run = self.runs.last_mut().expect("a run per trace");
        run.generations += 1;
        if let Some(info) = reader.info() {
            if run.generations == 1 || run.pid == 0 {
                run.pid = info.pid;
                run.start_wall_ns = info.start_wall_ns;
                run.start_mono_ns = info.start_mono_ns;
            }
        }
        // Names of the types this trace allocated before their table came,
        // and of those to come.
        for (&id, info) in reader.types() {
            let next = self.types.len() as u32;
            let trace = self.trace;
            let i = *self.type_index.entry((trace, id)).or_insert_with(|| {
                self.types.push(TypeUsage {
                    trace,
                    type_id: id,
                    name: None,
                    size: 0,
                    usage: Usage::default(),
                });
                next
            });
            let t = &mut self.types[i as usize];
            t.name = Some(info.name.clone());
            t.size = info.size;
        }
    }

    #[inline]
    fn alloc(&mut self, alloc: &Alloc) {
        self.sizes[alloc.memory as usize].add(alloc.size, alloc.size);
        self.thread(alloc.thread).alloc(alloc.size);
        if alloc.type_id != 0 {
            self.type_usage(alloc.type_id).alloc(alloc.size);
        }
        if let Some(run) = self.runs.last_mut() {
            run.duration_ns = run.duration_ns.max(alloc.time_ns);
        }
    }

    #[inline]
    fn free(&mut self, alloc: &Alloc, free: &Free) {
        if !alloc.existed {
            let lifetime = free.time_ns.saturating_sub(alloc.time_ns);
            self.lifetimes.add(lifetime, alloc.size);
        }
        self.thread(alloc.thread).free(alloc.size);
        if alloc.type_id != 0 {
            self.type_usage(alloc.type_id).free(alloc.size);
        }
        if let Some(run) = self.runs.last_mut() {
            run.duration_ns = run.duration_ns.max(free.time_ns);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pass::Memory;

    fn alloc(time_ns: u64, thread: u64, size: u64, type_id: u64) -> Alloc {
        Alloc {
            time_ns,
            thread,
            addr: time_ns,
            size,
            type_id,
            stack: 0,
            memory: Memory::Heap,
            entry: None,
            existed: false,
        }
    }

    fn free(time_ns: u64) -> Free {
        Free {
            time_ns,
            thread: 99,
            entry: None,
            implicit: false,
        }
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
    fn sizes_lifetimes_threads_and_types_add_up() {
        let mut b = Breakdown::new();
        b.trace_start(0);
        let a1 = alloc(0, 1, 16, 0);
        let a2 = alloc(10, 2, 1000, 5);
        let a3 = alloc(20, 1, 40, 5);
        b.alloc(&a1);
        b.alloc(&a2);
        b.alloc(&a3);
        // Thread 99 frees thread 1's object: it counts against thread 1.
        b.free(&a1, &free(1_000_020));
        b.free(&a2, &free(14));
        let heap = &b.sizes[Memory::Heap as usize];
        assert_eq!(heap.counts[log2_bucket(16)], 1);
        assert_eq!(heap.counts[log2_bucket(40)], 1);
        assert_eq!(heap.bytes[log2_bucket(1000)], 1000);
        assert_eq!(heap.total(), 3);
        assert_eq!(heap.used(), Some(5..=10));
        assert_eq!(b.lifetimes.counts[log2_bucket(4)], 1);
        assert_eq!(b.lifetimes.counts[log2_bucket(1_000_020)], 1);
        assert_eq!(b.lifetimes.total(), 2);
        let threads = b.threads();
        assert_eq!(threads.len(), 2);
        assert_eq!(threads[0].thread, 1);
        assert_eq!(threads[0].usage.allocations, 2);
        assert_eq!(threads[0].usage.bytes, 56);
        assert_eq!(threads[0].usage.frees, 1);
        assert_eq!(threads[0].usage.live_bytes, 40);
        assert_eq!(threads[0].usage.peak_bytes, 56);
        assert_eq!(threads[1].usage.live_bytes, 0);
        assert_eq!(threads[1].usage.peak_bytes, 1000);
        let types = b.types();
        assert_eq!(types.len(), 1);
        assert_eq!(types[0].type_id, 5);
        assert_eq!(types[0].usage.allocations, 2);
        assert_eq!(types[0].usage.live_objects, 1);
        assert_eq!(types[0].usage.peak_bytes, 1040);
        assert_eq!(b.runs.len(), 1);
        assert_eq!(b.runs[0].duration_ns, 1_000_020);
    }

    #[test]
    fn threads_of_different_traces_stay_apart() {
        let mut b = Breakdown::new();
        b.trace_start(0);
        b.alloc(&alloc(0, 7, 8, 0));
        b.trace_start(1);
        b.alloc(&alloc(0, 7, 8, 0));
        b.alloc(&alloc(1, 7, 8, 0));
        assert_eq!(b.threads().len(), 2);
        assert_eq!(b.threads()[1].trace, 1);
        assert_eq!(b.threads()[1].usage.allocations, 2);
        assert_eq!(b.runs.len(), 2);
    }
}
