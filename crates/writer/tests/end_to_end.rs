//! Writer to reader: several threads emit while generations advance and
//! threads come and go; the reader must give back exactly what each thread
//! emitted, in order, with nothing lost.

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use alloctrace_reader::{EventData, TraceReader};
use alloctrace_writer::events;

const THREADS: usize = 4;
const EVENTS_PER_THREAD: usize = if cfg!(debug_assertions) {
    20_000
} else {
    200_000
};

/// What thread `t` emits as its `i`-th pair: an alloc, then a free, at an
/// address no other thread uses.
fn address(t: usize, i: usize) -> usize {
    0x1000_0000 + (t << 28) + i * 16
}

#[test]
fn every_event_comes_back_in_order() {
    let dir = std::env::temp_dir().join(format!("alloctrace-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("e2e.trace");
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    // Small buffers so that many refills happen.
    let config = alloctrace_writer::Config {
        buffer_size: 4096,
        min_heap_align: 16,
        ..Default::default()
    };
    let ty = events::type_register(b"pair", 16, 0);
    alloctrace_writer::start(
        &config,
        alloctrace_writer::Output::create(&cpath).unwrap(),
        None,
    )
    .unwrap();

    let running = Arc::new(AtomicBool::new(true));
    let advancer = {
        let running = Arc::clone(&running);
        std::thread::spawn(move || {
            let mut advances = 0;
            while running.load(Ordering::Relaxed) {
                alloctrace_writer::advance().unwrap();
                advances += 1;
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            advances
        })
    };
    let barrier = Arc::new(Barrier::new(THREADS));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                // Each worker splits its work over two OS threads in a row;
                // the first exits mid-run and its events must still arrive.
                let half = EVENTS_PER_THREAD / 2;
                let first = std::thread::spawn(move || {
                    for i in 0..half {
                        events::heap_object_alloc(address(t, i), 16, ty);
                        events::heap_object_free(address(t, i));
                    }
                    events::thread_id()
                });
                let first_id = first.join().unwrap();
                for i in half..EVENTS_PER_THREAD {
                    events::heap_object_alloc(address(t, i), 16, ty);
                    events::heap_object_free(address(t, i));
                }
                (first_id, events::thread_id())
            })
        })
        .collect();
    let ids: Vec<(u64, u64)> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    running.store(false, Ordering::Relaxed);
    let advances = advancer.join().unwrap();
    alloctrace_writer::stop().unwrap();

    let mut reader =
        TraceReader::new(std::io::BufReader::new(std::fs::File::open(&path).unwrap())).unwrap();
    let mut per_thread: HashMap<u64, Vec<(u64, bool)>> = HashMap::new();
    let mut last_ticks: HashMap<u64, u64> = HashMap::new();
    let mut last_time = 0u64;
    let mut last_generation = 0u64;
    while let Some(e) = reader.next_event().unwrap() {
        if e.generation == last_generation {
            assert!(
                e.time_ns >= last_time,
                "time went backwards within generation {}",
                e.generation
            );
        }
        assert!(e.generation >= last_generation, "generations out of order");
        last_generation = e.generation;
        last_time = e.time_ns;
        let prev = last_ticks.insert(e.thread, e.ticks).unwrap_or(0);
        assert!(
            e.ticks > prev,
            "thread {} timestamps not strictly increasing",
            e.thread
        );
        assert!(!e.long_form);
        let is_alloc = match e.data {
            EventData::HeapObjectAlloc { size, type_id } => {
                assert_eq!((size, type_id), (16, ty));
                true
            }
            EventData::HeapObjectFree => false,
            other => panic!("unexpected event {other:?}"),
        };
        per_thread
            .entry(e.thread)
            .or_default()
            .push((e.addr, is_alloc));
    }
    assert_eq!(reader.truncated(), None);
    assert_eq!(reader.lost_events(), 0);
    assert!(reader.generations() as usize >= 2, "advances: {advances}");
    assert_eq!(
        per_thread.len(),
        THREADS * 2,
        "one trace thread per OS thread"
    );

    for (t, &(first_id, second_id)) in ids.iter().enumerate() {
        let half = EVENTS_PER_THREAD / 2;
        for (id, range) in [(first_id, 0..half), (second_id, half..EVENTS_PER_THREAD)] {
            let got = per_thread
                .get(&id)
                .unwrap_or_else(|| panic!("no events from thread {id}"));
            let want: Vec<(u64, bool)> = range
                .flat_map(|i| [(address(t, i) as u64, true), (address(t, i) as u64, false)])
                .collect();
            assert_eq!(got.len(), want.len(), "thread {id}: event count");
            assert!(
                *got == want,
                "thread {id}: events differ from what it emitted"
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
