//! `alloctrace check`: a verdict with an exit code scripts can test.
//! 0 ok, 2 malformed, 3 truncated, 4 inconsistent (1: cannot open or read).
//! When several apply, the first in that order wins: a malformed file says
//! nothing reliable about the rest, and a cut-off trace explains anomalies.

use serde_json::json;

use crate::failure::Failure;
use crate::input::Input;
use crate::print::{prefix, print_stdout};
use crate::stats::{self, Stats};

struct Verdict {
    status: &'static str,
    code: u8,
    message: String,
    /// Byte offset of the problem, where there is one.
    offset: Option<u64>,
}

/// Checks one trace; a labelled one (one of several) has its name before
/// each message, or a `"file"` key in its JSON object.
pub fn run(input: &Input, json: bool, label: Option<&str>) -> Result<(), Failure> {
    let (verdict, stats) = match stats::collect(input) {
        Ok(stats) => (judge(&stats), Some(stats)),
        Err(Failure::Malformed(err)) => {
            let message = format!(
                "malformed: {err}\nThe file is damaged at that offset, or is not an alloctrace trace. \
                 Everything before it can still be read with `alloctrace dump`; \
                 if the alloctrace writer produced this file, please report a bug with the file attached."
            );
            (
                Verdict {
                    status: "malformed",
                    code: 2,
                    message,
                    offset: Some(err.offset()),
                },
                None,
            )
        }
        Err(other) => return Err(other),
    };
    if json {
        let summary = stats.as_ref().map(|s| {
            json!({
                "events": s.total_events,
                "generations": s.generations,
                "threads": s.threads(),
                "anomalies": s.anomalies(),
                "page_anomalies": s.page_anomalies(),
                "unknown_type_refs": s.unknown_type_refs,
                "lost_events": s.lost_events,
                "lost_stacks": s.lost_stacks,
                "truncated_at": s.truncated_at,
                "flight_window": s.flight_window,
                "frees_before_window": s.frees_before_window,
            })
        });
        let mut obj = json!({
            "status": verdict.status,
            "exit_code": verdict.code,
            "message": verdict.message,
            "offset": verdict.offset,
        });
        if let (Some(map), Some(serde_json::Value::Object(summary))) =
            (obj.as_object_mut(), summary)
        {
            map.extend(summary);
        }
        if let (Some(name), Some(map)) = (label, obj.as_object_mut()) {
            map.insert("file".into(), serde_json::Value::from(name));
        }
        print_stdout(&format!("{}\n", crate::print::json_text(&obj)))?;
    } else if verdict.code == 0 {
        print_stdout(&format!("{}{}\n", prefix(label), verdict.message))?;
    } else {
        eprintln!("{}{}", prefix(label), verdict.message);
    }
    if let Some(s) = stats.as_ref().filter(|s| s.lost_events > 0) {
        eprintln!(
            "{}warning: the writer could not record {} events (counted in generation-end batches); see lost_events in `alloctrace stats`",
            prefix(label),
            s.lost_events
        );
    }
    if let Some(s) = stats.as_ref().filter(|s| s.lost_stacks > 0) {
        eprintln!(
            "{}warning: {} allocations were recorded without their call stack (counted in generation-end batches as lost_stacks): the allocations are in the trace, their stacks are not",
            prefix(label),
            s.lost_stacks
        );
    }
    match verdict.code {
        0 => Ok(()),
        code => Err(Failure::Verdict(code)),
    }
}

fn judge(s: &Stats) -> Verdict {
    if let Some(offset) = s.truncated_at {
        let message = format!(
            "truncated: the trace ends at byte offset {offset} without its trace-end batch \
             (the process was probably killed before trace_stop).\n\
             The {} events of every complete batch before the cut are intact: `alloctrace dump` and `alloctrace stats` read them. \
             To get complete traces, make sure trace_stop runs before the process exits.",
            s.total_events
        );
        return Verdict {
            status: "truncated",
            code: 3,
            message,
            offset: Some(offset),
        };
    }
    if s.anomalies() > 0 || s.unknown_type_refs > 0 || s.page_anomalies() > 0 {
        let p = &s.pages;
        let mut message = format!(
            "inconsistent: {} anomalies ({} frees of addresses that are not live, {} allocations of addresses already live), \
             {} heap object events with a type ID missing from their generation's type table.",
            s.anomalies(),
            s.unknown_free(),
            s.double_alloc(),
            s.unknown_type_refs
        );
        if s.page_anomalies() > 0 {
            message.push_str(&format!(
                " {} page anomalies ({} frees of pages not allocated, {} allocations of pages in use, \
                 {} scavenges of pages in use, {} page events of 0 pages).",
                s.page_anomalies(),
                p.free_not_allocated,
                p.alloc_in_use,
                p.scav_in_use,
                p.zero_npages
            ));
        }
        if let Some(first) = &s.first_anomaly {
            message.push_str(&format!("\nfirst anomaly: {first}"));
        }
        if let Some(first) = &p.first_anomaly {
            message.push_str(&format!("\nfirst page anomaly: {first}"));
        }
        if let Some(first) = &s.first_unknown_type {
            message.push_str(&format!("\nfirst unknown type: {first}"));
        }
        message.push_str(
            "\nThe file is well formed, but the recorded program reported frees or allocations the trace cannot pair up \
             (a path that allocates or frees without calling the tracer, a type used before trace_type_register, \
             or lost events). `alloctrace dump` shows the events around the times above; `alloctrace pages` sums up the page events.",
        );
        return Verdict {
            status: "inconsistent",
            code: 4,
            message,
            offset: None,
        };
    }
    let mut message = format!(
        "ok: {} in {}, {}",
        plural(s.total_events, "event"),
        plural(s.generations, "generation"),
        plural(s.threads(), "thread")
    );
    if s.flight_window {
        message.push_str(&format!(
            " (a flight-recorder window: the last generations of the run; {} of memory allocated before it)",
            plural(s.frees_before_window, "free")
        ));
    }
    Verdict {
        status: "ok",
        code: 0,
        message,
        offset: None,
    }
}

/// `1 generation`, `2 generations`.
fn plural(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
