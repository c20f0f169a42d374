//! `alloctrace stats`: counts and live-heap accounting over a whole trace,
//! in memory proportional to the live objects (and the runs of pages in
//! use, for page-tracer events).
//!
//! - count.rs: the per-event accounting (the counts and the live maps).
//! - pipeline.rs: the two threads: the reading thread decodes the trace
//!   and hands the events, in order and in chunks, to a counting thread,
//!   which keeps the counts and the live maps. The results are those of
//!   counting every event in order on one thread.
//! - render.rs: the text table and the JSON object.

mod count;
mod pipeline;
mod render;

use std::collections::{BTreeMap, BTreeSet};

use alloctrace_format::{EntryPoint, ENTRY_POINTS};
use serde_json::Value;

use crate::pages::PageStats;
use crate::{prefix, print_stdout, truncation_warning, Failure, Input};

use count::{Maps, KINDS};
pub use pipeline::collect;

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
    pub generations: u64,
    pub lost_events: u64,
    /// Allocations recorded without their stack (generation-end batches,
    /// format version 3).
    pub lost_stacks: u64,
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

    /// Events tagged with `entry`.
    pub fn entry_point(&self, entry: EntryPoint) -> u64 {
        self.entry_points[entry as usize - 1]
    }
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
