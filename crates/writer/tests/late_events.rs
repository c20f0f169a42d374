//! `stop_at_exit`: the trace is complete when it returns, and events that
//! come after it (`late_event`, from any thread) are counted as lost events
//! of its last generation, rewritten in place, with compression on or off.

use std::ffi::CString;

use alloctrace_reader::TraceReader;
use alloctrace_writer::events;

/// Events read back, lost events, and whether the trace is complete.
fn read(path: &std::path::Path) -> (usize, u64, bool) {
    let mut reader =
        TraceReader::new(std::io::BufReader::new(std::fs::File::open(path).unwrap())).unwrap();
    let mut n = 0;
    while reader.next_event().unwrap().is_some() {
        n += 1;
    }
    (n, reader.lost_events(), reader.truncated().is_none())
}

#[test]
fn events_after_a_stop_at_exit_are_counted_in_the_complete_trace() {
    let dir = std::env::temp_dir().join(format!("alloctrace-late-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for compress in [false, true] {
        let path = dir.join(format!("late-{compress}.trace"));
        let cpath = CString::new(path.to_str().unwrap()).unwrap();
        let config = alloctrace_writer::Config {
            compress,
            ..Default::default()
        };
        let output = alloctrace_writer::Output::create(&cpath).unwrap();
        alloctrace_writer::start(&config, output, None).unwrap();
        for i in 0..1000usize {
            events::heap_object_alloc(0x5555_0000_0000 + i * 32, 24, 0);
            if i == 500 {
                alloctrace_writer::advance().unwrap();
            }
        }
        alloctrace_writer::stop_at_exit().unwrap();
        // Complete as the stop returns, nothing lost yet.
        assert_eq!(read(&path), (1000, 0, true), "compress {compress}");

        alloctrace_writer::late_event();
        assert_eq!(read(&path), (1000, 1, true), "compress {compress}");
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..5000 {
                        alloctrace_writer::late_event();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(read(&path), (1000, 20_001, true), "compress {compress}");
        // An event made after the session ended, not at exit, is not late.
        events::heap_object_free(0x5555_0000_0000);
        assert_eq!(read(&path), (1000, 20_001, true), "compress {compress}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
