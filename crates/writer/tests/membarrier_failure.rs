//! A membarrier call that fails at run time (ENOMEM) must not leave the
//! handshake with a one-sided fence (handshake.rs, "When membarrier fails
//! at run time"): a failure that passes is retried, and the advance then
//! completes with every event in the trace; one that never passes aborts
//! the process with a message instead of taking buffers unsafely.

use std::process::Command;

use alloctrace_reader::TraceReader;
use alloctrace_writer::events;

const CHILD_ENV: &str = "ALLOCTRACE_TEST_MEMBARRIER_CHILD";

fn trace_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "alloctrace-membarrier-{}-{name}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("t.trace")
}

fn start(path: &std::path::Path) -> bool {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    alloctrace_writer::start(
        &Default::default(),
        alloctrace_writer::Output::create(&c).unwrap(),
        None,
    )
    .unwrap();
    if !alloctrace_writer::asymmetric_fences() {
        eprintln!("membarrier is not available here: writers use real fences, nothing to inject");
        alloctrace_writer::stop().unwrap();
        return false;
    }
    true
}

#[test]
fn transient_membarrier_failures_are_retried() {
    let path = trace_path("retry");
    if !start(&path) {
        return;
    }
    for i in 0..100usize {
        events::heap_object_alloc(0x1000 + i * 16, 16, 0);
    }
    // Fewer failures than attempts: the advance must still complete.
    alloctrace_writer::inject_membarrier_failures(alloctrace_writer::MEMBARRIER_ATTEMPTS - 1);
    alloctrace_writer::advance().unwrap();
    for i in 0..100usize {
        events::heap_object_free(0x1000 + i * 16);
    }
    alloctrace_writer::stop().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let mut reader = TraceReader::new(&bytes[..]).unwrap();
    let mut n = 0;
    while reader.next_event().unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, 200);
    assert_eq!(reader.lost_events(), 0);
    std::fs::remove_dir_all(path.parent().unwrap()).ok();
}

/// Run in a child process by [`a_membarrier_that_never_succeeds_aborts`].
#[test]
fn membarrier_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let path = trace_path("child");
    if !start(&path) {
        std::process::exit(77);
    }
    events::heap_object_alloc(0x1000, 16, 0);
    alloctrace_writer::inject_membarrier_failures(u32::MAX);
    let _ = alloctrace_writer::advance();
    // Reached only if the advance went on with a one-sided fence.
    std::process::exit(3);
}

#[test]
fn a_membarrier_that_never_succeeds_aborts() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "membarrier_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(77) {
        eprintln!("membarrier is not available here: nothing to inject");
        return;
    }
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "status {:?}, stderr: {stderr}",
        out.status
    );
    assert!(
        stderr.contains("alloctrace: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) failed 40 times (last errno 12)"),
        "stderr: {stderr}"
    );
}
