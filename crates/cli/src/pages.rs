//! `alloctrace pages`: the page tracer's events (FORMAT.md section 7)
//! accounted as runs of pages in use. [`PageStats`] is a visitor of
//! analysis's `Pass` (memory: the runs, and the pass's lean live table);
//! `stats` and `check` count their page anomalies with it, in their own
//! visitor of the pass.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use alloctrace_analysis::{Entry, Free, GenerationView, Op, Pass, Size, StackTable, Visitor};
use alloctrace_format::exact_log2;
use alloctrace_reader::{EventData, GenerationInfo};
use serde_json::{json, Value};

use crate::failure::Failure;
use crate::input::{open, Input};
use crate::print::{prefix, print_stdout, truncation_warning};
use crate::progress::Progress;

/// Pages in use as disjoint, non-adjacent runs of page numbers: start to
/// end (exclusive). u128 so that a run near the top of the address space
/// with any npages cannot overflow.
#[derive(Default)]
pub struct PageRuns {
    runs: BTreeMap<u128, u128>,
    /// Sum of the run lengths.
    pages: u128,
}

impl PageRuns {
    /// Pages in use.
    pub fn pages(&self) -> u128 {
        self.pages
    }

    /// Number of runs.
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    /// How many pages of `start..end` are in use.
    pub fn in_use(&self, start: u128, end: u128) -> u128 {
        // Runs are sorted and disjoint, so going down from the last run that
        // starts before `end`, their ends decrease too.
        self.runs
            .range(..end)
            .rev()
            .take_while(|(_, &e)| e > start)
            .map(|(&s, &e)| e.min(end) - s.max(start))
            .sum()
    }

    /// Marks `start..end` in use, merging with the runs it overlaps or
    /// touches. Returns how many of its pages were in use already.
    pub fn insert(&mut self, start: u128, end: u128) -> u128 {
        if start >= end {
            return 0;
        }
        let touching: Vec<(u128, u128)> = self
            .runs
            .range(..=end)
            .rev()
            .take_while(|(_, &e)| e >= start)
            .map(|(&s, &e)| (s, e))
            .collect();
        let (mut lo, mut hi, mut already) = (start, end, 0);
        for (s, e) in touching {
            self.runs.remove(&s);
            self.pages -= e - s;
            already += e.min(end).saturating_sub(s.max(start));
            lo = lo.min(s);
            hi = hi.max(e);
        }
        self.runs.insert(lo, hi);
        self.pages += hi - lo;
        already
    }

    /// Marks `start..end` not in use, splitting the runs it cuts. Returns
    /// how many of its pages were in use.
    pub fn remove(&mut self, start: u128, end: u128) -> u128 {
        if start >= end {
            return 0;
        }
        let overlapping: Vec<(u128, u128)> = self
            .runs
            .range(..end)
            .rev()
            .take_while(|(_, &e)| e > start)
            .map(|(&s, &e)| (s, e))
            .collect();
        let mut removed = 0;
        for (s, e) in overlapping {
            self.runs.remove(&s);
            removed += e.min(end) - s.max(start);
            if s < start {
                self.runs.insert(s, start);
            }
            if e > end {
                self.runs.insert(end, e);
            }
        }
        self.pages -= removed;
        removed
    }
}

/// Events and pages of one page event kind.
#[derive(Clone, Copy, Default)]
pub struct Tally {
    pub events: u64,
    pub pages: u128,
}

impl Tally {
    fn add(&mut self, npages: u64) {
        self.events += 1;
        self.pages += u128::from(npages);
    }

    fn to_json(self) -> Value {
        json!({ "events": self.events, "pages": saturate(self.pages) })
    }
}

/// The page accounting of a whole trace.
#[derive(Default)]
pub struct PageStats {
    /// The info batch's page_size of the generation being read; `None`
    /// before the first generation.
    pub page_size: Option<u64>,
    shift: u32,
    pub alloc: Tally,
    pub free: Tally,
    pub scav: Tally,
    in_use: PageRuns,
    peak: u128,
    /// Largest npages of any single alloc event.
    pub largest_run: u64,
    /// Frees of pages not in use (some or all of the run).
    pub free_not_allocated: u64,
    /// Allocs of pages already in use (some or all of the run).
    pub alloc_in_use: u64,
    /// Scavenges of pages in use (some or all of the run).
    pub scav_in_use: u64,
    /// Page events with npages 0.
    pub zero_npages: u64,
    pub first_anomaly: Option<String>,
    /// The trace is a flight-recorder window (the pass's
    /// `GenerationView::flight_window`).
    pub flight_window: bool,
    /// In a flight-recorder window: frees of pages allocated before the
    /// window (some or all of the run), no anomaly there, as the pass
    /// counts heap frees.
    pub frees_before_window: u64,
    /// The generation being read (as a visitor of a pass).
    generation: u64,
}

/// Where a page event is, for an anomaly's message.
struct At {
    addr: u64,
    time_ns: u64,
    generation: u64,
    thread: u64,
}

/// The pass hands it every event; it needs nothing of the live table.
impl<E: Entry> Visitor<E> for PageStats {
    fn generation(&mut self, generation: &GenerationView, _stacks: &StackTable) {
        self.generation_start(generation.info());
        self.generation = generation.generation();
        self.flight_window = generation.flight_window();
    }

    #[inline]
    fn event(&mut self, op: &Op) {
        let at = At {
            addr: op.addr,
            time_ns: op.time_ns,
            generation: self.generation,
            thread: op.thread,
        };
        self.account(&op.data, &at);
    }

    fn alloc(&mut self, _alloc: &E) {}

    fn free(&mut self, _alloc: &E, _free: &Free) {}
}

impl PageStats {
    fn generation_start(&mut self, info: Option<&GenerationInfo>) {
        if let Some(info) = info {
            // A power of two: the reader checked the info batch.
            self.page_size = Some(info.page_size);
            self.shift = exact_log2(info.page_size).unwrap_or(0);
        }
    }

    /// Accounts a page event, `data`, at `at`; other events are ignored.
    fn account(&mut self, data: &EventData, at: &At) {
        let (npages, what) = match *data {
            EventData::PageAlloc { npages } => {
                self.alloc.add(npages);
                self.largest_run = self.largest_run.max(npages);
                (npages, PageOp::Alloc)
            }
            EventData::PageFree { npages } => {
                self.free.add(npages);
                (npages, PageOp::Free)
            }
            EventData::PageScav { npages } => {
                self.scav.add(npages);
                (npages, PageOp::Scav)
            }
            _ => return,
        };
        if npages == 0 {
            self.zero_npages += 1;
            self.anomaly(data, at, "npages is 0");
            return;
        }
        // An address off the page grid counts from the page that holds it.
        let start = u128::from(at.addr >> self.shift);
        let end = start + u128::from(npages);
        match what {
            PageOp::Alloc => {
                if self.in_use.insert(start, end) > 0 {
                    self.alloc_in_use += 1;
                    self.anomaly(data, at, "allocation of pages already in use");
                }
                self.peak = self.peak.max(self.in_use.pages());
            }
            PageOp::Free => {
                let freed = self.in_use.remove(start, end);
                if freed < end - start && self.flight_window {
                    self.frees_before_window += 1;
                } else if freed < end - start {
                    self.free_not_allocated += 1;
                    self.anomaly(data, at, "free of pages that are not allocated");
                }
            }
            PageOp::Scav => {
                if self.in_use.in_use(start, end) > 0 {
                    self.scav_in_use += 1;
                    self.anomaly(data, at, "scavenge of pages in use");
                }
            }
        }
    }

    fn anomaly(&mut self, data: &EventData, at: &At, what: &str) {
        if self.first_anomaly.is_none() {
            let npages = match *data {
                EventData::PageAlloc { npages }
                | EventData::PageFree { npages }
                | EventData::PageScav { npages } => npages,
                _ => 0,
            };
            self.first_anomaly = Some(format!(
                "{} at {:#x} npages={npages} ({} ns, generation {}, thread {}): {what}",
                data.name(),
                at.addr,
                at.time_ns,
                at.generation,
                at.thread
            ));
        }
    }

    pub fn anomalies(&self) -> u64 {
        self.free_not_allocated + self.alloc_in_use + self.scav_in_use + self.zero_npages
    }

    pub fn pages_in_use(&self) -> u64 {
        saturate(self.in_use.pages())
    }

    pub fn peak_pages_in_use(&self) -> u64 {
        saturate(self.peak)
    }

    fn bytes(&self, pages: u128) -> u64 {
        saturate(pages.saturating_mul(u128::from(self.page_size.unwrap_or(0))))
    }

    pub fn to_json(&self, truncated_at: Option<u64>) -> Value {
        json!({
            "page_alloc": self.alloc.to_json(),
            "page_free": self.free.to_json(),
            "page_scav": self.scav.to_json(),
            "pages_in_use": self.pages_in_use(),
            "peak_pages_in_use": self.peak_pages_in_use(),
            "bytes_in_use": self.bytes(self.in_use.pages()),
            "peak_bytes_in_use": self.bytes(self.peak),
            "runs_in_use": self.in_use.runs(),
            "largest_run": self.largest_run,
            "anomalies": self.anomalies(),
            "anomaly_kinds": {
                "free_not_allocated": self.free_not_allocated,
                "alloc_in_use": self.alloc_in_use,
                "scav_in_use": self.scav_in_use,
                "zero_npages": self.zero_npages,
            },
            "first_anomaly": self.first_anomaly,
            "flight_window": self.flight_window,
            "frees_before_window": self.frees_before_window,
            "page_size": self.page_size,
            "truncated": truncated_at.is_some(),
            "truncated_at": truncated_at,
        })
    }

    pub fn to_text(&self, name: &str, file_bytes: u64, truncated_at: Option<u64>) -> String {
        let mut s = format!(
            "{:<30}{} ({file_bytes} bytes)\n",
            "file",
            crate::print::printable(name)
        );
        let mut row = |name: &str, value: &dyn std::fmt::Display, note: &str| {
            let _ = writeln!(s, "{name:<30}{value:>14}{note}");
        };
        match self.page_size {
            Some(size) => row("page size", &size, " bytes"),
            None => row("page size", &"-", ""),
        }
        let _ = writeln!(s, "{:<30}{:>14}{:>16}", "", "events", "pages");
        for (name, t) in [
            ("page_alloc", self.alloc),
            ("page_free", self.free),
            ("page_scav", self.scav),
        ] {
            let _ = writeln!(s, "{name:<30}{:>14}{:>16}", t.events, saturate(t.pages));
        }
        let mut row = |name: &str, value: &dyn std::fmt::Display, note: &str| {
            let _ = writeln!(s, "{name:<30}{value:>14}{note}");
        };
        let bytes_note = |pages: u128| format!(" pages ({} bytes)", self.bytes(pages));
        row(
            "pages in use",
            &self.pages_in_use(),
            &bytes_note(self.in_use.pages()),
        );
        row(
            "peak pages in use",
            &self.peak_pages_in_use(),
            &bytes_note(self.peak),
        );
        row("runs in use", &self.in_use.runs(), "");
        row("largest run", &self.largest_run, " pages");
        row("anomalies", &self.anomalies(), "");
        row(
            "  free of pages not allocated",
            &self.free_not_allocated,
            "",
        );
        row("  alloc of pages in use", &self.alloc_in_use, "");
        row("  scav of pages in use", &self.scav_in_use, "");
        row("  npages 0", &self.zero_npages, "");
        if self.flight_window {
            row(
                "frees before window",
                &self.frees_before_window,
                " (a flight-recorder window: pages allocated before it)",
            );
        }
        match truncated_at {
            Some(offset) => row("truncated at byte", &offset, ""),
            None => row("truncated", &"no", ""),
        }
        if let Some(first) = &self.first_anomaly {
            let _ = writeln!(s, "first anomaly: {first}");
        }
        s
    }
}

#[derive(Clone, Copy)]
enum PageOp {
    Alloc,
    Free,
    Scav,
}

fn saturate(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// Prints one trace's page stats; a labelled one (one of several) gets a
/// `"file"` key in its JSON object, or a blank line after its table.
pub fn run(input: &Input, json: bool, label: Option<&str>) -> Result<(), Failure> {
    let mut reader = open(input)?;
    let size = input.size();
    let mut stats = PageStats::default();
    let mut progress = Progress::new(size);
    let result =
        Pass::new().run::<_, Size, _>(&mut reader, &mut stats, |bytes| progress.update(bytes));
    progress.finish();
    result?;
    let truncated_at = reader.truncated();
    let text = if json {
        let mut v = stats.to_json(truncated_at);
        if let (Some(name), Some(map)) = (label, v.as_object_mut()) {
            map.insert("file".into(), serde_json::Value::from(name));
        }
        format!("{}\n", crate::print::json_text(&v))
    } else {
        let mut text = stats.to_text(&input.name(), size.max(reader.bytes_read()), truncated_at);
        if label.is_some() {
            text.push('\n');
        }
        text
    };
    print_stdout(&text)?;
    if let Some(offset) = truncated_at {
        eprintln!("{}{}", prefix(label), truncation_warning(offset));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::PageRuns;

    /// The runs against a plain set of pages, on small random operations.
    #[test]
    fn runs_match_a_set_of_pages() {
        let mut runs = PageRuns::default();
        let mut set = std::collections::BTreeSet::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let start = u128::from(x % 200);
            let end = start + u128::from((x >> 8) % 12);
            let before: u128 = (start..end).filter(|p| set.contains(p)).count() as u128;
            assert_eq!(runs.in_use(start, end), before);
            match (x >> 16) % 3 {
                0 => {
                    assert_eq!(runs.insert(start, end), before);
                    set.extend(start..end);
                }
                1 => {
                    assert_eq!(runs.remove(start, end), before);
                    for p in start..end {
                        set.remove(&p);
                    }
                }
                _ => {}
            }
            assert_eq!(runs.pages(), set.len() as u128);
            // Disjoint and not touching: merged as far as they can be.
            let v: Vec<(u128, u128)> = runs.runs.iter().map(|(&s, &e)| (s, e)).collect();
            assert!(v.iter().all(|&(s, e)| s < e));
            assert!(v.windows(2).all(|w| w[0].1 < w[1].0), "{v:?}");
        }
    }
}
