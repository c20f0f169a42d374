//! The alloctrace binary on traces built by the reader's test builder.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use alloctrace_reader::testing::{info, sample_trace, EventsBody, TraceBuilder};
use alloctrace_reader::{EventData, TypeInfo};
use serde_json::{json, Value};

/// Writes `bytes` to a fresh file under the test target directory.
fn trace_file(bytes: &[u8]) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli-{}-{n}.trace", std::process::id()));
    std::fs::write(&path, bytes).expect("write trace");
    path
}

fn alloctrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .args(args)
        .output()
        .expect("run alloctrace")
}

fn run(cmd: &str, bytes: &[u8], extra: &[&str]) -> (i32, String, String) {
    let path = trace_file(bytes);
    let mut args = vec![cmd, path.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = alloctrace(&args);
    let _ = std::fs::remove_file(&path);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const SAMPLE_DUMP: &str = "\
type gen=1 id=1 size=48 ptr_bytes=16 name=struct node
type gen=1 id=2 size=32 ptr_bytes=0 name=char[32]
100 gen=1 thread=1 span_exists addr=0x20000 npages=2 class=7
200 gen=1 thread=1 heap_object_exists addr=0x10040 size=48 type=1
250 gen=1 thread=2 stack_alloc addr=0x50000 size=3000 long
300 gen=1 thread=1 stack_exists addr=0x40000 size=8192
300 gen=1 thread=2 heap_object_alloc addr=0x10008 size=24 type=0 long
400 gen=1 thread=1 span_alloc addr=0x22000 npages=1 class=3
500 gen=1 thread=1 heap_object_alloc addr=0x10080 size=32 type=2
600 gen=1 thread=1 heap_object_free addr=0x10040
700 gen=1 thread=2 stack_free addr=0x50000
800 gen=1 thread=2 span_free addr=0x22000
type gen=2 id=1 size=48 ptr_bytes=16 name=struct node
type gen=2 id=2 size=32 ptr_bytes=0 name=char[32]
4100 gen=2 thread=1 heap_object_free addr=0x10080
4200 gen=2 thread=1 stack_free addr=0x40000
4300 gen=2 thread=1 heap_object_free addr=0x10008 long
";

const WARNING_PREFIX: &str = "warning: trace truncated at byte offset";

/// The sample trace without its trace-end batch (the last 8 bytes: kind,
/// length, and the generation, thread and base varints).
fn sample_without_end() -> Vec<u8> {
    let mut bytes = sample_trace();
    bytes.truncate(bytes.len() - 8);
    bytes
}

#[test]
fn dump_text_is_exact() {
    let (code, out, err) = run("dump", &sample_trace(), &[]);
    assert_eq!((code, err.as_str()), (0, ""));
    assert_eq!(out, SAMPLE_DUMP);
}

#[test]
fn dump_json_has_one_object_per_event() {
    let (code, out, _) = run("dump", &sample_trace(), &["--json"]);
    assert_eq!(code, 0);
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(lines.len(), 13);
    assert_eq!(
        lines[0],
        json!({"time_ns": 100, "gen": 1, "thread": 1, "kind": "span_exists", "addr": 0x20000, "long_form": false, "npages": 2, "class": 7})
    );
    assert_eq!(
        lines[4],
        json!({"time_ns": 300, "gen": 1, "thread": 2, "kind": "heap_object_alloc", "addr": 0x10008, "long_form": true, "size": 24, "type": 0})
    );
    assert_eq!(
        lines[2],
        json!({"time_ns": 250, "gen": 1, "thread": 2, "kind": "stack_alloc", "addr": 0x50000, "long_form": true, "size": 3000})
    );
    assert_eq!(
        lines[12],
        json!({"time_ns": 4300, "gen": 2, "thread": 1, "kind": "heap_object_free", "addr": 0x10008, "long_form": true})
    );
}

#[test]
fn stats_json_is_exact() {
    let bytes = sample_trace();
    let (code, out, err) = run("stats", &bytes, &["--json"]);
    assert_eq!((code, err.as_str()), (0, ""));
    let got: Value = serde_json::from_str(&out).expect("one JSON object");
    let expected = json!({
        "events": {
            "span_exists": 1, "span_alloc": 1, "span_free": 1,
            "heap_object_exists": 1, "heap_object_alloc": 2, "heap_object_free": 3, "call": 0,
            "stack_exists": 1, "stack_alloc": 1, "stack_free": 2
        },
        "total_events": 13,
        "generations": 2,
        "threads": 2,
        "per_thread": {"1": 9, "2": 4},
        "types": 2,
        // 48 (exists) + 24 + 32 live at once before the first free.
        "live_objects": 0,
        "live_bytes": 0,
        "peak_live_bytes": 104,
        "live_spans": 1,
        "live_stacks": 0,
        "lost_events": 3,
        "anomalies": 0,
        "anomaly_kinds": {"unknown_free": 0, "double_alloc": 0},
        "long_form_events": 3,
        "duration_ns": 5000,
        "bytes": bytes.len(),
        "truncated": false,
        "truncated_at": null,
        "skipped_page_events": 0
    });
    assert_eq!(got, expected);
}

#[test]
fn stats_tracks_live_maps_and_anomalies() {
    let g = info(1);
    let mut b = EventsBody::new(1000);
    b.event(
        &g,
        1001,
        0x10010,
        &EventData::HeapObjectAlloc {
            size: 100,
            type_id: 0,
        },
    )
    .event(
        &g,
        1002,
        0x10020,
        &EventData::HeapObjectAlloc {
            size: 50,
            type_id: 0,
        },
    )
    .event(
        &g,
        1003,
        0x10010,
        &EventData::HeapObjectAlloc {
            size: 10,
            type_id: 0,
        },
    ) // double alloc: replaces 100
    .event(&g, 1004, 0x10030, &EventData::HeapObjectFree) // unknown free
    .event(
        &g,
        1005,
        0x20000,
        &EventData::SpanAlloc {
            npages: 1,
            kind_class: 0,
        },
    )
    // Same address in another space is not a double alloc.
    .event(&g, 1006, 0x20000, &EventData::StackAlloc { size: 4096 })
    .event(&g, 1007, 0x20000, &EventData::SpanFree)
    .event(&g, 1008, 0x20000, &EventData::SpanFree); // unknown free
    let mut t = TraceBuilder::new();
    t.info(&g)
        .events(1, 5, &b)
        .generation_end(1, 2000, 5_001_000, 0)
        .trace_end(1);
    let (code, out, _) = run("stats", t.bytes(), &["--json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["live_objects"], 2);
    assert_eq!(v["live_bytes"], 60);
    assert_eq!(v["peak_live_bytes"], 150);
    assert_eq!(v["live_spans"], 0);
    assert_eq!(v["live_stacks"], 1);
    assert_eq!(v["anomalies"], 3);
    assert_eq!(
        v["anomaly_kinds"],
        json!({"unknown_free": 2, "double_alloc": 1})
    );
    assert_eq!(v["threads"], 1);

    let (code, _, err) = run("check", t.bytes(), &[]);
    assert_eq!(code, 4, "{err}");
    assert!(
        err.starts_with("inconsistent: 3 anomalies (2 frees"),
        "{err}"
    );
    assert!(
        err.contains("first anomaly: heap_object_alloc at 0x10010 (3 ns, generation 1, thread 5)"),
        "{err}"
    );
}

#[test]
fn stats_text_is_a_table() {
    let (code, out, _) = run("stats", &sample_trace(), &[]);
    assert_eq!(code, 0);
    assert!(
        out.contains("\nevents                            13\n"),
        "{out}"
    );
    assert!(
        out.contains("\n  heap_object_free                 3\n"),
        "{out}"
    );
    assert!(
        out.contains("\npeak live bytes                  104\n"),
        "{out}"
    );
    assert!(
        out.contains("\ntruncated                         no\n"),
        "{out}"
    );
}

#[test]
fn check_ok() {
    let (code, out, _) = run("check", &sample_trace(), &[]);
    assert_eq!(code, 0);
    assert_eq!(out, "ok: 13 events in 2 generations, 2 threads\n");
    let (code, out, _) = run("check", &sample_trace(), &["--json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (
            v["status"].as_str(),
            v["exit_code"].as_u64(),
            v["events"].as_u64()
        ),
        (Some("ok"), Some(0), Some(13))
    );
}

#[test]
fn check_malformed_exits_2_with_the_offset() {
    let mut bytes = sample_trace();
    // The first batch's kind byte.
    bytes[16] = 9;
    let (code, out, err) = run("check", &bytes, &[]);
    assert_eq!((code, out.as_str()), (2, ""));
    assert!(
        err.starts_with("malformed: malformed trace at byte offset 16: unknown batch kind 9\n"),
        "{err}"
    );
    let (code, out, _) = run("check", &bytes, &["--json"]);
    assert_eq!(code, 2);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["status"].as_str(), v["offset"].as_u64()),
        (Some("malformed"), Some(16))
    );

    let (code, _, err) = run("check", b"definitely not a trace", &[]);
    assert_eq!(code, 2);
    assert!(err.contains("not an alloctrace trace"), "{err}");
}

#[test]
fn check_truncated_exits_3() {
    let bytes = sample_without_end();
    let (code, _, err) = run("check", &bytes, &[]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.starts_with(&format!(
            "truncated: the trace ends at byte offset {} without its trace-end batch",
            bytes.len()
        )),
        "{err}"
    );
    // Cut inside a batch: the offset is the batch's start.
    let full = sample_trace();
    let (code, _, err) = run("check", &full[..full.len() - 3], &[]);
    assert_eq!(code, 3);
    assert!(
        err.contains(&format!("byte offset {}", full.len() - 8)),
        "{err}"
    );
}

#[test]
fn check_unknown_type_exits_4() {
    let g = info(1);
    let mut b = EventsBody::new(1000);
    b.event(
        &g,
        1001,
        0x10010,
        &EventData::HeapObjectAlloc {
            size: 8,
            type_id: 9,
        },
    );
    let mut t = TraceBuilder::new();
    let types = [TypeInfo {
        id: 1,
        size: 8,
        ptr_bytes: 0,
        name: "x".into(),
    }];
    t.info(&g)
        .events(1, 1, &b)
        .types(1, &types)
        .generation_end(1, 2000, 5_001_000, 0)
        .trace_end(1);
    let (code, _, err) = run("check", t.bytes(), &[]);
    assert_eq!(code, 4, "{err}");
    assert!(
        err.contains("1 heap object events with a type ID missing"),
        "{err}"
    );
    assert!(
        err.contains("has type ID 9, which is not in the generation's type table"),
        "{err}"
    );
}

#[test]
fn truncation_warning_on_dump_and_stats() {
    let bytes = sample_without_end();
    let expected = format!(
        "warning: trace truncated at byte offset {} (the process was probably killed); showing every complete batch before it\n",
        bytes.len()
    );
    let (code, out, err) = run("dump", &bytes, &[]);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (0, SAMPLE_DUMP, expected.as_str())
    );
    let (code, out, err) = run("stats", &bytes, &["--json"]);
    assert_eq!((code, err.as_str()), (0, expected.as_str()));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["truncated"].as_bool(), v["truncated_at"].as_u64()),
        (Some(true), Some(bytes.len() as u64))
    );
    assert!(err.starts_with(WARNING_PREFIX));
}

#[test]
fn dump_prints_what_it_read_before_an_error() {
    let g = info(1);
    let mut b = EventsBody::new(1000);
    b.event(&g, 1001, 0x10010, &EventData::HeapObjectFree);
    let mut t = TraceBuilder::new();
    t.info(&g)
        .events(1, 1, &b)
        .generation_end(1, 2000, 5_001_000, 0);
    let at = t.len();
    t.batch(1, 3, 1, 0, &[]); // generation 3 after 1: 2 is missing
    let (code, out, err) = run("dump", t.bytes(), &[]);
    assert_eq!(code, 2);
    assert_eq!(out, "1 gen=1 thread=1 heap_object_free addr=0x10010\n");
    assert!(
        err.starts_with(&format!(
            "error: malformed trace at byte offset {at}: batch of generation 3"
        )),
        "{err}"
    );
}

#[test]
fn missing_file_and_usage_errors_exit_1() {
    let out = alloctrace(&["stats", "/nonexistent/dir/app.trace"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot open /nonexistent/dir/app.trace"),
        "{err}"
    );
    assert_eq!(alloctrace(&["check"]).status.code(), Some(1));
    assert_eq!(alloctrace(&["frobnicate", "x"]).status.code(), Some(1));
    assert_eq!(alloctrace(&[]).status.code(), Some(1));
    let help = alloctrace(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("dump"));
}

#[test]
fn type_names_stay_on_one_line() {
    let mut t = TraceBuilder::new();
    let types = [TypeInfo {
        id: 3,
        size: 1,
        ptr_bytes: 0,
        name: "two\nlines and spaces".into(),
    }];
    t.info(&info(1))
        .types(1, &types)
        .generation_end(1, 2000, 5_001_000, 0)
        .trace_end(1);
    let (code, out, _) = run("dump", t.bytes(), &[]);
    assert_eq!(code, 0);
    assert_eq!(
        out,
        "type gen=1 id=3 size=1 ptr_bytes=0 name=two\\nlines and spaces\n"
    );
}

#[test]
fn page_events_are_counted_and_noted() {
    use alloctrace_format::pages::{sync_word, Layout, KIND_ALLOC, SYNC_THREAD, SYNC_TIME};
    let layout = Layout {
        page_shift: 12,
        lost_bits: 7,
    };
    let body: Vec<u8> = [
        layout.word(),
        sync_word(SYNC_THREAD, 1),
        sync_word(SYNC_TIME, 8),
        layout.event_word(KIND_ALLOC, 0x7000_0000, 3, 5),
        layout.event_word(KIND_ALLOC, 0x7000_4000, 1, 6),
    ]
    .iter()
    .flat_map(|w| w.to_le_bytes())
    .collect();
    let mut t = TraceBuilder::new();
    t.info(&info(1))
        .batch(6, 1, 1, 1000, &body)
        .generation_end(1, 2000, 5_001_000, 0)
        .trace_end(1);
    let note = "note: 2 page-tracer events (pages batches) were checked but are not shown: this version does not decode them yet\n";
    let (code, out, err) = run("check", t.bytes(), &[]);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (0, "ok: 0 events in 1 generations, 0 threads\n", note)
    );
    let (code, out, err) = run("dump", t.bytes(), &[]);
    assert_eq!((code, out.as_str(), err.as_str()), (0, "", note));
    let (_, out, _) = run("stats", t.bytes(), &["--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["skipped_page_events"], 2);
}
