//! `alloctrace record` (issue 10, items 3, 6, 12, 13): what it lists and
//! reports, what it does when the shim cannot trace, signals, where traces
//! go, --only, --no-follow, --overwrite.

use std::time::Duration;

use crate::harness::*;

/// Runs `alloctrace record ARGS` in D with the settings `vars`, stdout to
/// D/`out` and stderr to D/`err`; its rc.
fn record(case: &Case, vars: &[(&str, &str)], args: &[&str], out: &str, err: &str) -> i32 {
    let mut argv = vec![cli(), "record"];
    argv.extend_from_slice(args);
    let mut cmd = case.command(vars, &argv, out, err);
    cmd.current_dir(case.dir());
    run_limited(&mut cmd)
}

/// The files under `dir` (recursively) whose name `keep` accepts.
fn files_under(dir: &std::path::Path, keep: &dyn Fn(&str) -> bool) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = e.path();
        if path.is_dir() {
            found.extend(files_under(&path, keep));
        } else if keep(&e.file_name().to_string_lossy()) {
            found.push(path);
        }
    }
    found
}

/// The traces of a forking program listed with a summary each; the exit
/// status passed through (7, 143 for SIGTERM, 127 not found); an existing
/// -o refused.
#[test]
fn record_lists_and_passes_status() {
    let case = Case::new("record");
    let d = esc(&case.path(""));
    let r1 = record(
        &case,
        &[],
        &["-o", "rec.%p.trace", "--", &prog("prog_fork"), "2"],
        "out",
        "err",
    );
    let err = case.read("err");
    let r2 = record(
        &case,
        &[],
        &["-o", "one.trace", "--", "sh", "-c", "exit 7"],
        "out2",
        "err2",
    );
    let r3 = record(
        &case,
        &[],
        &["-o", "one.trace", "--", "true"],
        "out3",
        "err3",
    );
    let r4 = record(
        &case,
        &[],
        &["-o", "sig.trace", "--", "sh", "-c", "kill -TERM $$"],
        "out4",
        "err4",
    );
    let missing = case.path("no-such-program");
    let r5 = record(
        &case,
        &[],
        &["-o", "x.trace", "--", &missing],
        "out5",
        "err5",
    );
    assert_eq!(r1, 0, "exit status; stderr: {}", head(&err, 5));
    let listed = grep(
        &format!(r"^  {d}rec\.[0-9]*\.trace \(pid [0-9]*, prog_fork\)$"),
        &err,
    )
    .len();
    assert_eq!(listed, 3, "traces listed: {}", head(&err, 5));
    let summaries = grep(
        r"events in .* generation.* from .* thread.*; peak live heap .*; at exit .* still live; complete\.$",
        &err,
    )
    .len();
    assert_eq!(summaries, 3, "summaries: {}", head(&err, 5));
    assert!(
        has("^alloctrace: 3 traces written$", &err),
        "stderr: {}",
        head(&err, 5)
    );
    assert_eq!(r2, 7, "exit 7 passed through");
    assert_eq!(r3, 1, "an existing -o: exit status");
    assert!(
        case.read("err3").contains("one.trace exists"),
        "an existing -o: {}",
        case.read("err3")
    );
    assert_eq!(r4, 143, "SIGTERM passed through");
    assert_eq!(r5, 127, "a program not found");
}

/// A trace file the shim cannot create: exit 125, the report says which
/// process and why, in words.
#[test]
fn record_untraced() {
    let case = Case::new("record_untraced");
    let r = record(
        &case,
        &[],
        &[
            "-o",
            "/proc/nope.%p.trace",
            "--",
            &prog("prog_churn"),
            "0",
            "10",
        ],
        "out",
        "err",
    );
    let err = case.read("err");
    assert_eq!(r, 125, "exit status; stderr: {}", head(&err, 5));
    assert!(
        has(
            r"^alloctrace: pid [0-9]* \(prog_churn\) was not traced: cannot create the trace file /proc/nope\.[0-9]*\.trace: No such file or directory$",
            &err
        ),
        "which process and why: {}",
        head(&err, 5)
    );
    assert!(
        has(
            "^alloctrace: no trace was written; .*prog_churn exited with status 0$",
            &err
        ),
        "no trace: {}",
        head(&err, 5)
    );
    assert!(
        !has("os error|did not load|setuid", &err),
        "the report's words: {}",
        head(&err, 5)
    );
    assert!(
        case.read("out").contains("threads"),
        "the program's output: {}",
        case.read("out")
    );
}

/// Waits (up to the time limit) until the file `path` is not empty; no
/// timing is asserted.
fn wait_for(path: &str) -> bool {
    for _ in 0..limit() * 10 {
        if !read(path).is_empty() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// SIGTERM, SIGINT and SIGHUP sent to record reach the program (which
/// exits 10 + N from its handler, or 3), record passes its status
/// through, reports, and leaves no index file.
fn record_signal(name: &str, signal: i32, want: i32) {
    let case = Case::new(name);
    let tmp = case.path("tmp");
    std::fs::create_dir_all(&tmp).expect("create TMPDIR");
    let ready = case.path("ready");
    let wait = prog("prog_wait");
    let mut argv = vec![cli(), "record", "-o", "s.%p.trace", "--", &wait, &ready];
    if want == 3 {
        argv.push("3");
    }
    let mut cmd = case.command(&[("TMPDIR", &tmp)], &argv, "out", "err");
    cmd.current_dir(case.dir());
    // record leaves a signal ignored when it started ignored (as by a
    // background job of a shell without job control, which `make` may be
    // run as): the signal to send starts at its default, as from a
    // terminal.
    // SAFETY: signal(2) is async-signal-safe; the closure touches nothing
    // of the parent's.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            libc::signal(signal, libc::SIG_DFL);
            Ok(())
        })
    };
    let mut rec = cmd.spawn().expect("run alloctrace record");
    // Ends the program if the case fails before it is checked below (its
    // pid is then still the program's: record, its parent, has not
    // reaped it, or is itself killed).
    struct EndProgram<'a>(&'a str);
    impl Drop for EndProgram<'_> {
        fn drop(&mut self) {
            if let (true, Ok(pid)) = (std::thread::panicking(), read(self.0).trim().parse::<i32>())
            {
                // SAFETY: kill(2) of the program this case started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
    let _end = EndProgram(&ready);
    if wait_for(&ready) {
        // SAFETY: kill(2) with the pid of our own child, not yet waited for.
        unsafe { libc::kill(rec.id() as i32, signal) };
    }
    let r = wait_limited(&mut rec, "alloctrace record");
    let left = files_under(std::path::Path::new(&tmp), &|_| true).len();
    let running = read(&ready).trim().parse::<i32>().is_ok_and(|pid| {
        // SAFETY: signal 0 checks that the process exists; 9 ends a
        // program this case started that outlived it.
        unsafe { libc::kill(pid, 0) == 0 && libc::kill(pid, libc::SIGKILL) == 0 }
    });
    let err = case.read("err");
    assert_eq!(r, want, "record's exit status; stderr: {}", head(&err, 4));
    assert_eq!(left, 0, "files left in TMPDIR");
    assert!(!running, "the program was still running");
    assert!(
        has("^alloctrace: 1 trace written$", &err),
        "stderr: {}",
        head(&err, 4)
    );
    assert!(
        has(r"events in 1 generation.*complete\.$", &err),
        "the report: {}",
        head(&err, 4)
    );
}

#[test]
fn record_sigterm_25() {
    record_signal("record_sigTERM_25", libc::SIGTERM, 25);
}

#[test]
fn record_sigint_12() {
    record_signal("record_sigINT_12", libc::SIGINT, 12);
}

#[test]
fn record_sighup_11() {
    record_signal("record_sigHUP_11", libc::SIGHUP, 11);
}

#[test]
fn record_sigterm_3() {
    record_signal("record_sigTERM_3", libc::SIGTERM, 3);
}

/// A background process that outlives the command is reported still
/// running.
#[test]
fn record_background() {
    let case = Case::new("record_background");
    let ready = case.path("ready");
    let script = format!(
        "'{}' '{ready}' >/dev/null 2>&1 & while [ ! -s '{ready}' ]; do sleep 0.05; done",
        prog("prog_wait")
    );
    let r = record(
        &case,
        &[],
        &["-o", "b.%p.trace", "--", "sh", "-c", &script],
        "out",
        "err",
    );
    let bg = case.read("ready").trim().to_string();
    if let Ok(pid) = bg.parse::<i32>() {
        // SAFETY: kill(2) of the background program this case started.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let err = case.read("err");
    assert_eq!(r, 0, "exit status; stderr: {}", head(&err, 6));
    let d = esc(&case.path(""));
    assert!(
        has(
            &format!(r"^  {d}b\.{bg}(\.[0-9]*)?\.trace \(pid {bg}, prog_wait\)$"),
            &err
        ),
        "the background pid {bg} is not listed: {}",
        head(&err, 6)
    );
    let lines: Vec<&str> = err.lines().collect();
    let still = lines.iter().enumerate().any(|(i, l)| {
        l.contains(&format!("(pid {bg}, prog_wait)"))
            && lines[i..(i + 2).min(lines.len())]
                .iter()
                .any(|l| l.contains("still running"))
    });
    assert!(still, "not reported still running: {}", head(&err, 6));
}

/// Without -o: the traces go in a new directory, none in the current
/// one, and check reads the directory; with no trace, no directory is
/// left.
#[test]
fn record_directory() {
    let case = Case::new("record_directory");
    let churn = prog("prog_churn");
    let script = format!("'{churn}' 0 10; '{churn}' 0 10");
    let r = record(&case, &[], &["--", "sh", "-c", &script], "out", "err");
    let entries = |prefix: &str| -> Vec<String> {
        let mut found: Vec<String> = std::fs::read_dir(case.dir())
            .expect("read the case's directory")
            .flatten()
            .filter(|e| e.path().is_dir() && e.file_name().to_string_lossy().starts_with(prefix))
            .map(|e| e.path().to_string_lossy().into_owned())
            .collect();
        found.sort();
        found
    };
    let dirs = entries("alloctrace-sh-");
    let dir = dirs.first().cloned().unwrap_or_default();
    let here = std::fs::read_dir(case.dir())
        .expect("read the case's directory")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".trace"))
        .count();
    let inside = files_under(std::path::Path::new(&dir), &|n| n.ends_with(".trace")).len();
    let r2 = record(
        &case,
        &[],
        &["--only", "no-such-program", "--", "true"],
        "out2",
        "err2",
    );
    let empty = entries("alloctrace-true-").len();
    let err = case.read("err");
    assert_eq!(r, 0, "exit status; stderr: {}", head(&err, 3));
    assert_eq!(dirs.len(), 1, "directories made: {dirs:?}");
    assert_eq!(here, 0, "traces in the current directory");
    assert_eq!(inside, 3, "traces in {dir}");
    assert!(
        has(&format!(r"^  {}/[0-9]*\.trace \(pid", esc(&dir)), &err),
        "stderr: {}",
        head(&err, 3)
    );
    let (_, out, cerr) = run_cli(&["check", &dir]);
    let oks = format!("{out}{cerr}")
        .lines()
        .filter(|l| l.contains(": ok: "))
        .count();
    assert_eq!(oks, 3, "check of the directory: {out}{cerr}");
    assert_eq!(r2, 125, "nothing traced: exit status");
    assert_eq!(empty, 0, "nothing traced: directories left");
}

/// --only prog_churn: the two prog_churn traced (one a grandchild through
/// an untraced sh), the 2 sh untraced and listed.
#[test]
fn record_only() {
    let case = Case::new("record_only");
    let churn = prog("prog_churn");
    let script = format!("'{churn}' 0 10; sh -c '{churn} 0 10'");
    let args = [
        "--only",
        "prog_churn,nothing",
        "--only",
        "other",
        "-o",
        "o.%p.trace",
        "--",
        "sh",
        "-c",
        &script,
    ];
    let r = record(&case, &[], &args, "out", "err");
    let err = case.read("err");
    let d = esc(&case.path(""));
    let listed = grep(
        &format!(r"^  {d}o\.[0-9]*\.trace \(pid [0-9]*, prog_churn\)$"),
        &err,
    )
    .len();
    assert_eq!(r, 0, "exit status; stderr: {}", head(&err, 6));
    assert_eq!(listed, 2, "prog_churn traces listed: {}", head(&err, 6));
    assert!(
        has("^alloctrace: 2 traces written$", &err),
        "stderr: {}",
        head(&err, 6)
    );
    assert!(
        has("^alloctrace: 2 processes ran untraced, not named by --only prog_churn,nothing,other: sh", &err),
        "stderr: {}",
        head(&err, 6)
    );
    let files = files_under(case.dir(), &|n| n.ends_with(".trace")).len();
    assert_eq!(files, 2, "trace files");
}

/// --no-follow: the command's process traced (sh, then the prog_churn it
/// exec'd), its child prog_churn ran untraced.
#[test]
fn record_no_follow() {
    let case = Case::new("record_no_follow");
    let churn = prog("prog_churn");
    let script = format!("'{churn}' 0 10; exec '{churn}' 0 10");
    let r = record(
        &case,
        &[],
        &["--no-follow", "-o", "n.%p.trace", "--", "sh", "-c", &script],
        "out",
        "err",
    );
    let err = case.read("err");
    let d = esc(&case.path(""));
    let root = grep(
        &format!(r"^  {d}n\.[0-9]*\.trace \(pid [0-9]*, sh\)$"),
        &err,
    )
    .first()
    .and_then(|l| l.split("(pid ").nth(1))
    .and_then(|l| l.split(',').next())
    .unwrap_or_default()
    .to_string();
    assert_eq!(r, 0, "exit status; stderr: {}", head(&err, 6));
    assert!(
        !root.is_empty(),
        "sh's trace is not listed: {}",
        head(&err, 6)
    );
    assert!(
        has("^alloctrace: 2 traces written$", &err),
        "stderr: {}",
        head(&err, 6)
    );
    assert!(
        has(
            &format!(r"^  {d}n\.{root}\.1\.trace \(pid {root}, prog_churn\)$"),
            &err
        ),
        "the exec'd prog_churn is not listed: {}",
        head(&err, 6)
    );
    assert_eq!(
        case.read("out")
            .lines()
            .filter(|l| l.contains("threads"))
            .count(),
        2,
        "the programs' output"
    );
}

/// zstd by default; a trace over the report's bound summed up from the
/// index, a small one read; --no-report lists paths only.
#[test]
fn record_report() {
    let case = Case::new("record_report");
    let churn = prog("prog_churn");
    let r1 = record(
        &case,
        &[],
        &["-o", "big.trace", "--", &churn, "0", "300000"],
        "out",
        "err",
    );
    let r2 = record(
        &case,
        &[],
        &[
            "--compression",
            "none",
            "-o",
            "plain.trace",
            "--",
            &churn,
            "0",
            "300000",
        ],
        "out2",
        "err2",
    );
    let r3 = record(
        &case,
        &[],
        &["--no-report", "-o", "quiet.trace", "--", &churn, "0", "10"],
        "out3",
        "err3",
    );
    let size = |name: &str| std::fs::metadata(case.path(name)).map_or(0, |m| m.len());
    let (big, plain) = (size("big.trace"), size("plain.trace"));
    let (err, err2, err3) = (case.read("err"), case.read("err2"), case.read("err3"));
    assert_eq!(r1, 0, "zstd: exit status; stderr: {}", head(&err, 3));
    assert!(big > 1 << 20, "zstd: {big} bytes, want > 1 MiB");
    assert!(
        has(
            r"^    [0-9.]* MiB in 1 generation over [0-9.]* m?s; complete \(not read for this report: .alloctrace stats. counts its events\)\.$",
            &err
        ),
        "the report of a big trace: {}",
        head(&err, 3)
    );
    assert_eq!(r2, 0, "none: exit status; stderr: {}", head(&err2, 3));
    assert!(plain > big * 3 / 2, "zstd {big} bytes vs none {plain}");
    assert!(
        has(
            r"events in 1 generation from 1 thread; .*complete\.$",
            &err2
        ),
        "the report of a small trace: {}",
        head(&err2, 3)
    );
    assert_eq!(r3, 0, "--no-report: exit status");
    let pid = err3
        .split("(pid ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or_default();
    assert_eq!(
        err3.trim_end_matches('\n'),
        format!(
            "alloctrace: 1 trace written\n  {} (pid {pid}, prog_churn)",
            case.path("quiet.trace")
        ),
        "--no-report's stderr"
    );
}

/// --overwrite with several processes: only the run's first process
/// replaces the file (unlink, then a new 0600 file); every other process,
/// exec'd by bash (which builds each program's environment from its own
/// variables) or running concurrently, gets a file of its own; every
/// trace checks ok.
fn overwrite_run(name: &str, under_record: bool) {
    use std::os::unix::fs::PermissionsExt;
    let case = Case::new(name);
    let churn = prog("prog_churn");
    let script = format!(
        "'{churn}' 0 20000\n'{churn}' 0 20000\n'{churn}' 2 20000 &\n'{churn}' 2 20000 &\nwait\n"
    );
    std::fs::write(case.path("script.sh"), script).expect("write the script");
    let out_trace = case.path("out.trace");
    std::fs::write(&out_trace, "old\n").expect("write out.trace");
    std::fs::set_permissions(&out_trace, std::fs::Permissions::from_mode(0o644))
        .expect("chmod out.trace");
    let script = case.path("script.sh");
    let mut problems = Vec::new();
    let rc = if under_record {
        case.limited(
            &[("ALLOCTRACE_PRELOAD", shim())],
            &[
                cli(),
                "record",
                "--overwrite",
                "-o",
                &out_trace,
                "--",
                "bash",
                &script,
            ],
        )
    } else {
        let rc = case.traced(
            &[
                ("ALLOCTRACE_OVERWRITE", "1"),
                ("ALLOCTRACE_OUTPUT", &out_trace),
            ],
            &["bash", &script],
        );
        let index = case.read("index");
        let first: Vec<&str> = index
            .lines()
            .next()
            .unwrap_or_default()
            .split('\t')
            .skip(1)
            .take(2)
            .collect();
        if first != ["bash", out_trace.as_str()] {
            problems.push(format!("first index line {first:?}"));
        }
        rc
    };
    let traces = files_under(case.dir(), &|n| {
        n.starts_with("out") && n.ends_with(".trace")
    });
    let mut big = 0;
    for t in &traces {
        let t = t.to_string_lossy();
        let (crc, out) = check(&t);
        if crc != 0 {
            problems.push(format!("{t}: {}", head(&out, 1)));
        }
        if stats(&t).num("heap_object_alloc") >= 10000 {
            big += 1;
        }
    }
    let mode = std::fs::metadata(&out_trace).map(|m| m.permissions().mode() & 0o777);
    assert_eq!(rc, 0, "exit status; stderr: {}", case.err_head());
    assert!(traces.len() >= 5, "{} traces, want >= 5", traces.len());
    assert_eq!(big, 4, "the 4 programs' traces found");
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(mode.ok(), Some(0o600), "out.trace's mode");
    let allocs = stats(&out_trace).num("heap_object_alloc");
    assert!(
        allocs < 10000,
        "out.trace has {allocs} allocs: not bash's trace"
    );
}

#[test]
fn overwrite_run_shim() {
    overwrite_run("overwrite_run_shim", false);
}

#[test]
fn overwrite_run_record() {
    overwrite_run("overwrite_run_record", true);
}

/// An existing FIFO named by -o with overwrite: refused with the reason,
/// never opened (opening it would block the program until a reader came).
#[test]
fn overwrite_fifo() {
    use std::os::unix::fs::FileTypeExt;
    let case = Case::new("overwrite_fifo");
    let fifo = case.path("f.trace");
    let made = command("mkfifo").arg(&fifo).status().expect("run mkfifo");
    assert!(made.success(), "mkfifo failed");
    let churn = prog("prog_churn");
    let r1 = case.traced(
        &[("ALLOCTRACE_OVERWRITE", "1"), ("ALLOCTRACE_OUTPUT", &fifo)],
        &[&churn, "0", "10"],
    );
    let err1 = case.read("err");
    let r2 = case.limited(
        &[("ALLOCTRACE_PRELOAD", shim())],
        &[
            cli(),
            "record",
            "--overwrite",
            "-o",
            &fifo,
            "--",
            &churn,
            "0",
            "10",
        ],
    );
    let err = case.read("err");
    let still_fifo = std::fs::metadata(&fifo).is_ok_and(|m| m.file_type().is_fifo());
    assert_eq!(r1, 0, "the shim: exit status; stderr: {}", head(&err1, 2));
    assert_eq!(r2, 1, "record: exit status; stderr: {}", head(&err, 2));
    assert!(still_fifo, "the FIFO is gone");
    assert!(
        has("f.trace.*FIFO", &err1),
        "the shim's reason: {}",
        head(&err1, 2)
    );
    assert!(
        err.contains("f.trace is a FIFO"),
        "record's reason: {}",
        head(&err, 2)
    );
    assert!(
        case.read("out").is_empty(),
        "record ran the program: {}",
        case.read("out")
    );
}
