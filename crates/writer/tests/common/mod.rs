//! What several of the core's test programs share. Each program uses
//! part of it.
#![allow(dead_code)]

use std::io::Read;
use std::os::fd::FromRawFd;

/// A pipe whose read end a thread drains slowly, in 4 KiB sips 20 us
/// apart, so that a tracer writing into it falls behind and its threads
/// run out of free buffers. Returns the write end (for
/// `Output::borrowed_fd`) and the thread, which returns every byte read
/// once the write end is closed.
pub fn slow_pipe() -> (i32, std::thread::JoinHandle<Vec<u8>>) {
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid out-array of two ints.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let (read_fd, write_fd) = (fds[0], fds[1]);
    let drain = std::thread::spawn(move || {
        // Nothing is read until a producer has waited for a buffer, so that
        // the wait happens whatever the machine's load: with the pipe full,
        // the writer thread blocks, the bounded buffers fill, and the next
        // event must wait. (A minute without a wait: drain anyway, and the
        // caller's assertion on the waits says what went wrong.)
        let since = std::time::Instant::now();
        while since.elapsed() < std::time::Duration::from_secs(60)
            && alloctrace_writer::session_stats().is_none_or(|s| s.producer_waits == 0)
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // SAFETY: read_fd is the read end this thread owns from here on.
        let mut pipe = unsafe { std::fs::File::from_raw_fd(read_fd) };
        let mut trace = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match pipe.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    trace.extend_from_slice(&chunk[..n]);
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
                Err(e) => panic!("pipe read: {e}"),
            }
        }
        trace
    });
    (write_fd, drain)
}

/// Starts tracing into a new file at `path` with `config`.
pub fn start_to(path: &std::path::Path, config: &alloctrace_writer::Config) {
    let cpath = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    alloctrace_writer::start(
        config,
        alloctrace_writer::Output::create(&cpath).unwrap(),
        None,
    )
    .unwrap();
}

/// `pairs` allocations of 48 bytes, each freed at once, at addresses
/// spread so that their events take several bytes each; pauses now and
/// then so that the tracer's own threads run on a loaded machine.
pub fn churn(pairs: usize) {
    for i in 0..pairs {
        if i % 50_000 == 0 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let a = 0x10_0000_0000 + (i * 7919 % 1_000_003) * 16;
        alloctrace_writer::events::heap_object_alloc(a, 48, 0);
        alloctrace_writer::events::heap_object_free(a);
    }
}
