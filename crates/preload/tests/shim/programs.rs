//! The C test programs under the shim: churn, every entry point, fork,
//! signals during allocation, every way to exit, exec, constructors that
//! allocate first, and the families of ALLOCTRACE_RECORD.

use crate::harness::*;

/// The entry points prog_entry_points calls, each counted by the trace
/// and by libcounter.so.
pub const ENTRIES: [&str; 13] = [
    "malloc",
    "calloc",
    "realloc",
    "free",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "valloc",
    "pvalloc",
    "reallocarray",
    "mmap",
    "munmap",
    "mremap",
];

/// The count of `entry` in a counting interposer's output (lines "NAME N").
pub fn counted(counts: &str, entry: &str) -> Option<i64> {
    counts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next() == Some(entry)).then(|| f.next().and_then(|n| n.parse().ok()))?
    })
}

/// The sum of a counting interposer's counts.
pub fn counted_total(counts: &str) -> i64 {
    counts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<i64>().ok())
        .sum()
}

/// A traced run must exit 0, list one trace at least, and every trace
/// must check ok.
fn assert_ran(case: &Case, rc: i32) {
    assert_eq!(rc, 0, "exit status; stderr: {}", case.err_head());
    assert!(
        !case.traces().is_empty(),
        "no trace listed; stderr: {}",
        case.err_head()
    );
    let bad = case.check_all();
    assert!(bad.is_empty(), "check: {bad:?}");
}

#[test]
fn churn_single() {
    let case = Case::new("churn_single");
    let rc = case.traced(&[], &[&prog("prog_churn"), "0", "200000"]);
    assert_ran(&case, rc);
    let s = stats(&case.trace());
    let allocs = s.num("heap_object_alloc");
    assert_eq!(allocs, s.num("heap_object_free"), "allocs = frees");
    assert_eq!(s.num("live_objects"), 0, "live at exit");
    assert!(allocs >= 100000, "{allocs} allocs, want >= 100000");
}

/// 8 threads exiting while others allocate.
#[test]
fn churn_threads() {
    let case = Case::new("churn_threads");
    let rc = case.traced(&[], &[&prog("prog_churn"), "8", "100000"]);
    assert_ran(&case, rc);
    let s = stats(&case.trace());
    assert_eq!(s.num("stack_alloc"), 8, "thread stacks allocated");
    assert_eq!(s.num("stack_free"), 8, "thread stacks freed");
    assert_eq!(s.num("stack_exists"), 1, "thread stacks existing at start");
    assert!(
        s.num("threads") >= 9,
        "{} threads, want >= 9",
        s.num("threads")
    );
    assert_eq!(s.num("lost_events"), 0, "lost events");
}

/// The trace's entry_points equal the counting interposer's.
#[test]
fn entry_points() {
    let case = Case::new("entry_points");
    let counts = case.path("counts");
    let crc = case.limited(
        &[
            ("COUNT_OUTPUT", &counts),
            ("LD_PRELOAD", &prog("libcounter.so")),
        ],
        &[&prog("prog_entry_points")],
    );
    assert_eq!(
        crc,
        0,
        "under the counter: exit status; {}",
        case.err_head()
    );
    let counts = case.read("counts");
    assert!(!counts.is_empty(), "the counter wrote nothing");
    let rc = case.traced(&[], &[&prog("prog_entry_points")]);
    assert_ran(&case, rc);
    let s = stats(&case.trace());
    for e in ENTRIES {
        let want = counted(&counts, e);
        assert_eq!(
            Some(s.entry(e)),
            want,
            "{e}: trace (left) vs counter (right)"
        );
    }
}

/// A parent and 5 children traced into 6 files; each child records the
/// frees of inherited blocks as calls, and its inherited span exists and
/// is freed.
#[test]
fn fork() {
    let case = Case::new("fork");
    let rc = case.traced(&[], &[&prog("prog_fork"), "5"]);
    assert_ran(&case, rc);
    let traces = case.traces();
    assert_eq!(traces.len(), 6, "traces: {traces:?}");
    let mut pids = case.trace_pids();
    pids.sort();
    pids.dedup();
    assert_eq!(pids.len(), 6, "distinct pids");
    for t in &traces[1..] {
        let s = stats(t);
        let frees = s.num("heap_object_free");
        let calls = s.entry("free") - frees;
        assert!(frees >= 100, "{t}: {frees} frees, want >= 100");
        assert!(
            calls >= 3,
            "{t}: {calls} inherited frees recorded as calls, want >= 3"
        );
        assert!(s.num("span_exists") >= 1, "{t}: no inherited span exists");
        assert!(s.num("span_free") >= 1, "{t}: no span freed");
        assert_eq!(s.num("stack_exists"), 1, "{t}: thread stacks existing");
    }
}

/// A signal handler allocating during the program's allocations: the
/// calls recorded plus those lost are the calls made.
#[test]
fn signal() {
    let case = Case::new("signal");
    let rc = case.traced(
        &[("ALLOCTRACE_BUFFER_SIZE", "4096")],
        &[&prog("prog_signal"), "1000000"],
    );
    assert_ran(&case, rc);
    let out = case.read("out");
    let mut f = out
        .split_whitespace()
        .map(|n| n.parse::<i64>().expect("a number"));
    let (m, h) = (
        f.next().expect("iterations"),
        f.next().expect("handler runs"),
    );
    let s = stats(&case.trace());
    let tags = s.entry("free") + s.entry("malloc");
    let lost = s.num("lost_events");
    assert_eq!(
        tags + lost,
        2 * m + 2 * h,
        "{tags} recorded + {lost} lost vs calls made (M={m}, H={h})"
    );
    assert!(h > 0, "the handler never ran");
}

/// prog_exit leaves by MODE; the trace is complete (check ok).
fn exit_complete(name: &'static str, mode: &str) {
    let case = Case::new(name);
    let rc = case.traced(
        &[("ALLOCTRACE_BUFFER_SIZE", "4096")],
        &[&prog("prog_exit"), mode, "20000"],
    );
    assert_ran(&case, rc);
    let allocs = stats(&case.trace()).num("heap_object_alloc");
    assert!(allocs >= 20000, "only {allocs} allocs recorded");
}

#[test]
fn exit_return() {
    exit_complete("exit_return", "return");
}

#[test]
fn exit_exit() {
    exit_complete("exit_exit", "exit");
}

#[test]
fn exit_underscore_exit() {
    exit_complete("exit__exit", "_exit");
}

#[test]
fn exit_underscore_capital_exit() {
    exit_complete("exit__Exit", "_Exit");
}

/// prog_exit leaves without running an exit handler: check says
/// truncated (3); dump and stats read the complete batches.
fn exit_truncated(name: &'static str, mode: &str, want_rc: i32) {
    let case = Case::new(name);
    let rc = case.traced(
        &[("ALLOCTRACE_BUFFER_SIZE", "4096")],
        &[&prog("prog_exit"), mode, "20000"],
    );
    assert_eq!(rc, want_rc, "exit status; stderr: {}", case.err_head());
    let t = case.trace();
    assert!(!t.is_empty(), "no trace listed");
    assert_eq!(check(&t).0, 3, "check's exit status (truncated)");
    assert_eq!(run_cli(&["dump", &t]).0, 0, "dump's exit status");
    let s = stats(&t);
    assert!(s.truncated(), "stats does not say truncated");
    let allocs = s.num("heap_object_alloc");
    assert!(allocs >= 10000, "{allocs} allocs read, want >= 10000");
}

#[test]
fn exit_exit_group() {
    exit_truncated("exit_exit_group", "exit_group", 0);
}

#[test]
fn exit_kill() {
    exit_truncated("exit_kill", "kill", 137);
}

/// A failed exec: the trace goes on in a 2nd file; an exec with a clean
/// environment is still traced, into a 3rd.
#[test]
fn exec() {
    let case = Case::new("exec");
    let rc = case.traced(&[], &[&prog("prog_exec")]);
    assert_ran(&case, rc);
    assert_eq!(case.traces().len(), 3, "traces: {:?}", case.traces());
    let mut pids = case.trace_pids();
    pids.sort();
    pids.dedup();
    assert_eq!(pids.len(), 1, "pids: {pids:?}");
    assert!(
        case.read("out").contains("child traced"),
        "out: {}",
        case.read("out")
    );
}

/// Blocks allocated by a library constructor before the shim's are
/// 'exists' events; their frees pair up (check ok).
#[test]
fn early() {
    let case = Case::new("early");
    let rc = case.traced(&[], &[&prog("prog_early")]);
    assert_ran(&case, rc);
    let exists = stats(&case.trace()).num("heap_object_exists");
    assert!(exists >= 5, "{exists} exists events, want >= 5");
}

/// ALLOCTRACE_RECORD=heap: heap events only; =mmap,stacks: none of them.
#[test]
fn families() {
    let case = Case::new("families");
    case.traced(
        &[("ALLOCTRACE_RECORD", "heap")],
        &[&prog("prog_entry_points")],
    );
    let s = stats(&case.trace());
    let h1 = s.num("heap_object_alloc");
    let s1 = s.num("span_alloc") + s.num("stack_alloc") + s.num("stack_exists");
    let bad = case.check_all();
    case.reset_index();
    case.traced(
        &[("ALLOCTRACE_RECORD", "mmap,stacks")],
        &[&prog("prog_entry_points")],
    );
    let s = stats(&case.trace());
    assert!(h1 > 0, "heap only: no heap allocs");
    assert_eq!(s1, 0, "heap only: span and thread-stack events");
    assert_eq!(s.num("heap_object_alloc"), 0, "mmap,stacks: heap allocs");
    assert!(s.num("span_alloc") > 0, "mmap,stacks: no span allocs");
    assert_eq!(s.num("stack_alloc"), 2, "mmap,stacks: thread stacks");
    assert!(bad.is_empty(), "heap only: check: {bad:?}");
    let bad = case.check_all();
    assert!(bad.is_empty(), "mmap,stacks: check: {bad:?}");
}
