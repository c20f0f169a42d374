//! The flight recorder under the shim (ALLOCTRACE_FLIGHT_RECORDER): a
//! fatal signal and the RSS threshold write the ring to the trace file,
//! which reads cleanly as a flight-recorder window; a normal exit writes
//! nothing; a bad value is refused before anything is traced.

use crate::harness::*;

/// prog_crash MODE COUNT THREADS [busy] under the flight recorder dies as
/// untraced, and its trace file holds the ring: a window, complete, that
/// `check` accepts, with the last allocations before the crash.
fn flight_crash(name: &'static str, want: i32, args: &[&str]) {
    let case = Case::new(name);
    let prog = prog("prog_crash");
    let argv: Vec<&str> = std::iter::once(prog.as_str())
        .chain(args.iter().copied())
        .collect();
    let rc = case.traced(&[("ALLOCTRACE_FLIGHT_RECORDER", "4MiB")], &argv);
    assert_eq!(rc, want, "traced exit status; stderr: {}", case.err_head());
    let t = case.trace();
    assert!(!t.is_empty(), "no trace listed");
    let (code, out) = check(&t);
    assert_eq!(code, 0, "check: {}", head(&out, 3));
    assert!(out.contains("flight-recorder window"), "check: {out}");
    let s = stats(&t);
    assert!(!s.truncated());
    assert!(s.num("heap_object_alloc") > 0, "the ring's allocations");
    assert_eq!(s.0["flight_window"], serde_json::Value::Bool(true));
}

#[test]
fn flight_abort() {
    flight_crash("flight_abort", 134, &["abort", "150000", "0"]);
}

#[test]
fn flight_segv_busy_threads() {
    // Threads that go on allocating and freeing: frees of blocks
    // allocated before the window are expected, not anomalies.
    flight_crash(
        "flight_segv_busy_threads",
        139,
        &["segv", "200000", "3", "busy"],
    );
}

#[test]
fn flight_normal_exit_writes_nothing() {
    let case = Case::new("flight_normal_exit");
    let prog = prog("prog_churn");
    let rc = case.traced(
        &[("ALLOCTRACE_FLIGHT_RECORDER", "4MiB")],
        &[&prog, "2", "20000"],
    );
    assert_eq!(rc, 0, "stderr: {}", case.err_head());
    let t = case.trace();
    assert!(!t.is_empty(), "no trace listed");
    assert_eq!(std::fs::metadata(&t).unwrap().len(), 0, "{t}");
}

#[test]
fn flight_dump_on_rss() {
    let case = Case::new("flight_dump_on_rss");
    let prog = prog("prog_churn");
    // A threshold every process passes: the dump comes within the first
    // check of the writer thread, while the program churns.
    let rc = case.traced(
        &[
            ("ALLOCTRACE_FLIGHT_RECORDER", "4MiB"),
            ("ALLOCTRACE_DUMP_ON_RSS", "1"),
        ],
        &[&prog, "2", "2000000"],
    );
    assert_eq!(rc, 0, "stderr: {}", case.err_head());
    let t = case.trace();
    let (code, out) = check(&t);
    assert_eq!(code, 0, "check: {}", head(&out, 3));
    assert!(out.contains("flight-recorder window"), "check: {out}");
}

#[test]
fn flight_bad_value_runs_untraced() {
    let case = Case::new("flight_bad_value");
    let prog = prog("prog_churn");
    let rc = case.traced(
        &[("ALLOCTRACE_FLIGHT_RECORDER", "500ms")],
        &[&prog, "0", "100"],
    );
    assert_eq!(rc, 0);
    assert!(case.trace().is_empty(), "nothing traced");
    assert!(
        case.read("err")
            .contains("ALLOCTRACE_FLIGHT_RECORDER=\"500ms\": a duration from 1s to 7 days"),
        "{}",
        case.err_head()
    );
}

/// `record --flight-recorder`: a program that exits normally leaves an
/// empty trace, which the report says; one that crashes leaves a window.
#[test]
fn flight_record_reports() {
    let case = Case::new("flight_record");
    let run = |args: &[&str], err: &str| {
        let mut argv = vec![cli(), "record", "--flight-recorder", "4MiB"];
        argv.extend_from_slice(args);
        let mut cmd = case.command(&[], &argv, "out", err);
        cmd.current_dir(case.dir());
        run_limited(&mut cmd)
    };
    let churn = prog("prog_churn");
    assert_eq!(
        run(&["-o", "ok.trace", "--", &churn, "0", "1000"], "err1"),
        0
    );
    let err = case.read("err1");
    assert!(err.contains("empty: nothing was written"), "{err}");
    assert_eq!(std::fs::metadata(case.path("ok.trace")).unwrap().len(), 0);
    let crash = prog("prog_crash");
    let rc = run(
        &["-o", "crash.trace", "--", &crash, "abort", "1500", "0"],
        "err2",
    );
    assert_eq!(rc, 134);
    let err = case.read("err2");
    assert!(err.contains("a flight-recorder window"), "{err}");
    // A duration: the last 2 s, in a ring of 4 MiB.
    let mut argv = vec![cli(), "record", "--flight-recorder", "2s,4MiB"];
    argv.extend_from_slice(&["-o", "aged.trace", "--", &crash, "abort", "1500", "0"]);
    let mut cmd = case.command(&[], &argv, "out", "err3");
    cmd.current_dir(case.dir());
    assert_eq!(run_limited(&mut cmd), 134);
    let err = case.read("err3");
    assert!(err.contains("a flight-recorder window"), "{err}");
    let (code, out) = check(&case.path("aged.trace"));
    assert_eq!(code, 0, "check: {}", head(&out, 3));
}
