//! The snapshot signal (ALLOCTRACE_SNAPSHOT_SIGNAL, SIGUSR2 by default)
//! on prog_snapshot_signal: where the program leaves SIGUSR2 at SIG_DFL,
//! the signal writes a file beside the trace and the program goes on;
//! a program's own handler or SIG_IGN acts as untraced; turned off, or
//! without a control thread, the signal ends the process as untraced.

use crate::harness::*;

/// SIGUSR2's default action: the process ends by the signal.
const KILLED_BY_USR2: i32 = 128 + libc::SIGUSR2;

#[test]
fn snapshot_signal_in_flight_mode_writes_a_dump_and_goes_on() {
    let case = Case::new("snapshot_signal_flight");
    let dir = case.dir().display().to_string();
    let prog = prog("prog_snapshot_signal");
    let rc = case.traced(
        &[("ALLOCTRACE_FLIGHT_RECORDER", "4MiB")],
        &[&prog, "dfl", &dir, ".flight-1.trace"],
    );
    assert_eq!(rc, 0, "stderr: {}", case.err_head());
    let t = case.trace();
    let dump = t.replace(".trace", ".flight-1.trace");
    let (code, out) = check(&dump);
    assert_eq!(code, 0, "check {dump}: {}", head(&out, 3));
    assert!(out.contains("flight-recorder window"), "check: {out}");
    let s = stats(&dump);
    assert!(!s.truncated());
    assert!(
        s.num("heap_object_alloc") >= 100,
        "the 100 live blocks before the signal"
    );
}

#[test]
fn snapshot_signal_leaves_the_programs_handler_alone() {
    let case = Case::new("snapshot_signal_handler");
    let dir = case.dir().display().to_string();
    let prog = prog("prog_snapshot_signal");
    let rc = case.traced(
        &[("ALLOCTRACE_FLIGHT_RECORDER", "4MiB")],
        &[&prog, "handler", &dir, ".flight-1.trace"],
    );
    assert_eq!(rc, 0, "stderr: {}", case.err_head());
    assert!(!case.trace().is_empty());
    let dumps: Vec<_> = std::fs::read_dir(case.dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".flight-"))
        .collect();
    assert!(dumps.is_empty(), "the program's handler took the signal");
}

#[test]
fn snapshot_signal_leaves_sig_ign_alone() {
    let case = Case::new("snapshot_signal_ignore");
    let dir = case.dir().display().to_string();
    let prog = prog("prog_snapshot_signal");
    let rc = case.traced(
        &[("ALLOCTRACE_FLIGHT_RECORDER", "4MiB")],
        &[&prog, "ignore", &dir, ".flight-1.trace"],
    );
    assert_eq!(rc, 0, "stderr: {}", case.err_head());
}

#[test]
fn snapshot_signal_off_or_without_control_ends_the_process_as_untraced() {
    let prog = prog("prog_snapshot_signal");
    let untraced = Case::new("snapshot_signal_untraced");
    let dir = untraced.dir().display().to_string();
    let argv = [prog.as_str(), "dfl", &dir, ".never"];
    assert_eq!(untraced.limited(&[], &argv), KILLED_BY_USR2);
    for (name, var, value) in [
        ("snapshot_signal_off", "ALLOCTRACE_SNAPSHOT_SIGNAL", "off"),
        ("snapshot_signal_usr1", "ALLOCTRACE_SNAPSHOT_SIGNAL", "USR1"),
        ("snapshot_signal_no_control", "ALLOCTRACE_CONTROL", "off"),
    ] {
        let case = Case::new(name);
        let dir = case.dir().display().to_string();
        let argv = [prog.as_str(), "dfl", &dir, ".never"];
        let rc = case.traced(&[(var, value)], &argv);
        assert_eq!(rc, KILLED_BY_USR2, "{name}: stderr: {}", case.err_head());
        // The fatal path flushed the trace, as for any fatal signal.
        let (code, out) = check(&case.trace());
        assert_eq!(code, 0, "{name}: check: {}", head(&out, 3));
    }
}

#[test]
fn snapshot_signal_in_sampling_mode_writes_the_live_heap_beside_the_trace() {
    let case = Case::new("snapshot_signal_sampling");
    let dir = case.dir().display().to_string();
    let prog = prog("prog_snapshot_signal");
    // One byte between samples: every allocation is sampled.
    let rc = case.traced(
        &[("ALLOCTRACE_SAMPLE_BYTES", "1")],
        &[&prog, "dfl", &dir, ".snapshot-1.trace"],
    );
    assert_eq!(rc, 0, "stderr: {}", case.err_head());
    let snapshot = case.trace().replace(".trace", ".snapshot-1.trace");
    let (code, out) = check(&snapshot);
    assert_eq!(code, 0, "check {snapshot}: {}", head(&out, 3));
    let s = stats(&snapshot);
    assert!(
        s.num("live_objects") >= 100 && s.num("live_bytes") >= 400_000,
        "the 100 live blocks of 4000 bytes: {:?}",
        (s.num("live_objects"), s.num("live_bytes"))
    );
}

#[test]
fn snapshot_signal_in_full_mode_without_a_live_table_ends_the_process_as_untraced() {
    let case = Case::new("snapshot_signal_full");
    let dir = case.dir().display().to_string();
    let prog = prog("prog_snapshot_signal");
    let rc = case.traced(&[], &[&prog, "dfl", &dir, ".never"]);
    assert_eq!(rc, KILLED_BY_USR2, "stderr: {}", case.err_head());
    let case = Case::new("snapshot_signal_full_table");
    let dir = case.dir().display().to_string();
    let rc = case.traced(
        &[("ALLOCTRACE_LIVE_TABLE", "on")],
        &[&prog, "dfl", &dir, ".snapshot-1.trace"],
    );
    assert_eq!(rc, 0, "stderr: {}", case.err_head());
    let snapshot = case.trace().replace(".trace", ".snapshot-1.trace");
    assert_eq!(check(&snapshot).0, 0);
}
