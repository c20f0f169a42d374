//! The flush of a thread's buffers when it gives its slot back
//! (`trace_thread_destroy`) or exits, which the session layer installs
//! into thread.rs at start (`thread::set_exit_flush`): the events a thread
//! recorded before it gave its slot back stay under its old thread ID, and
//! those after it under its new one. Without the flush the next owner of
//! the slot would append to the old batch, under the old ID.

use std::ffi::CString;

use alloctrace_reader::TraceReader;
use alloctrace_writer::events;

#[test]
fn events_before_and_after_thread_destroy_keep_their_thread_ids() {
    let dir = std::env::temp_dir().join(format!("alloctrace-destroy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.trace");
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    alloctrace_writer::start(
        &alloctrace_writer::Config::default(),
        alloctrace_writer::Output::create(&cpath).unwrap(),
        None,
    )
    .unwrap();
    const BEFORE: usize = 0x1000_0000;
    const AFTER: usize = 0x2000_0000;
    let (first, second, third) = std::thread::spawn(|| {
        events::heap_object_alloc(BEFORE, 16, 0);
        let first = events::thread_id();
        events::thread_destroy();
        events::heap_object_alloc(AFTER, 16, 0);
        let second = events::thread_id();
        // And a thread that exits: its events reach the trace under its ID.
        let third = std::thread::spawn(|| {
            events::heap_object_alloc(AFTER + 0x100, 16, 0);
            events::thread_id()
        })
        .join()
        .unwrap();
        (first, second, third)
    })
    .join()
    .unwrap();
    alloctrace_writer::stop().unwrap();
    assert_ne!(first, second, "thread_destroy gives the thread a new ID");

    let mut reader =
        TraceReader::new(std::io::BufReader::new(std::fs::File::open(&path).unwrap())).unwrap();
    let mut got = Vec::new();
    while let Some(e) = reader.next_event().unwrap() {
        got.push((e.addr, e.thread));
    }
    got.sort();
    assert_eq!(
        got,
        vec![
            (BEFORE as u64, first),
            (AFTER as u64, second),
            (AFTER as u64 + 0x100, third)
        ]
    );
    assert_eq!(reader.lost_events(), 0);
    std::fs::remove_dir_all(&dir).ok();
}
