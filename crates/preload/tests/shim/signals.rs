//! A program that dies of a signal leaves a complete trace holding every
//! event recorded before the crash, and dies exactly as it would untraced.

use std::process::Stdio;
use std::time::Duration;

use crate::harness::*;

/// Runs prog_crash untraced with `args`, stdout to D/uout, stderr to
/// D/uerr; its rc.
fn untraced_crash(case: &Case, args: &[&str]) -> i32 {
    let prog = prog("prog_crash");
    let argv: Vec<&str> = std::iter::once(prog.as_str())
        .chain(args.iter().copied())
        .collect();
    run_limited(&mut case.command(&[], &argv, "uout", "uerr"))
}

/// The traced run of prog_crash MODE COUNT THREADS [busy] dies as the
/// untraced one (exit status `want`, 128 + the signal), its trace is
/// complete (trace end present: check ok, not truncated) and holds at
/// least COUNT * (THREADS + 1) allocations. For the double free, check
/// shows the crash's cause: exactly one free of an address that is not
/// live.
fn crash_case(name: &'static str, want: i32, mode: &str, count: u64, threads: u64, busy: bool) {
    let case = Case::new(name);
    let (count_s, threads_s) = (count.to_string(), threads.to_string());
    let mut args = vec![mode, count_s.as_str(), threads_s.as_str()];
    if busy {
        args.push("busy");
    }
    let urc = untraced_crash(&case, &args);
    let prog = prog("prog_crash");
    let argv: Vec<&str> = std::iter::once(prog.as_str())
        .chain(args.iter().copied())
        .collect();
    let rc = case.traced(&[], &argv);
    assert_eq!(rc, want, "traced exit status; stderr: {}", case.err_head());
    assert_eq!(urc, want, "untraced exit status");
    let t = case.trace();
    assert!(!t.is_empty(), "no trace listed");
    let s = stats(&t);
    let (allocs, need) = (s.num("heap_object_alloc"), (count * (threads + 1)) as i64);
    let check_out = head(&check(&t).1, 2);
    assert!(
        allocs >= need,
        "{allocs} of {need} allocations in the trace; check: {check_out}"
    );
    assert!(!s.truncated(), "the trace is truncated; check: {check_out}");
    if mode == "double_free" {
        assert!(
            check_out.contains("1 anomalies (1 frees of addresses that are not live"),
            "check should show the double free, the crash's cause: {check_out}"
        );
    } else {
        assert!(check_out.starts_with("ok:"), "check: {check_out}");
    }
}

#[test]
fn signal_segv_1500() {
    crash_case("signal_segv_1500", 139, "segv", 1500, 0, false);
}

#[test]
fn signal_segv_150000() {
    crash_case("signal_segv_150000", 139, "segv", 150000, 0, false);
}

#[test]
fn signal_segv_threads() {
    crash_case("signal_segv_threads", 139, "segv", 20000, 3, false);
}

#[test]
fn signal_segv_busy_threads() {
    crash_case("signal_segv_busy_threads", 139, "segv", 20000, 3, true);
}

#[test]
fn signal_raise_term_busy_threads() {
    crash_case(
        "signal_raise_term_busy_threads",
        143,
        "raise_term",
        20000,
        3,
        true,
    );
}

#[test]
fn signal_abort_1500() {
    crash_case("signal_abort_1500", 134, "abort", 1500, 0, false);
}

#[test]
fn signal_abort_150000() {
    crash_case("signal_abort_150000", 134, "abort", 150000, 0, false);
}

#[test]
fn signal_double_free() {
    crash_case("signal_double_free", 134, "double_free", 1500, 0, false);
}

#[test]
fn signal_raise_term_1500() {
    crash_case("signal_raise_term_1500", 143, "raise_term", 1500, 0, false);
}

#[test]
fn signal_raise_term_150000() {
    crash_case(
        "signal_raise_term_150000",
        143,
        "raise_term",
        150000,
        0,
        false,
    );
}

#[test]
fn signal_sigpipe_1500() {
    crash_case("signal_sigpipe_1500", 141, "pipe", 1500, 0, false);
}

#[test]
fn signal_sigpipe_150000() {
    crash_case("signal_sigpipe_150000", 141, "pipe", 150000, 0, false);
}

#[test]
fn signal_reporter() {
    crash_case("signal_reporter", 139, "reporter", 1500, 0, false);
}

#[test]
fn signal_resethand() {
    crash_case("signal_resethand", 139, "resethand", 1500, 0, false);
}

/// Killed by another process while it waits (SIGINT: reset to SIG_DFL by
/// the program, as a background job inherits it ignored).
fn killed(name: &'static str, signal: i32) {
    let case = Case::new(name);
    let all = case.shim_vars(shim(), &[]);
    let vars: Vec<(&str, &str)> = all.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut child = case
        .command(
            &vars,
            &[&prog("prog_crash"), "wait", "150000"],
            "out",
            "err",
        )
        .spawn()
        .expect("run prog_crash");
    for _ in 0..limit() * 20 {
        if case.read("out").contains("ready") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill(2) with the pid of our own child, not yet waited for.
    unsafe { libc::kill(child.id() as i32, signal) };
    let rc = wait_limited(&mut child, "prog_crash wait");
    let t = case.trace();
    let allocs = stats(&t).num("heap_object_alloc");
    assert_eq!(rc, 128 + signal, "exit status; stderr: {}", case.err_head());
    assert!(!t.is_empty(), "no trace listed");
    assert!(allocs >= 150000, "{allocs} allocations, want >= 150000");
    let (crc, out) = check(&t);
    assert_eq!(crc, 0, "check: {}", head(&out, 1));
}

#[test]
fn signal_kill_term() {
    killed("signal_kill_TERM", libc::SIGTERM);
}

#[test]
fn signal_kill_int() {
    killed("signal_kill_INT", libc::SIGINT);
}

#[test]
fn signal_kill_quit() {
    killed("signal_kill_QUIT", libc::SIGQUIT);
}

/// quick_exit(3): status 3; a complete trace, the at_quick_exit handler's
/// allocation included.
#[test]
fn signal_quick_exit() {
    let case = Case::new("signal_quick_exit");
    let urc = untraced_crash(&case, &["quick_exit", "1500"]);
    let rc = case.traced(&[], &[&prog("prog_crash"), "quick_exit", "1500"]);
    let t = case.trace();
    assert_eq!(rc, 3, "traced exit status; stderr: {}", case.err_head());
    assert_eq!(urc, 3, "untraced exit status");
    assert!(!t.is_empty(), "no trace listed");
    let allocs = stats(&t).num("heap_object_alloc");
    assert!(allocs >= 1501, "{allocs} allocations, want >= 1501");
    let (crc, out) = check(&t);
    assert_eq!(crc, 0, "check: {}", head(&out, 1));
    assert!(
        case.read("out").contains("at_quick_exit handler ran"),
        "out: {}",
        case.read("out")
    );
}

/// A SIGSEGV handler that fixes the fault and returns runs 100 times, as
/// untraced.
#[test]
fn signal_program_handler() {
    let case = Case::new("signal_program_handler");
    let urc = untraced_crash(&case, &["handler", "1500"]);
    let rc = case.traced(&[], &[&prog("prog_crash"), "handler", "1500"]);
    let (out, uout) = (case.read("out"), case.read("uout"));
    assert_eq!(rc, 0, "traced exit status; stderr: {}", case.err_head());
    assert_eq!(urc, 0, "untraced exit status");
    assert!(out.lines().any(|l| l == "handled 100 faults"), "out: {out}");
    assert_eq!(out, uout, "output traced (left) and untraced (right)");
    let (crc, check_out) = check(&case.trace());
    assert_eq!(crc, 0, "check: {}", head(&check_out, 1));
}

/// A SIGTERM handler another library installed before the shim's
/// constructor stays the program's: it runs, and nothing is flushed
/// before it.
#[test]
fn signal_earlier_handler() {
    let case = Case::new("signal_earlier_handler");
    let sigearly = prog("libsigearly.so");
    let argv = [prog("prog_crash"), "raise_term".into(), "1500".into()];
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let urc = run_limited(&mut case.command(&[("LD_PRELOAD", &sigearly)], &argv, "uout", "uerr"));
    let preload = format!("{} {sigearly}", shim());
    let rc = case.traced(&[("LD_PRELOAD", &preload)], &argv);
    assert_eq!(urc, 7, "untraced exit status");
    assert_eq!(rc, 7, "traced exit status; out: {}", case.read("out"));
    assert!(
        case.read("out").contains("early handler ran"),
        "out: {}",
        case.read("out")
    );
    assert!(!case.traces().is_empty(), "no trace listed");
}

/// SIGPIPE ignored by the program, or inherited ignored: write fails with
/// EPIPE, the program goes on.
#[test]
fn signal_ignored_pipe() {
    let case = Case::new("signal_ignored_pipe");
    let r1 = case.traced(&[], &[&prog("prog_crash"), "ignore_pipe", "10"]);
    let o1 = case.read("out").trim_end_matches('\n').to_string();
    let script = format!(
        "trap '' PIPE; exec '{}' inherited_ignore 10",
        prog("prog_crash")
    );
    let r2 = case.traced(&[], &["sh", "-c", &script]);
    let o2 = case.read("out").trim_end_matches('\n').to_string();
    assert_eq!(r1, 0, "ignored: exit status");
    assert_eq!(r2, 0, "inherited ignored: exit status");
    assert_eq!(o1, "write returned -1, errno EPIPE", "ignored: output");
    assert_eq!(o2, o1, "inherited ignored: output");
}

/// sigaction, signal, sysv_signal, bsd_signal and sigset report exactly
/// what they do untraced.
#[test]
fn signal_views() {
    let case = Case::new("signal_views");
    untraced_crash(&case, &["views", "0"]);
    let rc = case.traced(&[], &[&prog("prog_crash"), "views", "0"]);
    assert_eq!(rc, 0, "exit status; stderr: {}", case.err_head());
    assert_eq!(
        case.read("out"),
        case.read("uout"),
        "what they report traced (left) and untraced (right)"
    );
}

/// With core dumps on, the traced program dumps core as the untraced one
/// does (the shim's handler lets the fault repeat under SIG_DFL, or sends
/// the signal again), for a fault and for abort.
#[test]
fn signal_core_dump() {
    use std::os::unix::process::CommandExt;
    let case = Case::new("signal_core_dump");
    let pattern = read("/proc/sys/kernel/core_pattern").trim_end().to_string();
    let unlimited = command("sh").args(["-c", "ulimit -c unlimited"]).status();
    if !pattern.starts_with("core") || !unlimited.is_ok_and(|s| s.success()) {
        skip(&format!(
            "core dumps go to '{pattern}', not to a file in the current directory"
        ));
        return;
    }
    let cores = |dir: &str| {
        std::fs::read_dir(dir)
            .expect("read a run's directory")
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().starts_with("core"))
            })
            .count()
    };
    for mode in ["segv", "abort"] {
        let (udir, tdir) = (
            case.path(&format!("u_{mode}")),
            case.path(&format!("t_{mode}")),
        );
        let argv = [prog("prog_crash"), mode.to_string(), "1500".to_string()];
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let mut rcs = Vec::new();
        for (dir, traced) in [(&udir, false), (&tdir, true)] {
            std::fs::create_dir_all(dir).expect("create a run's directory");
            let all = if traced {
                case.shim_vars(shim(), &[])
            } else {
                Vec::new()
            };
            let vars: Vec<(&str, &str)> =
                all.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let mut cmd = case.command(&vars, &argv, "out", "err");
            cmd.current_dir(dir);
            // SAFETY: setrlimit is async-signal-safe; the closure touches
            // nothing of the parent's.
            unsafe {
                cmd.pre_exec(|| {
                    let unlimited = libc::rlimit {
                        rlim_cur: libc::RLIM_INFINITY,
                        rlim_max: libc::RLIM_INFINITY,
                    };
                    if libc::setrlimit(libc::RLIMIT_CORE, &unlimited) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                })
            };
            rcs.push(run_limited(&mut cmd));
        }
        let (ucores, tcores) = (cores(&udir), cores(&tdir));
        for dir in [&udir, &tdir] {
            let _ = std::fs::remove_dir_all(dir);
        }
        assert_eq!(ucores, 1, "{mode}: core files untraced");
        assert_eq!(tcores, 1, "{mode}: core files traced");
        assert_eq!(
            rcs[0], rcs[1],
            "{mode}: exit status untraced (left) and traced (right)"
        );
    }
}

/// `producer | head -1`: the producer dies of SIGPIPE once head has gone,
/// leaving a complete trace.
#[test]
fn signal_pipeline() {
    let case = Case::new("signal_pipeline");
    let all = case.shim_vars(shim(), &[]);
    let mut producer = command(prog("prog_crash"))
        .args(["spew", "150000"])
        .envs(all.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(case.path("err")).expect("create err"))
        .spawn()
        .expect("run prog_crash spew");
    let mut head_1 = {
        // The command holds the pipe's read end: dropped after the spawn,
        // so that head's exit leaves the producer no reader.
        let mut cmd = command("head");
        cmd.arg("-1")
            .stdin(producer.stdout.take().expect("the producer's stdout"))
            .stdout(std::fs::File::create(case.path("out")).expect("create out"));
        cmd.spawn().expect("run head")
    };
    wait_limited(&mut head_1, "head -1");
    let status = wait_limited(&mut producer, "prog_crash spew");
    let t = case.trace();
    let allocs = stats(&t).num("heap_object_alloc");
    assert_eq!(
        status,
        141,
        "the producer's exit status; stderr: {}",
        case.err_head()
    );
    assert!(!t.is_empty(), "no trace listed");
    assert!(allocs >= 150000, "{allocs} allocations, want >= 150000");
    let (crc, out) = check(&t);
    assert_eq!(crc, 0, "check: {}", head(&out, 1));
}
