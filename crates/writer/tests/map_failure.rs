//! Lossless back-pressure when the kernel refuses memory: a thread that
//! finds no free buffer and whose mmap fails waits for the writer to
//! return one (buffer.rs, BufferPool::take) instead of dropping the event.

mod common;

use alloctrace_reader::TraceReader;
use alloctrace_writer::events;

#[test]
fn refused_mmap_waits_for_a_buffer_instead_of_losing_events() {
    // A slow reader, so that threads run out of free buffers.
    let (write_fd, drain) = common::slow_pipe();

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
    // From here every new buffer mapping fails: only the few buffers start
    // mapped circulate, far below the 64 allowed.
    const INJECTED: u32 = 1_000_000_000;
    alloctrace_writer::inject_map_failures(INJECTED);
    const THREADS: usize = 2;
    const PAIRS: usize = 50_000;
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..PAIRS {
                    let a = 0x1000_0000 + (t << 28) + i * 8;
                    events::heap_object_alloc(a, 8, 0);
                    events::heap_object_free(a);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let left = alloctrace_writer::inject_map_failures(0);
    let stats = alloctrace_writer::session_stats().unwrap();
    alloctrace_writer::stop().unwrap();
    // SAFETY: we own the write end; closing it ends the drain thread.
    unsafe { libc::close(write_fd) };
    let trace = drain.join().unwrap();

    assert!(
        left < INJECTED,
        "no mmap was refused: the test did not test the refusal"
    );
    assert!(stats.producer_waits > 0, "no producer waited");
    let mut reader = TraceReader::new(&trace[..]).unwrap();
    let mut count = 0usize;
    while reader.next_event().unwrap().is_some() {
        count += 1;
    }
    assert_eq!(reader.lost_events(), 0);
    assert_eq!(count, THREADS * PAIRS * 2);
    assert_eq!(reader.truncated(), None);
}
