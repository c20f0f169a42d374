//! The live memory over time, downsampled to a bounded number of buckets.
//!
//! [`Timeline`] is a [`Visitor`]: after every allocation and free it knows
//! the live heap-object, span and stack bytes, their total and the live
//! object count (the total and the count as [`Profile`](crate::Profile)'s
//! peak takes them: heap objects and spans; stacks, a thread's reserved
//! 8 MiB under the shim or a runtime's stacks inside its spans, beside),
//! and keeps, per time bucket, each quantity's minimum, maximum and last
//! value, so a spike shorter than a bucket still shows as the bucket's
//! maximum. The trace's end time is unknown until the pass ends, so the
//! bucket width starts at 1 ns and doubles (neighbouring buckets merged in
//! pairs) whenever an event falls past the last bucket the limit allows:
//! at most `max_buckets` buckets whatever the trace's length, each event
//! costing a few comparisons.
//!
//! Each trace of the pass (one per process) has its own [`Series`], on the
//! absolute monotonic clock (`time_origin_ns` + event time), since each has
//! its own live memory; [`Timeline::merged`] sums them on one grid.
//!
//! ## Invariants
//! 1. A series' buckets are `width_ns()` wide, bucket `i` starting at
//!    `origin_ns + i * width_ns()`; there are at most `max_buckets` of them
//!    (`max_buckets` is even and at least 2).
//! 2. Every bucket's `last` is the live amount after the last event before
//!    its end; a bucket without events is flat at the level it inherits.
//! 3. The maximum over all buckets of `max` is the exact peak of the trace.

use crate::pass::GenerationView;

use crate::pass::{Alloc, Free, Memory, Visitor};
use crate::stacks::StackTable;

/// The default bound on a series' buckets.
pub const DEFAULT_BUCKETS: usize = 2000;

/// A quantity over a bucket: its smallest, largest and last value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Range {
    pub min: u64,
    pub max: u64,
    pub last: u64,
}

impl Range {
    fn flat(value: u64) -> Range {
        Range {
            min: value,
            max: value,
            last: value,
        }
    }

    /// The value grew to `value` (from `last`, within the range: the
    /// minimum stays).
    #[inline]
    fn rise(&mut self, value: u64) {
        self.max = self.max.max(value);
        self.last = value;
    }

    /// The value fell to `value` (the maximum stays).
    #[inline]
    fn fall(&mut self, value: u64) {
        self.min = self.min.min(value);
        self.last = value;
    }

    /// `self` followed by `later`.
    fn then(&mut self, later: &Range) {
        self.min = self.min.min(later.min);
        self.max = self.max.max(later.max);
        self.last = later.last;
    }

    fn add(&mut self, other: &Range) {
        self.min = self.min.saturating_add(other.min);
        self.max = self.max.saturating_add(other.max);
        self.last = self.last.saturating_add(other.last);
    }
}

/// Live memory at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Levels {
    /// Live heap-object bytes.
    pub heap: u64,
    /// Live span (pages, `mmap`) bytes.
    pub span: u64,
    /// Live goroutine-style stack bytes.
    pub stack: u64,
    /// Live heap objects and spans.
    pub objects: u64,
}

impl Levels {
    /// Heap-object and span bytes (stacks are not counted, as in
    /// [`Profile`](crate::Profile)'s peak).
    pub fn total(&self) -> u64 {
        self.heap.saturating_add(self.span)
    }

    fn bytes_mut(&mut self, memory: Memory) -> &mut u64 {
        match memory {
            Memory::Heap => &mut self.heap,
            Memory::Span => &mut self.span,
            Memory::Stack => &mut self.stack,
        }
    }
}

/// One time bucket of a [`Series`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    pub heap: Range,
    pub span: Range,
    pub stack: Range,
    /// Heap-object and span bytes together ([`Levels::total`]).
    pub total: Range,
    pub objects: Range,
    /// Allocations and frees in the bucket, and the bytes allocated.
    pub allocs: u64,
    pub frees: u64,
    pub alloc_bytes: u64,
}

impl Bucket {
    fn flat(levels: &Levels) -> Bucket {
        Bucket {
            heap: Range::flat(levels.heap),
            span: Range::flat(levels.span),
            stack: Range::flat(levels.stack),
            total: Range::flat(levels.total()),
            objects: Range::flat(levels.objects),
            allocs: 0,
            frees: 0,
            alloc_bytes: 0,
        }
    }

    fn then(&mut self, later: &Bucket) {
        self.heap.then(&later.heap);
        self.span.then(&later.span);
        self.stack.then(&later.stack);
        self.total.then(&later.total);
        self.objects.then(&later.objects);
        self.allocs += later.allocs;
        self.frees += later.frees;
        self.alloc_bytes = self.alloc_bytes.saturating_add(later.alloc_bytes);
    }

    fn add(&mut self, other: &Bucket) {
        self.heap.add(&other.heap);
        self.span.add(&other.span);
        self.stack.add(&other.stack);
        self.total.add(&other.total);
        self.objects.add(&other.objects);
        self.allocs += other.allocs;
        self.frees += other.frees;
        self.alloc_bytes = self.alloc_bytes.saturating_add(other.alloc_bytes);
    }
}

/// The live memory of one trace over time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Series {
    /// Start of bucket 0 on the monotonic clock, ns (the first event's
    /// time); `None` before the first event.
    pub origin_ns: Option<u64>,
    /// Bucket width is `1 << shift` ns.
    shift: u32,
    max_buckets: usize,
    pub buckets: Vec<Bucket>,
    /// Live memory after the last event.
    pub levels: Levels,
    /// Time of the last event on the monotonic clock, ns.
    pub end_ns: u64,
    /// End of the last bucket (monotonic ns): an event before it goes to
    /// the last bucket without arithmetic. 0 before the first event.
    limit_ns: u64,
}

impl Series {
    fn new(max_buckets: usize) -> Series {
        Series {
            origin_ns: None,
            shift: 0,
            max_buckets,
            buckets: Vec::new(),
            levels: Levels::default(),
            end_ns: 0,
            limit_ns: 0,
        }
    }

    pub fn width_ns(&self) -> u64 {
        1u64 << self.shift
    }

    /// Start of bucket `i` on the monotonic clock, ns.
    pub fn bucket_start_ns(&self, i: usize) -> u64 {
        self.origin_ns
            .unwrap_or(0)
            .saturating_add((i as u64) << self.shift)
    }

    /// The largest value of the heap, span and stack bytes and the object
    /// count, each at its own moment (so `total()` of the result is not
    /// the peak total: see [`peak_total`](Self::peak_total)).
    pub fn peaks(&self) -> Levels {
        let mut p = Levels::default();
        for b in &self.buckets {
            p.heap = p.heap.max(b.heap.max);
            p.span = p.span.max(b.span.max);
            p.stack = p.stack.max(b.stack.max);
            p.objects = p.objects.max(b.objects.max);
        }
        p
    }

    /// The largest live total ([`Levels::total`]).
    pub fn peak_total(&self) -> u64 {
        self.buckets.iter().map(|b| b.total.max).max().unwrap_or(0)
    }

    /// Halves the resolution: buckets merged in pairs.
    fn coarsen(&mut self) {
        let n = self.buckets.len();
        let mut out = 0;
        let mut i = 0;
        while i < n {
            let mut b = self.buckets[i];
            if i + 1 < n {
                let next = self.buckets[i + 1];
                b.then(&next);
            }
            self.buckets[out] = b;
            out += 1;
            i += 2;
        }
        self.buckets.truncate(out);
        self.shift += 1;
        let len = self.buckets.len() as u64;
        self.limit_ns = self
            .origin_ns
            .unwrap_or(0)
            .saturating_add(len << self.shift);
    }

    /// The index of the bucket of time `at` (monotonic ns), made if
    /// needed (flat at the current levels).
    #[inline]
    fn bucket(&mut self, at: u64) -> usize {
        self.end_ns = self.end_ns.max(at);
        // The last bucket is the event's, or later: an event earlier than
        // the last bucket (clocks of threads disagreeing by a little)
        // counts in the last one.
        if at < self.limit_ns {
            return self.buckets.len() - 1;
        }
        self.new_bucket(at)
    }

    /// [`bucket`](Self::bucket) past the last bucket.
    #[cold]
    fn new_bucket(&mut self, at: u64) -> usize {
        let origin = *self.origin_ns.get_or_insert(at);
        let mut index = at.saturating_sub(origin) >> self.shift;
        while index >= self.max_buckets as u64 {
            self.coarsen();
            index >>= 1;
        }
        let index = index as usize;
        if index >= self.buckets.len() {
            let flat = Bucket::flat(&self.levels);
            self.buckets.resize(index + 1, flat);
        }
        let len = self.buckets.len() as u64;
        self.limit_ns = origin.saturating_add(len << self.shift);
        self.buckets.len() - 1
    }

    /// The levels grew (of `memory` and the object count, by an
    /// allocation): bucket `i` takes them (the other kinds' ranges are
    /// unchanged: flat since the bucket was made or changed by their own
    /// events).
    #[inline]
    fn record_rise(&mut self, i: usize, memory: Memory) {
        let levels = &self.levels;
        let b = &mut self.buckets[i];
        match memory {
            Memory::Heap => b.heap.rise(levels.heap),
            Memory::Span => b.span.rise(levels.span),
            Memory::Stack => b.stack.rise(levels.stack),
        }
        b.total.rise(levels.total());
        b.objects.rise(levels.objects);
    }

    /// The levels fell (by a free).
    #[inline]
    fn record_fall(&mut self, i: usize, memory: Memory) {
        let levels = &self.levels;
        let b = &mut self.buckets[i];
        match memory {
            Memory::Heap => b.heap.fall(levels.heap),
            Memory::Span => b.span.fall(levels.span),
            Memory::Stack => b.stack.fall(levels.stack),
        }
        b.total.fall(levels.total());
        b.objects.fall(levels.objects);
    }

    /// An allocation of `size` bytes standing for `count` (1 but in a
    /// sampled trace).
    #[inline]
    fn alloc(&mut self, at: u64, memory: Memory, size: u64, count: u64) {
        let i = self.bucket(at);
        let levels = &mut self.levels;
        let bytes = levels.bytes_mut(memory);
        *bytes = bytes.saturating_add(size);
        levels.objects += count * u64::from(memory != Memory::Stack);
        let b = &mut self.buckets[i];
        b.allocs += count;
        b.alloc_bytes = b.alloc_bytes.saturating_add(size);
        self.record_rise(i, memory);
    }

    #[inline]
    fn free(&mut self, at: u64, memory: Memory, size: u64, count: u64) {
        let i = self.bucket(at);
        let levels = &mut self.levels;
        let bytes = levels.bytes_mut(memory);
        *bytes = bytes.saturating_sub(size);
        levels.objects = levels
            .objects
            .saturating_sub(count * u64::from(memory != Memory::Stack));
        self.buckets[i].frees += count;
        self.record_fall(i, memory);
    }
}

/// The live memory over time of every trace of a pass.
pub struct Timeline {
    max_buckets: usize,
    series: Vec<Series>,
    /// The current trace's `time_origin_ns`.
    origin_ns: u64,
    /// The current generation's `sample_bytes` (0: not sampled).
    sample_bytes: u64,
    sampling: crate::sampling::Sampling,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline::new(DEFAULT_BUCKETS)
    }
}

impl Timeline {
    /// Weighs the next events as a generation sampled every
    /// `sample_bytes` (0: not sampled) does: for a timeline fed by another
    /// visitor, which sees no generation.
    pub fn set_sample_bytes(&mut self, sample_bytes: u64) {
        self.sample_bytes = sample_bytes;
        self.sampling.note(sample_bytes);
    }

    /// Whether the traces were sampled: the levels are estimates.
    pub fn sampling(&self) -> crate::sampling::Sampling {
        self.sampling
    }

    /// A timeline of at most `max_buckets` buckets per series (rounded up
    /// to an even number, at least 2).
    pub fn new(max_buckets: usize) -> Timeline {
        Timeline {
            max_buckets: max_buckets.max(2).next_multiple_of(2),
            series: Vec::new(),
            origin_ns: 0,
            sample_bytes: 0,
            sampling: crate::sampling::Sampling::default(),
        }
    }

    /// One series per trace of the pass, in order.
    pub fn series(&self) -> &[Series] {
        &self.series
    }

    /// Every trace's series summed on one grid of at most the timeline's
    /// bucket bound. Traces count 0 before their first event and after
    /// their last. With several traces, a bucket's `min` and `max` are
    /// the sums of theirs (bounds: the traces' extremes need not
    /// coincide); `last` is exact.
    pub fn merged(&self) -> Series {
        let live: Vec<&Series> = self
            .series
            .iter()
            .filter(|s| s.origin_ns.is_some())
            .collect();
        match live.len() {
            0 => return Series::new(self.max_buckets),
            1 => return live[0].clone(),
            _ => {}
        }
        let origin = live.iter().filter_map(|s| s.origin_ns).min().unwrap_or(0);
        let end = live.iter().map(|s| s.end_ns).max().unwrap_or(origin);
        let mut out = Series::new(self.max_buckets);
        out.origin_ns = Some(origin);
        out.end_ns = end;
        while (end - origin) >> out.shift >= self.max_buckets as u64 {
            out.shift += 1;
        }
        let n = (((end - origin) >> out.shift) + 1) as usize;
        out.buckets = vec![Bucket::default(); n];
        for s in live {
            let mut contrib: Vec<Option<Bucket>> = vec![None; n];
            for (i, b) in s.buckets.iter().enumerate() {
                let start = s.bucket_start_ns(i).min(end);
                let stop = start
                    .saturating_add(s.width_ns() - 1)
                    .min(s.end_ns)
                    .max(start);
                let first = ((start - origin) >> out.shift) as usize;
                let last = ((stop - origin) >> out.shift) as usize;
                for (j, c) in contrib.iter_mut().enumerate().take(last + 1).skip(first) {
                    match c {
                        Some(c) => c.then(b),
                        None => {
                            let mut b = *b;
                            // Counts go to the bucket the series' bucket
                            // starts in.
                            if j != first {
                                b.allocs = 0;
                                b.frees = 0;
                                b.alloc_bytes = 0;
                            }
                            *c = Some(b)
                        }
                    }
                }
            }
            for (o, c) in out.buckets.iter_mut().zip(&contrib) {
                if let Some(c) = c {
                    o.add(c);
                }
            }
            let l = &mut out.levels;
            l.heap += s.levels.heap;
            l.span += s.levels.span;
            l.stack += s.levels.stack;
            l.objects += s.levels.objects;
        }
        out
    }

    #[inline]
    fn current(&mut self) -> &mut Series {
        if self.series.is_empty() {
            self.series.push(Series::new(self.max_buckets));
        }
        self.series.last_mut().expect("a series")
    }
}

impl Visitor for Timeline {
    fn trace_start(&mut self, _index: usize) {
        self.series.push(Series::new(self.max_buckets));
        self.origin_ns = 0;
    }

    fn generation(&mut self, reader: &GenerationView, _stacks: &StackTable) {
        self.origin_ns = reader.time_origin_ns().unwrap_or(0);
        self.set_sample_bytes(reader.info().map_or(0, |i| i.sample_bytes));
    }

    #[inline]
    fn alloc(&mut self, alloc: &Alloc) {
        let at = self.origin_ns.saturating_add(alloc.time_ns);
        // A sampled trace: estimated counts and bytes (crate::sampling).
        let est = crate::sampling::estimate(alloc, self.sample_bytes);
        self.current().alloc(at, alloc.memory, est.bytes, est.count);
    }

    #[inline]
    fn free(&mut self, alloc: &Alloc, free: &Free) {
        let at = self.origin_ns.saturating_add(free.time_ns);
        let est = crate::sampling::estimate(alloc, self.sample_bytes);
        self.current().free(at, alloc.memory, est.bytes, est.count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(time_ns: u64, addr: u64, size: u64, memory: Memory) -> Alloc {
        Alloc {
            memory,
            ..crate::testing::alloc(time_ns, addr, size, 0)
        }
    }

    fn free(time_ns: u64) -> Free {
        crate::testing::free(time_ns, 1)
    }

    #[test]
    fn a_spike_shorter_than_a_bucket_survives_downsampling() {
        let mut t = Timeline::new(10);
        t.trace_start(0);
        // A steady 100-byte object, a 1 MB spike of 1 ns at t=500_000, then
        // small allocations until t=1_000_000.
        let base = alloc(0, 1, 100, Memory::Heap);
        t.alloc(&base);
        for i in 1..1000u64 {
            let a = alloc(i * 1000, 100 + i, 10, Memory::Heap);
            t.alloc(&a);
            t.free(&a, &free(i * 1000 + 1));
            if i == 500 {
                let spike = alloc(i * 1000 + 2, 7, 1 << 20, Memory::Span);
                t.alloc(&spike);
                t.free(&spike, &free(i * 1000 + 3));
            }
        }
        let s = &t.series()[0];
        assert!(s.buckets.len() <= 10, "{} buckets", s.buckets.len());
        assert!(s.buckets.len() >= 5);
        assert_eq!(s.peak_total(), 100 + (1 << 20));
        assert_eq!(s.peaks().span, 1 << 20);
        assert_eq!(s.peaks().heap, 110);
        let spiky: Vec<usize> = (0..s.buckets.len())
            .filter(|&i| s.buckets[i].span.max > 0)
            .collect();
        assert_eq!(spiky.len(), 1);
        let i = spiky[0];
        let start = s.bucket_start_ns(i);
        assert!(start <= 500_002 && 500_002 < start + s.width_ns());
        // Every bucket ends at the steady level.
        assert!(s.buckets.iter().all(|b| b.total.last == 100));
        // The first bucket starts before the first allocation.
        assert_eq!(s.buckets[0].total.min, 0);
        assert!(s.buckets[1..].iter().all(|b| b.total.min == 100));
        assert_eq!(s.buckets.iter().map(|b| b.allocs).sum::<u64>(), 1001);
        assert_eq!(s.buckets.iter().map(|b| b.frees).sum::<u64>(), 1000);
        assert_eq!(s.levels.heap, 100);
        assert_eq!(s.levels.objects, 1);
    }

    #[test]
    fn the_bucket_count_stays_bounded_on_long_traces() {
        let mut t = Timeline::new(2000);
        t.trace_start(0);
        let mut time = 0u64;
        for i in 0..200_000u64 {
            time += 1 + i % 7919;
            let a = alloc(time, i, 16, Memory::Heap);
            t.alloc(&a);
        }
        let s = &t.series()[0];
        assert!(s.buckets.len() <= 2000);
        assert!(s.buckets.len() > 1000, "{}", s.buckets.len());
        // Live bytes only grow: each bucket's last is its max, and they
        // never decrease.
        let lasts: Vec<u64> = s.buckets.iter().map(|b| b.heap.last).collect();
        assert!(lasts.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*lasts.last().unwrap(), 200_000 * 16);
        assert_eq!(s.buckets.iter().map(|b| b.allocs).sum::<u64>(), 200_000);
    }

    #[test]
    fn gaps_are_flat_at_the_level_before() {
        let mut t = Timeline::new(100);
        t.trace_start(0);
        let a = alloc(0, 1, 64, Memory::Heap);
        t.alloc(&a);
        let b = alloc(99, 2, 32, Memory::Stack);
        t.alloc(&b);
        let s = &t.series()[0];
        assert_eq!(s.buckets.len(), 100);
        for b in &s.buckets[1..99] {
            assert_eq!(b.heap, Range::flat(64));
            assert_eq!(b.total, Range::flat(64));
            assert_eq!(b.allocs, 0);
        }
        // Stacks are beside the total.
        assert_eq!(s.buckets[99].total, Range::flat(64));
        assert_eq!(s.buckets[99].objects, Range::flat(1));
        assert_eq!(s.buckets[99].stack.last, 32);
    }

    #[test]
    fn traces_merge_on_one_grid_and_count_zero_outside_their_span() {
        let mut t = Timeline::new(100);
        t.trace_start(0);
        t.alloc(&alloc(0, 1, 10, Memory::Heap));
        t.alloc(&alloc(999, 2, 10, Memory::Heap));
        t.trace_start(1);
        t.alloc(&alloc(500, 1, 1000, Memory::Span));
        t.alloc(&alloc(1999, 2, 1000, Memory::Span));
        let m = t.merged();
        assert!(m.buckets.len() <= 100);
        assert_eq!(m.origin_ns, Some(0));
        assert_eq!(m.end_ns, 1999);
        assert_eq!(m.buckets[0].total.last, 10);
        assert_eq!(m.buckets.last().unwrap().total.last, 2000);
        // Trace 0 ended at 999 (10 bytes until then), trace 1 at 1999.
        assert_eq!(m.peak_total(), 2000);
        let mid = (750 >> (m.width_ns().trailing_zeros())) as usize;
        assert_eq!(m.buckets[mid].total.last, 1010);
        assert_eq!(m.buckets.iter().map(|b| b.allocs).sum::<u64>(), 4);
        assert_eq!(m.levels.total(), 2020);
    }

    #[test]
    fn buckets_agree_with_the_levels_recomputed_event_by_event() {
        // Random allocations and frees of heap objects and spans; each
        // bucket's min, max and last must be those of the total after
        // every event in it (and of the level it started from).
        let mut t = Timeline::new(64);
        t.trace_start(0);
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut live: Vec<Alloc> = Vec::new();
        let mut time = 0u64;
        let mut total = 0u64;
        // (time, total after the event)
        let mut history = vec![];
        for i in 0..5000u64 {
            time += next() % 1000;
            if live.is_empty() || next() % 3 != 0 {
                let memory = if next() % 4 == 0 {
                    Memory::Span
                } else {
                    Memory::Heap
                };
                let a = alloc(time, i, 1 + next() % 5000, memory);
                t.alloc(&a);
                total += a.size;
                live.push(a);
            } else {
                let k = (next() % live.len() as u64) as usize;
                let a = live.swap_remove(k);
                t.free(&a, &free(time));
                total -= a.size;
            }
            history.push((time, total));
        }
        let s = &t.series()[0];
        assert!(s.buckets.len() <= 64);
        let mut before = 0u64;
        let mut h = history.iter().peekable();
        for (i, b) in s.buckets.iter().enumerate() {
            let end = s.bucket_start_ns(i) + s.width_ns();
            let (mut lo, mut hi, mut last) = (before, before, before);
            while let Some(&&(at, v)) = h.peek() {
                if at >= end {
                    break;
                }
                lo = lo.min(v);
                hi = hi.max(v);
                last = v;
                h.next();
            }
            assert_eq!(
                (b.total.min, b.total.max, b.total.last),
                (lo, hi, last),
                "bucket {i}"
            );
            before = last;
        }
        assert_eq!(s.levels.total(), total);
    }
}
