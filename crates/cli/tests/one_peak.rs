//! `stats` and the reports (`top`, whose sites' `peak_bytes` are what was
//! live at the report's peak) take one trace's peak of live heap objects
//! and spans on the same rule: `stats`' `peak_live_total_bytes` is the sum
//! of `top --by thread --sort peak`'s rows (issue 21, part 3: one
//! live-memory engine, analysis's pass, of which both are visitors).

use std::path::PathBuf;

mod support;

use alloctrace_reader::testing::{info, EventsBody, TraceBuilder};
use alloctrace_reader::EventData;
use serde_json::Value;

/// Writes `bytes` to a fresh file under the test target directory.
fn trace_file(bytes: &[u8]) -> PathBuf {
    support::temp_file("one-peak", bytes, "trace")
}

fn json(args: &[&str]) -> Value {
    support::alloctrace_json(args)
}

/// (stats' peak_live_total_bytes, the sum of the report's sites' bytes at
/// its peak) of a one-generation trace of `events`, written by two
/// threads (thread 5 writes the events from index `split` on).
fn peaks(events: &[(u64, EventData)], split: usize) -> (u64, u64) {
    let g = info(1);
    let mut ticks = 1000;
    let mut body = |events: &[(u64, EventData)]| {
        let mut b = EventsBody::new(ticks);
        for (addr, data) in events {
            ticks += 1;
            b.event(&g, ticks, *addr, data);
        }
        b
    };
    let (first, second) = events.split_at(split);
    let (b1, b2) = (body(first), body(second));
    let mut t = TraceBuilder::new();
    t.info(&g)
        .events(1, 4, &b1)
        .events(1, 5, &b2)
        .generation_end(1, 100_000, 5_099_000, 0)
        .trace_end(1);
    let path = trace_file(t.bytes());
    let p = path.to_str().unwrap();
    let stats = json(&["stats", "--json", p]);
    let top = json(&[
        "top", "--json", "--by", "thread", "--sort", "peak", "-n", "0", p,
    ]);
    let _ = std::fs::remove_file(&path);
    let sites = top["sites"].as_array().expect("sites");
    let report: u64 = sites
        .iter()
        .map(|s| s["peak_bytes"].as_u64().expect("peak_bytes"))
        .sum();
    let stats = stats["peak_live_total_bytes"].as_u64().expect("peak");
    (stats, report)
}

fn heap(size: u64) -> EventData {
    EventData::HeapObjectAlloc { size, type_id: 0 }
}

fn heap_exists(size: u64) -> EventData {
    EventData::HeapObjectExists { size, type_id: 0 }
}

fn span(npages: u64) -> EventData {
    EventData::SpanAlloc {
        npages,
        kind_class: 0,
    }
}

#[test]
fn heap_objects_peak_alike() {
    let events = [
        (0x10000, heap(100)),
        (0x10100, heap(200)),
        (0x10000, EventData::HeapObjectFree),
        (0x10200, heap(50)),
        (0x10100, EventData::HeapObjectFree),
        (0x10300, heap(400)),
    ];
    let (stats, report) = peaks(&events, 3);
    assert_eq!(stats, 450);
    assert_eq!(report, stats);
}

/// The peak is of heap objects and spans at one moment (not the sum of
/// their peaks); a heap object and a span at one address are two.
#[test]
fn spans_and_heap_objects_peak_together() {
    let events = [
        (0x10000, heap(1000)),
        (0x100000, span(2)),
        (0x100000, heap(16)),
        (0x10000, EventData::HeapObjectFree),
        (0x200000, span(1)),
        (0x100000, EventData::SpanFree),
        (0x10000, heap(3000)),
        // Not a span: an unknown free, which changes nothing.
        (0x10000, EventData::SpanFree),
    ];
    let (stats, report) = peaks(&events, 4);
    // 3 pages and 16 bytes, after the heap object of 1000 was freed
    // (before: 2 pages and 1016 bytes; after: 1 page and 3016 bytes).
    assert_eq!(stats, 3 * 4096 + 16);
    assert_eq!(report, stats);
}

/// An allocation at a live address (its free was missed) replaces the
/// live one in both.
#[test]
fn a_missed_free_peaks_alike() {
    let events = [
        (0x10000, heap(100)),
        (0x10000, heap(300)),
        (0x10100, heap(10)),
        (0x10000, EventData::HeapObjectFree),
        (0x10000, heap(200)),
    ];
    let (stats, report) = peaks(&events, 2);
    assert_eq!(stats, 310);
    assert_eq!(report, stats);
}

/// An exists event naming a live address of the same size (what a
/// snapshot of live memory says of memory the trace saw allocated).
#[test]
fn an_exists_event_at_a_live_address_peaks_alike() {
    let events = [
        (0x10000, heap_exists(64)),
        (0x10100, heap(100)),
        (0x10100, heap_exists(100)),
        (0x10200, heap(36)),
        (0x10000, EventData::HeapObjectFree),
    ];
    let (stats, report) = peaks(&events, 2);
    assert_eq!(stats, 200);
    assert_eq!(report, stats);
}

/// An exists event naming a live address with another size is an
/// allocation at a live address: it replaces the live one, its size
/// included (docs/CLI.md, `stats`' accounting), in `stats` and the reports
/// alike (before one engine: 1010 against 110).
#[test]
fn an_exists_event_of_another_size_peaks_alike() {
    let events = [
        (0x10000, heap(100)),
        (0x10000, heap_exists(1000)),
        (0x10100, heap(10)),
    ];
    let (stats, report) = peaks(&events, 2);
    assert_eq!(stats, 1010);
    assert_eq!(report, stats);
}
