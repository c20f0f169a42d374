//! `alloctrace stats`: counts and live-heap accounting over a whole trace,
//! in memory proportional to the live objects (and the runs of pages in
//! use, for page-tracer events).
//!
//! The trace is read by analysis's [`Pass`], the one account of live
//! memory (the reports' too): what is live, its peaks and the anomalies
//! are the pass's, its live table kept lean ([`Size`]: no call stacks).
//!
//! - count.rs: the pass's visitor, which counts every event.
//! - render.rs: the text table and the JSON object.

mod count;
mod render;

use std::collections::{BTreeMap, BTreeSet};

use alloctrace_analysis::{Live, Memory, Pass, Size};
use alloctrace_format::{EntryPoint, ENTRY_POINTS};
use alloctrace_reader::ProcessInfo;
use serde_json::Value;

use crate::failure::Failure;
use crate::input::{open, Input};
use crate::pages::PageStats;
use crate::print::{prefix, print_stdout, truncation_warning};
use crate::progress::Progress;

use count::{Tally, TypeCount, KINDS};

/// What `stats` finds in a trace (see docs/CLI.md for each number).
#[derive(Default)]
pub struct Stats {
    /// Per event kind, indexed by [`count::kind_index`].
    counts: [u64; KINDS],
    /// The sum of `counts`, once the trace has been read.
    pub total_events: u64,
    /// Events per thread ID (0 included).
    pub per_thread: BTreeMap<u64, u64>,
    /// Type IDs defined in any generation's type table.
    pub type_ids: BTreeSet<u64>,
    /// Per type ID, its name and size in the latest type table that
    /// defines it.
    pub type_names: BTreeMap<u64, (String, u64)>,
    /// Allocations (exists events included) per type ID, for the IDs
    /// allocated (not 0).
    per_type: BTreeMap<u64, TypeCount>,
    /// The traced process, from the first generation.
    pub process: Option<Process>,
    pub generations: u64,
    pub lost_events: u64,
    /// Allocations recorded without their stack (generation-end batches,
    /// format version 3).
    pub lost_stacks: u64,
    /// A sampled trace's mean bytes between samples (format version 6;
    /// 0: every allocation recorded).
    pub sample_bytes: u64,
    /// A sampled trace's exact counts (generation-end batches, version 6).
    pub totals: alloctrace_reader::Totals,
    /// What the pass left live, with the peaks.
    live: Live<Size>,
    unknown_free: u64,
    double_alloc: u64,
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
    /// The trace is a flight recorder's dump (FORMAT.md section 1).
    pub flight_window: bool,
    /// In a flight-recorder window: frees of memory allocated before the
    /// window (not anomalies there), as the pass classifies them, page
    /// frees included.
    pub frees_before_window: u64,
}

/// Which process a trace is of: its first generation's info batch, and
/// the first process batch (format version 4).
pub struct Process {
    pub pid: u64,
    /// CLOCK_REALTIME when the trace started, ns since the Unix epoch.
    pub start_wall_ns: u64,
    /// `None` for traces before version 4.
    pub command: Option<ProcessInfo>,
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
        self.unknown_free + self.double_alloc
    }

    /// Frees of an address that is not live.
    pub fn unknown_free(&self) -> u64 {
        self.unknown_free
    }

    /// Allocations (and exists events) of an address that is already
    /// live.
    pub fn double_alloc(&self) -> u64 {
        self.double_alloc
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
        self.live.count(Memory::Heap) as u64
    }

    pub fn live_bytes(&self) -> u64 {
        saturate(self.live.bytes(Memory::Heap))
    }

    pub fn peak_live_bytes(&self) -> u64 {
        saturate(self.live.peaks().heap_bytes)
    }

    /// The most heap objects live at once.
    pub fn peak_live_objects(&self) -> u64 {
        self.live.peaks().heap_objects
    }

    /// Spans live at the end.
    pub fn live_spans(&self) -> u64 {
        self.live.count(Memory::Span) as u64
    }

    /// Bytes of the spans live at the end (pages times the page size).
    pub fn live_span_bytes(&self) -> u64 {
        saturate(self.live.bytes(Memory::Span))
    }

    pub fn peak_live_span_bytes(&self) -> u64 {
        saturate(self.live.peaks().span_bytes)
    }

    /// The most spans live at once.
    pub fn peak_live_spans(&self) -> u64 {
        self.live.peaks().spans
    }

    /// The peak of heap plus span bytes, live at one moment.
    pub fn peak_live_total_bytes(&self) -> u64 {
        saturate(self.live.peaks().total_bytes)
    }

    /// Goroutine-style stacks live at the end.
    pub fn live_stacks(&self) -> u64 {
        self.live.count(Memory::Stack) as u64
    }

    /// Per type allocated (and, with `defined`, per type a type table
    /// defines, allocated or not): its ID, name (`None` when no type table
    /// defines it), allocations and bytes; most bytes first, then most
    /// allocations, then by ID.
    pub fn types_by_bytes(&self, defined: bool) -> Vec<(u64, Option<&str>, u64, u64)> {
        let none = TypeCount::default();
        let ids: BTreeSet<u64> = if defined {
            self.per_type
                .keys()
                .chain(&self.type_ids)
                .copied()
                .collect()
        } else {
            self.per_type.keys().copied().collect()
        };
        let mut v: Vec<_> = ids
            .into_iter()
            .map(|id| {
                let c = self.per_type.get(&id).unwrap_or(&none);
                let name = self.type_names.get(&id).map(|(n, _)| n.as_str());
                let bytes = u64::try_from(c.bytes).unwrap_or(u64::MAX);
                (id, name, c.allocations, bytes)
            })
            .collect();
        v.sort_by(|a, b| b.3.cmp(&a.3).then(b.2.cmp(&a.2)).then(a.0.cmp(&b.0)));
        v
    }

    /// Events tagged with `entry`.
    pub fn entry_point(&self, entry: EntryPoint) -> u64 {
        self.entry_points[entry as usize - 1]
    }
}

/// Printed saturated to u64.
fn saturate(n: u128) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// Reads the whole trace into a [`Stats`]. Fails on a malformed trace or an
/// I/O error.
pub fn collect(input: &Input) -> Result<Stats, Failure> {
    let mut reader = open(input)?;
    let size = input.size();
    let mut stats = Stats::new(size);
    stats.flight_window = reader.flight_window();
    let mut tally = Tally::new(stats);
    let mut progress = Progress::new(size);
    let mut pass = Pass::new();
    let result = pass.run(&mut reader, &mut tally, |bytes| progress.update(bytes));
    progress.finish();
    let live = result?;
    let mut stats = tally.finish();
    stats.live = live;
    stats.frees_before_window = pass.stats.frees_before_window + stats.pages.frees_before_window;
    stats.total_events = stats.counts.iter().sum();
    stats.generations = reader.generations();
    stats.lost_events = reader.lost_events();
    stats.lost_stacks = reader.lost_stacks();
    stats.sample_bytes = reader.sample_bytes();
    stats.totals = reader.totals();
    stats.truncated_at = reader.truncated();
    if stats.bytes == 0 {
        stats.bytes = reader.bytes_read();
    }
    Ok(stats)
}

/// Prints one trace's stats; a labelled one (one of several) gets a
/// `"file"` key in its JSON object, or a blank line after its table.
/// `all`: the table shows every row, zero or not (the JSON always does).
pub fn run(input: &Input, json: bool, all: bool, label: Option<&str>) -> Result<(), Failure> {
    let stats = collect(input)?;
    let text = if json {
        let mut v = stats.to_json();
        if let (Some(name), Some(map)) = (label, v.as_object_mut()) {
            map.insert("file".into(), Value::from(name));
        }
        format!("{}\n", crate::print::json_text(&v))
    } else {
        let mut text = stats.to_text(&input.name(), all);
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
