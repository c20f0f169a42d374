//! The counting of `alloctrace stats`: per event, the counts and the live
//! maps. The counting thread's [`Tally`] counts every event but the page
//! events; the reading thread's [`Reading`] counts what needs the reader
//! (type tables) and the page events, and turns the other events into
//! [`Op`]s for the tally. Neither knows about threads (see pipeline.rs).

use std::collections::{BTreeMap, BTreeSet};
use std::hash::BuildHasher as _;

use alloctrace_format::{ENTRY_POINTS, EVENT_KINDS};
use alloctrace_reader::{Clock, Event, EventData, PAGE_EVENT_NAMES};
use hashbrown::hash_table::{Entry, HashTable};
use rustc_hash::{FxBuildHasher, FxHashMap};

use super::Stats;
use crate::input::Reader;

/// Live map of one address space (heap objects, spans or stacks): address
/// to the size recorded at allocation. FxHash: one lookup per event, and
/// the keys are addresses from the trace, not from an adversary that
/// could hurt more than this one run.
///
/// A `hashbrown::HashTable` rather than a `HashMap`, for its entry API: an
/// allocation finds the address or the slot it goes in with one probe,
/// and a free finds and removes its entry with one. (On the counting
/// thread, a few newest allocations kept out of the map, so that a free
/// soon after finds them without a lookup, cost more than they saved.)
#[derive(Default)]
pub(super) struct Live {
    map: HashTable<(u64, u64)>,
}

#[inline(always)]
fn addr_hash(addr: u64) -> u64 {
    FxBuildHasher.hash_one(addr)
}

impl Live {
    /// Returns the size it replaces when the address was already live.
    #[inline]
    fn alloc(&mut self, addr: u64, size: u64) -> Option<u64> {
        let hash = addr_hash(addr);
        match self
            .map
            .entry(hash, |&(a, _)| a == addr, |&(a, _)| addr_hash(a))
        {
            Entry::Occupied(mut live) => Some(std::mem::replace(&mut live.get_mut().1, size)),
            Entry::Vacant(slot) => {
                slot.insert((addr, size));
                None
            }
        }
    }

    #[inline]
    fn free(&mut self, addr: u64) -> Option<u64> {
        match self.map.find_entry(addr_hash(addr), |&(a, _)| a == addr) {
            Ok(live) => Some(live.remove().0 .1),
            Err(_) => None,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }
}

/// The three live maps and what they count: heap objects (with their
/// bytes), spans (with their bytes: pages times the generation's page
/// size) and stacks; the peaks of the heap, of the spans and of their sum
/// (the total, at one moment).
#[derive(Default)]
pub(super) struct Maps {
    pub(super) heap: Live,
    pub(super) spans: Live,
    pub(super) stacks: Live,
    /// u128 so that odd sizes (long-form events may carry any value) cannot
    /// overflow; printed saturated to u64.
    pub(super) live_bytes: u128,
    pub(super) peak_live_bytes: u128,
    /// The most heap objects live at once.
    pub(super) peak_live_objects: u64,
    /// Bytes of the live spans.
    pub(super) span_bytes: u128,
    pub(super) peak_span_bytes: u128,
    /// The most spans live at once.
    pub(super) peak_spans: u64,
    /// The peak of `live_bytes + span_bytes`: both at one moment.
    pub(super) peak_total_bytes: u128,
    pub(super) unknown_free: u64,
    pub(super) double_alloc: u64,
}

/// Thread IDs below this are counted in a vector (see
/// `Tally::small_thread_counts`), others in a map.
const SMALL_THREADS: usize = 4096;

/// Number of event kinds without a stack (FORMAT.md section 3): the ten
/// `stats` counts, an allocation with a stack (kinds 11 and 12) counted as
/// one without (5 and 2). They come first in `EVENT_KINDS`.
const KINDS_WITHOUT_STACK: usize = {
    let mut n = 0;
    while n < EVENT_KINDS.len() && !EVENT_KINDS[n].has_stack() {
        n += 1;
    }
    n
};

/// Number of event kinds `stats` counts: the ten of FORMAT.md section 3
/// without a stack, then the three page events.
pub(super) const KINDS: usize = KINDS_WITHOUT_STACK + PAGE_EVENT_NAMES.len();

/// The index of `data`'s kind in [`Stats::counts`]: the kind byte's value
/// less one, then the page events in [`PAGE_EVENT_NAMES`] order.
pub(super) fn kind_index(data: &EventData) -> usize {
    match data {
        EventData::SpanExists { .. } => 0,
        EventData::SpanAlloc { .. } => 1,
        EventData::SpanFree => 2,
        EventData::HeapObjectExists { .. } => 3,
        EventData::HeapObjectAlloc { .. } => 4,
        EventData::HeapObjectFree => 5,
        EventData::StackExists { .. } => 6,
        EventData::StackAlloc { .. } => 7,
        EventData::StackFree => 8,
        EventData::Call => 9,
        EventData::PageAlloc { .. } => 10,
        EventData::PageFree { .. } => 11,
        EventData::PageScav { .. } => 12,
    }
}

/// The names of the kinds counted in [`Stats::counts`], in index order.
pub(super) fn kind_names() -> impl Iterator<Item = &'static str> {
    EVENT_KINDS[..KINDS_WITHOUT_STACK]
        .iter()
        .map(|k| k.name())
        .chain(PAGE_EVENT_NAMES)
}

/// An event other than a page event, as the counting thread needs it.
#[derive(Clone, Copy)]
pub(super) struct Op {
    addr: u64,
    /// A heap object's, a span's or a stack's bytes; 0 for a free or a
    /// call.
    size: u64,
    ticks: u64,
    thread: u64,
    /// A heap object's type ID (0 for none), saturated to u32 (the
    /// writers number types from 1): the Op stays 40 bytes.
    type_id: u32,
    /// [`kind_index`], below 10.
    kind: u8,
    /// The entry point's tag, 0 for none.
    entry: u8,
    long_form: bool,
}

/// Type IDs below this are counted in a vector (see `Tally::types`),
/// others in a map.
const SMALL_TYPES: usize = 4096;

/// Allocations of one type ID: how many (exists events included) and
/// their bytes.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct TypeCount {
    pub(crate) allocations: u64,
    pub(crate) bytes: u128,
}

const WHAT_DOUBLE_ALLOC: &str = "allocation of an address that is already live";
pub(super) const WHAT_UNKNOWN_FREE: &str = "free of an address that is not live";

/// What the counting thread counts: every event but the page events, in
/// trace order. Most of the work of an event is here (the live maps
/// above all), on a thread of its own, while the reading thread decodes
/// the next events.
pub(super) struct Tally {
    /// Per event kind, indexed by [`kind_index`] (page events stay 0).
    counts: [u64; KINDS],
    /// Events per thread ID, for IDs from `SMALL_THREADS` on.
    thread_counts: FxHashMap<u64, u64>,
    /// Events per thread ID below `SMALL_THREADS`, indexed by ID (trace
    /// thread IDs count from 1): one increment per event, with no branch on
    /// whether the thread changed (threads writing at once take turns every
    /// few events).
    small_thread_counts: Box<[u64; SMALL_THREADS]>,
    long_form_events: u64,
    entry_points: [u64; ENTRY_POINTS.len()],
    /// Allocations per type ID below `SMALL_TYPES`, indexed by ID (grown
    /// as IDs come).
    types: Vec<TypeCount>,
    /// Allocations per type ID from `SMALL_TYPES` on.
    big_types: FxHashMap<u64, TypeCount>,
    maps: Maps,
    first_anomaly: Option<String>,
    /// The time of the latest event.
    duration_ns: u64,
}

impl Default for Tally {
    fn default() -> Tally {
        Tally {
            counts: [0; KINDS],
            thread_counts: FxHashMap::default(),
            small_thread_counts: Box::new([0; SMALL_THREADS]),
            types: Vec::new(),
            big_types: FxHashMap::default(),
            long_form_events: 0,
            entry_points: [0; ENTRY_POINTS.len()],
            maps: Maps::default(),
            first_anomaly: None,
            duration_ns: 0,
        }
    }
}

impl Tally {
    /// Counts `ops`, events of `generation` in trace order, whose times
    /// `clock` gives.
    pub(super) fn count(&mut self, ops: &[Op], generation: u64, clock: Option<&Clock>) {
        let at = Where { generation, clock };
        for op in ops {
            self.op(op, &at);
        }
        // Times grow with ticks within a generation: the last event of a
        // run is its latest.
        if let (Some(op), Some(clock)) = (ops.last(), clock) {
            self.duration_ns = self.duration_ns.max(clock.time_ns(op.ticks));
        }
    }

    #[inline(always)]
    fn op(&mut self, op: &Op, at: &Where<'_>) {
        if let Some(n) = self.counts.get_mut(usize::from(op.kind)) {
            *n += 1;
        }
        match usize::try_from(op.thread)
            .ok()
            .and_then(|i| self.small_thread_counts.get_mut(i))
        {
            Some(n) => *n += 1,
            None => self.count_big_thread(op.thread),
        }
        self.long_form_events += u64::from(op.long_form);
        if let Some(n) = self
            .entry_points
            .get_mut(usize::from(op.entry).wrapping_sub(1))
        {
            *n += 1;
        }
        let maps = &mut self.maps;
        let what = match op.kind {
            // Heap object exists, alloc, free.
            3 | 4 => {
                let old = maps.heap.alloc(op.addr, op.size);
                if let Some(old) = old {
                    // The old object was never freed: replace it.
                    maps.live_bytes = maps.live_bytes.saturating_sub(u128::from(old));
                }
                maps.live_bytes += u128::from(op.size);
                maps.peak_live_bytes = maps.peak_live_bytes.max(maps.live_bytes);
                maps.peak_total_bytes =
                    maps.peak_total_bytes.max(maps.live_bytes + maps.span_bytes);
                maps.peak_live_objects = maps.peak_live_objects.max(maps.heap.len() as u64);
                if op.type_id != 0 {
                    self.count_type(op.type_id, op.size);
                }
                old.map(|_| WHAT_DOUBLE_ALLOC)
            }
            5 => match maps.heap.free(op.addr) {
                Some(size) => {
                    maps.live_bytes = maps.live_bytes.saturating_sub(u128::from(size));
                    None
                }
                None => Some(WHAT_UNKNOWN_FREE),
            },
            // A call that changed no memory (counted under events.call).
            9 => None,
            kind => self.other(kind, op.addr, op.size),
        };
        if let Some(what) = what {
            self.anomaly(op, at, what);
        }
    }

    /// Spans and stacks: out of the heap objects' loop.
    #[inline(never)]
    fn other(&mut self, kind: u8, addr: u64, size: u64) -> Option<&'static str> {
        let maps = &mut self.maps;
        match kind {
            // Span exists, alloc: its bytes count in the spans' and the
            // total's peaks.
            0 | 1 => {
                let old = maps.spans.alloc(addr, size);
                maps.span_bytes =
                    maps.span_bytes.saturating_sub(old.map_or(0, u128::from)) + u128::from(size);
                maps.peak_span_bytes = maps.peak_span_bytes.max(maps.span_bytes);
                maps.peak_total_bytes =
                    maps.peak_total_bytes.max(maps.live_bytes + maps.span_bytes);
                maps.peak_spans = maps.peak_spans.max(maps.spans.len() as u64);
                old.map(|_| WHAT_DOUBLE_ALLOC)
            }
            2 => match maps.spans.free(addr) {
                Some(size) => {
                    maps.span_bytes = maps.span_bytes.saturating_sub(u128::from(size));
                    None
                }
                None => Some(WHAT_UNKNOWN_FREE),
            },
            6 | 7 => maps.stacks.alloc(addr, size).map(|_| WHAT_DOUBLE_ALLOC),
            _ => maps
                .stacks
                .free(addr)
                .map_or(Some(WHAT_UNKNOWN_FREE), |_| None),
        }
    }

    /// One allocation of `size` bytes of type `type_id` (not 0).
    #[inline]
    fn count_type(&mut self, type_id: u32, size: u64) {
        let count = match self.types.get_mut(type_id as usize) {
            Some(count) => count,
            None => return self.count_type_slow(type_id, size),
        };
        count.allocations += 1;
        count.bytes += u128::from(size);
    }

    /// [`count_type`](Self::count_type) for an ID the vector does not
    /// reach yet.
    #[inline(never)]
    fn count_type_slow(&mut self, type_id: u32, size: u64) {
        let i = type_id as usize;
        let count = if i < SMALL_TYPES {
            self.types.resize(i + 1, TypeCount::default());
            &mut self.types[i]
        } else {
            self.big_types.entry(u64::from(type_id)).or_default()
        };
        count.allocations += 1;
        count.bytes += u128::from(size);
    }

    #[cold]
    #[inline(never)]
    fn anomaly(&mut self, op: &Op, at: &Where<'_>, what: &'static str) {
        if what == WHAT_DOUBLE_ALLOC {
            self.maps.double_alloc += 1;
        } else {
            self.maps.unknown_free += 1;
        }
        if self.first_anomaly.is_none() {
            let name = EVENT_KINDS
                .get(usize::from(op.kind))
                .map_or("?", |k| k.name());
            let time_ns = at.clock.map_or(0, |c| c.time_ns(op.ticks));
            self.first_anomaly = Some(format!(
                "{name} at {:#x} ({time_ns} ns, generation {}, thread {}): {what}",
                op.addr, at.generation, op.thread
            ));
        }
    }

    #[inline(never)]
    fn count_big_thread(&mut self, thread: u64) {
        *self.thread_counts.entry(thread).or_insert(0) += 1;
    }

    /// Adds the counts into `stats`.
    pub(super) fn finish(self, stats: &mut Stats) {
        for (total, n) in stats.counts.iter_mut().zip(self.counts) {
            *total += n;
        }
        let small = self.small_thread_counts.into_iter();
        let threads = self.thread_counts.into_iter().chain((0u64..).zip(small));
        for (thread, n) in threads.filter(|&(_, n)| n > 0) {
            *stats.per_thread.entry(thread).or_insert(0) += n;
        }
        stats.long_form_events += self.long_form_events;
        for (total, n) in stats.entry_points.iter_mut().zip(self.entry_points) {
            *total += n;
        }
        stats.maps = self.maps;
        let types = (0u64..).zip(self.types).chain(self.big_types);
        for (id, count) in types.filter(|(_, c)| c.allocations > 0) {
            let total = stats.per_type.entry(id).or_default();
            total.allocations += count.allocations;
            total.bytes += count.bytes;
        }
        stats.first_anomaly = self.first_anomaly;
        stats.duration_ns = stats.duration_ns.max(self.duration_ns);
    }
}

/// The generation of the events being counted, for an anomaly's message.
struct Where<'a> {
    generation: u64,
    clock: Option<&'a Clock>,
}

/// What the reading thread counts itself while it reads: what needs the
/// reader (type tables) and the page events; every other event becomes an
/// [`Op`] for the counting thread's [`Tally`].
#[derive(Default)]
pub(super) struct Reading {
    /// Type IDs of the current generation's type table.
    generation_types: BTreeSet<u64>,
    /// The current generation's page size: a span's bytes are its pages
    /// times it.
    page_size: u64,
    /// Ticks of the last event handed out.
    pub(super) last_ticks: u64,
    /// Page events per thread.
    page_threads: BTreeMap<u64, u64>,
}

impl Reading {
    pub(super) fn generation_start(&mut self, stats: &mut Stats, reader: &Reader) {
        self.generation_types.clear();
        self.generation_types.extend(reader.types().keys().copied());
        stats.type_ids.extend(reader.types().keys().copied());
        for t in reader.types().values() {
            // The latest generation's name of an ID wins.
            stats.type_names.insert(t.id, (t.name.clone(), t.size));
        }
        self.page_size = reader.info().map_or(0, |info| info.page_size);
        // The first generation's process (a trace is of one process); the
        // command line of the first generation that has one.
        if let (None, Some(info)) = (&stats.process, reader.info()) {
            stats.process = Some(super::Process {
                pid: info.pid,
                start_wall_ns: info.start_wall_ns,
                command: None,
            });
        }
        if let Some(p) = stats.process.as_mut().filter(|p| p.command.is_none()) {
            p.command = reader.process().cloned();
        }
        stats.pages.generation_start(reader.info());
        if let (Some(end), Some(origin)) = (reader.generation_end(), reader.time_origin_ns()) {
            stats.duration_ns = stats
                .duration_ns
                .max(end.end_mono_ns.saturating_sub(origin));
        }
    }

    /// Counts `e`, of the generation whose clock is `clock`, as far as it
    /// needs this thread (type IDs and page events), and returns what the
    /// counting thread is to count, if anything. Reads no `e.time_ns` (the
    /// compiler then drops the reader's conversion): the rare paths that
    /// need a time convert the ticks with `clock`.
    #[inline(always)]
    pub(super) fn event(&mut self, stats: &mut Stats, e: &Event, clock: &Clock) -> Option<Op> {
        self.last_ticks = e.ticks;
        let mut type_id = 0;
        let size = match e.data {
            EventData::HeapObjectExists { size, type_id: t }
            | EventData::HeapObjectAlloc { size, type_id: t } => {
                if t != 0 {
                    if !self.generation_types.contains(&t) {
                        unknown_type(stats, timed(e, clock), t);
                    }
                    type_id = u32::try_from(t).unwrap_or(u32::MAX);
                }
                size
            }
            EventData::SpanExists { npages, .. } | EventData::SpanAlloc { npages, .. } => {
                npages.saturating_mul(self.page_size)
            }
            EventData::StackExists { size } | EventData::StackAlloc { size } => size,
            EventData::HeapObjectFree
            | EventData::SpanFree
            | EventData::StackFree
            | EventData::Call => 0,
            EventData::PageAlloc { .. }
            | EventData::PageFree { .. }
            | EventData::PageScav { .. } => {
                self.page_event(stats, timed(e, clock));
                return None;
            }
        };
        Some(Op {
            addr: e.addr,
            size,
            ticks: e.ticks,
            thread: e.thread,
            type_id,
            kind: kind_index(&e.data) as u8,
            entry: e.entry.map_or(0, |entry| entry as u8),
            long_form: e.long_form,
        })
    }

    /// Page-tracer events: out of the hot path, which stays small enough
    /// to be inlined into the reading loop.
    #[inline(never)]
    fn page_event(&mut self, stats: &mut Stats, e: Event) {
        stats.counts[kind_index(&e.data)] += 1;
        *self.page_threads.entry(e.thread).or_insert(0) += 1;
        stats.long_form_events += u64::from(e.long_form);
        stats.pages.event(&e)
    }

    /// Adds the page events' threads into `stats`.
    pub(super) fn finish(self, stats: &mut Stats) {
        for (thread, n) in self.page_threads {
            *stats.per_thread.entry(thread).or_insert(0) += n;
        }
    }
}

#[cold]
#[inline(never)]
fn unknown_type(stats: &mut Stats, e: Event, type_id: u64) {
    stats.unknown_type_refs += 1;
    if stats.first_unknown_type.is_none() {
        stats.first_unknown_type = Some(format!(
            "{} at {:#x} ({} ns, generation {}, thread {}) has type ID {type_id}, which is not in the generation's type table",
            e.data.name(), e.addr, e.time_ns, e.generation, e.thread
        ));
    }
}

/// A copy of `e` with its time from `clock`, for the paths out of line
/// (see [`Reading::event`]).
#[inline(always)]
fn timed(e: &Event, clock: &Clock) -> Event {
    Event {
        time_ns: clock.time_ns(e.ticks),
        ..e.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::Live;
    use std::collections::HashMap;

    /// `Live` answers as a plain map would, whatever the order of allocs
    /// and frees.
    #[test]
    fn live_is_a_map() {
        let mut live = Live::default();
        let mut want: HashMap<u64, u64> = HashMap::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Few addresses: frees of live and of unknown addresses, and
            // allocs of live ones, all come often.
            let addr = 0x1000 + (x % 40) * 16;
            if x >> 60 < 9 {
                assert_eq!(
                    live.alloc(addr, i),
                    want.insert(addr, i),
                    "alloc {addr:#x} at {i}"
                );
            } else {
                assert_eq!(live.free(addr), want.remove(&addr), "free {addr:#x} at {i}");
            }
            assert_eq!(live.len(), want.len(), "at {i}");
        }
    }
}
