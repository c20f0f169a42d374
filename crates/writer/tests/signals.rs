//! A signal handler that emits events while its thread is inside the event
//! path must not corrupt the buffer: each of its events is either recorded
//! or counted in lost_events, and the trace reads back well formed.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};

use alloctrace_reader::{EventData, TraceReader};
use alloctrace_writer::events;

static HANDLER_EVENTS: AtomicU64 = AtomicU64::new(0);
/// Handler runs that have made their event (HANDLER_EVENTS counts those
/// that started): SIGALRM is the process's, so a handler may run on
/// another thread, late, and the session must not stop under it.
static HANDLER_DONE: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_alarm(_: libc::c_int) {
    let n = HANDLER_EVENTS.fetch_add(1, Ordering::Relaxed) as usize;
    events::stack_alloc(0x7000_0000_0000 + n * 4096, 4096);
    HANDLER_DONE.fetch_add(1, Ordering::Release);
}

#[test]
fn handler_events_are_recorded_or_counted() {
    let dir = std::env::temp_dir().join(format!("alloctrace-signal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sig.trace");
    let config = alloctrace_writer::Config {
        buffer_size: 4096,
        ..Default::default()
    };
    common::start_to(&path, &config);

    // SAFETY: installs a handler and a 20 µs interval timer for this test.
    unsafe {
        libc::signal(
            libc::SIGALRM,
            on_alarm as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
        let every = libc::timeval {
            tv_sec: 0,
            tv_usec: 20,
        };
        let timer = libc::itimerval {
            it_interval: every,
            it_value: every,
        };
        libc::setitimer(libc::ITIMER_REAL, &timer, core::ptr::null_mut());
    }
    // At least 300 ms and 200 handler runs: on a busy machine the thread
    // may run for little of the 300 ms, and the count of timer signals it
    // gets is no verdict (the 60 s bound only stops a broken timer).
    let start = std::time::Instant::now();
    let mut main_events = 0u64;
    while (start.elapsed() < std::time::Duration::from_millis(300)
        || HANDLER_EVENTS.load(Ordering::Relaxed) < 200)
        && start.elapsed() < std::time::Duration::from_secs(60)
    {
        events::heap_object_alloc(0x1000, 16, 0);
        events::heap_object_free(0x1000);
        main_events += 2;
    }
    // SAFETY: stops the timer.
    unsafe {
        let zero = libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        };
        let timer = libc::itimerval {
            it_interval: zero,
            it_value: zero,
        };
        libc::setitimer(libc::ITIMER_REAL, &timer, core::ptr::null_mut());
        libc::signal(libc::SIGALRM, libc::SIG_IGN);
    }
    // No handler starts from here on; wait for those under way.
    while HANDLER_DONE.load(Ordering::Acquire) != HANDLER_EVENTS.load(Ordering::Relaxed) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    alloctrace_writer::stop().unwrap();

    let mut reader =
        TraceReader::new(std::io::BufReader::new(std::fs::File::open(&path).unwrap())).unwrap();
    let (mut objects, mut stacks) = (0u64, 0u64);
    while let Some(e) = reader.next_event().unwrap() {
        match e.data {
            EventData::StackAlloc { size: 4096 } => stacks += 1,
            EventData::HeapObjectAlloc { .. } | EventData::HeapObjectFree => objects += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    let handler = HANDLER_EVENTS.load(Ordering::Relaxed);
    assert!(handler > 100, "the timer fired only {handler} times");
    assert_eq!(
        objects, main_events,
        "every event of the interrupted thread is there"
    );
    assert_eq!(
        stacks + reader.lost_events(),
        handler,
        "handler events: recorded {stacks}, lost {}",
        reader.lost_events()
    );
    std::fs::remove_dir_all(&dir).ok();
}
