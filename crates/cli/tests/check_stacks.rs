//! The differential test of the shim's stack walks (issue 19, "Tests"):
//! programs run under the shim with `ALLOCTRACE_CHECK_STACKS=1`, which
//! walks every allocation's stack three ways, the memo walk the capture
//! uses, the full compact walk and framehop's alone, and compares them
//! frame for frame (alloctrace-writer's capture check mode). The shim
//! prints `alloctrace: check-stacks: N captures compared, M mismatches (K
//! more before the compact tables were built: ...)` when the session ends;
//! M must be 0 and N above a floor.
//!
//! The programs: bench/workload.c (2 threads), python3's deep-stack loop
//! (bench/deep_stack.py, PYTHONMALLOC=malloc; skipped, saying so, without
//! /usr/bin/python3), and c_tests/stacks/check_walks.c at -O0 with frame
//! pointers and at -O2 without them (inner paths alternating by 1 to 16
//! frames, the same leaf from two callers at the same depth, stacks deeper
//! than the limit, a signal handler's allocations, a second thread).
//!
//! Needs the shim next to the `alloctrace` binary under test (`make lib
//! preload cli`, or `cargo build --release -p alloctrace-preload` before
//! `cargo test --release -p alloctrace-cli --test check_stacks`) and gcc.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod support;

use support::{compile, repo, shim, Scratch};

/// What the check mode counted in one process.
#[derive(Debug)]
struct Checked {
    compared: u64,
    mismatches: u64,
    before_tables: u64,
}

/// Runs `prog args` under the shim with the check mode (`envs` added),
/// killed after two minutes; returns its counts. Panics, with the
/// program's stderr, when it fails or prints no (or more than one) count.
fn run_checked(dir: &Scratch, prog: &Path, args: &[&str], envs: &[(&str, &str)]) -> Checked {
    let err_path = dir.path("stderr");
    let err = std::fs::File::create(&err_path).expect("create the stderr file");
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .env("LD_PRELOAD", shim())
        .env("ALLOCTRACE_OUTPUT", dir.path("t.%p.trace"))
        .env("ALLOCTRACE_CHECK_STACKS", "1")
        .env("ALLOCTRACE_STACKS", "full")
        // The compact tables at the session's start, not when the writer
        // thread gets to them: otherwise how many walks are compared with
        // all three depends on the machine's load (a loaded CI machine ran
        // a whole workload before the writer thread built them).
        .env("ALLOCTRACE_TABLES_AT_START", "1")
        .env_remove("ALLOCTRACE_STACK_DEPTH")
        .env_remove("ALLOCTRACE_RECORD")
        .env_remove("ALLOCTRACE_FOLLOW")
        .env_remove("ALLOCTRACE_ONLY")
        .env_remove("ALLOCTRACE_DISABLE")
        .envs(envs.iter().copied())
        .stdout(Stdio::null())
        .stderr(err);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}", prog.display()));
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the program") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{} did not end within 120 s", prog.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(
        status.success(),
        "{} {args:?}: {status}\n{stderr}",
        prog.display()
    );
    let counts: Vec<Checked> = stderr.lines().filter_map(parse_counts).collect();
    assert_eq!(
        counts.len(),
        1,
        "{}: one check-stacks count expected\n{stderr}",
        prog.display()
    );
    let checked = counts.into_iter().next().unwrap();
    println!("{} {args:?}: {checked:?}", prog.display());
    assert_eq!(
        checked.mismatches,
        0,
        "{} {args:?}: the walks differ\n{stderr}",
        prog.display()
    );
    checked
}

/// The counts of `alloctrace: check-stacks: N captures compared, M
/// mismatches (K more before ...`.
fn parse_counts(line: &str) -> Option<Checked> {
    let rest = line.strip_prefix("alloctrace: check-stacks: ")?;
    let (compared, rest) = rest.split_once(" captures compared, ")?;
    let (mismatches, rest) = rest.split_once(" mismatches (")?;
    let (before, _) = rest.split_once(" more before the compact tables")?;
    Some(Checked {
        compared: compared.parse().ok()?,
        mismatches: mismatches.parse().ok()?,
        before_tables: before.parse().ok()?,
    })
}

#[test]
fn the_counts_line_parses() {
    let c = parse_counts("alloctrace: check-stacks: 12 captures compared, 3 mismatches (4 more before the compact tables were built: memo and framehop only)").unwrap();
    assert_eq!((c.compared, c.mismatches, c.before_tables), (12, 3, 4));
    assert!(parse_counts("alloctrace: check-stacks: mismatch:").is_none());
}

#[test]
fn the_workload_walks_agree() {
    let dir = Scratch::new("workload");
    let prog = dir.path("workload");
    let bench = repo().join("bench");
    compile(
        "gcc",
        &[
            "-std=c11",
            "-D_GNU_SOURCE",
            "-O2",
            "-g",
            "-I",
            bench.to_str().unwrap(),
            bench.join("workload.c").to_str().unwrap(),
            "-lpthread",
            "-o",
            prog.to_str().unwrap(),
        ],
    );
    // 2 threads of 100,000 mallocs each.
    let c = run_checked(&dir, &prog, &["2", "100000"], &[]);
    // Every walk compared with all three (tables at start).
    assert!(c.compared >= 200_000, "{c:?}");
}

#[test]
fn the_python_loop_walks_agree() {
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        println!("skipped: /usr/bin/python3 is not installed");
        return;
    }
    let dir = Scratch::new("python");
    let script = repo().join("bench/deep_stack.py");
    // About 120,000 allocations, 30-60 native frames deep in the loop.
    let c = run_checked(
        &dir,
        python,
        &[script.to_str().unwrap(), "100"],
        &[("PYTHONMALLOC", "malloc")],
    );
    assert!(c.compared >= 60_000, "{c:?}");
}

#[test]
fn synthetic_chains_walks_agree_with_and_without_frame_pointers() {
    let dir = Scratch::new("chains");
    let source = repo().join("c_tests/stacks/check_walks.c");
    for (name, flags) in [
        ("fp", ["-O0", "-fno-omit-frame-pointer"]),
        ("nofp", ["-O2", "-fomit-frame-pointer"]),
    ] {
        let prog = dir.path(&format!("check_walks_{name}"));
        let mut args = vec!["-Wall", "-Wextra", "-Werror", "-g", "-pthread"];
        args.extend_from_slice(&flags);
        args.extend_from_slice(&[source.to_str().unwrap(), "-o", prog.to_str().unwrap()]);
        compile("gcc", &args);
        // 8 rounds, each of 6,000 alternating paths, 1,500 allocations of
        // the same leaf, 16 deep stacks and 8 signal handlers' allocations
        // (both threads), 24 from a recursion deeper than the limit:
        // 60,576 allocations.
        let c = run_checked(&dir, &prog, &["8"], &[]);
        assert!(c.compared >= 60_000, "{name}: {c:?}");
    }
}
