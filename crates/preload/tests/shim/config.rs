//! Configuration and output files: a bad setting, existing files and
//! symbolic links, ALLOCTRACE_OVERWRITE.

use crate::harness::*;

/// A bad setting: one message for the process tree; its programs run
/// untraced.
fn bad_setting(name: &str, var: &str, value: &str) {
    let case = Case::new(name);
    let churn = prog("prog_churn");
    let script = format!("'{churn}' 0 10; '{churn}' 0 10");
    let rc = case.traced(&[(var, value)], &["sh", "-c", &script]);
    let err = case.read("err");
    let files = std::fs::read_dir(case.dir())
        .expect("read the case's directory")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".trace"))
        })
        .count();
    assert_eq!(rc, 0, "exit status; stderr: {}", head(&err, 3));
    let lines: Vec<&str> = err.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 1, "stderr lines: {}", head(&err, 3));
    assert!(
        lines[0].starts_with(&format!("alloctrace: {var}="))
            && lines[0].ends_with("; running untraced"),
        "the message: {}",
        lines[0]
    );
    assert_eq!(files, 0, "trace files written");
    assert_eq!(
        case.read("out")
            .lines()
            .filter(|l| l.contains("threads"))
            .count(),
        2,
        "the programs' output: {}",
        case.read("out")
    );
}

#[test]
fn bad_buffer_size_12x() {
    bad_setting(
        "bad_ALLOCTRACE_BUFFER_SIZE_12x",
        "ALLOCTRACE_BUFFER_SIZE",
        "12x",
    );
}

#[test]
fn bad_buffer_size_100() {
    bad_setting(
        "bad_ALLOCTRACE_BUFFER_SIZE_100",
        "ALLOCTRACE_BUFFER_SIZE",
        "100",
    );
}

#[test]
fn bad_record_heap_pages() {
    bad_setting(
        "bad_ALLOCTRACE_RECORD_heap_pages",
        "ALLOCTRACE_RECORD",
        "heap,pages",
    );
}

#[test]
fn bad_output_percent_d() {
    bad_setting("bad_ALLOCTRACE_OUTPUT_x__d", "ALLOCTRACE_OUTPUT", "x.%d");
}

#[test]
fn bad_overwrite_yes() {
    bad_setting(
        "bad_ALLOCTRACE_OVERWRITE_yes",
        "ALLOCTRACE_OVERWRITE",
        "yes",
    );
}

/// An existing file and a symbolic link are left alone: the traces go to
/// out.1.trace and link.1.trace, mode 600.
#[test]
fn output_files() {
    use std::os::unix::fs::PermissionsExt;
    let case = Case::new("output_files");
    std::fs::write(case.path("out.trace"), "keep\n").expect("write out.trace");
    std::fs::write(case.path("victim"), "victim\n").expect("write victim");
    std::os::unix::fs::symlink(case.path("victim"), case.path("link.trace")).expect("symlink");
    let churn = prog("prog_churn");
    let r1 = case.traced(
        &[("ALLOCTRACE_OUTPUT", &case.path("out.trace"))],
        &[&churn, "0", "10"],
    );
    let r2 = case.traced(
        &[("ALLOCTRACE_OUTPUT", &case.path("link.trace"))],
        &[&churn, "0", "10"],
    );
    let mode = std::fs::metadata(case.path("out.1.trace")).map(|m| m.permissions().mode() & 0o777);
    assert_eq!(r1, 0, "exit status into out.trace");
    assert_eq!(r2, 0, "exit status into link.trace");
    assert_eq!(case.read("out.trace"), "keep\n", "out.trace");
    assert_eq!(case.read("victim"), "victim\n", "the link's target");
    assert_eq!(mode.ok(), Some(0o600), "out.1.trace's mode");
    assert!(
        case.dir().join("link.1.trace").is_file(),
        "link.1.trace is missing"
    );
    let bad = case.check_all();
    assert!(bad.is_empty(), "check: {bad:?}");
}

/// ALLOCTRACE_OVERWRITE=1 replaces the first process's file only (its
/// child writes out.1.trace) and still refuses a symbolic link.
#[test]
fn overwrite() {
    let case = Case::new("overwrite");
    std::fs::write(case.path("out.trace"), "old\n").expect("write out.trace");
    std::fs::write(case.path("victim"), "victim\n").expect("write victim");
    std::os::unix::fs::symlink(case.path("victim"), case.path("link.trace")).expect("symlink");
    let churn = prog("prog_churn");
    let out = case.path("out.trace");
    let r1 = case.traced(
        &[("ALLOCTRACE_OVERWRITE", "1"), ("ALLOCTRACE_OUTPUT", &out)],
        &["sh", "-c", &format!("'{churn}' 0 10")],
    );
    let c1 = head(&check(&out).1, 1);
    let link = case.path("link.trace");
    let r2 = case.traced(
        &[("ALLOCTRACE_OVERWRITE", "1"), ("ALLOCTRACE_OUTPUT", &link)],
        &[&churn, "0", "10"],
    );
    let err = case.read("err");
    assert_eq!(r1, 0, "exit status into out.trace");
    assert!(c1.starts_with("ok:"), "out.trace: {c1}");
    assert!(
        case.dir().join("out.1.trace").is_file(),
        "the child's out.1.trace is missing"
    );
    assert_eq!(r2, 0, "exit status into link.trace");
    assert_eq!(case.read("victim"), "victim\n", "the link's target");
    assert!(
        err.lines().any(|l| l
            .find("link.trace")
            .is_some_and(|i| l[i..].contains("running untraced"))),
        "stderr: {}",
        head(&err, 2)
    );
}
