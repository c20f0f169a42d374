//! `alloctrace stats`: counts and live-heap accounting over a whole trace,
//! in memory proportional to the live objects (and the runs of pages in
//! use, for page-tracer events).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::hash::BuildHasher as _;
use std::path::Path;

use alloctrace_format::{EntryPoint, ENTRY_POINTS, EVENT_KINDS};
use alloctrace_reader::{Clock, Event, EventData, Record, PAGE_EVENT_NAMES};
use hashbrown::HashTable;
use rustc_hash::{FxBuildHasher, FxHashMap};
use serde_json::{json, Value};

use crate::pages::PageStats;
use crate::progress::Progress;
use crate::{open, print_stdout, truncation_warning, Failure, Reader};

/// Live map of one address space (heap objects, spans or stacks): address
/// to the size recorded at allocation. FxHash: one lookup per event, and
/// the keys are addresses from the trace, not from an adversary that
/// could hurt more than this one run.
///
/// The newest `PENDING` allocations wait outside the map, in `pending`,
/// before they go in: an object freed that soon never touches the map. (A
/// lookup right after an insert near the same slot stalls: it loads the 16
/// control bytes of which the insert has just stored one, and the load
/// waits for the store to reach the cache.) The map is a
/// `hashbrown::HashTable`: an allocation that leaves `pending` goes in
/// without a search, as `pending` and the map never hold the same address.
#[derive(Default)]
struct Live {
    map: HashTable<(u64, u64)>,
    /// (address, size) of at most `PENDING` allocations, none of them in
    /// `map`: slot `i` holds one when bit `i` of `used` is set.
    pending: [(u64, u64); PENDING],
    used: u32,
    /// The slot the next allocation takes (its object, if any, goes into
    /// the map).
    next: usize,
}

/// Slots of [`Live::pending`]. Two are enough to keep each insert away
/// from the lookups of the next few events; more cost more comparisons.
const PENDING: usize = 2;

#[inline(always)]
fn addr_hash(addr: u64) -> u64 {
    FxBuildHasher.hash_one(addr)
}

impl Live {
    /// The slot of `pending` that holds `addr`, if any.
    #[inline(always)]
    fn pending_slot(&self, addr: u64) -> Option<usize> {
        let mut hits = 0u32;
        for (i, &(a, _)) in self.pending.iter().enumerate() {
            hits |= u32::from(a == addr) << i;
        }
        hits &= self.used;
        (hits != 0).then(|| hits.trailing_zeros() as usize % PENDING)
    }

    /// Returns the size it replaces when the address was already live.
    #[inline]
    fn alloc(&mut self, addr: u64, size: u64) -> Option<u64> {
        if let Some(i) = self.pending_slot(addr) {
            return Some(std::mem::replace(&mut self.pending[i].1, size));
        }
        if let Some((_, old)) = self.map.find_mut(addr_hash(addr), |&(a, _)| a == addr) {
            return Some(std::mem::replace(old, size));
        }
        let i = self.next;
        self.next = (i + 1) % PENDING;
        let old = std::mem::replace(&mut self.pending[i], (addr, size));
        if self.used >> i & 1 != 0 {
            self.map.insert_unique(addr_hash(old.0), old, |&(a, _)| addr_hash(a));
        }
        self.used |= 1 << i;
        None
    }

    #[inline]
    fn free(&mut self, addr: u64) -> Option<u64> {
        if let Some(i) = self.pending_slot(addr) {
            self.used &= !(1 << i);
            return Some(self.pending[i].1);
        }
        match self.map.find_entry(addr_hash(addr), |&(a, _)| a == addr) {
            Ok(live) => Some(live.remove().0 .1),
            Err(_) => None,
        }
    }

    fn len(&self) -> usize {
        self.map.len() + self.used.count_ones() as usize
    }
}

/// Thread IDs below this are counted in a vector (see
/// `Stats::small_thread_counts`), others in a map.
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

#[derive(Default)]
pub struct Stats {
    /// Per event kind, indexed by [`kind_index`].
    counts: [u64; KINDS],
    /// The sum of `counts`, once the trace has been read.
    pub total_events: u64,
    /// Events per thread ID (0 included). Filled from `thread_counts` when
    /// the trace has been read.
    pub per_thread: BTreeMap<u64, u64>,
    /// Events per thread ID while the trace is read, but for the current
    /// run of events of one thread (threads write long runs, so most events
    /// just count up `run_events`).
    thread_counts: FxHashMap<u64, u64>,
    /// The same for thread IDs below `SMALL_THREADS`, indexed by ID (trace
    /// thread IDs count from 1): threads writing at once take turns every
    /// few events, so a run often ends after one or two.
    small_thread_counts: Vec<u64>,
    run_thread: u64,
    run_events: u64,
    /// Type IDs of the current generation's type table.
    generation_types: BTreeSet<u64>,
    /// Type IDs defined in any generation's type table.
    pub type_ids: BTreeSet<u64>,
    pub generations: u64,
    pub lost_events: u64,
    heap: Live,
    spans: Live,
    stacks: Live,
    /// u128 so that odd sizes (long-form events may carry any value) cannot
    /// overflow; printed saturated to u64.
    live_bytes: u128,
    peak_live_bytes: u128,
    pub unknown_free: u64,
    pub double_alloc: u64,
    pub long_form_events: u64,
    /// Heap object events naming a type ID absent from their generation's
    /// type table.
    pub unknown_type_refs: u64,
    pub first_anomaly: Option<String>,
    pub first_unknown_type: Option<String>,
    pub duration_ns: u64,
    /// Ticks of the last event counted.
    last_ticks: u64,
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

    /// Moves the per-thread counts into `per_thread`, for output.
    fn finish(&mut self) {
        self.total_events = self.counts.iter().sum();
        self.end_thread_run();
        self.per_thread.extend(self.thread_counts.drain());
        let small = std::mem::take(&mut self.small_thread_counts);
        self.per_thread
            .extend((0u64..).zip(small).filter(|&(_, n)| n > 0));
    }

    #[inline(never)]
    fn end_thread_run(&mut self) {
        if self.run_events > 0 {
            let thread = self.run_thread;
            match usize::try_from(thread) {
                Ok(i) if i < SMALL_THREADS => {
                    if self.small_thread_counts.len() <= i {
                        self.small_thread_counts.resize(i + 1, 0);
                    }
                    self.small_thread_counts[i] += self.run_events;
                }
                _ => *self.thread_counts.entry(thread).or_insert(0) += self.run_events,
            }
            self.run_events = 0;
        }
    }

    /// Threads (non-zero IDs) that wrote events.
    pub fn threads(&self) -> u64 {
        self.per_thread.keys().filter(|&&t| t != 0).count() as u64
    }

    pub fn anomalies(&self) -> u64 {
        self.unknown_free + self.double_alloc
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
        self.heap.len() as u64
    }

    pub fn live_bytes(&self) -> u64 {
        u64::try_from(self.live_bytes).unwrap_or(u64::MAX)
    }

    pub fn peak_live_bytes(&self) -> u64 {
        u64::try_from(self.peak_live_bytes).unwrap_or(u64::MAX)
    }

    fn generation_start(&mut self, reader: &Reader) {
        self.generation_types.clear();
        self.generation_types.extend(reader.types().keys().copied());
        self.type_ids.extend(reader.types().keys().copied());
        self.pages.generation_start(reader.info());
        if let (Some(end), Some(origin)) = (reader.generation_end(), reader.time_origin_ns()) {
            self.duration_ns = self.duration_ns.max(end.end_mono_ns.saturating_sub(origin));
        }
    }

    /// Counts `e`, of the generation whose clock is `clock`. Reads no
    /// `e.time_ns`: the common case needs no time (the duration comes from
    /// the ticks of the last event, see `collect`), so the compiler drops
    /// the reader's conversion; the rare paths that need one convert the
    /// ticks with `clock`.
    #[inline(always)]
    fn event(&mut self, e: &Event, clock: &Clock) {
        self.counts[kind_index(&e.data)] += 1;
        if e.thread != self.run_thread {
            self.end_thread_run();
            self.run_thread = e.thread;
        }
        self.run_events += 1;
        self.long_form_events += u64::from(e.long_form);
        self.last_ticks = e.ticks;
        if let Some(entry) = e.entry {
            self.entry_points[entry as usize - 1] += 1;
        }
        match e.data {
            EventData::HeapObjectExists { size, type_id }
            | EventData::HeapObjectAlloc { size, type_id } => {
                if type_id != 0 && !self.generation_types.contains(&type_id) {
                    self.unknown_type(timed(e, clock), type_id);
                }
                if let Some(old) = self.heap.alloc(e.addr, size) {
                    // The old object was never freed: replace it.
                    self.live_bytes = self.live_bytes.saturating_sub(u128::from(old));
                    self.anomaly(timed(e, clock), "allocation of an address that is already live", true);
                }
                self.live_bytes += u128::from(size);
                self.peak_live_bytes = self.peak_live_bytes.max(self.live_bytes);
            }
            EventData::HeapObjectFree => match self.heap.free(e.addr) {
                Some(size) => self.live_bytes = self.live_bytes.saturating_sub(u128::from(size)),
                None => self.anomaly(timed(e, clock), "free of an address that is not live", false),
            },
            _ => self.other_event(timed(e, clock)),
        }
    }

    /// Events other than heap objects': out of the hot path, which stays
    /// small enough to be inlined into the reading loop.
    #[inline(never)]
    fn other_event(&mut self, e: Event) {
        match e.data {
            EventData::SpanExists { npages, .. } | EventData::SpanAlloc { npages, .. } => {
                if self.spans.alloc(e.addr, npages).is_some() {
                    self.anomaly(e, "allocation of an address that is already live", true);
                }
            }
            EventData::StackExists { size } | EventData::StackAlloc { size } => {
                if self.stacks.alloc(e.addr, size).is_some() {
                    self.anomaly(e, "allocation of an address that is already live", true);
                }
            }
            EventData::SpanFree => {
                if self.spans.free(e.addr).is_none() {
                    self.anomaly(e, "free of an address that is not live", false);
                }
            }
            EventData::StackFree => {
                if self.stacks.free(e.addr).is_none() {
                    self.anomaly(e, "free of an address that is not live", false);
                }
            }
            // A call that changed no memory (counted under events.call).
            EventData::Call => {}
            EventData::PageAlloc { .. } | EventData::PageFree { .. } | EventData::PageScav { .. } => {
                self.pages.event(&e)
            }
            // Handled by `event`.
            EventData::HeapObjectExists { .. }
            | EventData::HeapObjectAlloc { .. }
            | EventData::HeapObjectFree => {}
        }
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

    #[cold]
    #[inline(never)]
    fn anomaly(&mut self, e: Event, what: &str, double_alloc: bool) {
        if double_alloc {
            self.double_alloc += 1;
        } else {
            self.unknown_free += 1;
        }
        if self.first_anomaly.is_none() {
            self.first_anomaly = Some(format!(
                "{} at {:#x} ({} ns, generation {}, thread {}): {what}",
                e.data.name(),
                e.addr,
                e.time_ns,
                e.generation,
                e.thread
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
            "live_spans": self.spans.len(),
            "live_stacks": self.stacks.len(),
            "lost_events": self.lost_events,
            "anomalies": self.anomalies(),
            "anomaly_kinds": { "unknown_free": self.unknown_free, "double_alloc": self.double_alloc },
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
    pub fn to_text(&self, path: &Path) -> String {
        let mut s = format!("{:<22}{} ({} bytes)\n", "file", path.display(), self.bytes);
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
        row("live spans", &self.spans.len(), "");
        row("live stacks", &self.stacks.len(), "");
        row("long-form events", &self.long_form_events, "");
        if self.has_entry_points() {
            row("entry points", &self.entry_points.iter().sum::<u64>(), " tagged events");
            for e in ENTRY_POINTS {
                row(&format!("  {}", e.name()), &self.entry_point(e), "");
            }
        }
        row("lost events", &self.lost_events, "");
        row("anomalies", &self.anomalies(), "");
        row("  unknown frees", &self.unknown_free, "");
        row("  double allocs", &self.double_alloc, "");
        row("page anomalies", &self.page_anomalies(), "  (alloctrace pages)");
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
pub fn collect(path: &Path) -> Result<Stats, Failure> {
    let mut reader = open(path)?;
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let mut stats = Stats::new(size);
    let mut progress = Progress::new(size);
    let result = loop {
        let clock = reader.clock();
        let drained = match &clock {
            Some(clock) => reader.next_events(1 << 16, #[inline(always)] |e| stats.event(e, clock)),
            // No generation yet: nothing to hand out (but an error).
            None => reader.next_events(1, |_| {}),
        };
        match drained {
            Ok(0) => {}
            Ok(_) => {
                // Times grow with ticks within a generation, so the last
                // event handed out is its latest so far.
                if let Some(clock) = clock {
                    stats.duration_ns = stats.duration_ns.max(clock.time_ns(stats.last_ticks));
                }
                progress.update(reader.bytes_read());
                continue;
            }
            Err(err) => break Err(err),
        }
        match reader.next_record() {
            Ok(Some(Record::GenerationStart { .. })) => stats.generation_start(&reader),
            Ok(Some(Record::Event(e))) => {
                if let Some(clock) = reader.clock() {
                    stats.event(&e, &clock);
                }
                stats.duration_ns = stats.duration_ns.max(e.time_ns);
            }
            Ok(None) => break Ok(()),
            Err(err) => break Err(err),
        }
    };
    progress.finish();
    result?;
    stats.finish();
    stats.generations = reader.generations();
    stats.lost_events = reader.lost_events();
    stats.truncated_at = reader.truncated();
    if stats.bytes == 0 {
        stats.bytes = reader.bytes_read();
    }
    Ok(stats)
}

pub fn run(path: &Path, json: bool) -> Result<(), Failure> {
    let stats = collect(path)?;
    let text = if json {
        format!("{}\n", stats.to_json())
    } else {
        stats.to_text(path)
    };
    print_stdout(&text)?;
    if let Some(offset) = stats.truncated_at {
        eprintln!("{}", truncation_warning(offset));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Live;
    use std::collections::HashMap;

    /// `Live` answers as a plain map would, whatever the order of allocs
    /// and frees (the newest allocations wait outside the map).
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
                assert_eq!(live.alloc(addr, i), want.insert(addr, i), "alloc {addr:#x} at {i}");
            } else {
                assert_eq!(live.free(addr), want.remove(&addr), "free {addr:#x} at {i}");
            }
            assert_eq!(live.len(), want.len(), "at {i}");
        }
    }
}
