//! Allocation sites: what each call stack allocated, leaked, held at the
//! program's peak and freed at once, in one pass.
//!
//! [`Profile`] is a [`Visitor`] that keeps, per [`StackId`], a [`Site`]
//! (and, when asked, the same per thread, per type and per size), the
//! moment of the peak ([`Peak`]) and the totals. `top`, `leaks`,
//! `flamegraph` and `diff` read it.
//!
//! ## Definitions
//! - The peak is the moment the total of live bytes (heap objects and
//!   spans) is highest; the first such moment when it is reached twice.
//!   A site's `peak_bytes` and `peak_objects` are its live heap-object and
//!   span bytes and objects at that moment. Stacks (threads' stacks under
//!   the shim: mostly untouched reservations of 8 MiB; a runtime's stacks,
//!   which live in its spans) are not part of it: [`Peak::stack_bytes`]
//!   says how much stack was live then.
//! - A temporary allocation is freed right after it was made: no other
//!   allocation and no other free between its alloc and its free, in the
//!   trace's global event order (heaptrack's count: its "last allocation"
//!   is forgotten at every free). An allocation ended by a new allocation
//!   at its address (a missed free) is never temporary.
//! - Leaked: allocated in the trace and live at the end of its trace, of
//!   any kind of memory (heap objects, spans, stacks).
//! - Memory the trace learnt of through exists events (live before
//!   tracing started, such as the main thread's stack) is live (it counts
//!   at the peak) but neither allocated (`allocations`, `bytes`) nor
//!   leaked.
//! - Several traces (processes) in one pass: every count is summed over
//!   the traces; each trace has its own peak, and a site's `peak_bytes` is
//!   the sum over the traces of its live bytes at its trace's peak
//!   ([`Profile::peaks`] lists each trace's, [`Profile::peak`] sums them).
//! - A sampled trace (format version 6): every count and byte is an
//!   estimate, each recorded heap-object allocation weighing what it stands
//!   for ([`crate::sampling`]); [`Profile::sampling`] says so.
//!
//! ## Cost
//! The peak composition is found in the one pass, in O(1) amortized per
//! event and O(keys) memory: each key keeps its live bytes and a snapshot
//! valid at the last peak; keys changed since the last peak are listed,
//! and copied into their snapshot when a new peak is reached (each change
//! is listed once, so the copying is bounded by the events).

use crate::pass::GenerationView;
use rustc_hash::FxHashMap;

use crate::pass::{Alloc, Free, Live, Memory, Visitor};
use crate::sampling::{estimate, Estimate, Sampling};
use crate::stacks::{StackId, StackTable};

/// What one site (a stack, thread, type or size) did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Site {
    pub allocations: u64,
    pub bytes: u64,
    /// Live bytes and objects at the peak (summed over traces).
    pub peak_bytes: u64,
    pub peak_objects: u64,
    pub leaked_objects: u64,
    pub leaked_bytes: u64,
    pub temporary: u64,
}

impl Site {
    /// Adds `other`'s counts to this one.
    pub fn add(&mut self, other: &Site) {
        self.allocations += other.allocations;
        self.bytes += other.bytes;
        self.peak_bytes += other.peak_bytes;
        self.peak_objects += other.peak_objects;
        self.leaked_objects += other.leaked_objects;
        self.leaked_bytes += other.leaked_bytes;
        self.temporary += other.temporary;
    }

    /// Whether every count is 0.
    pub fn is_empty(&self) -> bool {
        *self == Site::default()
    }
}

/// The moment of a trace's peak of live memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peak {
    /// When it was reached (the trace's clock); 0 if nothing was live.
    pub time_ns: u64,
    pub heap_bytes: u64,
    pub span_bytes: u64,
    pub stack_bytes: u64,
    /// heap + span bytes (stacks are not counted).
    pub total_bytes: u64,
    /// Live heap objects and spans.
    pub objects: u64,
}

/// The breakdowns [`Profile`] keeps beside the per-stack one (each costs a
/// hash lookup per event).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Breakdowns {
    pub threads: bool,
    pub types: bool,
    pub sizes: bool,
}

/// One key's counts and its peak bookkeeping for the current trace.
#[derive(Clone, Copy, Default)]
struct Entry {
    site: Site,
    live_bytes: u64,
    live_objects: u64,
    /// Live bytes and objects at the current trace's last peak; valid
    /// unless `touched` (then `live` changed since, and the snapshot still
    /// holds the peak's values).
    snap_bytes: u64,
    snap_objects: u64,
    touched: bool,
}

/// Whether an allocation is part of the live total the peak is taken on
/// (heap objects and spans, not stacks).
#[inline]
fn counts_at_peak(alloc: &Alloc) -> bool {
    alloc.memory != Memory::Stack
}

/// Counts per dense key index, with the peak snapshot.
#[derive(Default)]
struct Tally {
    entries: Vec<Entry>,
    /// Indexes whose live counts changed since the last peak.
    touched: Vec<u32>,
}

impl Tally {
    #[inline]
    fn entry(&mut self, index: u32) -> &mut Entry {
        let i = index as usize;
        if i >= self.entries.len() {
            self.entries.resize(i + 1, Entry::default());
        }
        let e = &mut self.entries[i];
        if !e.touched {
            e.touched = true;
            self.touched.push(index);
        }
        e
    }

    #[inline]
    fn alloc(&mut self, index: u32, alloc: &Alloc, est: Estimate) {
        let e = self.entry(index);
        if !alloc.existed {
            e.site.allocations += est.count;
            e.site.bytes += est.bytes;
        }
        if counts_at_peak(alloc) {
            e.live_bytes += est.bytes;
            e.live_objects += est.count;
        }
    }

    #[inline]
    fn free(&mut self, index: u32, alloc: &Alloc, temporary: bool, est: Estimate) {
        let e = self.entry(index);
        if counts_at_peak(alloc) {
            e.live_bytes = e.live_bytes.saturating_sub(est.bytes);
            e.live_objects = e.live_objects.saturating_sub(est.count);
        }
        if temporary {
            e.site.temporary += est.count;
        }
    }

    /// A new peak: the live counts of every touched key become its
    /// snapshot.
    fn commit_peak(&mut self) {
        for &i in &self.touched {
            let e = &mut self.entries[i as usize];
            e.snap_bytes = e.live_bytes;
            e.snap_objects = e.live_objects;
            e.touched = false;
        }
        self.touched.clear();
    }

    fn leak(&mut self, index: u32, est: Estimate) {
        let i = index as usize;
        if i >= self.entries.len() {
            self.entries.resize(i + 1, Entry::default());
        }
        let e = &mut self.entries[i];
        e.site.leaked_objects += est.count;
        e.site.leaked_bytes += est.bytes;
    }

    /// The trace ended: its peak snapshot goes into the sites, and the
    /// live state is reset for the next trace.
    fn end_trace(&mut self) {
        for e in &mut self.entries {
            e.site.peak_bytes += e.snap_bytes;
            e.site.peak_objects += e.snap_objects;
            e.live_bytes = 0;
            e.live_objects = 0;
            e.snap_bytes = 0;
            e.snap_objects = 0;
            e.touched = false;
        }
        self.touched.clear();
    }

    fn sites(&self) -> impl Iterator<Item = (u32, &Site)> + '_ {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| !e.site.is_empty())
            .map(|(i, e)| (i as u32, &e.site))
    }
}

/// A map from sparse keys (thread IDs, sizes, type names) to dense indexes.
#[derive(Default)]
struct Keys<K> {
    index: FxHashMap<K, u32>,
    keys: Vec<K>,
    /// Number keys: the index of each key below [`SMALL_KEYS`] plus one
    /// (0: not seen yet), and the last key looked up (events come in runs
    /// of one thread).
    small: Vec<u32>,
    last: Option<(u64, u32)>,
}

/// Number keys below this (sizes, mostly) skip the hash map.
const SMALL_KEYS: u64 = 4096;

impl Keys<u64> {
    #[inline]
    fn get_number(&mut self, key: u64) -> u32 {
        if key < SMALL_KEYS {
            if let Some(&i) = self.small.get(key as usize) {
                if i != 0 {
                    return i - 1;
                }
            }
            let i = self.get(&key);
            if self.small.len() <= key as usize {
                self.small.resize(key as usize + 1, 0);
            }
            self.small[key as usize] = i + 1;
            return i;
        }
        if let Some((k, i)) = self.last {
            if k == key {
                return i;
            }
        }
        let i = self.get(&key);
        self.last = Some((key, i));
        i
    }
}

impl<K: std::hash::Hash + Eq + Clone> Keys<K> {
    #[inline]
    fn get(&mut self, key: &K) -> u32 {
        if let Some(&i) = self.index.get(key) {
            return i;
        }
        let i = self.keys.len() as u32;
        self.keys.push(key.clone());
        self.index.insert(key.clone(), i);
        i
    }
}

/// A per-key breakdown: the keys and their tally.
#[derive(Default)]
struct Breakdown<K> {
    keys: Keys<K>,
    tally: Tally,
}

impl<K: std::hash::Hash + Eq + Clone> Breakdown<K> {
    fn sites(&self) -> Vec<(K, Site)> {
        self.tally
            .sites()
            .map(|(i, s)| (self.keys.keys[i as usize].clone(), *s))
            .collect()
    }
}

/// Per-site counts of a pass; see the module's documentation.
#[derive(Default)]
pub struct Profile {
    sites: Tally,
    threads: Option<Breakdown<u64>>,
    sizes: Option<Breakdown<u64>>,
    /// Keyed by type name (type IDs are per trace).
    types: Option<Breakdown<String>>,
    /// The current trace's type IDs as indexes of `types`.
    type_ids: FxHashMap<u64, u32>,
    /// The last type ID looked up and its index (allocations come in runs
    /// of one type, or of none: 0 for every shim trace).
    last_type: Option<(u64, u32)>,
    /// Live bytes per [`Memory`] now, and the current trace's peak.
    live_bytes: [u64; 3],
    live_objects: u64,
    peak: Peak,
    peaks: Vec<Peak>,
    total: Site,
    /// The last allocation of the current trace, (memory, address), while
    /// no other allocation or free followed it.
    last_alloc: Option<(Memory, u64)>,
    /// The current generation's `sample_bytes` (0: not sampled).
    sample_bytes: u64,
    sampling: Sampling,
}

/// The key of allocations without a type (`--by type`).
pub const NO_TYPE: &str = "(no type)";

impl Profile {
    /// A profile per stack, plus the breakdowns asked for.
    pub fn new(breakdowns: Breakdowns) -> Profile {
        Profile {
            threads: breakdowns.threads.then(Breakdown::default),
            sizes: breakdowns.sizes.then(Breakdown::default),
            types: breakdowns.types.then(Breakdown::default),
            ..Profile::default()
        }
    }

    /// Every stack with a non-zero count, and its site (in StackId order;
    /// 0 is the allocations without a stack).
    pub fn sites(&self) -> impl Iterator<Item = (StackId, &Site)> + '_ {
        self.sites.sites()
    }

    /// The site of one stack (all zero if it allocated nothing).
    pub fn site(&self, stack: StackId) -> Site {
        self.sites
            .entries
            .get(stack as usize)
            .map_or_else(Site::default, |e| e.site)
    }

    /// Per allocating thread (the thread that made the allocation), if
    /// asked for.
    pub fn by_thread(&self) -> Option<Vec<(u64, Site)>> {
        self.threads.as_ref().map(Breakdown::sites)
    }

    /// Per allocation size in bytes, if asked for.
    pub fn by_size(&self) -> Option<Vec<(u64, Site)>> {
        self.sizes.as_ref().map(Breakdown::sites)
    }

    /// Per type name ([`NO_TYPE`] for allocations without one; `type N`
    /// for an ID the trace never defined), if asked for.
    pub fn by_type(&self) -> Option<Vec<(String, Site)>> {
        self.types.as_ref().map(Breakdown::sites)
    }

    /// Each trace's peak, in pass order.
    pub fn peaks(&self) -> &[Peak] {
        &self.peaks
    }

    /// The peaks of every trace summed (time: the first trace's).
    pub fn peak(&self) -> Peak {
        let mut sum = Peak::default();
        for (i, p) in self.peaks.iter().enumerate() {
            if i == 0 {
                sum.time_ns = p.time_ns;
            }
            sum.heap_bytes += p.heap_bytes;
            sum.span_bytes += p.span_bytes;
            sum.stack_bytes += p.stack_bytes;
            sum.total_bytes += p.total_bytes;
            sum.objects += p.objects;
        }
        sum
    }

    /// Every site summed.
    pub fn total(&self) -> Site {
        self.total
    }

    /// Whether the traces were sampled, so that every number is an
    /// estimate.
    pub fn sampling(&self) -> Sampling {
        self.sampling
    }

    #[inline]
    fn type_index(&mut self, type_id: u64) -> u32 {
        if let Some((id, i)) = self.last_type {
            if id == type_id {
                return i;
            }
        }
        let i = self.type_index_lookup(type_id);
        self.last_type = Some((type_id, i));
        i
    }

    fn type_index_lookup(&mut self, type_id: u64) -> u32 {
        if let Some(&i) = self.type_ids.get(&type_id) {
            return i;
        }
        let name = if type_id == 0 {
            NO_TYPE.to_string()
        } else {
            format!("type {type_id}")
        };
        let types = self.types.as_mut().expect("types breakdown");
        let i = types.keys.get(&name);
        self.type_ids.insert(type_id, i);
        i
    }

    /// Live heap-object and span bytes now.
    #[inline]
    fn peak_total(&self) -> u64 {
        self.live_bytes[Memory::Heap as usize] + self.live_bytes[Memory::Span as usize]
    }

    fn commit_peak(&mut self, time_ns: u64) {
        self.peak = Peak {
            time_ns,
            heap_bytes: self.live_bytes[Memory::Heap as usize],
            span_bytes: self.live_bytes[Memory::Span as usize],
            stack_bytes: self.live_bytes[Memory::Stack as usize],
            total_bytes: self.peak_total(),
            objects: self.live_objects,
        };
        self.sites.commit_peak();
        for b in [self.threads.as_mut(), self.sizes.as_mut()]
            .into_iter()
            .flatten()
        {
            b.tally.commit_peak();
        }
        if let Some(b) = self.types.as_mut() {
            b.tally.commit_peak();
        }
    }
}

impl Visitor for Profile {
    fn trace_start(&mut self, _index: usize) {
        self.live_bytes = [0; 3];
        self.live_objects = 0;
        self.peak = Peak::default();
        self.last_alloc = None;
        self.type_ids.clear();
        self.last_type = None;
    }

    fn generation(&mut self, reader: &GenerationView, stacks: &StackTable) {
        if self.sites.entries.len() < stacks.len() {
            self.sites.entries.resize(stacks.len(), Entry::default());
        }
        self.last_type = None;
        self.sample_bytes = reader.info().map_or(0, |i| i.sample_bytes);
        self.sampling.note(self.sample_bytes);
        if let Some(types) = self.types.as_mut() {
            for (&id, info) in reader.types() {
                let i = types.keys.get(&info.name);
                self.type_ids.insert(id, i);
            }
        }
    }

    #[inline]
    fn alloc(&mut self, alloc: &Alloc) {
        let est = estimate(alloc, self.sample_bytes);
        self.sites.alloc(alloc.stack, alloc, est);
        if let Some(b) = self.threads.as_mut() {
            let i = b.keys.get_number(alloc.thread);
            b.tally.alloc(i, alloc, est);
        }
        if let Some(b) = self.sizes.as_mut() {
            let i = b.keys.get_number(alloc.size);
            b.tally.alloc(i, alloc, est);
        }
        if self.types.is_some() {
            let i = self.type_index(alloc.type_id);
            self.types.as_mut().unwrap().tally.alloc(i, alloc, est);
        }
        if !alloc.existed {
            self.total.allocations += est.count;
            self.total.bytes += est.bytes;
        }
        self.live_bytes[alloc.memory as usize] += est.bytes;
        if counts_at_peak(alloc) {
            self.live_objects += est.count;
        }
        self.last_alloc = Some((alloc.memory, alloc.addr));
        if self.peak_total() > self.peak.total_bytes {
            self.commit_peak(alloc.time_ns);
        }
    }

    #[inline]
    fn free(&mut self, alloc: &Alloc, free: &Free) {
        let temporary =
            !free.implicit && !alloc.existed && self.last_alloc == Some((alloc.memory, alloc.addr));
        // Any free ends the chance of the last allocation being temporary.
        self.last_alloc = None;
        let est = estimate(alloc, self.sample_bytes);
        if temporary {
            self.total.temporary += est.count;
        }
        self.sites.free(alloc.stack, alloc, temporary, est);
        if let Some(b) = self.threads.as_mut() {
            let i = b.keys.get_number(alloc.thread);
            b.tally.free(i, alloc, temporary, est);
        }
        if let Some(b) = self.sizes.as_mut() {
            let i = b.keys.get_number(alloc.size);
            b.tally.free(i, alloc, temporary, est);
        }
        if self.types.is_some() {
            let i = self.type_index(alloc.type_id);
            self.types
                .as_mut()
                .unwrap()
                .tally
                .free(i, alloc, temporary, est);
        }
        let m = alloc.memory as usize;
        self.live_bytes[m] = self.live_bytes[m].saturating_sub(est.bytes);
        if counts_at_peak(alloc) {
            self.live_objects = self.live_objects.saturating_sub(est.count);
        }
    }

    fn trace_end(&mut self, live: &Live) {
        self.end_trace(live.iter());
    }
}

impl Profile {
    /// The trace ended with `live` never freed.
    fn end_trace<'a>(&mut self, live: impl Iterator<Item = &'a Alloc>) {
        for alloc in live.filter(|a| !a.existed) {
            let est = estimate(alloc, self.sample_bytes);
            self.sites.leak(alloc.stack, est);
            self.total.leaked_objects += est.count;
            self.total.leaked_bytes += est.bytes;
            if let Some(b) = self.threads.as_mut() {
                let i = b.keys.get_number(alloc.thread);
                b.tally.leak(i, est);
            }
            if let Some(b) = self.sizes.as_mut() {
                let i = b.keys.get_number(alloc.size);
                b.tally.leak(i, est);
            }
            if self.types.is_some() {
                let i = self.type_index(alloc.type_id);
                self.types.as_mut().unwrap().tally.leak(i, est);
            }
        }
        self.sites.end_trace();
        for b in [self.threads.as_mut(), self.sizes.as_mut()]
            .into_iter()
            .flatten()
        {
            b.tally.end_trace();
        }
        if let Some(b) = self.types.as_mut() {
            b.tally.end_trace();
        }
        self.total.peak_bytes += self.peak.total_bytes;
        self.total.peak_objects += self.peak.objects;
        self.peaks.push(self.peak);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::alloc;

    fn free(time_ns: u64) -> Free {
        crate::testing::free(time_ns, 1)
    }

    /// Feeds a trace's allocations and frees, then its end with what
    /// remains live.
    struct Feed {
        profile: Profile,
        live: Vec<Alloc>,
    }

    impl Feed {
        fn new(breakdowns: Breakdowns) -> Feed {
            let mut profile = Profile::new(breakdowns);
            profile.trace_start(0);
            Feed {
                profile,
                live: Vec::new(),
            }
        }
        fn alloc(&mut self, a: Alloc) {
            self.live.push(a);
            self.profile.alloc(&a);
        }
        fn free(&mut self, addr: u64, time_ns: u64) {
            let i = self.live.iter().position(|a| a.addr == addr).unwrap();
            let a = self.live.remove(i);
            self.profile.free(&a, &free(time_ns));
        }
        fn end(&mut self) {
            let live = std::mem::take(&mut self.live);
            self.profile.end_trace(live.iter());
        }
    }

    #[test]
    fn peak_composition_is_the_sites_live_bytes_at_the_highest_total() {
        let mut f = Feed::new(Breakdowns::default());
        // Site 1 rises to 300, site 2 to 50: peak 350 at t=4.
        f.alloc(alloc(1, 0x10, 100, 1));
        f.alloc(alloc(2, 0x20, 200, 1));
        f.alloc(alloc(3, 0x30, 10, 3));
        f.free(0x30, 3);
        f.alloc(alloc(4, 0x40, 50, 2));
        // Then site 1 drops and site 2 grows, but the total stays below.
        f.free(0x20, 5);
        f.alloc(alloc(6, 0x50, 120, 2));
        f.alloc(alloc(7, 0x60, 30, 3));
        f.end();
        let p = &f.profile;
        assert_eq!(p.site(1).peak_bytes, 300);
        assert_eq!(p.site(1).peak_objects, 2);
        assert_eq!(p.site(2).peak_bytes, 50);
        assert_eq!(p.site(3).peak_bytes, 0);
        assert_eq!(p.peak().total_bytes, 350);
        assert_eq!(p.peak().time_ns, 4);
        assert_eq!(p.peak().objects, 3);
        // Leaks: 0x10 (site 1), 0x40 and 0x50 (site 2), 0x60 (site 3).
        assert_eq!(p.site(1).leaked_bytes, 100);
        assert_eq!(p.site(2).leaked_objects, 2);
        assert_eq!(p.site(2).leaked_bytes, 170);
        assert_eq!(p.site(3).leaked_bytes, 30);
        assert_eq!(p.site(1).allocations, 2);
        assert_eq!(p.site(1).bytes, 300);
        assert_eq!(p.total().allocations, 6);
        assert_eq!(p.total().leaked_bytes, 300);
    }

    #[test]
    fn a_later_higher_peak_replaces_the_snapshot() {
        let mut f = Feed::new(Breakdowns::default());
        f.alloc(alloc(1, 0x10, 100, 1));
        f.free(0x10, 2);
        f.alloc(alloc(3, 0x20, 60, 2));
        f.alloc(alloc(4, 0x30, 60, 2));
        f.end();
        assert_eq!(f.profile.site(1).peak_bytes, 0);
        assert_eq!(f.profile.site(2).peak_bytes, 120);
        assert_eq!(f.profile.peak().time_ns, 4);
    }

    #[test]
    fn temporaries_are_freed_with_nothing_between() {
        let mut f = Feed::new(Breakdowns::default());
        f.alloc(alloc(1, 0x10, 8, 1));
        f.free(0x10, 2); // temporary
        f.alloc(alloc(3, 0x10, 8, 1));
        f.alloc(alloc(4, 0x20, 8, 2));
        f.free(0x10, 5); // not: an allocation between
        f.free(0x20, 6); // not: a free between
        f.alloc(alloc(7, 0x30, 8, 2));
        f.free(0x30, 8); // temporary
        f.alloc(alloc(9, 0x40, 8, 2));
        f.end();
        assert_eq!(f.profile.site(1).temporary, 1);
        assert_eq!(f.profile.site(2).temporary, 1);
        assert_eq!(f.profile.total().temporary, 2);
        assert_eq!(f.profile.site(2).leaked_objects, 1);
    }

    #[test]
    fn memory_live_before_tracing_is_neither_allocated_nor_leaked() {
        let mut f = Feed::new(Breakdowns::default());
        let mut stack = alloc(1, 0x1000, 8 << 20, 0);
        stack.memory = Memory::Stack;
        stack.existed = true;
        f.alloc(stack);
        f.alloc(alloc(2, 0x10, 8, 1));
        f.end();
        let p = &f.profile;
        assert_eq!(p.total().allocations, 1);
        assert_eq!(p.total().leaked_bytes, 8);
        assert_eq!(p.site(0).leaked_objects, 0);
        // Stacks are not part of the peak; how much was live is noted.
        assert_eq!(p.site(0).peak_bytes, 0);
        assert_eq!(p.peak().total_bytes, 8);
        assert_eq!(p.peak().stack_bytes, 8 << 20);
    }

    #[test]
    fn a_replaced_allocation_is_not_temporary() {
        let mut p = Profile::new(Breakdowns::default());
        p.trace_start(0);
        let a = alloc(1, 0x10, 8, 1);
        p.alloc(&a);
        let mut f = free(2);
        f.implicit = true;
        p.free(&a, &f);
        assert_eq!(p.site(1).temporary, 0);
    }

    #[test]
    fn several_traces_sum_their_own_peaks() {
        let mut f = Feed::new(Breakdowns::default());
        f.alloc(alloc(1, 0x10, 100, 1));
        f.free(0x10, 2);
        f.alloc(alloc(3, 0x20, 10, 2));
        f.end();
        // The second trace's peak is site 2's.
        f.profile.trace_start(1);
        f.alloc(alloc(1, 0x10, 40, 1));
        f.alloc(alloc(2, 0x20, 500, 2));
        f.end();
        let p = &f.profile;
        assert_eq!(p.peaks().len(), 2);
        assert_eq!(p.peaks()[0].total_bytes, 100);
        assert_eq!(p.peaks()[1].total_bytes, 540);
        assert_eq!(p.site(1).peak_bytes, 100 + 40);
        assert_eq!(p.site(2).peak_bytes, 500);
        assert_eq!(p.peak().total_bytes, 640);
        assert_eq!(p.site(2).leaked_bytes, 10 + 500);
    }

    #[test]
    fn spans_count_towards_the_peak() {
        let mut f = Feed::new(Breakdowns::default());
        f.alloc(alloc(1, 0x10, 100, 1));
        let mut span = alloc(2, 0x10, 4096, 2);
        span.memory = Memory::Span;
        f.alloc(span);
        f.free(0x10, 3); // the heap object (first in the list)
        f.end();
        let peak = f.profile.peak();
        assert_eq!(peak.heap_bytes, 100);
        assert_eq!(peak.span_bytes, 4096);
        assert_eq!(peak.total_bytes, 4196);
        assert_eq!(f.profile.site(2).peak_bytes, 4096);
    }

    #[test]
    fn number_keys_get_one_index_each_small_or_large() {
        let mut keys = Keys::<u64>::default();
        let seq = [
            5,
            1 << 40,
            5,
            70_000,
            1 << 40,
            1 << 40,
            0,
            4095,
            4096,
            70_000,
        ];
        let got: Vec<u32> = seq.iter().map(|&k| keys.get_number(k)).collect();
        assert_eq!(got, [0, 1, 0, 2, 1, 1, 3, 4, 5, 2]);
        assert_eq!(keys.keys, [5, 1 << 40, 70_000, 0, 4095, 4096]);
    }

    #[test]
    fn breakdowns_by_thread_size_and_type() {
        let mut f = Feed::new(Breakdowns {
            threads: true,
            types: true,
            sizes: true,
        });
        let mut a = alloc(1, 0x10, 16, 1);
        a.thread = 7;
        a.type_id = 3;
        f.alloc(a);
        f.alloc(alloc(2, 0x20, 16, 1));
        f.alloc(alloc(3, 0x30, 32, 1));
        f.free(0x30, 4);
        f.end();
        let p = &f.profile;
        let mut threads = p.by_thread().unwrap();
        threads.sort_by_key(|t| t.0);
        assert_eq!(threads.len(), 2);
        assert_eq!(threads[0].0, 1);
        assert_eq!(threads[0].1.allocations, 2);
        assert_eq!(threads[0].1.temporary, 1);
        assert_eq!(threads[1].1.leaked_bytes, 16);
        let mut sizes = p.by_size().unwrap();
        sizes.sort_by_key(|t| t.0);
        assert_eq!(sizes[0], (16, sizes[0].1));
        assert_eq!(sizes[0].1.peak_bytes, 32);
        assert_eq!(sizes[1].1.peak_bytes, 32);
        assert_eq!(sizes[1].1.leaked_objects, 0);
        let types = p.by_type().unwrap();
        let named: Vec<&str> = types.iter().map(|t| t.0.as_str()).collect();
        assert!(named.contains(&"type 3"));
        assert!(named.contains(&NO_TYPE));
        let untyped = types.iter().find(|t| t.0 == NO_TYPE).unwrap();
        assert_eq!(untyped.1.allocations, 2);
    }
}
