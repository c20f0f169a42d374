//! Lossless back-pressure: when the output drains slower than threads emit,
//! producers wait for free buffers instead of dropping events, and buffer
//! memory stays within its bound.

mod common;

use alloctrace_reader::TraceReader;
use alloctrace_writer::events;

#[test]
fn slow_output_loses_nothing() {
    // A slow reader, so that threads run out of free buffers.
    let (write_fd, drain) = common::slow_pipe();

    // 64 buffers of 4 KiB at most: far less than the trace.
    let config = alloctrace_writer::Config {
        buffer_size: 4096,
        max_buffer_memory: 64 * 4096,
        ..Default::default()
    };
    alloctrace_writer::start(
        &config,
        alloctrace_writer::Output::borrowed_fd(write_fd),
        None,
    )
    .unwrap();
    const THREADS: usize = 2;
    const PAIRS: usize = 100_000;
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                // Waiting for a buffer makes syscalls; the program's errno
                // must come out of every event call unchanged.
                const SENTINEL: i32 = 4242;
                for i in 0..PAIRS {
                    let a = 0x1000_0000 + (t << 28) + i * 8;
                    // SAFETY: this thread's errno.
                    unsafe { *libc::__errno_location() = SENTINEL };
                    events::heap_object_alloc(a, 8, 0);
                    events::heap_object_free(a);
                    assert_eq!(
                        // SAFETY: as above.
                        unsafe { *libc::__errno_location() },
                        SENTINEL,
                        "errno changed by event {i}"
                    );
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let stats = alloctrace_writer::session_stats().unwrap();
    alloctrace_writer::stop().unwrap();
    // SAFETY: we own the write end; closing it ends the drain thread.
    unsafe { libc::close(write_fd) };
    let trace = drain.join().unwrap();

    assert!(
        stats.buffers_mapped <= 64,
        "memory bound exceeded: {} buffers",
        stats.buffers_mapped
    );
    assert!(
        stats.producer_waits > 0,
        "the test did not make producers wait"
    );
    let mut reader = TraceReader::new(&trace[..]).unwrap();
    let mut count = 0usize;
    while reader.next_event().unwrap().is_some() {
        count += 1;
    }
    assert_eq!(count, THREADS * PAIRS * 2);
    assert_eq!(reader.lost_events(), 0);
    assert_eq!(reader.truncated(), None);
}
