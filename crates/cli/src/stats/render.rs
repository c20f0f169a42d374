//! The output of `alloctrace stats`: a [`Stats`] as a text table or a JSON
//! object (docs/CLI.md).

use std::fmt::Write as _;

use alloctrace_format::ENTRY_POINTS;
use serde_json::{json, Value};

use super::count::kind_names;
use super::Stats;

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
            "lost_stacks": self.lost_stacks,
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
        if self.lost_stacks > 0 {
            row("lost stacks", &self.lost_stacks, "");
        }
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
