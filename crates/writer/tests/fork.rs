//! fork while tracing: the child starts with tracing off (its events never
//! reach the parent's trace, and it never waits for the parent's writer
//! thread), holds no descriptor of the parent's trace, can start a trace of
//! its own, and the parent's trace stays exact.

mod common;

use std::ffi::CString;

use alloctrace_reader::TraceReader;
use alloctrace_writer::events;

fn read_addresses(path: &std::path::Path) -> Vec<u64> {
    let mut reader =
        TraceReader::new(std::io::BufReader::new(std::fs::File::open(path).unwrap())).unwrap();
    let mut out = Vec::new();
    while let Some(e) = reader.next_event().unwrap() {
        out.push(e.addr);
    }
    assert_eq!(reader.truncated(), None, "{}", path.display());
    out
}

/// Whether a descriptor of this process names the file `path` (its
/// /proc/self/fd link), without allocating (a forked child).
fn holds_file(path: &[u8]) -> bool {
    let mut link = [0u8; 64];
    let mut target = [0u8; 4096];
    for fd in 0..65536u32 {
        // SAFETY: F_GETFD on any number is harmless.
        if unsafe { libc::fcntl(fd as i32, libc::F_GETFD) } < 0 {
            continue;
        }
        let prefix = b"/proc/self/fd/";
        link[..prefix.len()].copy_from_slice(prefix);
        let mut digits = [0u8; 10];
        let (mut n, mut v) = (0, fd);
        loop {
            digits[n] = b'0' + (v % 10) as u8;
            n += 1;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        for i in 0..n {
            link[prefix.len() + i] = digits[n - 1 - i];
        }
        link[prefix.len() + n] = 0;
        // SAFETY: link is NUL-terminated, target a buffer of its length.
        let len = unsafe {
            libc::readlink(
                link.as_ptr().cast(),
                target.as_mut_ptr().cast(),
                target.len(),
            )
        };
        if len > 0 && &target[..len as usize] == path {
            return true;
        }
    }
    false
}

#[test]
fn child_is_clean_and_parent_trace_is_exact() {
    let dir = std::env::temp_dir().join(format!("alloctrace-fork-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let parent_path = dir.join("parent.trace");
    let child_path = dir.join("child.trace");
    let child_cpath = CString::new(child_path.to_str().unwrap()).unwrap();
    let parent_bytes = parent_path.to_str().unwrap().as_bytes().to_vec();
    let config = alloctrace_writer::Config {
        buffer_size: 4096,
        ..Default::default()
    };
    common::start_to(&parent_path, &config);

    // A second thread is mid-stream in the parent when the fork happens.
    let busy = std::thread::spawn(|| {
        for i in 0..200_000usize {
            events::heap_object_alloc(0x4000_0000 + i * 8, 8, 0);
        }
    });
    for i in 0..1000usize {
        events::heap_object_alloc(0x1000_0000 + i * 8, 8, 0);
    }

    // SAFETY: the child only calls the tracer and async-signal-safe libc
    // functions before _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let mut status = 0;
        if alloctrace_writer::enabled() {
            status |= 1;
        }
        if holds_file(&parent_bytes) {
            status |= 32;
        }
        // Must return at once, not wait for a writer thread the child lacks.
        for i in 0..100_000usize {
            events::heap_object_alloc(0x2000_0000 + i * 8, 8, 0);
        }
        if alloctrace_writer::advance().is_ok() {
            status |= 2;
        }
        // The child's own trace.
        match alloctrace_writer::Output::create_new(&child_cpath) {
            Ok(out) => {
                if alloctrace_writer::start(&config, out, None).is_err() {
                    status |= 4;
                }
                for i in 0..10usize {
                    events::heap_object_alloc(0x3000_0000 + i * 8, 8, 0);
                }
                if alloctrace_writer::stop().is_err() {
                    status |= 8;
                }
            }
            Err(_) => status |= 16,
        }
        // SAFETY: ends the child without running the parent's atexit work.
        unsafe { libc::_exit(status) };
    }
    let mut status = 0;
    // SAFETY: pid is our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status), "child died: {status:#x}");
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "child status bits (see the test)"
    );

    for i in 1000..2000usize {
        events::heap_object_alloc(0x1000_0000 + i * 8, 8, 0);
    }
    busy.join().unwrap();
    alloctrace_writer::stop().unwrap();

    let parent = read_addresses(&parent_path);
    assert_eq!(
        parent.len(),
        2000 + 200_000,
        "the parent's trace holds exactly its own events"
    );
    assert!(parent
        .iter()
        .all(|&a| !(0x2000_0000..0x3000_0000).contains(&a)
            && !(0x3000_0000..0x4000_0000).contains(&a)));
    let child = read_addresses(&child_path);
    assert_eq!(
        child,
        (0..10u64).map(|i| 0x3000_0000 + i * 8).collect::<Vec<_>>()
    );

    // create_new refuses an existing file.
    assert_eq!(
        alloctrace_writer::Output::create_new(&child_cpath).err(),
        Some(libc::EEXIST)
    );
    std::fs::remove_dir_all(&dir).ok();
}
