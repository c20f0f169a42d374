//! The panic boundary (crates/preload/src/boundary.rs).
//!
//! The panic-test shim with ALLOCTRACE_TEST_PANIC=KIND panics in the first
//! recording of that kind of call. The program must not notice: the same
//! output and exit status as untraced, every block usable (prog_panic
//! checks each), and one line on stderr, no Rust panic message. The trace
//! checks ok and says what it lacks: a panic while recording a call (an
//! entry point, a new thread's stack) turns that thread's tracing off, and
//! its event and each later call of the thread count in lost_events, so
//! that the calls in the trace plus lost_events are the calls the counting
//! interposer saw (plus the thread's stack, for `thread`). A panic in the
//! shim's own work (the module table's refresh after dlopen) loses nothing.

use std::sync::OnceLock;

use crate::harness::*;
use crate::programs::counted_total;

/// Whether `line` is the line the first panic of a process writes, ending
/// with `ending`: "alloctrace: internal error (a panic in the tracer at
/// PATH/boundary.rs:LINE:COLUMN: alloctrace test panic); ENDING".
fn is_panic_line(line: &str, ending: &str) -> bool {
    let Some(rest) = line.strip_prefix("alloctrace: internal error (a panic in the tracer at ")
    else {
        return false;
    };
    let Some((place, tail)) = rest.split_once(' ') else {
        return false;
    };
    let Some(place) = place.strip_suffix(':') else {
        return false;
    };
    let mut parts = place.rsplitn(3, ':');
    let (column, row, file) = (parts.next(), parts.next(), parts.next());
    let number =
        |s: Option<&str>| s.is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()));
    number(column)
        && number(row)
        && file.is_some_and(|f| f.ends_with("boundary.rs"))
        && tail == format!("alloctrace test panic); {ending}")
}

/// The ending of the line of a panic while recording a call.
const EVENT_PANIC: &str =
    "this thread's later calls go untraced, counted in the trace's lost_events";
/// The ending of the line of a panic in the shim's own work.
const OWN_PANIC: &str = "the program's calls go on";

/// prog_panic untraced: its output (stdout and stderr), exit status and
/// the calls the counting interposer saw.
struct Untraced {
    out: String,
    rc: i32,
    calls: i64,
}

fn untraced() -> &'static Untraced {
    static UNTRACED: OnceLock<Untraced> = OnceLock::new();
    let u = UNTRACED.get_or_init(|| {
        let case = Case::new("panic_untraced");
        let mut cmd = case.command(&[], &[&prog("prog_panic")], "uout", "uerr");
        let out = std::fs::OpenOptions::new()
            .append(true)
            .open(case.path("uout"))
            .expect("open uout");
        cmd.stdout(out.try_clone().expect("dup uout")).stderr(out);
        let rc = run_limited(&mut cmd);
        let counts = case.path("counts");
        let counter = prog("libcounter.so");
        run_limited(&mut case.command(
            &[("COUNT_OUTPUT", &counts), ("LD_PRELOAD", &counter)],
            &[&prog("prog_panic")],
            "cout",
            "cout",
        ));
        Untraced {
            out: case.read("uout"),
            rc,
            calls: counted_total(&case.read("counts")),
        }
    });
    assert_eq!(
        u.rc,
        0,
        "prog_panic untraced: exit status; out: {}",
        head(&u.out, 3)
    );
    assert!(
        u.out.lines().any(|l| l == "ok"),
        "prog_panic untraced: out: {}",
        head(&u.out, 3)
    );
    assert!(u.calls >= 30, "counter: {} calls, want >= 30", u.calls);
    u
}

#[test]
fn panic_untraced() {
    let u = untraced();
    println!(
        "prog_panic untraced: {}({} calls counted)",
        head(&u.out, 2),
        u.calls
    );
}

/// prog_panic under the panic-test shim panicking in the first recording
/// of `kind`.
fn panic_case(kind: &str) {
    let u = untraced();
    let case = Case::new(&format!("panic_{kind}"));
    let rc = case.traced_with(
        &built().panic_shim,
        &[("ALLOCTRACE_TEST_PANIC", kind)],
        &[&prog("prog_panic")],
    );
    let (out, err) = (case.read("out"), case.read("err"));
    assert_eq!(rc, 0, "exit status (untraced 0); stderr: {}", head(&err, 3));
    assert_eq!(out, u.out, "output traced (left) and untraced (right)");
    let t = case.trace();
    assert!(!t.is_empty(), "no trace listed");
    let ending = if kind == "dlopen" {
        OWN_PANIC
    } else {
        EVENT_PANIC
    };
    assert!(
        err.matches('\n').count() == 1 && is_panic_line(err.trim_end_matches('\n'), ending),
        "stderr is not the one line wanted: {}",
        head(&err, 5)
    );
    let (crc, check_out) = check(&t);
    assert_eq!(crc, 0, "check: {}", head(&check_out, 2));
    let s = stats(&t);
    let (calls, lost) = (s.calls(), s.num("lost_events"));
    if kind == "dlopen" {
        assert_eq!(lost, 0, "events lost");
        assert_eq!(calls, u.calls, "calls in the trace (left), counted (right)");
    } else {
        let extra_lost = i64::from(kind == "thread");
        assert!(lost >= 1, "no event lost");
        assert_eq!(
            calls + lost,
            u.calls + extra_lost,
            "{calls} calls in the trace + {lost} lost vs {} counted + {extra_lost}",
            u.calls
        );
    }
    let want_stacks = if kind == "thread" { 0 } else { 1 };
    assert_eq!(s.num("stack_alloc"), want_stacks, "thread stacks recorded");
}

macro_rules! panic_cases {
    ($($name:ident: $kind:literal,)*) => {$(
        #[test]
        fn $name() {
            panic_case($kind);
        }
    )*};
}

panic_cases! {
    panic_malloc: "malloc",
    panic_calloc: "calloc",
    panic_realloc: "realloc",
    panic_free: "free",
    panic_posix_memalign: "posix_memalign",
    panic_aligned_alloc: "aligned_alloc",
    panic_memalign: "memalign",
    panic_valloc: "valloc",
    panic_pvalloc: "pvalloc",
    panic_reallocarray: "reallocarray",
    panic_mmap: "mmap",
    panic_munmap: "munmap",
    panic_mremap: "mremap",
    panic_thread: "thread",
    panic_dlopen: "dlopen",
}

/// A shell pipeline whose every process panics at its first traced malloc
/// (each exec'd program arms the hook again; a forked child inherits its
/// parent's state): output and exit status as untraced, only the one-line
/// reports on stderr, every trace checks ok.
#[test]
fn panic_pipeline() {
    let case = Case::new("panic_pipeline");
    let input: String = (1..=3000).map(|i| format!("{i}\n")).collect();
    std::fs::write(case.path("input"), input).expect("write the input");
    let script = format!("sort -rn '{}' | uniq | wc -l; exit 3", case.path("input"));
    let mut cmd = case.command(&[], &["sh", "-c", &script], "uout", "uout");
    let uout = std::fs::OpenOptions::new()
        .append(true)
        .open(case.path("uout"))
        .expect("open uout");
    cmd.stdout(uout.try_clone().expect("dup uout")).stderr(uout);
    let urc = run_limited(&mut cmd);
    let rc = case.traced_with(
        &built().panic_shim,
        &[("ALLOCTRACE_TEST_PANIC", "malloc")],
        &["sh", "-c", &script],
    );
    let traces = case.traces();
    let err = case.read("err");
    let lines = err.lines().filter(|l| !l.is_empty()).count();
    let others = err
        .lines()
        .filter(|l| !is_panic_line(l, EVENT_PANIC))
        .count();
    let lost: i64 = traces.iter().map(|t| stats(t).num("lost_events")).sum();
    assert_eq!(rc, 3, "traced exit status");
    assert_eq!(urc, 3, "untraced exit status");
    assert_eq!(
        case.read("out"),
        case.read("uout"),
        "output traced (left) and untraced (right)"
    );
    assert!(traces.len() >= 3, "{} traces, want >= 3", traces.len());
    let bad = case.check_all();
    assert!(bad.is_empty(), "check: {bad:?}");
    assert!(
        lines >= 3,
        "{lines} stderr lines, want one per process (>= 3)"
    );
    assert_eq!(
        others,
        0,
        "stderr lines other than the panic's: {}",
        head(&err, 4)
    );
    assert!(lost >= lines as i64, "{lost} events lost, want >= {lines}");
}
