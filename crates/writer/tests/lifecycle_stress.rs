//! Any thread may call start, stop and advance at any time (issue 10,
//! item 9): four threads loop over start/stop/advance while two others emit
//! events, with the tracer's advancer thread ending generations of its own
//! (a small `generation_bytes`). Every call must return (a watchdog turns
//! a deadlock into a failure instead of a hang), and every trace written
//! must read back complete, with nothing lost.
//!
//! The loop is bounded by iterations and by time (whichever comes first):
//! the assertion is that it completes, never how fast.

use std::ffi::CString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use alloctrace_reader::TraceReader;
use alloctrace_writer::{events, ClockKind, Config, Error, Output};

const CONTROLLERS: usize = 4;
const EMITTERS: usize = 2;
const ITERATIONS: usize = if cfg!(debug_assertions) {
    2_000
} else {
    20_000
};
const RUN_FOR: Duration = Duration::from_secs(10);
/// Far above what the run needs: only a deadlock reaches it.
const WATCHDOG: Duration = Duration::from_secs(120);

fn next_rand(s: &mut u64) -> u64 {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    s.wrapping_mul(2685821657736338717)
}

#[test]
fn concurrent_start_stop_advance_never_deadlock() {
    let dir = std::env::temp_dir().join(format!("alloctrace-lifecycle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (done_tx, done_rx) = mpsc::channel();
    let run_dir = dir.clone();
    std::thread::spawn(move || {
        let result = run(&run_dir);
        let _ = done_tx.send(result);
    });
    let traces = match done_rx.recv_timeout(WATCHDOG) {
        Ok(traces) => traces,
        Err(_) => panic!("start/stop/advance from {CONTROLLERS} threads did not finish in {WATCHDOG:?}: deadlock"),
    };
    assert!(
        traces.len() >= CONTROLLERS,
        "only {} sessions started",
        traces.len()
    );
    let mut events_read = 0u64;
    for path in &traces {
        let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut reader = TraceReader::new(std::io::BufReader::new(file))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        while reader
            .next_event()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .is_some()
        {
            events_read += 1;
        }
        assert_eq!(reader.truncated(), None, "{}: cut short", path.display());
        assert_eq!(reader.lost_events(), 0, "{}: events lost", path.display());
        assert!(
            reader.generations() >= 1,
            "{}: no generation",
            path.display()
        );
    }
    assert!(events_read > 0, "the emitters' events reached no trace");
    eprintln!("{} traces, {events_read} events read back", traces.len());
    std::fs::remove_dir_all(&dir).ok();
}

/// Runs the controllers and emitters; returns every trace a start created.
fn run(dir: &std::path::Path) -> Vec<PathBuf> {
    let stop_emitting = Arc::new(AtomicBool::new(false));
    let emitted = Arc::new(AtomicU64::new(0));
    let emitters: Vec<_> = (0..EMITTERS)
        .map(|t| {
            let stop = Arc::clone(&stop_emitting);
            let emitted = Arc::clone(&emitted);
            std::thread::spawn(move || {
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let addr = 0x1000_0000 + (t << 28) + (i % 4096) * 16;
                    events::heap_object_alloc(addr, 16, 0);
                    events::heap_object_free(addr);
                    i += 1;
                    if i.is_multiple_of(1024) {
                        // Threads come and go too.
                        events::thread_destroy();
                    }
                    if i.is_multiple_of(256) {
                        // Keeps the traces small; the point is the calls
                        // racing the lifecycle, not volume.
                        std::thread::sleep(Duration::from_micros(50));
                    }
                }
                emitted.fetch_add(i as u64, Ordering::Relaxed);
            })
        })
        .collect();

    let traces = Arc::new(Mutex::new(Vec::new()));
    let deadline = Instant::now() + RUN_FOR;
    let controllers: Vec<_> = (0..CONTROLLERS)
        .map(|c| {
            let traces = Arc::clone(&traces);
            let dir = dir.to_path_buf();
            std::thread::spawn(move || {
                let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ (c as u64 + 1);
                for i in 0..ITERATIONS {
                    if Instant::now() >= deadline {
                        break;
                    }
                    match next_rand(&mut seed) % 3 {
                        0 => {
                            let path = dir.join(format!("c{c}-{i}.trace"));
                            let cpath = CString::new(path.to_str().unwrap()).unwrap();
                            let config = Config {
                                // Small generations: the tracer's advancer
                                // thread advances too.
                                generation_bytes: 4096,
                                clock: if i % 2 == 0 {
                                    ClockKind::Coarse
                                } else {
                                    ClockKind::Precise
                                },
                                compress: i % 5 == 0,
                                ..Config::default()
                            };
                            let opened = Arc::new(AtomicBool::new(false));
                            let flag = Arc::clone(&opened);
                            let r = alloctrace_writer::start_with(
                                &config,
                                || {
                                    flag.store(true, Ordering::Relaxed);
                                    Output::create(&cpath).map_err(Error::Io)
                                },
                                None,
                            );
                            match r {
                                Ok(()) => traces.lock().unwrap().push(path),
                                Err(Error::AlreadyStarted) => {
                                    assert!(!opened.load(Ordering::Relaxed))
                                }
                                Err(e) => panic!("start: {e:?}"),
                            }
                        }
                        1 => match alloctrace_writer::stop() {
                            Ok(()) | Err(Error::NotStarted) => {}
                            Err(e) => panic!("stop: {e:?}"),
                        },
                        _ => match alloctrace_writer::advance() {
                            Ok(()) | Err(Error::NotStarted) => {}
                            Err(e) => panic!("advance: {e:?}"),
                        },
                    }
                }
            })
        })
        .collect();
    for c in controllers {
        c.join().unwrap();
    }
    match alloctrace_writer::stop() {
        Ok(()) | Err(Error::NotStarted) => {}
        Err(e) => panic!("final stop: {e:?}"),
    }
    stop_emitting.store(true, Ordering::Relaxed);
    for e in emitters {
        e.join().unwrap();
    }
    let traces = traces.lock().unwrap().clone();
    traces
}
