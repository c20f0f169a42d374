//! Page tracer, writer to reader, as a property: for page shifts 12 to 16,
//! random page events (every kind; bases on and off the page grid, above
//! 2^48, near 2^64; npages from 0 to beyond 2^40) from two threads, with
//! pauses long enough that time deltas overflow their 16 bits and advances
//! in between, come back from the reader exactly: kind, base, npages,
//! thread, long form, in each thread's order.
//!
//! Times: each page event is bracketed by two heap object events of its
//! thread, whose ticks are exact and, with the page event's, strictly
//! increasing (one clock per thread). So the page event's true ticks `t`
//! lie strictly between the brackets, and its reconstructed ticks `r`
//! (`r <= t < r + 128`) must satisfy `r < after` and `before < r + 128`.
//!
//! One tracing session at a time per process: a single #[test] that runs
//! the cases in a loop.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use alloctrace_format::pages::{Layout, TIME_LOST_BITS};
use alloctrace_reader::{EventData, TraceReader};
use alloctrace_writer::events;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestCaseError, TestRunner};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Alloc,
    Free,
    Scav,
}

#[derive(Clone, Copy, Debug)]
enum Pause {
    None,
    /// Busy-wait this many loop iterations.
    Spin(u32),
    /// Sleep this many microseconds; up to 12 ms, past 2^16 units of 128
    /// ticks on any clock of at most 5 GHz and on the 1 GHz fallback clock.
    Sleep(u64),
}

#[derive(Clone, Copy, Debug)]
struct Op {
    kind: Kind,
    base: u64,
    npages: u64,
    pause: Pause,
    advance: bool,
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![Just(Kind::Alloc), Just(Kind::Free), Just(Kind::Scav)]
}

/// Mostly page-aligned below 2^48 (for the largest shift, so aligned for
/// every shift); sometimes off the grid, at or above 2^48, or near 2^64.
fn base() -> impl Strategy<Value = u64> {
    prop_oneof![
        8 => (0u64..1 << 48).prop_map(|b| b & !((1 << 16) - 1)),
        2 => (0u64..1 << 48).prop_map(|b| b & !((1 << 12) - 1)),
        1 => 0u64..1 << 48,
        1 => (1u64 << 48)..u64::MAX,
        1 => (0u64..1 << 16).prop_map(|d| u64::MAX - d),
    ]
}

/// Many small, many at or above 1024 (the large form for shifts up to 13),
/// some 0, some up to 2^40.
fn npages() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 1u64..64,
        4 => 1024u64..1 << 20,
        1 => Just(0u64),
        2 => 0u64..=1 << 40,
    ]
}

fn pause() -> impl Strategy<Value = Pause> {
    prop_oneof![
        30 => Just(Pause::None),
        8 => (0u32..100_000).prop_map(Pause::Spin),
        1 => (0u64..12_000).prop_map(Pause::Sleep),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    (
        kind(),
        base(),
        npages(),
        pause(),
        prop::bool::weighted(0.03),
    )
        .prop_map(|(kind, base, npages, pause, advance)| Op {
            kind,
            base,
            npages,
            pause,
            advance,
        })
}

/// The address of the bracket events of a thread's `i`-th page event.
fn marker(worker: usize, i: usize) -> u64 {
    0x1000_0000 + ((worker as u64) << 24) + 16 * i as u64
}

/// Runs `ops` on the calling thread; returns its trace thread ID.
fn emit(worker: usize, ops: &[Op]) -> u64 {
    for (i, op) in ops.iter().enumerate() {
        let m = marker(worker, i) as usize;
        events::heap_object_alloc(m, i as u64, 0);
        let (base, npages) = (op.base as usize, op.npages as usize);
        match op.kind {
            Kind::Alloc => events::page_alloc(base, npages),
            Kind::Free => events::page_free(base, npages),
            Kind::Scav => events::page_scav(base, npages),
        }
        events::heap_object_free(m);
        match op.pause {
            Pause::None => {}
            Pause::Spin(n) => {
                for k in 0..n {
                    std::hint::black_box(k);
                }
            }
            Pause::Sleep(us) => std::thread::sleep(Duration::from_micros(us)),
        }
        if op.advance {
            alloctrace_writer::advance().expect("advance");
        }
    }
    events::thread_id()
}

/// Page events seen whose ticks were more than 2^16 units after their
/// thread's previous page event: the time-base path was taken.
/// A page event as read: kind, base, npages, long form, ticks.
type PageRead = (Kind, u64, u64, bool, u64);

static BIG_GAPS: AtomicU64 = AtomicU64::new(0);
static CASES: AtomicU64 = AtomicU64::new(0);

fn run_case(dir: &std::path::Path, shift: u32, ops: &[Vec<Op>; 2]) -> Result<(), TestCaseError> {
    let n = CASES.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("pages-{n}.trace"));
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    let config = alloctrace_writer::Config {
        page_size: 1 << shift,
        // Small buffers: many batches, many refills.
        buffer_size: 4096,
        ..Default::default()
    };
    alloctrace_writer::start(
        &config,
        alloctrace_writer::Output::create(&cpath).unwrap(),
        None,
    )
    .expect("start");
    let ids: Vec<u64> = std::thread::scope(|s| {
        let workers: Vec<_> = ops
            .iter()
            .enumerate()
            .map(|(w, ops)| s.spawn(move || emit(w, ops)))
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    alloctrace_writer::stop().expect("stop");
    prop_assert!(
        ids[0] != ids[1] && ids[0] != 0 && ids[1] != 0,
        "thread ids {:?}",
        ids
    );

    let file = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
    let mut reader = TraceReader::new(file).unwrap();
    // Per thread: page events (kind, base, npages, long, ticks) in stream
    // order, and the ticks of each marker event by address.
    let mut pages: HashMap<u64, Vec<PageRead>> = HashMap::new();
    let mut markers: HashMap<(u64, u64, bool), u64> = HashMap::new();
    let mut last_generation = 0;
    while let Some(e) = reader
        .next_event()
        .map_err(|e| TestCaseError::fail(e.to_string()))?
    {
        prop_assert!(e.generation >= last_generation);
        last_generation = e.generation;
        let kind = match e.data {
            EventData::PageAlloc { .. } => Kind::Alloc,
            EventData::PageFree { .. } => Kind::Free,
            EventData::PageScav { .. } => Kind::Scav,
            EventData::HeapObjectAlloc { .. } => {
                markers.insert((e.thread, e.addr, true), e.ticks);
                continue;
            }
            EventData::HeapObjectFree => {
                markers.insert((e.thread, e.addr, false), e.ticks);
                continue;
            }
            other => return Err(TestCaseError::fail(format!("unexpected event {other:?}"))),
        };
        let (EventData::PageAlloc { npages }
        | EventData::PageFree { npages }
        | EventData::PageScav { npages }) = e.data
        else {
            unreachable!()
        };
        pages
            .entry(e.thread)
            .or_default()
            .push((kind, e.addr, npages, e.long_form, e.ticks));
    }
    prop_assert_eq!(reader.truncated(), None);
    prop_assert_eq!(reader.lost_events(), 0);
    std::fs::remove_file(&path).ok();

    let layout = Layout {
        page_shift: shift,
        lost_bits: TIME_LOST_BITS,
    };
    let unit = 1u64 << TIME_LOST_BITS;
    for (w, (ops, id)) in ops.iter().zip(&ids).enumerate() {
        let got = pages.remove(id).unwrap_or_default();
        prop_assert_eq!(got.len(), ops.len(), "thread {}: page event count", id);
        let mut prev_ticks = 0;
        for (i, (op, &(kind, base, npages, long, ticks))) in ops.iter().zip(&got).enumerate() {
            prop_assert_eq!(
                (kind, base, npages),
                (op.kind, op.base, op.npages),
                "thread {} event {}",
                id,
                i
            );
            prop_assert_eq!(
                long,
                !layout.fits(op.base),
                "long form of base {:#x}",
                op.base
            );
            prop_assert!(
                ticks >= prev_ticks,
                "thread {} event {}: time went back",
                id,
                i
            );
            if i > 0 && (ticks - prev_ticks) / unit >= 1 << 16 {
                BIG_GAPS.fetch_add(1, Ordering::Relaxed);
            }
            prev_ticks = ticks;
            let m = marker(w, i);
            let before = markers.get(&(*id, m, true)).copied();
            let after = markers.get(&(*id, m, false)).copied();
            let (Some(before), Some(after)) = (before, after) else {
                return Err(TestCaseError::fail(format!(
                    "thread {id} event {i}: markers missing"
                )));
            };
            prop_assert!(
                ticks < after && before < ticks + unit,
                "thread {} event {}: page ticks {} outside ({}, {}) by more than a unit",
                id,
                i,
                ticks,
                before,
                after
            );
        }
    }
    prop_assert!(
        pages.is_empty(),
        "page events of unknown threads: {:?}",
        pages.keys()
    );
    Ok(())
}

#[test]
fn page_events_round_trip_through_writer_and_reader() {
    let dir = std::env::temp_dir().join(format!("alloctrace-pages-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = if cfg!(debug_assertions) { 24 } else { 48 };
    let mut runner = TestRunner::new(RunnerConfig {
        cases,
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let ops = || prop::collection::vec(op(), 1..160);
    let strategy = (12u32..=16, [ops(), ops()]);
    let result = runner.run(&strategy, |(shift, ops)| run_case(&dir, shift, &ops));
    std::fs::remove_dir_all(&dir).ok();
    if let Err(e) = result {
        panic!("{e}");
    }
    // The pauses really made deltas that do not fit 16 bits.
    assert!(
        BIG_GAPS.load(Ordering::Relaxed) > 0,
        "no time delta overflowed 16 bits"
    );
}
