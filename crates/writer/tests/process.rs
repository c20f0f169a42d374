//! The process batch: every generation carries the command line the
//! session read from /proc/self/cmdline at its start; one longer than a
//! buffer (or than 64 KiB) is cut at an argument, with the truncation flag.

use std::ffi::CString;
use std::path::Path;
use std::process::Command;

use alloctrace_reader::{Record, TraceReader};
use alloctrace_writer::events;

/// Traces a few events into `path` over three generations, with batches
/// of `buffer_size` bytes.
fn write_trace(path: &Path, buffer_size: usize) {
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    let config = alloctrace_writer::Config {
        buffer_size,
        ..Default::default()
    };
    alloctrace_writer::start(
        &config,
        alloctrace_writer::Output::create(&cpath).unwrap(),
        None,
    )
    .unwrap();
    for i in 0..3 {
        events::heap_object_alloc(0x10_0000 + i * 64, 48, 0);
        alloctrace_writer::advance().unwrap();
    }
    alloctrace_writer::stop().unwrap();
}

/// Each generation's command line and truncation flag.
fn command_lines(path: &Path) -> Vec<(Vec<String>, bool)> {
    let bytes = std::fs::read(path).unwrap();
    let mut reader = TraceReader::new(bytes.as_slice()).unwrap();
    let mut out = Vec::new();
    while let Some(record) = reader.next_record().unwrap() {
        if let Record::GenerationStart { .. } = record {
            let p = reader
                .process()
                .expect("a process batch in every generation");
            out.push((p.command_line.clone(), p.truncated));
        }
    }
    out
}

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("alloctrace-process-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn every_generation_carries_the_command_line() {
    if std::env::var_os("ALLOCTRACE_TEST_CHILD_TRACE").is_some() {
        return;
    }
    let path = temp("whole.trace");
    write_trace(&path, 64 << 10);
    let lines = command_lines(&path);
    assert_eq!(lines.len(), 4, "start, three advances");
    let want: Vec<String> = std::env::args().collect();
    for (args, truncated) in lines {
        assert_eq!(args, want);
        assert!(!truncated);
    }
    let _ = std::fs::remove_file(&path);
}

/// In a child run with a long command line (see below): writes the trace
/// the parent reads.
#[test]
fn child_writes_a_trace() {
    let Some(path) = std::env::var_os("ALLOCTRACE_TEST_CHILD_TRACE") else {
        return;
    };
    let buffer_size = std::env::var("ALLOCTRACE_TEST_CHILD_BUFFER")
        .unwrap()
        .parse()
        .unwrap();
    write_trace(Path::new(&path), buffer_size);
}

/// Runs this test binary's `child_writes_a_trace` with `extra` arguments
/// after its own (libtest takes them as further name filters, which match
/// nothing) and returns the trace's command lines and the child's full
/// argument list.
fn child(
    name: &str,
    buffer_size: usize,
    extra: &[String],
) -> (Vec<(Vec<String>, bool)>, Vec<String>) {
    let path = temp(name);
    let exe = std::env::current_exe().unwrap();
    let mut args = vec!["child_writes_a_trace".to_string(), "--exact".to_string()];
    args.extend_from_slice(extra);
    let status = Command::new(&exe)
        .args(&args)
        .env("ALLOCTRACE_TEST_CHILD_TRACE", &path)
        .env("ALLOCTRACE_TEST_CHILD_BUFFER", buffer_size.to_string())
        .status()
        .unwrap();
    assert!(status.success());
    let lines = command_lines(&path);
    let _ = std::fs::remove_file(&path);
    let mut full = vec![exe.to_str().unwrap().to_string()];
    full.extend(args);
    (lines, full)
}

#[test]
fn a_command_line_longer_than_a_buffer_is_cut_at_an_argument() {
    if std::env::var_os("ALLOCTRACE_TEST_CHILD_TRACE").is_some() {
        return;
    }
    // 20 arguments of 500 bytes: 10 KB, over a 4 KiB buffer.
    let extra: Vec<String> = (0..20)
        .map(|i| format!("{i:03}{}", "x".repeat(497)))
        .collect();
    let (lines, full) = child("cut.trace", 4096, &extra);
    assert_eq!(lines.len(), 4);
    for (args, truncated) in lines {
        assert!(truncated);
        let bytes: usize = args.iter().map(|a| a.len() + 2).sum();
        assert!(bytes <= 4096, "{bytes} bytes of arguments");
        // Whole arguments, the first ones.
        assert!(args.len() >= 4, "{args:?}");
        assert_eq!(args[..], full[..args.len()]);
    }
}

#[test]
fn a_command_line_over_64_kib_is_cut_at_64_kib() {
    if std::env::var_os("ALLOCTRACE_TEST_CHILD_TRACE").is_some() {
        return;
    }
    // 100 arguments of 1000 bytes: 100 KB.
    let extra: Vec<String> = (0..100)
        .map(|i| format!("{i:03}{}", "y".repeat(997)))
        .collect();
    let (lines, full) = child("long.trace", 1 << 20, &extra);
    assert_eq!(lines.len(), 4);
    for (args, truncated) in lines {
        assert!(truncated);
        // 64 KiB of /proc/self/cmdline: each argument and its NUL; the
        // last one cut.
        let kept: usize = args.iter().map(|a| a.len() + 1).sum();
        assert!((65_536..=65_537).contains(&kept), "{kept}");
        let last = args.len() - 1;
        assert_eq!(args[..last], full[..last]);
        // (Whole when the cut fell right after its NUL.)
        assert!(full[last].starts_with(&args[last]));
    }
}
