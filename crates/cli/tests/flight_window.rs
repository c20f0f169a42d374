//! A flight recorder's dump (the header's window flag, in section 1 of
//! FORMAT.md) reads cleanly: frees of memory allocated before the window
//! are counted apart, not as anomalies, and every reader says it is a
//! window; the same trace without the flag is inconsistent.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use alloctrace_format::{FileHeader, FILE_HEADER_LEN, FLAG_FLIGHT_WINDOW, VERSION};
use alloctrace_reader::testing::{info, EventsBody, PagesBody, TraceBuilder};
use alloctrace_reader::EventData;
use serde_json::Value;

/// Generations 7 and 8 of a run: a free of an object allocated before
/// them, and an object allocated in the window and never freed.
fn window(flags: u16) -> Vec<u8> {
    window_with(flags, false)
}

/// [`window`]; with `pages`, a page free of pages allocated before the
/// window too (and pages allocated and freed in it).
fn window_with(flags: u16, pages: bool) -> Vec<u8> {
    let (g7, mut g8) = (info(7), info(8));
    g8.start_ticks = 5000;
    let mut b = EventsBody::new(1000);
    b.event(&g7, 1001, 0x10010, &EventData::HeapObjectFree)
        .event(
            &g7,
            1002,
            0x10020,
            &EventData::HeapObjectAlloc {
                size: 64,
                type_id: 0,
            },
        );
    let mut c = EventsBody::new(5000);
    c.event(&g8, 5001, 0x10030, &EventData::HeapObjectFree)
        .event(
            &g8,
            5002,
            0x10040,
            &EventData::HeapObjectAlloc {
                size: 16,
                type_id: 0,
            },
        )
        .event(&g8, 5003, 0x10040, &EventData::HeapObjectFree);
    let mut t = TraceBuilder::new();
    t.info(&g7)
        .events(7, 1, &b)
        .generation_end(7, 2000, 5_001_000, 0)
        .info(&g8)
        .events(8, 1, &c);
    if pages {
        let mut p = PagesBody::new(12, 1, 5004);
        p.event(5004, 0x700000, &EventData::PageFree { npages: 2 })
            .event(5005, 0x710000, &EventData::PageAlloc { npages: 1 })
            .event(5006, 0x710000, &EventData::PageFree { npages: 1 });
        t.pages(8, 1, &p);
    }
    t.generation_end(8, 6000, 5_005_000, 0).trace_end(8);
    let mut out = FileHeader {
        version: VERSION,
        flags,
    }
    .encode()
    .to_vec();
    out.extend_from_slice(&t.bytes()[FILE_HEADER_LEN..]);
    out
}

fn run(args: &[&str], bytes: &[u8]) -> (i32, String, String) {
    run_in(args, &[], bytes)
}

/// [`run`], with `after` after the trace's path.
fn run_in(args: &[&str], after: &[&str], bytes: &[u8]) -> (i32, String, String) {
    // A file of its own per call: tests run the same command at once.
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "flight-{}-{}-{}.trace",
        std::process::id(),
        args.join("-").replace('/', "_"),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, bytes).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .arg(args[0])
        .arg(&path)
        .args(&args[1..])
        .args(after)
        .output()
        .unwrap();
    std::fs::remove_file(&path).ok();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_accepts_a_window_and_says_so() {
    let (code, out, err) = run(&["check"], &window(FLAG_FLIGHT_WINDOW));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("flight-recorder window"), "{out}");
    assert!(
        out.contains("2 frees of memory allocated before it"),
        "{out}"
    );
    let (code, out, _) = run(&["check", "--json"], &window(FLAG_FLIGHT_WINDOW));
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["flight_window"], true);
    assert_eq!(v["frees_before_window"], 2);
    assert_eq!(v["anomalies"], 0);
    // Without the flag the same frees are anomalies.
    let (code, _, err) = run(&["check"], &window(0));
    assert_eq!(code, 4, "{err}");
}

#[test]
fn stats_and_leaks_read_a_window() {
    let (code, out, _) = run(&["stats", "--json"], &window(FLAG_FLIGHT_WINDOW));
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["flight_window"], true);
    assert_eq!(v["frees_before_window"], 2);
    assert_eq!(v["anomaly_kinds"]["unknown_free"], 0);
    assert_eq!(v["live_objects"], 1);
    let (code, out, _) = run(&["stats"], &window(FLAG_FLIGHT_WINDOW));
    assert_eq!(code, 0);
    assert!(out.contains("flight-recorder window"), "{out}");
    // The leak report lists what was allocated in the window and is
    // still live: the 64 bytes, and says it read a window.
    let (code, out, err) = run(&["leaks", "--json"], &window(FLAG_FLIGHT_WINDOW));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("flight-recorder window"), "{err}");
    assert!(out.contains("64"), "{out}");
}

/// The pass classifies frees before the window (analysis's pass.rs,
/// "Anomalies"), so every reader agrees: the HTML report does not take
/// them for frees of memory allocated before tracing started, and the
/// page accounting (`pages`, and `stats`' and `check`'s page anomalies)
/// does not take a page free of pages allocated before the window for an
/// anomaly.
#[test]
fn every_reader_counts_frees_before_the_window_apart() {
    let html = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("flight-report-{}.html", std::process::id()));
    let (code, _, err) = run_in(
        &["report"],
        &["-o", html.to_str().unwrap()],
        &window(FLAG_FLIGHT_WINDOW),
    );
    assert_eq!(code, 0, "{err}");
    let page = std::fs::read_to_string(&html).unwrap();
    std::fs::remove_file(&html).ok();
    assert!(
        !page.contains("allocated before tracing started"),
        "the window's frees taken for unknown ones"
    );
    assert!(page.contains("flight-recorder window"));

    let trace = window_with(FLAG_FLIGHT_WINDOW, true);
    let (code, out, err) = run(&["pages", "--json"], &trace);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["anomalies"], 0, "{v}");
    assert_eq!(v["flight_window"], true);
    assert_eq!(v["frees_before_window"], 1);
    assert_eq!(v["pages_in_use"], 0);
    let (code, out, _) = run(&["check", "--json"], &trace);
    assert_eq!(code, 0, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["frees_before_window"], 3, "2 heap frees, 1 page free");
    // Without the flag the page free is an anomaly.
    let (code, out, _) = run(&["pages", "--json"], &window_with(0, true));
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["anomaly_kinds"]["free_not_allocated"], 1);
}

#[test]
fn record_refuses_bad_flight_recorder_options_before_running() {
    let marker = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("flight-ran-{}", std::process::id()));
    let touch = format!("touch {}", marker.display());
    for (args, needle) in [
        (
            &["--flight-recorder", "500ms"][..],
            "a duration from 1s to 7 days",
        ),
        (
            &["--flight-recorder", "100"][..],
            "not a ring size or duration",
        ),
        (
            &["--flight-recorder", "30s,40s"][..],
            "not a ring size or duration",
        ),
        (
            &["--flight-recorder", "64MiB", "--dump-on-rss", "x"][..],
            "not a size",
        ),
        (&["--dump-on-rss", "1GiB"][..], "--flight-recorder"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
            .arg("record")
            .args(args)
            .args(["--", "sh", "-c", &touch])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!marker.exists(), "{args:?}: the command ran");
    }
}
