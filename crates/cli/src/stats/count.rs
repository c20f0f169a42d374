//! The counting of `alloctrace stats`: [`Tally`], a visitor of analysis's
//! [`Pass`](alloctrace_analysis::Pass), counts every event (per kind, per
//! thread, per type, per entry point, the long-form ones and the page
//! events) and the pass's anomalies. What is live and its peaks are the
//! pass's live table's (kept lean: an allocation's size alone).

use std::collections::BTreeSet;

use alloctrace_analysis::{Anomaly, Free, GenerationView, Op, Size, StackTable, Visitor};
use alloctrace_format::{ENTRY_POINTS, EVENT_KINDS};
use alloctrace_reader::{EventData, PAGE_EVENT_NAMES};
use rustc_hash::FxHashMap;

use super::{Process, Stats};
use crate::pages::PageStats;

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

/// What `stats` counts of every event, on the pass's pairing thread.
pub(super) struct Tally {
    /// Per event kind, indexed by [`kind_index`].
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
    /// Type IDs of the current generation's type table.
    generation_types: BTreeSet<u64>,
    /// The current generation's number, for an anomaly's message.
    generation: u64,
    /// The time of the latest event.
    duration_ns: u64,
    unknown_free: u64,
    double_alloc: u64,
    first_anomaly: Option<String>,
    unknown_type_refs: u64,
    first_unknown_type: Option<String>,
    /// What `stats` keeps of the generations (type tables, process).
    stats: Stats,
    pages: PageStats,
}

impl Tally {
    /// Counts into `stats` (its file size set), which
    /// [`finish`](Self::finish) gives back.
    pub(super) fn new(stats: Stats) -> Tally {
        Tally {
            counts: [0; KINDS],
            thread_counts: FxHashMap::default(),
            small_thread_counts: Box::new([0; SMALL_THREADS]),
            long_form_events: 0,
            entry_points: [0; ENTRY_POINTS.len()],
            types: Vec::new(),
            big_types: FxHashMap::default(),
            generation_types: BTreeSet::new(),
            generation: 0,
            duration_ns: 0,
            unknown_free: 0,
            double_alloc: 0,
            first_anomaly: None,
            unknown_type_refs: 0,
            first_unknown_type: None,
            stats,
            pages: PageStats::default(),
        }
    }
}

/// `stats` reads the trace through a pass whose live table keeps sizes.
impl Visitor<Size> for Tally {
    fn generation(&mut self, view: &GenerationView, stacks: &StackTable) {
        self.generation = view.generation();
        self.generation_types.clear();
        self.generation_types.extend(view.types().keys().copied());
        let stats = &mut self.stats;
        stats.type_ids.extend(view.types().keys().copied());
        for t in view.types().values() {
            // The latest generation's name of an ID wins.
            stats.type_names.insert(t.id, (t.name.clone(), t.size));
        }
        // The first generation's process (a trace is of one process); the
        // command line of the first generation that has one.
        if let (None, Some(info)) = (&stats.process, view.info()) {
            stats.process = Some(Process {
                pid: info.pid,
                start_wall_ns: info.start_wall_ns,
                command: None,
            });
        }
        if let Some(p) = stats.process.as_mut().filter(|p| p.command.is_none()) {
            p.command = view.process().cloned();
        }
        if let (Some(end), Some(origin)) = (view.generation_end(), view.time_origin_ns()) {
            self.duration_ns = self.duration_ns.max(end.end_mono_ns.saturating_sub(origin));
        }
        Visitor::<Size>::generation(&mut self.pages, view, stacks);
    }

    #[inline(always)]
    fn event(&mut self, op: &Op) {
        let kind = kind_index(&op.data);
        self.counts[kind] += 1;
        match usize::try_from(op.thread)
            .ok()
            .and_then(|i| self.small_thread_counts.get_mut(i))
        {
            Some(n) => *n += 1,
            None => self.count_big_thread(op.thread),
        }
        self.long_form_events += u64::from(op.long_form);
        if let Some(entry) = op.entry {
            self.entry_points[entry as usize - 1] += 1;
        }
        // Times grow with ticks within a generation.
        self.duration_ns = self.duration_ns.max(op.time_ns);
        match op.data {
            EventData::HeapObjectExists { size, type_id }
            | EventData::HeapObjectAlloc { size, type_id }
                if type_id != 0 =>
            {
                self.count_type(op, type_id, size);
            }
            EventData::PageAlloc { .. }
            | EventData::PageFree { .. }
            | EventData::PageScav { .. } => self.page_event(op),
            _ => {}
        }
    }

    #[cold]
    #[inline(never)]
    fn anomaly(&mut self, op: &Op, anomaly: Anomaly) {
        match anomaly {
            // (In a flight-recorder window, a free of memory allocated
            // before it comes as the pass's free_before_window instead.)
            Anomaly::UnknownFree => self.unknown_free += 1,
            Anomaly::DoubleAlloc => self.double_alloc += 1,
        }
        if self.first_anomaly.is_none() {
            self.first_anomaly = Some(format!(
                "{} at {:#x} ({} ns, generation {}, thread {}): {}",
                op.data.name(),
                op.addr,
                op.time_ns,
                self.generation,
                op.thread,
                anomaly.what()
            ));
        }
    }

    #[inline(always)]
    fn alloc(&mut self, _alloc: &Size) {}

    #[inline(always)]
    fn free(&mut self, _alloc: &Size, _free: &Free) {}
}

impl Tally {
    /// One allocation of `size` bytes of type `type_id` (not 0), which its
    /// generation's type table should define.
    #[inline]
    fn count_type(&mut self, op: &Op, type_id: u64, size: u64) {
        if !self.generation_types.contains(&type_id) {
            self.unknown_type(op, type_id);
        }
        // Saturated to u32: the writers number types from 1.
        let id = u32::try_from(type_id).unwrap_or(u32::MAX);
        let count = match self.types.get_mut(id as usize) {
            Some(count) => count,
            None => return self.count_type_slow(id, size),
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
    fn unknown_type(&mut self, op: &Op, type_id: u64) {
        self.unknown_type_refs += 1;
        if self.first_unknown_type.is_none() {
            self.first_unknown_type = Some(format!(
                "{} at {:#x} ({} ns, generation {}, thread {}) has type ID {type_id}, which is not in the generation's type table",
                op.data.name(), op.addr, op.time_ns, self.generation, op.thread
            ));
        }
    }

    /// Page-tracer events: out of the hot path.
    #[inline(never)]
    fn page_event(&mut self, op: &Op) {
        Visitor::<Size>::event(&mut self.pages, op);
    }

    #[inline(never)]
    fn count_big_thread(&mut self, thread: u64) {
        *self.thread_counts.entry(thread).or_insert(0) += 1;
    }

    /// The counts, in the [`Stats`] given to [`new`](Self::new).
    pub(super) fn finish(self) -> Stats {
        let mut stats = self.stats;
        stats.counts = self.counts;
        let small = self.small_thread_counts.into_iter();
        let threads = self.thread_counts.into_iter().chain((0u64..).zip(small));
        stats.per_thread = threads.filter(|&(_, n)| n > 0).collect();
        stats.long_form_events = self.long_form_events;
        stats.entry_points = self.entry_points;
        let types = (0u64..).zip(self.types).chain(self.big_types);
        stats.per_type = types.filter(|(_, c)| c.allocations > 0).collect();
        stats.unknown_free = self.unknown_free;
        stats.double_alloc = self.double_alloc;
        stats.first_anomaly = self.first_anomaly;
        stats.unknown_type_refs = self.unknown_type_refs;
        stats.first_unknown_type = self.first_unknown_type;
        stats.duration_ns = self.duration_ns;
        stats.pages = self.pages;
        stats
    }
}
