//! Sampled traces (format version 6, `sample_bytes` > 0): every reading
//! command shows estimates (each recorded allocation of `s` bytes weighing
//! 1 / (1 - exp(-s / sample_bytes))) and says that they are estimates;
//! `stats` shows the exact totals and the sampling parameter. A trace that
//! records everything says nothing of the kind.

use std::path::PathBuf;

mod support;

use support::alloctrace;

use alloctrace_reader::testing::{info, EventsBody, TraceBuilder};
use alloctrace_reader::{sample_weight, EventData, Totals};
use serde_json::Value;

const MEAN: u64 = 4096;

fn file(bytes: &[u8], ext: &str) -> PathBuf {
    support::temp_file("sampled", bytes, ext)
}

/// A trace of `sample_bytes`: 100 recorded allocations of 64 bytes (25
/// freed) and 10 of 1 MiB (none freed), with exact totals.
fn trace(sample_bytes: u64) -> Vec<u8> {
    let mut g = info(1);
    g.sample_bytes = sample_bytes;
    let mut e = EventsBody::new(g.start_ticks);
    let mut t = g.start_ticks;
    for i in 0..100u64 {
        t += 1;
        let data = EventData::HeapObjectAlloc {
            size: 64,
            type_id: 0,
        };
        e.event(&g, t, 0x10000 + i * 64, &data);
    }
    for i in 0..10u64 {
        t += 1;
        let data = EventData::HeapObjectAlloc {
            size: 1 << 20,
            type_id: 0,
        };
        e.event(&g, t, 0x1000_0000 + i * (2 << 20), &data);
    }
    for i in 0..25u64 {
        t += 1;
        e.event(&g, t, 0x10000 + i * 64, &EventData::HeapObjectFree);
    }
    let totals = Totals {
        allocs: 7000,
        alloc_bytes: 7000 * 64 + 10 * (1 << 20),
        frees: 1800,
        sample_overflow: 2,
    };
    let mut b = TraceBuilder::new();
    b.info(&g)
        .events(1, 1, &e)
        .generation_end_v6(1, t + 1, g.start_mono_ns + 1000, &totals)
        .trace_end(1);
    b.finish()
}

fn run(args: &[&str]) -> (String, String) {
    let out = alloctrace(args);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(args: &[&str]) -> Value {
    serde_json::from_str(&run(args).0).expect("JSON")
}

fn estimated_bytes() -> f64 {
    100.0 * 64.0 * sample_weight(64, MEAN) + 10.0 * (1 << 20) as f64 * sample_weight(1 << 20, MEAN)
}

#[test]
fn answers_show_estimates_and_say_so() {
    let sampled = file(&trace(MEAN), "trace");
    let full = file(&trace(0), "trace");
    let (s, f) = (sampled.to_str().unwrap(), full.to_str().unwrap());
    let want = serde_json::json!({"sample_bytes": MEAN, "estimated": true});

    // top: estimated allocations and bytes, the "sampled" key, a line.
    let top = json(&["top", s, "--json"]);
    assert_eq!(top["sampled"], want, "{top}");
    let site = &top["sites"][0];
    let bytes = site["bytes"].as_f64().unwrap();
    assert!(
        (bytes / estimated_bytes() - 1.0).abs() < 0.001,
        "{bytes} vs {}",
        estimated_bytes()
    );
    let count = site["allocations"].as_f64().unwrap();
    let want_count = 100.0 * sample_weight(64, MEAN) + 10.0;
    assert!((count / want_count - 1.0).abs() < 0.05, "{count}");
    let top_full = json(&["top", f, "--json"]);
    assert_eq!(top_full["sampled"], Value::Null);
    assert_eq!(top_full["sites"][0]["allocations"], 110);
    let (text, _) = run(&["top", s]);
    assert!(text.starts_with("Estimates: "), "{text}");
    assert!(!run(&["top", f]).0.contains("Estimates"));

    // leaks: the 75 small and 10 large objects, weighed.
    let leaks = json(&["leaks", s, "--json"]);
    assert_eq!(leaks["sampled"], want);
    let leaked = leaks["bytes"].as_f64().unwrap();
    let want_leaked = 75.0 * 64.0 * sample_weight(64, MEAN) + 10.0 * (1 << 20) as f64;
    assert!((leaked / want_leaked - 1.0).abs() < 0.001, "{leaked}");
    assert!(run(&["leaks", s]).0.contains("Estimates: "));

    // diff: either side sampled.
    let diff = json(&["diff", f, s, "--json"]);
    assert_eq!(diff["sampled"], want);
    assert!(run(&["diff", f, s]).0.contains("Estimates: "));

    // flamegraph: folded stacks carry the estimates; the note on stderr.
    let (folded, err) = run(&["flamegraph", s, "--collapsed"]);
    let value: f64 = folded
        .split_whitespace()
        .last()
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!((value / estimated_bytes() - 1.0).abs() < 0.001, "{folded}");
    assert!(err.contains("Estimates: "), "{err}");
    let svg = file(b"", "svg");
    run(&["flamegraph", s, "-o", svg.to_str().unwrap()]);
    assert!(std::fs::read_to_string(&svg).unwrap().contains("estimated"));

    // report: a line at the top.
    let html = file(b"", "html");
    run(&["report", s, "-o", html.to_str().unwrap()]);
    assert!(std::fs::read_to_string(&html)
        .unwrap()
        .contains("id=\"r-sampled\""));

    // export: chrome's otherData, pprof's comment, parquet's traces table.
    let chrome = file(b"", "json");
    let (_, err) = run(&[
        "export",
        s,
        "--format",
        "chrome",
        "-o",
        chrome.to_str().unwrap(),
    ]);
    assert!(err.contains("Estimates: "), "{err}");
    let doc: Value = serde_json::from_slice(&std::fs::read(&chrome).unwrap()).unwrap();
    assert_eq!(doc["otherData"]["sampled"], want);
    let pprof = file(b"", "pb.gz");
    let (_, err) = run(&[
        "export",
        s,
        "--format",
        "pprof",
        "-o",
        pprof.to_str().unwrap(),
    ]);
    assert!(err.contains("Estimates: "), "{err}");
    let mut raw = Vec::new();
    use std::io::Read;
    flate2::read::GzDecoder::new(std::fs::File::open(&pprof).unwrap())
        .read_to_end(&mut raw)
        .unwrap();
    let raw = String::from_utf8_lossy(&raw);
    assert!(raw.contains("estimated: alloctrace sampled"), "no comment");
    assert!(raw.contains("sample_bytes"), "no label");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("sampled-parquet-{}", std::process::id()));
    let (_, err) = run(&[
        "export",
        s,
        "--format",
        "parquet",
        "-o",
        dir.to_str().unwrap(),
    ]);
    assert!(err.contains("Estimates: "), "{err}");

    // stats: the exact totals and the parameter.
    let stats = json(&["stats", s, "--json"]);
    assert_eq!(
        stats["sampled"],
        serde_json::json!({
            "sample_bytes": MEAN,
            "total_allocs": 7000,
            "total_alloc_bytes": 7000 * 64 + 10 * (1 << 20),
            "total_frees": 1800,
            "sample_set_overflow": 2,
        })
    );
    assert_eq!(json(&["stats", f, "--json"])["sampled"], Value::Null);
    let (text, _) = run(&["stats", s]);
    assert!(text.contains("sampled every"), "{text}");
    assert!(text.contains("allocations (exact)"), "{text}");
}
