//! `alloctrace stats`: counts and live-heap accounting over a whole trace,
//! in memory proportional to the live objects (and the runs of pages in
//! use, for page-tracer events).
//!
//! Two threads: the reading thread decodes the trace and hands the events,
//! in order and in chunks, to a counting thread, which keeps the counts
//! and the live maps (see [`Feed`] and [`Tally`]). The results are those
//! of counting every event in order on one thread.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::hash::BuildHasher as _;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::{self, JoinHandle};

use alloctrace_format::{EntryPoint, ENTRY_POINTS, EVENT_KINDS};
use alloctrace_reader::{Clock, Event, EventData, Step, PAGE_EVENT_NAMES};
use hashbrown::hash_table::{Entry, HashTable};
use rustc_hash::{FxBuildHasher, FxHashMap};
use serde_json::{json, Value};

use crate::pages::PageStats;
use crate::progress::Progress;
use crate::{open, prefix, print_stdout, truncation_warning, Failure, Input, Reader};

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
struct Live {
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

    fn len(&self) -> usize {
        self.map.len()
    }
}

/// The three live maps and what they count: heap objects (with their
/// bytes), spans and stacks.
#[derive(Default)]
struct Maps {
    heap: Live,
    spans: Live,
    stacks: Live,
    /// u128 so that odd sizes (long-form events may carry any value) cannot
    /// overflow; printed saturated to u64.
    live_bytes: u128,
    peak_live_bytes: u128,
    unknown_free: u64,
    double_alloc: u64,
}

/// Thread IDs below this are counted in a vector (see
/// `Tally::small_thread_counts`), others in a map.
const SMALL_THREADS: usize = 4096;

/// Number of event kinds `stats` counts: the ten of FORMAT.md section 3,
/// then the three page events.
const KINDS: usize = EVENT_KINDS.len() + PAGE_EVENT_NAMES.len();

/// The index of `data`'s kind in [`Stats::counts`]: the kind byte's value
/// less one, then the page events in [`PAGE_EVENT_NAMES`] order.
fn kind_index(data: &EventData) -> usize {
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
fn kind_names() -> impl Iterator<Item = &'static str> {
    EVENT_KINDS.iter().map(|k| k.name()).chain(PAGE_EVENT_NAMES)
}

/// An event other than a page event, as the counting thread needs it.
#[derive(Clone, Copy)]
struct Op {
    addr: u64,
    /// A heap object's or a stack's bytes, a span's pages; 0 for a free or
    /// a call.
    size: u64,
    ticks: u64,
    thread: u64,
    /// [`kind_index`], below 10.
    kind: u8,
    /// The entry point's tag, 0 for none.
    entry: u8,
    long_form: bool,
}

/// Events of one generation, handed to the counting thread in order, and
/// handed back to be filled again.
struct Chunk {
    ops: Vec<Op>,
    generation: u64,
    /// The generation's clock, for the times the counting thread needs.
    clock: Option<Clock>,
}

/// Events per chunk: each chunk costs the threads a hand-over (a wake-up
/// of the counting thread, when it waits: 1024 cost 10% more time on a
/// 2-thread trace), and memory: 40 bytes an event, [`CHUNKS`] chunks.
const CHUNK: usize = 2048;

/// Full chunks waiting for the counting thread, at most. None: a chunk is
/// handed straight to the counting thread, which is faster than the
/// reading one and waits for it (a queue made no difference in time and
/// cost a chunk of memory).
const QUEUE: usize = 0;

/// Chunks in all: one being filled, the waiting ones, one being counted.
const CHUNKS: usize = QUEUE + 2;

impl Chunk {
    fn new() -> Chunk {
        Chunk {
            ops: Vec::with_capacity(CHUNK),
            generation: 0,
            clock: None,
        }
    }
}

const WHAT_DOUBLE_ALLOC: &str = "allocation of an address that is already live";
const WHAT_UNKNOWN_FREE: &str = "free of an address that is not live";

/// What the counting thread counts: every event but the page events, in
/// trace order. Most of the work of an event is here (the live maps
/// above all), on a thread of its own, while the reading thread decodes
/// the next events.
struct Tally {
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
            long_form_events: 0,
            entry_points: [0; ENTRY_POINTS.len()],
            maps: Maps::default(),
            first_anomaly: None,
            duration_ns: 0,
        }
    }
}

impl Tally {
    fn chunk(&mut self, chunk: &Chunk) {
        for op in &chunk.ops {
            self.op(op, chunk);
        }
        // Times grow with ticks within a generation: the last event of a
        // chunk is its latest.
        if let (Some(op), Some(clock)) = (chunk.ops.last(), &chunk.clock) {
            self.duration_ns = self.duration_ns.max(clock.time_ns(op.ticks));
        }
    }

    #[inline(always)]
    fn op(&mut self, op: &Op, chunk: &Chunk) {
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
            self.anomaly(op, chunk, what);
        }
    }

    /// Spans and stacks: out of the heap objects' loop.
    #[inline(never)]
    fn other(&mut self, kind: u8, addr: u64, size: u64) -> Option<&'static str> {
        let (live, alloc) = match kind {
            0 | 1 => (&mut self.maps.spans, true),
            2 => (&mut self.maps.spans, false),
            6 | 7 => (&mut self.maps.stacks, true),
            _ => (&mut self.maps.stacks, false),
        };
        if alloc {
            live.alloc(addr, size).map(|_| WHAT_DOUBLE_ALLOC)
        } else {
            live.free(addr).map_or(Some(WHAT_UNKNOWN_FREE), |_| None)
        }
    }

    #[cold]
    #[inline(never)]
    fn anomaly(&mut self, op: &Op, chunk: &Chunk, what: &'static str) {
        if what == WHAT_DOUBLE_ALLOC {
            self.maps.double_alloc += 1;
        } else {
            self.maps.unknown_free += 1;
        }
        if self.first_anomaly.is_none() {
            let name = EVENT_KINDS
                .get(usize::from(op.kind))
                .map_or("?", |k| k.name());
            let time_ns = chunk.clock.map_or(0, |c| c.time_ns(op.ticks));
            self.first_anomaly = Some(format!(
                "{name} at {:#x} ({time_ns} ns, generation {}, thread {}): {what}",
                op.addr, chunk.generation, op.thread
            ));
        }
    }

    #[inline(never)]
    fn count_big_thread(&mut self, thread: u64) {
        *self.thread_counts.entry(thread).or_insert(0) += 1;
    }

    /// Adds the counts into `stats`.
    fn finish(self, stats: &mut Stats) {
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
        stats.first_anomaly = self.first_anomaly;
        stats.duration_ns = stats.duration_ns.max(self.duration_ns);
    }
}

/// The counting thread and the chunks on their way to it: the reading
/// thread decodes events and hands them over; the counting thread counts
/// them, in the same order, into a [`Tally`].
struct Feed {
    chunk: Chunk,
    /// Chunks made so far, at most [`CHUNKS`].
    chunks: usize,
    to_counter: SyncSender<Chunk>,
    returned: Receiver<Chunk>,
    counter: JoinHandle<Tally>,
}

impl Feed {
    fn start() -> Result<Feed, Failure> {
        let (to_counter, work) = mpsc::sync_channel::<Chunk>(QUEUE);
        let (give_back, returned) = mpsc::channel::<Chunk>();
        let counter = thread::Builder::new()
            .name("alloctrace-count".into())
            .spawn(move || {
                let mut tally = Tally::default();
                for chunk in work {
                    tally.chunk(&chunk);
                    // The reading thread may have stopped (an error).
                    let _ = give_back.send(chunk);
                }
                tally
            })
            .map_err(|e| Failure::Io(format!("cannot start a thread: {e}")))?;
        Ok(Feed {
            chunk: Chunk::new(),
            chunks: 1,
            to_counter,
            returned,
            counter,
        })
    }

    #[inline(always)]
    fn push(&mut self, op: Op) {
        self.chunk.ops.push(op);
        if self.chunk.ops.len() >= CHUNK {
            self.send();
        }
    }

    /// Readies the chunk for the events of `generation` to come, sending
    /// the one being filled if it holds another generation's.
    fn open(&mut self, generation: u64, clock: Clock) {
        if self.chunk.generation != generation && !self.chunk.ops.is_empty() {
            self.send();
        }
        if self.chunk.ops.is_empty() {
            self.chunk.generation = generation;
            self.chunk.clock = Some(clock);
        }
    }

    /// Hands the chunk over and starts another of the same generation: one
    /// handed back, or a new one while fewer than [`CHUNKS`] exist.
    #[inline(never)]
    fn send(&mut self) {
        let next = match self.returned.try_recv() {
            Ok(chunk) => Some(chunk),
            Err(_) if self.chunks < CHUNKS => {
                self.chunks += 1;
                Some(Chunk::new())
            }
            // Every chunk is out: wait for one.
            Err(_) => self.returned.recv().ok(),
        };
        // None, or a failed send: the counting thread is gone (it
        // panicked; `finish` says so). The chunk is emptied and refilled.
        let Some(mut next) = next else {
            self.chunk.ops.clear();
            return;
        };
        next.ops.clear();
        next.generation = self.chunk.generation;
        next.clock = self.chunk.clock;
        let full = std::mem::replace(&mut self.chunk, next);
        if let Err(mpsc::SendError(mut full)) = self.to_counter.send(full) {
            full.ops.clear();
            self.chunk = full;
        }
    }

    /// Waits for the counting thread to count every event.
    fn finish(self) -> Result<Tally, Failure> {
        let Feed {
            chunk,
            to_counter,
            returned,
            counter,
            ..
        } = self;
        if !chunk.ops.is_empty() {
            let _ = to_counter.send(chunk);
        }
        drop((to_counter, returned));
        counter
            .join()
            .map_err(|_| Failure::Io("internal error: the counting thread failed".into()))
    }
}

/// What the reading thread keeps while it reads: what needs the reader
/// (type tables), the page events, and the feed of the others.
struct Reading {
    feed: Feed,
    /// The clock of the generation being read (from its start on).
    clock: Option<Clock>,
    /// Type IDs of the current generation's type table.
    generation_types: BTreeSet<u64>,
    /// Ticks of the last event handed out.
    last_ticks: u64,
    /// Page events per thread.
    page_threads: BTreeMap<u64, u64>,
}

#[derive(Default)]
pub struct Stats {
    /// Per event kind, indexed by [`kind_index`].
    counts: [u64; KINDS],
    /// The sum of `counts`, once the trace has been read.
    pub total_events: u64,
    /// Events per thread ID (0 included).
    pub per_thread: BTreeMap<u64, u64>,
    /// Type IDs defined in any generation's type table.
    pub type_ids: BTreeSet<u64>,
    pub generations: u64,
    pub lost_events: u64,
    maps: Maps,
    pub long_form_events: u64,
    /// Heap object events naming a type ID absent from their generation's
    /// type table.
    pub unknown_type_refs: u64,
    pub first_anomaly: Option<String>,
    pub first_unknown_type: Option<String>,
    pub duration_ns: u64,
    pub truncated_at: Option<u64>,
    pub bytes: u64,
    /// Events per entry point (FORMAT.md section 3), in tag order.
    pub entry_points: [u64; ENTRY_POINTS.len()],
    /// Page-tracer events accounted as runs of pages in use.
    pub pages: PageStats,
}

impl Stats {
    fn new(bytes: u64) -> Stats {
        Stats {
            bytes,
            ..Stats::default()
        }
    }

    /// Threads (non-zero IDs) that wrote events.
    pub fn threads(&self) -> u64 {
        self.per_thread.keys().filter(|&&t| t != 0).count() as u64
    }

    pub fn anomalies(&self) -> u64 {
        self.maps.unknown_free + self.maps.double_alloc
    }

    /// Frees of an address that is not live.
    pub fn unknown_free(&self) -> u64 {
        self.maps.unknown_free
    }

    /// Allocations of an address that is already live.
    pub fn double_alloc(&self) -> u64 {
        self.maps.double_alloc
    }

    /// Page-tracer anomalies (see `alloctrace pages`), counted apart from
    /// [`anomalies`](Self::anomalies).
    pub fn page_anomalies(&self) -> u64 {
        self.pages.anomalies()
    }

    /// Whether any event carries an entry-point tag.
    pub fn has_entry_points(&self) -> bool {
        self.entry_points.iter().any(|&n| n > 0)
    }

    pub fn live_objects(&self) -> u64 {
        self.maps.heap.len() as u64
    }

    pub fn live_bytes(&self) -> u64 {
        u64::try_from(self.maps.live_bytes).unwrap_or(u64::MAX)
    }

    pub fn peak_live_bytes(&self) -> u64 {
        u64::try_from(self.maps.peak_live_bytes).unwrap_or(u64::MAX)
    }

    fn generation_start(&mut self, reading: &mut Reading, reader: &Reader) {
        reading.generation_types.clear();
        reading
            .generation_types
            .extend(reader.types().keys().copied());
        self.type_ids.extend(reader.types().keys().copied());
        self.pages.generation_start(reader.info());
        if let (Some(end), Some(origin)) = (reader.generation_end(), reader.time_origin_ns()) {
            self.duration_ns = self.duration_ns.max(end.end_mono_ns.saturating_sub(origin));
        }
    }

    /// Hands `e`, of the generation whose clock is `clock`, to the counting
    /// thread, but for what needs this thread: type IDs and page events.
    /// Reads no `e.time_ns` (the compiler then drops the reader's
    /// conversion): the rare paths that need a time convert the ticks with
    /// `clock`.
    #[inline(always)]
    fn event(&mut self, reading: &mut Reading, e: &Event, clock: &Clock) {
        reading.last_ticks = e.ticks;
        let size = match e.data {
            EventData::HeapObjectExists { size, type_id }
            | EventData::HeapObjectAlloc { size, type_id } => {
                if type_id != 0 && !reading.generation_types.contains(&type_id) {
                    self.unknown_type(timed(e, clock), type_id);
                }
                size
            }
            EventData::SpanExists { npages, .. } | EventData::SpanAlloc { npages, .. } => npages,
            EventData::StackExists { size } | EventData::StackAlloc { size } => size,
            EventData::HeapObjectFree
            | EventData::SpanFree
            | EventData::StackFree
            | EventData::Call => 0,
            EventData::PageAlloc { .. }
            | EventData::PageFree { .. }
            | EventData::PageScav { .. } => {
                return self.page_event(reading, timed(e, clock));
            }
        };
        reading.feed.push(Op {
            addr: e.addr,
            size,
            ticks: e.ticks,
            thread: e.thread,
            kind: kind_index(&e.data) as u8,
            entry: e.entry.map_or(0, |entry| entry as u8),
            long_form: e.long_form,
        });
    }

    /// Page-tracer events: out of the hot path, which stays small enough
    /// to be inlined into the reading loop.
    #[inline(never)]
    fn page_event(&mut self, reading: &mut Reading, e: Event) {
        self.counts[kind_index(&e.data)] += 1;
        *reading.page_threads.entry(e.thread).or_insert(0) += 1;
        self.long_form_events += u64::from(e.long_form);
        self.pages.event(&e)
    }

    #[cold]
    #[inline(never)]
    fn unknown_type(&mut self, e: Event, type_id: u64) {
        self.unknown_type_refs += 1;
        if self.first_unknown_type.is_none() {
            self.first_unknown_type = Some(format!(
                "{} at {:#x} ({} ns, generation {}, thread {}) has type ID {type_id}, which is not in the generation's type table",
                e.data.name(), e.addr, e.time_ns, e.generation, e.thread
            ));
        }
    }

    pub fn to_json(&self) -> Value {
        let per_thread: serde_json::Map<String, Value> = self
            .per_thread
            .iter()
            .map(|(t, n)| (t.to_string(), json!(n)))
            .collect();
        let counts: serde_json::Map<String, Value> = kind_names()
            .zip(self.counts)
            .map(|(name, n)| (name.to_string(), json!(n)))
            .collect();
        let mut v = json!({
            "events": counts,
            "total_events": self.total_events,
            "generations": self.generations,
            "threads": self.threads(),
            "per_thread": per_thread,
            "types": self.type_ids.len(),
            "live_objects": self.live_objects(),
            "live_bytes": self.live_bytes(),
            "peak_live_bytes": self.peak_live_bytes(),
            "live_spans": self.maps.spans.len(),
            "live_stacks": self.maps.stacks.len(),
            "lost_events": self.lost_events,
            "anomalies": self.anomalies(),
            "anomaly_kinds": { "unknown_free": self.maps.unknown_free, "double_alloc": self.maps.double_alloc },
            "long_form_events": self.long_form_events,
            "duration_ns": self.duration_ns,
            "bytes": self.bytes,
            "truncated": self.truncated_at.is_some(),
            "truncated_at": self.truncated_at,
            "page_anomalies": self.page_anomalies(),
            // Page events are decoded since this key came: always 0, kept
            // for scripts that read it.
            "skipped_page_events": 0,
        });
        if let (true, Some(map)) = (self.has_entry_points(), v.as_object_mut()) {
            let entries: serde_json::Map<String, Value> = ENTRY_POINTS
                .iter()
                .map(|&e| (e.name().to_string(), json!(self.entry_point(e))))
                .collect();
            map.insert("entry_points".into(), Value::Object(entries));
        }
        v
    }

    /// Events tagged with `entry`.
    pub fn entry_point(&self, entry: EntryPoint) -> u64 {
        self.entry_points[entry as usize - 1]
    }

    /// A two-column table: names left, numbers right-aligned.
    pub fn to_text(&self, name: &str) -> String {
        let mut s = format!("{:<22}{} ({} bytes)\n", "file", name, self.bytes);
        let mut row = |name: &str, value: &dyn std::fmt::Display, note: &str| {
            let _ = writeln!(s, "{name:<22}{value:>14}{note}");
        };
        row("events", &self.total_events, "");
        for (kind, n) in kind_names().zip(self.counts) {
            row(&format!("  {kind}"), &n, "");
        }
        row("generations", &self.generations, "");
        row("threads", &self.threads(), "");
        for (thread, n) in &self.per_thread {
            row(&format!("  thread {thread}"), n, " events");
        }
        row("types", &self.type_ids.len(), "");
        row("live heap objects", &self.live_objects(), "");
        row("live bytes", &self.live_bytes(), "");
        row("peak live bytes", &self.peak_live_bytes(), "");
        row("live spans", &self.maps.spans.len(), "");
        row("live stacks", &self.maps.stacks.len(), "");
        row("long-form events", &self.long_form_events, "");
        if self.has_entry_points() {
            row(
                "entry points",
                &self.entry_points.iter().sum::<u64>(),
                " tagged events",
            );
            for e in ENTRY_POINTS {
                row(&format!("  {}", e.name()), &self.entry_point(e), "");
            }
        }
        row("lost events", &self.lost_events, "");
        row("anomalies", &self.anomalies(), "");
        row("  unknown frees", &self.maps.unknown_free, "");
        row("  double allocs", &self.maps.double_alloc, "");
        row(
            "page anomalies",
            &self.page_anomalies(),
            "  (alloctrace pages)",
        );
        row(
            "duration ns",
            &self.duration_ns,
            &format!("  ({:.3} ms)", self.duration_ns as f64 / 1e6),
        );
        match self.truncated_at {
            Some(offset) => row("truncated at byte", &offset, ""),
            None => row("truncated", &"no", ""),
        }
        s
    }
}

/// A copy of `e` with its time from `clock`, for the paths out of line
/// (see [`Stats::event`]).
#[inline(always)]
fn timed(e: &Event, clock: &Clock) -> Event {
    Event {
        time_ns: clock.time_ns(e.ticks),
        ..e.clone()
    }
}

/// Reads the whole trace into a [`Stats`]. Fails on a malformed trace or an
/// I/O error.
pub fn collect(input: &Input) -> Result<Stats, Failure> {
    let mut reader = open(input)?;
    let size = input.size();
    let mut stats = Stats::new(size);
    let mut reading = Reading {
        feed: Feed::start()?,
        clock: None,
        generation_types: BTreeSet::new(),
        last_ticks: 0,
        page_threads: BTreeMap::new(),
    };
    let mut progress = Progress::new(size);
    let result = loop {
        // Events come only after their generation's start, which sets the
        // clock.
        let step = match reading.clock {
            Some(clock) => reader.next_step(
                1 << 16,
                #[inline(always)]
                |e| stats.event(&mut reading, e, &clock),
            ),
            None => reader.next_step(1, |_| {}),
        };
        match step {
            Ok(Step::Events(_)) => {
                // Times grow with ticks within a generation, so the last
                // event handed out is its latest so far.
                if let Some(clock) = reading.clock {
                    stats.duration_ns = stats.duration_ns.max(clock.time_ns(reading.last_ticks));
                }
                progress.update(reader.bytes_read());
            }
            Ok(Step::GenerationStart { generation }) => {
                stats.generation_start(&mut reading, &reader);
                reading.clock = reader.clock();
                if let Some(clock) = reading.clock {
                    reading.feed.open(generation, clock);
                }
            }
            Ok(Step::End) => break Ok(()),
            Err(err) => break Err(err),
        }
    };
    progress.finish();
    // Waited for even after an error: no thread outlives the result.
    let tally = reading.feed.finish();
    result?;
    tally?.finish(&mut stats);
    for (thread, n) in reading.page_threads {
        *stats.per_thread.entry(thread).or_insert(0) += n;
    }
    stats.total_events = stats.counts.iter().sum();
    stats.generations = reader.generations();
    stats.lost_events = reader.lost_events();
    stats.truncated_at = reader.truncated();
    if stats.bytes == 0 {
        stats.bytes = reader.bytes_read();
    }
    Ok(stats)
}

/// Prints one trace's stats; a labelled one (one of several) gets a
/// `"file"` key in its JSON object, or a blank line after its table.
pub fn run(input: &Input, json: bool, label: Option<&str>) -> Result<(), Failure> {
    let stats = collect(input)?;
    let text = if json {
        let mut v = stats.to_json();
        if let (Some(name), Some(map)) = (label, v.as_object_mut()) {
            map.insert("file".into(), Value::from(name));
        }
        format!("{v}\n")
    } else {
        let mut text = stats.to_text(&input.name());
        if label.is_some() {
            text.push('\n');
        }
        text
    };
    print_stdout(&text)?;
    if let Some(offset) = stats.truncated_at {
        eprintln!("{}{}", prefix(label), truncation_warning(offset));
    }
    Ok(())
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
