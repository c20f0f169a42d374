//! `flush_for_fatal_signal` from a signal that lands at any point of a
//! thread's own events, inside them included: in forked children that
//! record events in a loop until a timer signal's handler flushes and
//! ends the child (never returning into the interrupted code, as the shim
//! does). Each trace must be complete and readable, with every event
//! recorded before the signal, and the interrupted event (if any) counted
//! lost (it may also be in the trace, when the signal came after its last
//! byte). Heap events (the events stream) and page events of all three
//! word forms (the pages stream, cut back to its last complete event).

use std::ffi::CString;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use alloctrace_reader::{EventData, TraceReader};
use alloctrace_writer::events;

/// Events completed by the child's loop.
static DONE: AtomicU64 = AtomicU64::new(0);
/// The pipe to the parent.
static REPORT_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_alarm(_: libc::c_int) {
    let r = alloctrace_writer::flush_for_fatal_signal();
    let report = [
        DONE.load(Ordering::SeqCst),
        (r.ended && r.drained) as u64,
        r.mid_event as u64,
    ];
    // SAFETY: writes a plain array to the pipe, then ends the child without
    // returning into the interrupted event.
    unsafe {
        libc::write(REPORT_FD.load(Ordering::SeqCst), report.as_ptr().cast(), 24);
        libc::_exit(0);
    }
}

/// The child: traces into `path`, records events until the timer fires.
fn child(path: &CString, pages: bool, delay_us: i64, fd: libc::c_int) -> ! {
    REPORT_FD.store(fd, Ordering::SeqCst);
    let config = alloctrace_writer::Config {
        buffer_size: 4096,
        ..Default::default()
    };
    alloctrace_writer::start(
        &config,
        alloctrace_writer::Output::create(path).unwrap(),
        None,
    )
    .unwrap();
    // SAFETY: a handler and a one-shot timer for this process.
    unsafe {
        libc::signal(
            libc::SIGALRM,
            on_alarm as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
        let timer = libc::itimerval {
            it_interval: libc::timeval {
                tv_sec: 0,
                tv_usec: 0,
            },
            it_value: libc::timeval {
                tv_sec: 0,
                tv_usec: delay_us,
            },
        };
        libc::setitimer(libc::ITIMER_REAL, &timer, core::ptr::null_mut());
    }
    let mut i = 0usize;
    loop {
        if pages {
            match i % 3 {
                0 => events::page_alloc(0x1000_0000 + i * 4096, 1),
                // npages too large for the word: a second word.
                1 => events::page_alloc(0x2000_0000, 1 << 40),
                // Off the page grid: the long form, three words.
                _ => events::page_alloc(0x3000_0001 + i, 2),
            }
        } else {
            events::heap_object_alloc(0x1000_0000 + i * 16, 16, 0);
        }
        i += 1;
        DONE.store(i as u64, Ordering::SeqCst);
    }
}

#[test]
fn every_event_before_the_signal_is_kept_and_an_interrupted_one_counted() {
    let dir = std::env::temp_dir().join(format!("alloctrace-fatal-mid-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut mid_events = 0;
    let trials = 40;
    for trial in 0..trials {
        let pages = trial % 2 == 1;
        let path = dir.join(format!("t{trial}.trace"));
        let cpath = CString::new(path.to_str().unwrap()).unwrap();
        let mut fds = [0; 2];
        // SAFETY: a pipe and a fork; the child never returns (child() ends
        // in _exit from the handler).
        let pid = unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            libc::fork()
        };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: the read end is the parent's.
            unsafe { libc::close(fds[0]) };
            child(&cpath, pages, 2000 + 97 * trial as i64, fds[1]);
        }
        let mut report = [0u64; 3];
        // SAFETY: reads the child's report, then reaps it.
        unsafe {
            libc::close(fds[1]);
            let n = libc::read(fds[0], report.as_mut_ptr().cast(), 24);
            assert_eq!(n, 24, "trial {trial}: no report from the child");
            libc::close(fds[0]);
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
        }
        let [done, ended, mid] = report;
        assert_eq!(ended, 1, "trial {trial}: the flush ended the session");
        let mut reader =
            TraceReader::new(std::io::BufReader::new(std::fs::File::open(&path).unwrap())).unwrap();
        let mut recorded = 0u64;
        while let Some(e) = reader
            .next_event()
            .unwrap_or_else(|e| panic!("trial {trial} (pages {pages}, mid-event {mid}): {e}"))
        {
            // Exactly the event the loop recorded as number `recorded`: a
            // half-written one would decode as something else.
            let i = recorded;
            let want = match (pages, i % 3) {
                (false, _) => (
                    0x1000_0000 + i * 16,
                    EventData::HeapObjectAlloc {
                        size: 16,
                        type_id: 0,
                    },
                ),
                (true, 0) => (0x1000_0000 + i * 4096, EventData::PageAlloc { npages: 1 }),
                (true, 1) => (0x2000_0000, EventData::PageAlloc { npages: 1 << 40 }),
                (true, _) => (0x3000_0001 + i, EventData::PageAlloc { npages: 2 }),
            };
            assert_eq!((e.addr, e.data), want, "trial {trial}: event {i}");
            recorded += 1;
        }
        assert_eq!(reader.truncated(), None, "trial {trial}: complete");
        if mid == 1 {
            mid_events += 1;
            // Counted lost; its bytes may have been complete just before
            // the signal (then it is in the trace too).
            assert_eq!(
                reader.lost_events(),
                1,
                "trial {trial}: the interrupted event is counted lost"
            );
            assert!(
                recorded == done || recorded == done + 1,
                "trial {trial} (pages {pages}): {recorded} recorded, {done} done"
            );
        } else {
            // The signal may land between an event's end and the count.
            assert!(
                recorded == done || recorded == done + 1,
                "trial {trial}: {recorded} recorded, {done} done"
            );
            assert_eq!(reader.lost_events(), 0, "trial {trial}");
        }
    }
    eprintln!("{mid_events} of {trials} signals landed inside an event");
    std::fs::remove_dir_all(&dir).ok();
}
