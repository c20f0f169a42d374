//! `alloctrace record` keeps the program's status and descriptors,
//! whatever happens around it (issue 20, item 5):
//! - its own stderr a closed pipe or /dev/full: the report is lost, the
//!   exit status is still the program's (it was 101, a panic);
//! - fd 0, 1 or 2 closed when `record` starts: closed in the program too
//!   (Rust's runtime gave `record`, and so the program, /dev/null there);
//! - SIGQUIT, SIGUSR1, SIGUSR2, SIGHUP, SIGALRM sent to `record`: passed
//!   on to the program; `record` waits for it, reports, and exits with its
//!   status (the first three used to kill `record` and leave the program
//!   running).
//!
//! - a signal ignored when `record` starts (`nohup`, a shell's background
//!   job) stays ignored in the program.
//!
//! The program is c_tests/record/keeps.c. Synchronised by files only: no
//! timing is asserted. Needs the shim next to the binary, and gcc.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod support;

use support::{gcc_program, record_command, Scratch};

/// c_tests/record/keeps.c, built once per test run.
fn keeps() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| gcc_program("record/keeps.c", "record-keeps-program", &[]))
}

/// `record -o DIR/%p.trace -- keeps ARGS`.
fn record_keeps(dir: &Scratch, args: &[&Path]) -> Command {
    let mut cmd = record_command();
    cmd.arg("-o")
        .arg(dir.path("%p.trace"))
        .arg("--")
        .arg(keeps())
        .args(args)
        .current_dir(&dir.0);
    cmd
}

/// `command` started with descriptor `fd` closed (through sh's `N>&-`).
fn with_closed(fd: u32, command: &Command) -> Command {
    let mut sh = Command::new("sh");
    sh.arg("-c")
        .arg(format!("exec \"$@\" {fd}>&-"))
        .arg("sh")
        .arg(command.get_program())
        .args(command.get_args());
    for (name, value) in command.get_envs() {
        match value {
            Some(value) => sh.env(name, value),
            None => sh.env_remove(name),
        };
    }
    if let Some(dir) = command.get_current_dir() {
        sh.current_dir(dir);
    }
    sh
}

#[test]
fn a_closed_standard_descriptor_stays_closed_in_the_program() {
    for fd in 0..3u32 {
        let dir = Scratch::new(&format!("closed-{fd}"));
        let report = dir.path("report");
        let rec = record_keeps(&dir, &[Path::new("fds"), &report]);
        let out = with_closed(fd, &rec)
            .stdin(Stdio::null())
            .output()
            .expect("run record");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "fd {fd} closed: {stderr}");
        let text = std::fs::read_to_string(&report).expect("the program's report");
        // The program's first open gets the closed descriptor; with fd 1
        // closed, what it writes to fd 1 lands in that file, not in a
        // /dev/null of record's.
        let want = match fd {
            1 => "closed 1\nfd 1\nstdout\n".to_string(),
            _ => format!("closed {fd}\nfd {fd}\n"),
        };
        assert_eq!(text, want, "fd {fd} closed when record started");
        if fd != 1 {
            assert_eq!(String::from_utf8_lossy(&out.stdout), "stdout\n");
        }
        if fd != 2 {
            assert!(
                stderr.contains("alloctrace: 1 trace written"),
                "fd {fd}: {stderr}"
            );
        }
    }
}

#[test]
fn a_full_or_closed_stderr_keeps_the_programs_status() {
    let dir = Scratch::new("stderr-full");
    let report = dir.path("report");
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("open /dev/full");
    let status = record_keeps(&dir, &[Path::new("fds"), &report])
        .stdout(Stdio::null())
        .stderr(full)
        .status()
        .expect("run record");
    assert_eq!(status.code(), Some(3), "stderr /dev/full: {status}");

    let dir = Scratch::new("stderr-pipe");
    let report = dir.path("report");
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let status = record_keeps(&dir, &[Path::new("fds"), &report])
        .stdout(Stdio::null())
        .stderr(writer)
        .status()
        .expect("run record");
    assert_eq!(status.code(), Some(3), "stderr a closed pipe: {status}");
}

/// Waits for `path` to exist (the program writes it by a rename, so
/// whole); panics after a deadline that only a hung run reaches.
fn wait_for(path: &Path, child: &mut std::process::Child) -> String {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            return text;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("record ended ({status}) before {} appeared", path.display());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{} never appeared", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `signal` (a name `kill` knows) to `record`, once the program is
/// waiting; returns record's exit code, its stderr and what the program
/// got. Record's stderr goes to a file, so that a program left running
/// (when `record` is killed) does not keep the test waiting for its end;
/// such a program is then killed.
/// Starts `command` with every signal's disposition the default. Record
/// keeps signals ignored that it started with ignored (the test
/// `signals_ignored_when_record_starts_stay_ignored_in_the_program`), so
/// a test runner launched in the background, under nohup or from Python
/// (which ignores SIGXFSZ and SIGPIPE) would otherwise hand its ignored
/// signals on, and these tests would see them.
fn with_default_dispositions(command: &mut Command) {
    // SAFETY: between fork and exec only signal(2), which is
    // async-signal-safe, runs.
    unsafe {
        command.pre_exec(|| {
            for s in 1..=31 {
                if s != libc::SIGKILL && s != libc::SIGSTOP {
                    libc::signal(s, libc::SIG_DFL);
                }
            }
            Ok(())
        });
    }
}

fn signal_record(name: &str, signal: &str) -> (Option<i32>, String, Option<String>) {
    let dir = Scratch::new(name);
    let (ready, got, err) = (dir.path("ready"), dir.path("got"), dir.path("stderr"));
    let mut record = record_keeps(&dir, &[Path::new("wait"), &ready, &got]);
    with_default_dispositions(&mut record);
    let mut child = record
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).expect("create the stderr file"))
        .spawn()
        .expect("start record");
    let program = wait_for(&ready, &mut child);
    let kill = |signal: &str, pid: &str| {
        Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid)
            .stderr(Stdio::null())
            .status()
            .expect("run kill")
    };
    assert!(
        kill(signal, &child.id().to_string()).success(),
        "kill -{signal}"
    );
    let status = child.wait().expect("wait for record");
    if status.code().is_none() {
        // Record itself was killed: its program is still waiting.
        kill("KILL", program.trim());
    }
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    (status.code(), stderr, std::fs::read_to_string(&got).ok())
}

#[test]
fn signals_sent_to_record_reach_the_program_and_record_reports() {
    for (signal, number) in [("QUIT", 3), ("USR1", 10), ("USR2", 12), ("HUP", 1)] {
        let (code, stderr, got) = signal_record(&format!("sig-{signal}"), signal);
        assert_eq!(code, Some(40), "SIG{signal}: {stderr}");
        assert_eq!(got, Some(format!("{number}\n")), "SIG{signal}: {stderr}");
        assert!(
            stderr.contains("alloctrace: 1 trace written"),
            "SIG{signal}: {stderr}"
        );
    }
}

#[test]
fn a_signal_the_program_does_not_catch_ends_it_and_record_says_so() {
    // SIGALRM: the program has no handler, so the forwarded signal ends
    // it; record reports and exits 128 + 14, as for any signalled program.
    let (code, stderr, got) = signal_record("sig-ALRM", "ALRM");
    assert_eq!(code, Some(128 + 14), "{stderr}");
    assert_eq!(got, None);
    assert!(stderr.contains("alloctrace: 1 trace written"), "{stderr}");
}

#[test]
fn signals_ignored_when_record_starts_stay_ignored_in_the_program() {
    let dir = Scratch::new("ignored");
    let rec = record_keeps(&dir, &[Path::new("ignored")]);
    // As nohup (HUP) and a shell's background job (INT, QUIT) leave them.
    let mut sh = Command::new("sh");
    with_default_dispositions(&mut sh);
    let out = sh
        .arg("-c")
        .arg("trap '' HUP INT QUIT USR1; exec \"$@\"")
        .arg("sh")
        .arg(rec.get_program())
        .args(rec.get_args())
        .envs(rec.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .current_dir(&dir.0)
        .stdin(Stdio::null())
        .output()
        .expect("run record");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "1 2 3 10\n",
        "{stderr}"
    );
}
