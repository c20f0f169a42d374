//! The output of `alloctrace stats`: a [`Stats`] as a text table in human
//! units or a JSON object of exact numbers (docs/CLI.md).

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use alloctrace_format::ENTRY_POINTS;
use serde_json::{json, Value};

use super::count::kind_names;
use super::Stats;
use crate::print::printable;
use crate::units::{bytes, count, duration, Decimals};

/// Rows of threads and of types the table shows without `--all`.
const TOP_ROWS: usize = 10;

/// The UTC time `wall_ns` after the Unix epoch, ISO 8601 to the
/// millisecond: `2026-11-26T17:35:33.123Z`.
fn iso_time(wall_ns: u64) -> String {
    let t = SystemTime::UNIX_EPOCH + Duration::from_nanos(wall_ns);
    humantime::format_rfc3339_millis(t).to_string()
}

/// The command line as a shell would take it back (arguments quoted where
/// needed).
fn shell_line(args: &[String]) -> String {
    shlex::try_join(args.iter().map(String::as_str)).unwrap_or_else(|_| args.join(" "))
}

impl Stats {
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
        let per_type: Vec<Value> = self
            .types_by_bytes(true)
            .into_iter()
            .map(|(id, name, allocations, bytes)| {
                json!({"id": id, "name": name, "size": self.type_names.get(&id).map(|t| t.1), "allocations": allocations, "bytes": bytes})
            })
            .collect();
        let process = self.process.as_ref();
        let command = process.and_then(|p| p.command.as_ref());
        let mut v = json!({
            "events": counts,
            "total_events": self.total_events,
            "generations": self.generations,
            "threads": self.threads(),
            "per_thread": per_thread,
            "types": self.type_ids.len(),
            "per_type": per_type,
            "live_objects": self.live_objects(),
            "live_bytes": self.live_bytes(),
            "peak_live_bytes": self.peak_live_bytes(),
            "peak_live_objects": self.peak_live_objects(),
            "live_spans": self.live_spans(),
            "live_span_bytes": self.live_span_bytes(),
            "peak_live_spans": self.peak_live_spans(),
            "peak_live_span_bytes": self.peak_live_span_bytes(),
            "peak_live_total_bytes": self.peak_live_total_bytes(),
            "live_stacks": self.live_stacks(),
            "lost_events": self.lost_events,
            "lost_stacks": self.lost_stacks,
            "anomalies": self.anomalies(),
            "anomaly_kinds": { "unknown_free": self.unknown_free, "double_alloc": self.double_alloc },
            "flight_window": self.flight_window,
            "frees_before_window": self.frees_before_window,
            "long_form_events": self.long_form_events,
            "duration_ns": self.duration_ns,
            "bytes": self.bytes,
            "truncated": self.truncated_at.is_some(),
            "truncated_at": self.truncated_at,
            "page_anomalies": self.page_anomalies(),
            // Page events are decoded since this key came: always 0, kept
            // for scripts that read it.
            "skipped_page_events": 0,
            "pid": process.map(|p| p.pid),
            "start_wall_ns": process.map(|p| p.start_wall_ns),
            "start_time": process.map(|p| iso_time(p.start_wall_ns)),
            "command": command.map(|c| &c.command_line),
            "command_truncated": command.is_some_and(|c| c.truncated),
        });
        if let (true, Some(map)) = (self.sample_bytes > 0, v.as_object_mut()) {
            // A sampled trace: the events are the samples; the exact
            // totals are the writer's counts.
            map.insert(
                "sampled".into(),
                json!({
                    "sample_bytes": self.sample_bytes,
                    "total_allocs": self.totals.allocs,
                    "total_alloc_bytes": self.totals.alloc_bytes,
                    "total_frees": self.totals.frees,
                    "sample_set_overflow": self.totals.sample_overflow,
                }),
            );
        }
        if let (true, Some(map)) = (self.has_entry_points(), v.as_object_mut()) {
            let entries: serde_json::Map<String, Value> = ENTRY_POINTS
                .iter()
                .map(|&e| (e.name().to_string(), json!(self.entry_point(e))))
                .collect();
            map.insert("entry_points".into(), Value::Object(entries));
        }
        v
    }

    /// A two-column table: names left, values right-aligned, in human
    /// units. Rows that would say 0 (event kinds, entry points, anomaly
    /// kinds) are left out, and only the busiest threads and types shown,
    /// unless `all`.
    pub fn to_text(&self, name: &str, all: bool) -> String {
        let mut s = format!(
            "{:<24}{} ({})\n",
            "file",
            printable(name),
            bytes(self.bytes, Decimals::Fixed(2))
        );
        if let Some(p) = &self.process {
            let _ = writeln!(s, "{:<24}{}", "pid", p.pid);
            match &p.command {
                Some(c) => {
                    let cut = if c.truncated { " [cut]" } else { "" };
                    let line = shell_line(&c.command_line);
                    let line = printable(&line);
                    let _ = writeln!(s, "{:<24}{line}{cut}", "command");
                }
                None => {
                    let _ = writeln!(s, "{:<24}(not recorded)", "command");
                }
            }
            let _ = writeln!(s, "{:<24}{}", "started", iso_time(p.start_wall_ns));
        }
        let _ = writeln!(s, "{:<24}{}", "duration", duration(self.duration_ns));
        let mut row = |name: &str, value: &str, note: &str| {
            let _ = writeln!(s, "{name:<24}{value:>12}{note}");
        };
        row("events", &count(self.total_events), "");
        for (kind, n) in kind_names().zip(self.counts) {
            if n > 0 || all {
                row(&format!("  {kind}"), &count(n), "");
            }
        }
        row("generations", &count(self.generations), "");
        if self.flight_window {
            row(
                "flight-recorder window",
                "yes",
                ": the last generations of the run, not all of it",
            );
            row(
                "  frees before it",
                &count(self.frees_before_window),
                " frees of memory allocated before the window (expected)",
            );
        }
        row("threads", &count(self.threads()), "");
        let mut threads: Vec<_> = self.per_thread.iter().collect();
        threads.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let shown = if all { threads.len() } else { TOP_ROWS };
        for (thread, n) in threads.iter().take(shown) {
            row(&format!("  thread {thread}"), &count(**n), " events");
        }
        if threads.len() > shown {
            row(
                &format!("  {} more", threads.len() - shown),
                "",
                "   (--all lists them)",
            );
        }
        row("types", &count(self.type_ids.len() as u64), "");
        let types = self.types_by_bytes(all);
        let shown = if all { types.len() } else { TOP_ROWS };
        for (id, name, allocations, total) in types.iter().take(shown) {
            let name = match name {
                Some(name) => format!("  {}", printable(name)),
                None => format!("  type {id} (no name)"),
            };
            let noun = if *allocations == 1 {
                "allocation"
            } else {
                "allocations"
            };
            row(
                &name,
                &bytes(*total, Decimals::Fixed(2)),
                &format!("  in {} {noun}", count(*allocations)),
            );
        }
        if types.len() > shown {
            row(
                &format!("  {} more", types.len() - shown),
                "",
                "   (--all lists them)",
            );
        }
        row("live heap objects", &count(self.live_objects()), "");
        row(
            "live heap bytes",
            &bytes(self.live_bytes(), Decimals::Fixed(2)),
            "",
        );
        row(
            "peak live heap objects",
            &count(self.peak_live_objects()),
            "",
        );
        row(
            "peak live heap bytes",
            &bytes(self.peak_live_bytes(), Decimals::Fixed(2)),
            "",
        );
        row("live spans", &count(self.live_spans()), "");
        row(
            "live span bytes",
            &bytes(self.live_span_bytes(), Decimals::Fixed(2)),
            "",
        );
        row("peak live spans", &count(self.peak_live_spans()), "");
        row(
            "peak live span bytes",
            &bytes(self.peak_live_span_bytes(), Decimals::Fixed(2)),
            "",
        );
        row(
            "peak live total bytes",
            &bytes(self.peak_live_total_bytes(), Decimals::Fixed(2)),
            "  (heap + spans at one moment)",
        );
        row("live stacks", &count(self.live_stacks()), "");
        if self.long_form_events > 0 || all {
            row("long-form events", &count(self.long_form_events), "");
        }
        if self.has_entry_points() || all {
            row(
                "entry points",
                &count(self.entry_points.iter().sum::<u64>()),
                " tagged events",
            );
            for e in ENTRY_POINTS {
                let n = self.entry_point(e);
                if n > 0 || all {
                    row(&format!("  {}", e.name()), &count(n), "");
                }
            }
        }
        if self.sample_bytes > 0 {
            row(
                "sampled every",
                &bytes(self.sample_bytes, Decimals::Fixed(2)),
                "  (--sample-bytes: the events above are samples)",
            );
            row("  allocations (exact)", &count(self.totals.allocs), "");
            row(
                "  bytes allocated (exact)",
                &bytes(self.totals.alloc_bytes, Decimals::Fixed(2)),
                "",
            );
            row("  frees (exact)", &count(self.totals.frees), "");
            row(
                "  sampled set overflow",
                &count(self.totals.sample_overflow),
                "  (recorded, their frees not)",
            );
        }
        row("lost events", &count(self.lost_events), "");
        if self.lost_stacks > 0 || all {
            row("lost stacks", &count(self.lost_stacks), "");
        }
        row("anomalies", &count(self.anomalies()), "");
        if self.unknown_free > 0 || all {
            row("  unknown frees", &count(self.unknown_free), "");
        }
        if self.double_alloc > 0 || all {
            row("  double allocs", &count(self.double_alloc), "");
        }
        row(
            "page anomalies",
            &count(self.page_anomalies()),
            "  (alloctrace pages)",
        );
        match self.truncated_at {
            Some(offset) => row("truncated at byte", &offset.to_string(), ""),
            None => row("truncated", "no", ""),
        }
        s
    }
}
