//! `flush_for_fatal_signal`, called from a signal handler as the LD_PRELOAD
//! shim calls it: the trace is complete (trace end written, the writer
//! drained) and holds every event of the signalled thread and of the other
//! threads; afterwards (a process that goes on after all) tracing is off
//! and can start again.

mod common;

use std::ffi::CString;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Barrier};

use alloctrace_reader::{EventData, TraceReader};
use alloctrace_writer::events;

/// Bit 0: ended and drained, bit 1: own buffers flushed, bit 2: mid event,
/// bit 3: ran.
static RESULT: AtomicU8 = AtomicU8::new(0);

extern "C" fn on_usr1(_: libc::c_int) {
    let r = alloctrace_writer::flush_for_fatal_signal();
    RESULT.store(
        (r.ended && r.drained) as u8 | (r.own_flushed as u8) << 1 | (r.mid_event as u8) << 2 | 8,
        Ordering::SeqCst,
    );
}

fn read_allocs(path: &std::path::Path) -> (u64, Option<u64>) {
    let mut reader =
        TraceReader::new(std::io::BufReader::new(std::fs::File::open(path).unwrap())).unwrap();
    let mut allocs = 0;
    while let Some(e) = reader.next_event().unwrap() {
        if let EventData::HeapObjectAlloc { .. } = e.data {
            allocs += 1;
        }
    }
    (allocs, reader.truncated())
}

#[test]
fn a_fatal_signal_flush_completes_the_trace() {
    const THREADS: usize = 3;
    const PER_THREAD: usize = 20_000;
    const MAIN: usize = 1_500;
    let dir = std::env::temp_dir().join(format!("alloctrace-fatal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("crash.trace");
    let config = alloctrace_writer::Config {
        buffer_size: 4096,
        ..Default::default()
    };
    common::start_to(&path, &config);

    // Threads that record their events and then wait, outside any event,
    // while the signalled thread flushes.
    let recorded = Arc::new(Barrier::new(THREADS + 1));
    let flushed = Arc::new(Barrier::new(THREADS + 1));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (recorded, flushed) = (Arc::clone(&recorded), Arc::clone(&flushed));
            std::thread::spawn(move || {
                for i in 0..PER_THREAD {
                    events::heap_object_alloc(0x1000_0000 + (t * PER_THREAD + i) * 16, 16, 0);
                }
                recorded.wait();
                flushed.wait();
            })
        })
        .collect();
    recorded.wait();
    for i in 0..MAIN {
        events::heap_object_alloc(0x7000_0000 + i * 16, 16, 0);
    }
    // SAFETY: installs a handler for SIGUSR1 and raises it on this thread
    // (raise returns after the handler ran).
    unsafe {
        libc::signal(
            libc::SIGUSR1,
            on_usr1 as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
        libc::raise(libc::SIGUSR1);
    }
    let r = RESULT.load(Ordering::SeqCst);
    assert_eq!(
        r,
        8 | 2 | 1,
        "ran, own buffers flushed, ended, not mid-event (bits {r:#b})"
    );
    assert!(
        !alloctrace_writer::enabled(),
        "tracing is off after the flush"
    );
    let (allocs, truncated) = read_allocs(&path);
    assert_eq!(truncated, None, "the trace is complete");
    assert_eq!(
        allocs as usize,
        THREADS * PER_THREAD + MAIN,
        "every event of every thread"
    );
    flushed.wait();
    for t in threads {
        t.join().unwrap();
    }

    // The process goes on (a handler that returns): the flush released
    // CONTROL, so tracing can start again.
    let again = dir.join("again.trace");
    let cagain = CString::new(again.to_str().unwrap()).unwrap();
    alloctrace_writer::start(
        &config,
        alloctrace_writer::Output::create(&cagain).unwrap(),
        None,
    )
    .unwrap();
    for i in 0..10 {
        events::heap_object_alloc(0x9000_0000 + i * 16, 16, 0);
    }
    alloctrace_writer::stop().unwrap();
    assert_eq!(read_allocs(&again), (10, None));
    std::fs::remove_dir_all(&dir).ok();
}
