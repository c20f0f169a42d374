//! The alloctrace binary on traces built by the reader's test builder.

use std::path::{Path, PathBuf};
use std::process::Command;

mod support;

use support::alloctrace;

use alloctrace_reader::testing::{info, sample_trace, EventsBody, PagesBody, TraceBuilder};
use alloctrace_reader::{EventData, TypeInfo};
use serde_json::{json, Value};

/// Writes `bytes` to a fresh file under the test target directory.
fn trace_file(bytes: &[u8]) -> PathBuf {
    support::temp_file("cli", bytes, "trace")
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
    // The trace-end batch: 8 bytes and its trailer.
    bytes.truncate(bytes.len() - 8 - alloctrace_format::TRAILER_LEN);
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
            "stack_exists": 1, "stack_alloc": 1, "stack_free": 2,
            "page_alloc": 0, "page_free": 0, "page_scav": 0
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
        "lost_stacks": 0,
        "anomalies": 0,
        "anomaly_kinds": {"unknown_free": 0, "double_alloc": 0},
        "long_form_events": 3,
        "duration_ns": 5000,
        "bytes": bytes.len(),
        "truncated": false,
        "truncated_at": null,
        "page_anomalies": 0,
        "skipped_page_events": 0,
        // New keys; the ones above are unchanged (scripts read them).
        "per_type": [
            {"id": 1, "name": "struct node", "size": 48, "allocations": 1, "bytes": 48},
            {"id": 2, "name": "char[32]", "size": 32, "allocations": 1, "bytes": 32}
        ],
        "peak_live_objects": 3,
        // Spans of 4 KiB pages: 2 exist, 1 comes and goes.
        "live_span_bytes": 8192,
        "peak_live_spans": 2,
        "peak_live_span_bytes": 12288,
        // At 500 ns: spans of 3 pages and the heap's 104 bytes.
        "peak_live_total_bytes": 12392,
        "pid": 4242,
        "start_wall_ns": 1_700_000_000_000_000_000u64,
        "start_time": "2023-11-14T22:13:20.000Z",
        // A version-4 trace without a process batch.
        "command": null,
        "command_truncated": false,
        // Not a flight recorder's dump.
        "flight_window": false,
        "frees_before_window": 0
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
    let bytes = sample_trace();
    let (code, out, _) = run("stats", &bytes, &[]);
    assert_eq!(code, 0);
    let (_, body) = out.split_once('\n').unwrap();
    assert_eq!(
        body,
        "\
pid                     4242
command                 (not recorded)
started                 2023-11-14T22:13:20.000Z
duration                5.00 µs
events                            13
  span_exists                      1
  span_alloc                       1
  span_free                        1
  heap_object_exists               1
  heap_object_alloc                2
  heap_object_free                 3
  stack_exists                     1
  stack_alloc                      1
  stack_free                       2
generations                        2
threads                            2
  thread 1                         9 events
  thread 2                         4 events
types                              2
  struct node                   48 B  in 1 allocation
  char[32]                      32 B  in 1 allocation
live heap objects                  0
live heap bytes                  0 B
peak live heap objects             3
peak live heap bytes           104 B
live spans                         1
live span bytes             8.00 KiB
peak live spans                    2
peak live span bytes       12.00 KiB
peak live total bytes      12.10 KiB  (heap + spans at one moment)
live stacks                        0
long-form events                   3
lost events                        3
anomalies                          0
page anomalies                     0  (alloctrace pages)
truncated                         no
"
    );
    let first = out.lines().next().unwrap();
    assert!(
        first.starts_with("file                    /")
            && first.ends_with(&format!(".trace ({} B)", bytes.len())),
        "{first}"
    );
    // --all: the zero rows too.
    let (code, all, _) = run("stats", &bytes, &["--all"]);
    assert_eq!(code, 0);
    for line in [
        "\n  call                             0\n",
        "\n  page_scav                        0\n",
        "\n  malloc                           0\n",
        "\n  double allocs                    0\n",
        "\nlost stacks                        0\n",
    ] {
        assert!(all.contains(line) && !out.contains(line), "{line:?}: {all}");
    }
}

#[test]
fn stats_names_the_process_and_its_command() {
    use alloctrace_reader::testing::process_trace;
    let (code, out, _) = run("stats", &process_trace(), &[]);
    assert_eq!(code, 0);
    // Quoted as a shell would take it back; the invalid byte as U+FFFD.
    assert!(
        out.contains("\npid                     4242\ncommand                 /bin/app --size 3 'x\u{fffd}y'\nstarted                 2023-11-14T22:13:20.000Z\n"),
        "{out}"
    );
    let (_, out, _) = run("stats", &process_trace(), &["--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    // The first generation's command line.
    assert_eq!(
        v["command"],
        json!(["/bin/app", "--size", "3", "x\u{fffd}y"])
    );
    assert_eq!(v["command_truncated"], false);
    assert_eq!(v["pid"], 4242);
}

#[test]
fn stats_counts_types_and_peaks_in_human_units() {
    let g = info(1);
    let mut b = EventsBody::new(1000);
    let alloc = |size, type_id| EventData::HeapObjectAlloc { size, type_id };
    // 20,000 objects of type 1 (64 B), 3 of type 2 (1 MiB), one untyped;
    // then all of type 1 freed, and a 2 MiB span allocated: the heap peaks
    // with type 1's objects, the total with the span.
    let mut ticks = 1001;
    for i in 0..20_000u64 {
        b.event(&g, ticks, 0x100_0000 + i * 64, &alloc(64, 1));
        ticks += 1;
    }
    for i in 0..3u64 {
        b.event(&g, ticks, 0x4000_0000 + i * (1 << 20), &alloc(1 << 20, 2));
        ticks += 1;
    }
    b.event(&g, ticks, 0x5000_0000, &alloc(100, 0));
    ticks += 1;
    for i in 0..20_000u64 {
        b.event(&g, ticks, 0x100_0000 + i * 64, &EventData::HeapObjectFree);
        ticks += 1;
    }
    b.event(
        &g,
        ticks,
        0x6000_0000,
        &EventData::SpanAlloc {
            npages: 1024,
            kind_class: 0,
        },
    );
    let types = [
        TypeInfo {
            id: 1,
            size: 64,
            ptr_bytes: 8,
            name: "struct small".into(),
        },
        TypeInfo {
            id: 2,
            size: 1 << 20,
            ptr_bytes: 0,
            name: "big_buffer".into(),
        },
        // Defined, never allocated; a line break in its name.
        TypeInfo {
            id: 3,
            size: 8,
            ptr_bytes: 8,
            name: "unused\nnode".into(),
        },
    ];
    let mut t = TraceBuilder::new();
    t.info(&g)
        .types(1, &types)
        .events(1, 1, &b)
        .generation_end(1, 100_000, 5_099_000, 0)
        .trace_end(1);
    let (code, out, _) = run("stats", t.bytes(), &["--json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["per_type"],
        json!([
            {"id": 2, "name": "big_buffer", "size": 1 << 20, "allocations": 3, "bytes": 3 << 20},
            {"id": 1, "name": "struct small", "size": 64, "allocations": 20_000, "bytes": 20_000 * 64},
            {"id": 3, "name": "unused\nnode", "size": 8, "allocations": 0, "bytes": 0}
        ])
    );
    let heap_peak = 20_000 * 64 + (3 << 20) + 100;
    assert_eq!(v["peak_live_bytes"], heap_peak);
    assert_eq!(v["peak_live_objects"], 20_004);
    assert_eq!(v["peak_live_span_bytes"], 4 << 20);
    // Not the sum of the peaks: the span came after the frees.
    assert_eq!(v["peak_live_total_bytes"], (3 << 20) + 100 + (4 << 20));
    let (_, out, _) = run("stats", t.bytes(), &[]);
    for line in [
        "\nevents                        40.0 k\n",
        "\n  heap_object_alloc           20.0 k\n",
        "\n  big_buffer                3.00 MiB  in 3 allocations\n",
        "\n  struct small              1.22 MiB  in 20.0 k allocations\n",
        "\npeak live heap objects        20.0 k\n",
        "\npeak live heap bytes        4.22 MiB\n",
        "\npeak live total bytes       7.00 MiB  (heap + spans at one moment)\n",
        "\nduration                99.0 µs\n",
    ] {
        assert!(out.contains(line), "{line:?} in {out}");
    }
    assert!(!out.contains("unused"), "{out}");
    // --all: the type never allocated too, its name on one line.
    let (_, out, _) = run("stats", t.bytes(), &["--all"]);
    assert!(
        out.contains("\n  unused\\nnode                   0 B  in 0 allocations\n"),
        "{out}"
    );
}

#[test]
fn check_ok() {
    let (code, out, _) = run("check", &sample_trace(), &[]);
    assert_eq!(code, 0);
    assert_eq!(out, "ok: 13 events in 2 generations, 2 threads\n");
    // Singular for one.
    let g = info(1);
    let mut b = EventsBody::new(1000);
    b.event(
        &g,
        1001,
        0x10010,
        &EventData::HeapObjectAlloc {
            size: 16,
            type_id: 0,
        },
    );
    let mut t = TraceBuilder::new();
    t.info(&g)
        .events(1, 1, &b)
        .generation_end(1, 2000, 5_001_000, 0)
        .trace_end(1);
    let (code, out, _) = run("check", t.bytes(), &[]);
    assert_eq!(
        (code, out.as_str()),
        (0, "ok: 1 event in 1 generation, 1 thread\n")
    );
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
    bytes[16] = 14;
    let (code, out, err) = run("check", &bytes, &[]);
    assert_eq!((code, out.as_str()), (2, ""));
    assert!(
        err.starts_with("malformed: malformed trace at byte offset 16: unknown batch kind 14\n"),
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
        err.contains(&format!(
            "byte offset {}",
            full.len() - 8 - alloctrace_format::TRAILER_LEN
        )),
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

/// Two threads of page events: thread 1 allocates 0x100000 (4 pages) and
/// 0x200000 (1024 pages, large form), frees the first, scavenges it; thread
/// 2 allocates 2 pages off the page grid (long form) and frees them.
fn pages_trace() -> Vec<u8> {
    pages_trace_in(TraceBuilder::new())
}

fn pages_trace_in(mut t: TraceBuilder) -> Vec<u8> {
    t.info(&info(1));
    let mut p1 = PagesBody::new(12, 1, 1152);
    p1.event(1152, 0x100000, &EventData::PageAlloc { npages: 4 })
        .event(1280, 0x200000, &EventData::PageAlloc { npages: 1024 })
        .event(1536, 0x100000, &EventData::PageFree { npages: 4 })
        .event(1664, 0x100000, &EventData::PageScav { npages: 4 });
    t.pages(1, 1, &p1);
    let mut p2 = PagesBody::new(12, 2, 1408);
    p2.event(1408, 0x700800, &EventData::PageAlloc { npages: 2 })
        .event(1792, 0x700800, &EventData::PageFree { npages: 2 });
    t.pages(1, 2, &p2);
    t.generation_end(1, 2000, 5_001_000, 0).trace_end(1);
    t.finish()
}

#[test]
fn dump_prints_page_events() {
    let (code, out, err) = run("dump", &pages_trace(), &[]);
    assert_eq!((code, err.as_str()), (0, ""));
    assert_eq!(
        out,
        "\
152 gen=1 thread=1 page_alloc addr=0x100000 npages=4
280 gen=1 thread=1 page_alloc addr=0x200000 npages=1024
408 gen=1 thread=2 page_alloc addr=0x700800 npages=2 long
536 gen=1 thread=1 page_free addr=0x100000 npages=4
664 gen=1 thread=1 page_scav addr=0x100000 npages=4
792 gen=1 thread=2 page_free addr=0x700800 npages=2 long
"
    );
    let (code, out, _) = run("dump", &pages_trace(), &["--json"]);
    assert_eq!(code, 0);
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 6);
    assert_eq!(
        lines[2],
        json!({"time_ns": 408, "gen": 1, "thread": 2, "kind": "page_alloc", "addr": 0x700800, "long_form": true, "npages": 2})
    );
    assert_eq!(
        lines[4],
        json!({"time_ns": 664, "gen": 1, "thread": 1, "kind": "page_scav", "addr": 0x100000, "long_form": false, "npages": 4})
    );
}

#[test]
fn stats_and_check_count_page_events() {
    let (code, out, err) = run("stats", &pages_trace(), &["--json"]);
    assert_eq!((code, err.as_str()), (0, ""));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["events"]["page_alloc"], 3);
    assert_eq!(v["events"]["page_free"], 2);
    assert_eq!(v["events"]["page_scav"], 1);
    assert_eq!(v["total_events"], 6);
    assert_eq!(v["per_thread"], json!({"1": 4, "2": 2}));
    assert_eq!(v["long_form_events"], 2);
    assert_eq!(
        (v["anomalies"].as_u64(), v["page_anomalies"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(v.get("entry_points"), None, "no tagged event");
    let (code, out, _) = run("stats", &pages_trace(), &[]);
    assert_eq!(code, 0);
    assert!(
        out.contains("\n  page_alloc                       3\n"),
        "{out}"
    );
    assert!(
        out.contains("\n  page_scav                        1\n"),
        "{out}"
    );
    let (code, out, err) = run("check", &pages_trace(), &[]);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (0, "ok: 6 events in 1 generation, 2 threads\n", "")
    );
}

#[test]
fn pages_sums_up_runs_in_use() {
    let (code, out, err) = run("pages", &pages_trace(), &["--json"]);
    assert_eq!((code, err.as_str()), (0, ""));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v,
        json!({
            "page_alloc": {"events": 3, "pages": 1030},
            "page_free": {"events": 2, "pages": 6},
            "page_scav": {"events": 1, "pages": 4},
            "pages_in_use": 1024,
            "peak_pages_in_use": 1030,
            "bytes_in_use": 1024 * 4096,
            "peak_bytes_in_use": 1030 * 4096,
            "runs_in_use": 1,
            "largest_run": 1024,
            "anomalies": 0,
            "anomaly_kinds": {"free_not_allocated": 0, "alloc_in_use": 0, "scav_in_use": 0, "zero_npages": 0},
            "first_anomaly": null,
            "flight_window": false,
            "frees_before_window": 0,
            "page_size": 4096,
            "truncated": false,
            "truncated_at": null
        })
    );
    let (code, out, _) = run("pages", &pages_trace(), &[]);
    assert_eq!(code, 0);
    for line in [
        "page size                               4096 bytes\n",
        "                                      events           pages\n",
        "page_alloc                                 3            1030\n",
        "pages in use                            1024 pages (4194304 bytes)\n",
        "peak pages in use                       1030 pages (4218880 bytes)\n",
        "largest run                             1024 pages\n",
        "anomalies                                  0\n",
    ] {
        assert!(out.contains(line), "{line:?} not in\n{out}");
    }
}

#[test]
fn page_anomalies_are_counted_and_fail_the_check() {
    let mut t = TraceBuilder::new();
    t.info(&info(1));
    let mut p = PagesBody::new(12, 3, 1280);
    p.event(1280, 0x10000, &EventData::PageAlloc { npages: 8 }) // pages 16..24
        .event(1408, 0x14000, &EventData::PageAlloc { npages: 8 }) // 20..28: 4 in use
        .event(1536, 0x18000, &EventData::PageScav { npages: 1 }) // in use
        .event(1664, 0x30000, &EventData::PageScav { npages: 1 }) // fine
        .event(1792, 0x1c000, &EventData::PageFree { npages: 8 }) // 28..36: not allocated
        .event(1920, 0x10000, &EventData::PageAlloc { npages: 0 }) // npages 0
        .event(1930, 0x10000, &EventData::PageFree { npages: 0 }); // npages 0
    t.pages(1, 3, &p);
    t.generation_end(1, 2000, 5_001_000, 0).trace_end(1);
    let (code, out, _) = run("pages", t.bytes(), &["--json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["anomalies"], 5);
    assert_eq!(
        v["anomaly_kinds"],
        json!({"free_not_allocated": 1, "alloc_in_use": 1, "scav_in_use": 1, "zero_npages": 2})
    );
    // 16..28 in use, then 28..36 freed: nothing of it was in use.
    assert_eq!(
        (v["pages_in_use"].as_u64(), v["peak_pages_in_use"].as_u64()),
        (Some(12), Some(12))
    );
    assert_eq!(v["largest_run"], 8);
    assert_eq!(
        v["first_anomaly"],
        "page_alloc at 0x14000 npages=8 (408 ns, generation 1, thread 3): allocation of pages already in use"
    );
    let (_, out, _) = run("stats", t.bytes(), &["--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["anomalies"].as_u64(), v["page_anomalies"].as_u64()),
        (Some(0), Some(5))
    );
    let (code, _, err) = run("check", t.bytes(), &[]);
    assert_eq!(code, 4, "{err}");
    assert!(err.contains(" 5 page anomalies (1 frees of pages not allocated, 1 allocations of pages in use, 1 scavenges of pages in use, 2 page events of 0 pages)."), "{err}");
    assert!(
        err.contains("\nfirst page anomaly: page_alloc at 0x14000 npages=8"),
        "{err}"
    );
    let (code, out, _) = run("check", t.bytes(), &["--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (code, v["status"].as_str(), v["page_anomalies"].as_u64()),
        (4, Some("inconsistent"), Some(5))
    );
}

#[test]
fn pages_on_a_malformed_or_truncated_trace() {
    // Version 1, where no checksum catches the damage below first.
    let mut bytes = pages_trace_in(TraceBuilder::v1());
    let (code, _, err) = run("pages", &bytes[..bytes.len() - 8], &[]);
    assert_eq!(code, 0);
    assert!(err.starts_with(WARNING_PREFIX), "{err}");
    // Thread 1's layout word made an event word: nothing can be decoded.
    let layout_at = (0..bytes.len() - 8)
        .find(|&i| bytes[i..i + 8] == PagesBody::new(12, 1, 0).layout().word().to_le_bytes())
        .unwrap();
    bytes[layout_at..layout_at + 8].copy_from_slice(&3u64.to_le_bytes());
    let (code, _, err) = run("pages", &bytes, &["--json"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!(
            "malformed trace at byte offset {layout_at}: page event word before the layout word"
        )),
        "{err}"
    );
    // Version 2: the batch's checksum reports the same damage.
    let mut bytes = pages_trace();
    let layout_at = (0..bytes.len() - 8)
        .find(|&i| bytes[i..i + 8] == PagesBody::new(12, 1, 0).layout().word().to_le_bytes())
        .unwrap();
    bytes[layout_at..layout_at + 8].copy_from_slice(&3u64.to_le_bytes());
    let (code, _, err) = run("pages", &bytes, &["--json"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("checksum mismatch in the batch at byte offset") && err.contains("(kind 6,"),
        "{err}"
    );
}

#[test]
fn stats_counts_entry_points_when_events_are_tagged() {
    use alloctrace_format::{EntryPoint, ENTRY_TAG};
    let g = info(1);
    let mut b = EventsBody::new(1000);
    b.raw_event(5 | ENTRY_TAG, 1001, &[1, 16, 0, EntryPoint::Malloc as u64])
        .raw_event(5 | ENTRY_TAG, 1002, &[2, 16, 0, EntryPoint::Calloc as u64])
        .raw_event(6, 1003, &[1])
        .raw_event(5 | ENTRY_TAG, 1004, &[3, 16, 0, EntryPoint::Realloc as u64])
        .raw_event(10 | ENTRY_TAG, 1005, &[0, EntryPoint::Free as u64])
        .raw_event(6 | ENTRY_TAG, 1006, &[2, EntryPoint::Free as u64])
        .raw_event(2 | ENTRY_TAG, 1007, &[5, 1, 0, EntryPoint::Mmap as u64]);
    let mut t = TraceBuilder::new();
    t.info(&g)
        .events(1, 1, &b)
        .generation_end(1, 2000, 5_001_000, 0)
        .trace_end(1);
    let (code, out, _) = run("stats", t.bytes(), &["--json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["entry_points"],
        json!({
            "malloc": 1, "calloc": 1, "realloc": 1, "free": 2, "posix_memalign": 0,
            "aligned_alloc": 0, "memalign": 0, "valloc": 0, "pvalloc": 0,
            "reallocarray": 0, "mmap": 1, "munmap": 0, "mremap": 0
        })
    );
    assert_eq!(v["events"]["call"], 1);
    let (code, out, _) = run("stats", t.bytes(), &[]);
    assert_eq!(code, 0);
    assert!(
        out.contains("\nentry points                       6 tagged events\n"),
        "{out}"
    );
    assert!(
        out.contains("\n  free                             2\n"),
        "{out}"
    );
    // Functions never called only with --all.
    assert!(!out.contains("\n  mremap "), "{out}");
    let (_, out, _) = run("stats", t.bytes(), &["--all"]);
    assert!(
        out.contains("\n  mremap                           0\n"),
        "{out}"
    );
    // Untagged traces print no entry-point section.
    let (_, out, _) = run("stats", &sample_trace(), &[]);
    assert!(!out.contains("entry points"), "{out}");
}

/// `stats` (which counts on a thread of its own, fed in chunks) agrees with
/// the events as `dump` hands them out, counted one by one in order: on a
/// trace of two generations, three threads writing at once, many batches,
/// spans and stacks beside heap objects, and anomalies of every kind, the
/// first of them late (after many chunks).
#[test]
fn stats_counts_what_dump_hands_out() {
    use alloctrace_reader::testing::Rng;
    use std::collections::{BTreeMap, HashMap};

    let mut rng = Rng::new(0x5eed);
    let mut t = TraceBuilder::new();
    let mut ticks = 1000;
    for generation in 1..=2u64 {
        let mut g = info(generation);
        g.start_ticks = ticks;
        g.start_mono_ns = 5_000_000 + ticks;
        t.info(&g);
        for _batch in 0..12 {
            for thread in 1..=3u64 {
                let mut b = EventsBody::new(ticks);
                for _ in 0..700 {
                    ticks += 1 + rng.below(3);
                    // Heap objects from a small pool (double allocs and
                    // unknown frees come), after the first 20,000 events
                    // only: the first anomaly is late.
                    let late = generation == 2;
                    let pool = if late { 300 } else { 1 << 40 };
                    let slot = rng.below(pool);
                    let addr = 0x10000 + slot * 16;
                    let data = match rng.below(20) {
                        0 => EventData::SpanAlloc {
                            npages: 1,
                            kind_class: 0,
                        },
                        1 if late => EventData::SpanFree,
                        2 => EventData::StackAlloc { size: 8192 },
                        3 if late => EventData::StackFree,
                        4..=11 => EventData::HeapObjectAlloc {
                            size: 1 + rng.below(500),
                            type_id: 0,
                        },
                        _ if late => EventData::HeapObjectFree,
                        _ => EventData::HeapObjectAlloc {
                            size: 16,
                            type_id: 0,
                        },
                    };
                    let slot = if late { slot % 64 } else { slot };
                    let addr = match data {
                        EventData::SpanAlloc { .. } | EventData::SpanFree => {
                            0x1_0000_0000 + slot * 4096
                        }
                        EventData::StackAlloc { .. } | EventData::StackFree => {
                            0x2000_0000_0000 + slot * 8192
                        }
                        _ => addr,
                    };
                    b.event(&g, ticks - rng.below(2), addr, &data);
                }
                t.events(generation, thread, &b);
            }
        }
        ticks += 10;
        t.generation_end(generation, ticks, 5_000_000 + ticks, 0);
    }
    t.trace_end(2);

    // The model: dump's events, in dump's order.
    let (code, dump, err) = run("dump", t.bytes(), &["--json"]);
    assert_eq!(code, 0, "{err}");
    let mut heap: HashMap<u64, u64> = HashMap::new();
    let mut spans: HashMap<u64, u64> = HashMap::new();
    let mut stacks: HashMap<u64, u64> = HashMap::new();
    let (mut live, mut peak, mut unknown_free, mut double_alloc) = (0u64, 0u64, 0u64, 0u64);
    let mut first: Option<String> = None;
    let mut per_thread: BTreeMap<String, u64> = BTreeMap::new();
    let mut events = 0u64;
    for line in dump.lines() {
        let e: Value = serde_json::from_str(line).unwrap();
        events += 1;
        *per_thread.entry(e["thread"].to_string()).or_insert(0) += 1;
        let kind = e["kind"].as_str().unwrap();
        let addr = e["addr"].as_u64().unwrap();
        let anomaly = |what: &str, first: &mut Option<String>| {
            first.get_or_insert_with(|| {
                format!(
                    "{kind} at {addr:#x} ({} ns, generation {}, thread {}): {what}",
                    e["time_ns"], e["gen"], e["thread"]
                )
            });
        };
        match kind {
            "heap_object_alloc" => {
                let size = e["size"].as_u64().unwrap();
                if let Some(old) = heap.insert(addr, size) {
                    live -= old;
                    double_alloc += 1;
                    anomaly("allocation of an address that is already live", &mut first);
                }
                live += size;
                peak = peak.max(live);
            }
            "heap_object_free" => match heap.remove(&addr) {
                Some(size) => live -= size,
                None => {
                    unknown_free += 1;
                    anomaly("free of an address that is not live", &mut first);
                }
            },
            "span_alloc" | "stack_alloc" => {
                let map = if kind == "span_alloc" {
                    &mut spans
                } else {
                    &mut stacks
                };
                if map.insert(addr, 0).is_some() {
                    double_alloc += 1;
                    anomaly("allocation of an address that is already live", &mut first);
                }
            }
            "span_free" | "stack_free" => {
                let map = if kind == "span_free" {
                    &mut spans
                } else {
                    &mut stacks
                };
                if map.remove(&addr).is_none() {
                    unknown_free += 1;
                    anomaly("free of an address that is not live", &mut first);
                }
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert!(
        events > 50_000 && unknown_free > 0 && double_alloc > 0,
        "{events} {unknown_free} {double_alloc}"
    );
    let first = first.unwrap();
    assert!(first.contains("generation 2"), "{first}");

    let (code, out, err) = run("stats", t.bytes(), &["--json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["total_events"], events);
    assert_eq!(v["live_objects"], heap.len());
    assert_eq!(v["live_bytes"], live);
    assert_eq!(v["peak_live_bytes"], peak);
    assert_eq!(v["live_spans"], spans.len());
    assert_eq!(v["live_stacks"], stacks.len());
    assert_eq!(
        v["anomaly_kinds"],
        json!({"unknown_free": unknown_free, "double_alloc": double_alloc})
    );
    let threads: BTreeMap<String, u64> = serde_json::from_value(v["per_thread"].clone()).unwrap();
    assert_eq!(threads, per_thread);

    let (code, _, err) = run("check", t.bytes(), &[]);
    assert_eq!(code, 4, "{err}");
    assert!(
        err.contains(&format!("first anomaly: {first}")),
        "{err}\nwant {first}"
    );
}

/// Every bad `record` option is refused by the CLI with exit 2 and a usage
/// message, and the program never starts (it would create the marker).
#[test]
fn record_refuses_bad_options_before_running_anything() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("record-options-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let marker = dir.join("marker");
    let dir_arg = dir.to_str().unwrap().to_string();
    let missing = format!("{dir_arg}/no-such-dir/x.trace");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--clock", "x"],
            "invalid value 'x' for '--clock <KIND>'",
        ),
        (
            vec!["--compression", "lz4"],
            "invalid value 'lz4' for '--compression <KIND>'",
        ),
        (
            vec!["--stacks", "dwarf"],
            "invalid value 'dwarf' for '--stacks <MODE>'",
        ),
        (vec!["--stack-depth", "0"], "not a depth"),
        (vec!["--stack-depth", "257"], "not a depth"),
        (vec!["--stack-depth", "many"], "not a depth"),
        (vec!["--record", "bogus"], "unknown family"),
        (vec!["--buffer-size", "1"], "not a buffer size"),
        (vec!["--buffer-size", "17m"], "not a buffer size"),
        (vec!["--sample-bytes", "lots"], "not a sampling size"),
        (vec!["--sample-bytes", "512KiBs"], "not a sampling size"),
        (vec!["--sample-bytes=-1"], "not a sampling size"),
        (vec!["--sample-bytes", "2TiB"], "not a sampling size"),
        (vec!["-o", "x.%d.trace"], "unknown % escape"),
        (vec!["-o", "out/"], "names a directory"),
        (vec!["-o", &dir_arg], "is a directory"),
        (vec!["-o", &missing], "no such directory"),
        (
            vec!["--only", "/usr/bin/python3"],
            "a program name has no '/'",
        ),
        (vec!["--only", "a,,b"], "empty program name"),
        (vec!["--no-such-option"], "unexpected argument"),
    ];
    for (opts, needle) in cases {
        let mut args = vec!["record"];
        args.extend(&opts);
        args.extend(["--", "touch", marker.to_str().unwrap()]);
        let out = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
            .args(&args)
            .current_dir(&dir)
            // A shim that exists, so only the option can stop the run.
            .env("ALLOCTRACE_PRELOAD", "/dev/null")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{opts:?}: {err}");
        assert!(err.contains(needle), "{opts:?}: {err}");
        assert!(
            err.contains("Usage: alloctrace record") || err.contains("--help"),
            "{opts:?}: {err}"
        );
        assert!(!marker.exists(), "{opts:?} ran the program");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn output_of(args: &[&str], stdin: Option<&[u8]>) -> (i32, String, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    // A command that refuses its arguments exits without reading its
    // input: a closed pipe here is its answer, not the test's failure.
    if let Err(e) = input.write_all(stdin.unwrap_or(b"")) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
    drop(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `-` reads the trace from standard input, with the same results.
#[test]
fn reading_commands_read_standard_input() {
    let bytes = sample_trace();
    let path = trace_file(&bytes);
    for cmd in ["dump", "stats", "pages", "check"] {
        let from_file = output_of(&[cmd, "--json", path.to_str().unwrap()], None);
        let from_stdin = output_of(&[cmd, "--json", "-"], Some(&bytes));
        assert_eq!(from_file, from_stdin, "{cmd}");
        assert_eq!(from_file.0, 0, "{cmd}: {}", from_file.2);
    }
    let (code, _, err) = output_of(&["check", "-", "-"], Some(&bytes));
    assert_eq!(code, 1, "{err}");
    let _ = std::fs::remove_file(&path);
}

/// Several traces and directories: one section or JSON object per trace,
/// labelled with its name; the exit code is the lowest non-zero one.
#[test]
fn reading_commands_take_several_traces_and_directories() {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("run-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // 10.trace sorts after 9.trace; other files are left out.
    std::fs::write(dir.join("10.trace"), sample_without_end()).unwrap();
    std::fs::write(dir.join("9.trace"), sample_trace()).unwrap();
    std::fs::write(dir.join("notes.txt"), b"not a trace").unwrap();
    let d = dir.to_str().unwrap();
    let (nine, ten) = (format!("{d}/9.trace"), format!("{d}/10.trace"));

    let (code, out, err) = output_of(&["stats", "--json", d], None);
    assert_eq!(code, 0, "{err}");
    let objects: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(objects.len(), 2);
    assert_eq!(objects[0]["file"], json!(nine));
    assert_eq!(objects[1]["file"], json!(ten));
    assert_eq!(objects[0]["truncated"], json!(false));
    assert_eq!(objects[1]["truncated"], json!(true));
    assert!(
        err.starts_with(&format!("{ten}: {WARNING_PREFIX}")),
        "{err}"
    );

    let (code, out, _) = output_of(&["dump", &nine, &nine], None);
    assert_eq!(code, 0);
    assert_eq!(
        out,
        format!("==> {nine} <==\n{SAMPLE_DUMP}==> {nine} <==\n{SAMPLE_DUMP}")
    );
    let (code, out, _) = output_of(&["dump", "--json", &nine], None);
    assert_eq!(code, 0);
    assert!(!out.contains("\"file\""), "one file: unlabelled");
    let (_, out, _) = output_of(&["dump", "--json", d], None);
    let first: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(first["file"], json!(nine));

    let (code, out, err) = output_of(&["check", d], None);
    assert_eq!(code, 3, "{err}");
    assert!(out.starts_with(&format!("{nine}: ok: 13 events")), "{out}");
    assert!(err.contains(&format!("{ten}: truncated:")), "{err}");
    let (code, out, _) = output_of(&["check", "--json", &nine, &ten], None);
    assert_eq!(code, 3);
    let verdicts: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        (verdicts[0]["status"].clone(), verdicts[1]["status"].clone()),
        (json!("ok"), json!("truncated"))
    );
    // A missing file (1) comes before a truncated one (3).
    let (code, _, err) = output_of(&["check", d, &format!("{d}/missing.trace")], None);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("cannot open"), "{err}");
    let (code, out, _) = output_of(&["pages", "--json", d], None);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 2);

    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let (code, _, err) = output_of(&["stats", empty.to_str().unwrap()], None);
    assert_eq!(code, 1);
    assert!(err.contains("without .trace files"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

// --- w2-pack (issue 11, item 5): man pages and completions ---

/// `alloctrace __generate DIR` (run by `make install`) writes a man page per
/// subcommand and bash, zsh and fish completions from the clap definition,
/// with `record`'s options; `__generate` itself is in none of them, nor in
/// `--help`.
#[test]
fn generate_writes_man_pages_and_completions() {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("generate-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = alloctrace(&["__generate", dir.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read =
        |p: &str| std::fs::read_to_string(dir.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    let mut pages: Vec<String> = std::fs::read_dir(dir.join("man1"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    pages.sort();
    assert_eq!(
        pages,
        [
            "alloctrace-check.1",
            "alloctrace-diff.1",
            "alloctrace-dump.1",
            "alloctrace-export.1",
            "alloctrace-flamegraph.1",
            "alloctrace-leaks.1",
            "alloctrace-pages.1",
            "alloctrace-ps.1",
            "alloctrace-record.1",
            "alloctrace-report.1",
            "alloctrace-save.1",
            "alloctrace-snapshot.1",
            "alloctrace-stats.1",
            "alloctrace-symbolize.1",
            "alloctrace-top.1",
            "alloctrace.1",
        ]
    );
    let record = read("man1/alloctrace-record.1");
    assert!(
        record.starts_with(".ie") && record.contains(".TH alloctrace-record 1"),
        "{record}"
    );
    for option in ["\\-\\-compression", "\\-\\-no\\-follow", "\\-\\-only"] {
        assert!(
            record.contains(option),
            "alloctrace-record.1 lacks {option}"
        );
    }
    let bash = read("completions/alloctrace.bash");
    let zsh = read("completions/_alloctrace");
    let fish = read("completions/alloctrace.fish");
    for text in [&bash, &zsh, &fish] {
        for word in ["pages", "record", "no-follow", "compression"] {
            assert!(text.contains(word), "a completion lacks {word}");
        }
    }
    for text in [&bash, &zsh, &fish, &read("man1/alloctrace.1")] {
        assert!(
            !text.contains("generate"),
            "the internal __generate leaked into the generated files"
        );
    }
    let help = alloctrace(&["--help"]);
    assert!(!String::from_utf8_lossy(&help.stdout).contains("generate"));
    let _ = std::fs::remove_dir_all(&dir);
}

// s-format: call stacks (format version 3).

const STACKS_DUMP: &str = "\
100 gen=1 thread=1 heap_object_alloc addr=0x10040 size=16 type=0 stack=1
300 gen=1 thread=1 heap_object_alloc addr=0x10080 size=100 type=0 stack=2
400 gen=1 thread=1 heap_object_alloc addr=0x10081 size=7 type=0 stack=3 long
500 gen=1 thread=1 heap_object_alloc addr=0x100c0 size=8 type=0
600 gen=1 thread=1 span_alloc addr=0x22000 npages=2 class=1 stack=4
700 gen=1 thread=1 heap_object_free addr=0x10040
4100 gen=2 thread=2 heap_object_alloc addr=0x10100 size=24 type=0 stack=2
4200 gen=2 thread=2 heap_object_alloc addr=0x10140 size=32 type=0 stack=5
4300 gen=2 thread=2 heap_object_free addr=0x10080
";

const STACKS_LISTING: &str = "\
module gen=1 id=1 start=0x400000 end=0x500000 bias=0x400000 build_id=deadbeef load=0 unload=0 path=/usr/bin/app
module gen=1 id=2 start=0x7f0000000000 end=0x7f0000010000 bias=0x7f0000000000 build_id=- load=1200 unload=0 path=/lib/libfoo.so
stack gen=1 id=1 frames=1
  #0 app+0x1100
stack gen=1 id=2 frames=2
  #0 libfoo.so+0x234
  #1 app+0x1100
stack gen=1 id=3 frames=3
  #0 f a.lua:7
  #1 libfoo.so+0x234
  #2 app+0x1100
stack gen=1 id=4 frames=1
  #0 [truncated]
module gen=2 id=1 start=0x400000 end=0x500000 bias=0x400000 build_id=deadbeef load=0 unload=0 path=/usr/bin/app
module gen=2 id=2 start=0x7f0000000000 end=0x7f0000010000 bias=0x7f0000000000 build_id=- load=0 unload=0 path=/lib/libfoo.so
stack gen=2 id=1 frames=1
  #0 app+0x1100
stack gen=2 id=2 frames=2
  #0 libfoo.so+0x234
  #1 app+0x1100
stack gen=2 id=5 frames=2
  #0 0x9000
  #1 app+0x1100
";

#[test]
fn dump_shows_stack_ids_only_on_events_with_one() {
    let bytes = alloctrace_reader::testing::stacks_trace();
    let (code, out, err) = run("dump", &bytes, &[]);
    assert_eq!((code, err.as_str()), (0, ""));
    assert_eq!(out, STACKS_DUMP);
    let (code, out, _) = run("dump", &bytes, &["--json"]);
    assert_eq!(code, 0);
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines[2],
        json!({"time_ns": 400, "gen": 1, "thread": 1, "kind": "heap_object_alloc", "addr": 0x10081,
               "long_form": true, "size": 7, "type": 0, "stack": 3})
    );
    assert!(lines[3].get("stack").is_none(), "{}", lines[3]);
    // A trace without stacks: no stack key anywhere (SAMPLE_DUMP unchanged).
    let (_, out, _) = run("dump", &sample_trace(), &["--json"]);
    assert!(!out.contains("stack\""), "{out}");
}

#[test]
fn dump_stacks_lists_each_generations_stacks() {
    let bytes = alloctrace_reader::testing::stacks_trace();
    let (code, out, err) = run("dump", &bytes, &["--stacks"]);
    assert_eq!((code, err.as_str()), (0, ""));
    assert_eq!(out, STACKS_LISTING);
    let (code, out, _) = run("dump", &bytes, &["--stacks", "--json"]);
    assert_eq!(code, 0);
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4 + 2 + 3 + 2);
    assert_eq!(
        lines[4],
        json!({"gen": 1, "stack": 3, "frames": [
            {"function": "f", "file": "a.lua", "line": 7},
            {"addr": 0x7f00_0000_0234u64, "module": "/lib/libfoo.so", "offset": 0x234},
            {"addr": 0x40_1100, "module": "/usr/bin/app", "offset": 0x1100}
        ]})
    );
    assert_eq!(
        lines[5],
        json!({"gen": 1, "stack": 4, "frames": [{"truncated": true}]})
    );
    assert_eq!(
        lines[0]["module"],
        json!({"id": 1, "path": "/usr/bin/app", "start": 0x40_0000, "end": 0x50_0000,
               "bias": 0x40_0000, "eh_frame_hdr": 0x48_0000, "build_id": "deadbeef",
               "load_ticks": 0, "unload_ticks": 0})
    );
    assert_eq!(
        lines[10]["frames"][0],
        json!({"addr": 0x9000, "module": null, "offset": null})
    );
    // A trace without stacks lists nothing.
    let (code, out, _) = run("dump", &sample_trace(), &["--stacks"]);
    assert_eq!((code, out.as_str()), (0, ""));
}

#[test]
fn check_reports_lost_stacks_and_undefined_stack_ids() {
    let bytes = alloctrace_reader::testing::stacks_trace();
    let (code, out, err) = run("check", &bytes, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "ok: 9 events in 2 generations, 2 threads\n");
    assert!(
        err.contains("warning: 3 allocations were recorded without their call stack"),
        "{err}"
    );
    let (_, out, _) = run("check", &bytes, &["--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["lost_stacks"].clone(), v["status"].clone()),
        (json!(3), json!("ok"))
    );
    let (_, out, _) = run("stats", &bytes, &["--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["lost_stacks"], json!(3));
    // Kinds 11 and 12 count as the allocations they are.
    assert_eq!(
        (
            v["events"]["heap_object_alloc"].clone(),
            v["events"]["span_alloc"].clone()
        ),
        (json!(6), json!(1))
    );
    assert!(v["events"].get("heap_object_alloc_stack").is_none());
    // No warning for a trace without lost stacks.
    let (_, _, err) = run("check", &sample_trace(), &[]);
    assert!(!err.contains("call stack"), "{err}");

    // An event naming a stack its generation does not define: malformed,
    // at the event.
    let g = info(1);
    let mut b = EventsBody::new(1000);
    b.event_with_stack(
        &g,
        1001,
        0x10010,
        &EventData::HeapObjectAlloc {
            size: 8,
            type_id: 0,
        },
        7,
    );
    let mut t = TraceBuilder::new();
    t.info(&g);
    let events_at = t.len();
    t.events(1, 1, &b)
        .call_stacks(
            1,
            &[alloctrace_reader::testing::node(
                1,
                0,
                alloctrace_format::stacks::FrameWord::Native(0x10),
            )],
        )
        .generation_end_v3(1, 2000, 5_001_000, 0, 0)
        .trace_end(1);
    let bytes = t.finish();
    let (code, _, err) = run("check", &bytes, &[]);
    assert_eq!(code, 2, "{err}");
    let offset = events_at + 5 + 4;
    assert!(
        err.contains(&format!(
            "malformed trace at byte offset {offset}: heap_object_alloc_stack event names stack ID 7"
        )),
        "{err}"
    );
    let (code, _, err) = run("dump", &bytes, &["--stacks"]);
    assert_eq!(code, 2, "{err}");
}

/// A program run under the LD_PRELOAD shim (`alloctrace record`): `stats`
/// names its command line, as the program got it, and its pid. Needs the
/// shim built next to the binary (`cargo build -p alloctrace-preload`).
#[test]
fn stats_names_the_command_of_a_recorded_program() {
    // Fail early, before making the directory, without the shim.
    support::shim();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli-record-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("echo.trace");
    support::record(&[], &trace, Path::new("/bin/echo"), &["hello", "two words"]);
    let out = alloctrace(&["stats", "--json", trace.to_str().unwrap()]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["command"], json!(["/bin/echo", "hello", "two words"]));
    assert_eq!(v["command_truncated"], false);
    assert!(v["pid"].as_u64().is_some_and(|p| p > 0), "{v}");
    let out = alloctrace(&["stats", trace.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("\ncommand                 /bin/echo hello 'two words'\n"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
