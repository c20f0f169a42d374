//! `alloctrace record` on a run of many processes (issue 20, item 9):
//! - the report sums the traces up by program, gives a paragraph to the
//!   few largest and to those that did not end cleanly, and counts the
//!   others with the command that lists them all (it listed every trace:
//!   80 paragraphs for python3 started through pyenv's shim script);
//! - the run's directory is mode 0700 and the index 0600 even under
//!   umask 0777 (they were 0000: no process could have written there
//!   unless root).
//!
//! The programs are sh, /bin/true, ls and cat. No timing is asserted.
//! Needs the shim next to the binary.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod support;

use support::{record_command, traces_in, Scratch};

/// The one run directory `record` made in `dir`.
fn run_dir(dir: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read the scratch directory")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("alloctrace-sh-"))
        })
        .collect();
    assert_eq!(
        dirs.len(),
        1,
        "one run directory in {}: {dirs:?}",
        dir.display()
    );
    dirs[0].clone()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn many_traces_are_summed_up_by_program_with_the_largest_and_the_unclean() {
    let dir = Scratch::new("many");
    // 20 true, 6 ls, a sh that kills itself (its trace is cut short), cat.
    let script = "i=0; while [ $i -lt 20 ]; do /bin/true; i=$((i+1)); done; \
                  for i in 1 2 3 4 5 6; do ls / >/dev/null; done; \
                  sh -c 'echo $$ > killed; kill -KILL $$' 2>/dev/null; cat /dev/null";
    let out = record_command()
        .args(["--", "sh", "-c", script])
        .current_dir(&dir.0)
        .output()
        .expect("run alloctrace record");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let run = run_dir(&dir.0);
    let traces = traces_in(&run);
    let n = traces.len();
    assert!(n >= 29, "{n} traces: {err}");
    // From the report's first line (sh may say "Killed" before it).
    let lines: Vec<&str> = err
        .lines()
        .skip_while(|l| !l.starts_with("alloctrace: "))
        .collect();
    assert_eq!(lines[0], format!("alloctrace: {n} traces written"), "{err}");

    // The programs, most bytes first: each with its number of traces.
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        ["program", "traces", "on", "disk"],
        "{err}"
    );
    let rows: Vec<Vec<&str>> = lines[2..]
        .iter()
        .take_while(|l| !l.starts_with("alloctrace:"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    let count = |program: &str| {
        rows.iter()
            .find(|r| r[0] == program)
            .map(|r| r[1].to_string())
    };
    assert_eq!(count("true").as_deref(), Some("20"), "{err}");
    assert_eq!(count("ls").as_deref(), Some("6"), "{err}");
    assert_eq!(count("sh").as_deref(), Some("2"), "{err}");
    assert_eq!(count("cat").as_deref(), Some("1"), "{err}");
    assert_eq!(rows.len(), 4, "{err}");
    assert!(
        lines[2].starts_with("  ls "),
        "ls has the most bytes: {err}"
    );

    // The 5 largest, largest first, then the killed sh's.
    let heading = 2 + rows.len();
    assert_eq!(
        lines[heading], "alloctrace: the 5 largest traces, and 1 other that did not end cleanly:",
        "{err}"
    );
    let shown: Vec<PathBuf> = lines[heading..]
        .iter()
        .filter_map(|l| l.strip_prefix("  /"))
        .map(|l| {
            PathBuf::from(format!(
                "/{}",
                &l[..l.find(" (pid ").expect("a trace's head")]
            ))
        })
        .collect();
    assert_eq!(shown.len(), 6, "{err}");
    let size = |p: &Path| std::fs::metadata(p).expect("a trace").len();
    let mut sizes: Vec<u64> = traces.iter().map(|p| size(p)).collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    let shown_sizes: Vec<u64> = shown[..5].iter().map(|p| size(p)).collect();
    assert_eq!(shown_sizes, sizes[..5], "{err}");
    let killed = std::fs::read_to_string(dir.path("killed")).expect("the killed sh's pid");
    assert_eq!(
        shown[5],
        run.join(format!("{}.trace", killed.trim())),
        "{err}"
    );
    let killed_head = format!("  {} (pid {}, sh)", shown[5].display(), killed.trim());
    let at = lines
        .iter()
        .position(|l| *l == killed_head)
        .expect("its head");
    assert!(lines[at + 1].contains("cut short"), "{err}");

    // The others counted, with the command that lists them all.
    let name = run.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(
        *lines.last().unwrap(),
        format!(
            "alloctrace: {} more traces: `alloctrace check {name}` lists them all",
            n - 6
        ),
        "{err}"
    );
    let check = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .args(["check", &name])
        .current_dir(&dir.0)
        .output()
        .expect("run alloctrace check");
    let listed = text(&check.stdout) + &text(&check.stderr);
    let listed = listed
        .lines()
        .filter(|l| l.starts_with(&format!("{name}/")))
        .count();
    assert_eq!(listed, n, "{}", text(&check.stdout));
}

#[test]
fn a_run_of_a_few_traces_still_gets_a_paragraph_each() {
    let dir = Scratch::new("few");
    let out = record_command()
        .args(["--", "sh", "-c", "/bin/true; /bin/true"])
        .current_dir(&dir.0)
        .output()
        .expect("run alloctrace record");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(
        err.lines().next(),
        Some("alloctrace: 3 traces written"),
        "{err}"
    );
    assert_eq!(
        err.lines().filter(|l| l.starts_with("  /")).count(),
        3,
        "{err}"
    );
    assert!(!err.contains("largest"), "{err}");
}

/// `record ARGS` started by sh under `umask 0777`.
fn under_umask_0777(args: &[&str], dir: &Path) -> Output {
    let record = record_command();
    let mut sh = Command::new("sh");
    sh.arg("-c")
        .arg("umask 0777; exec \"$@\"")
        .arg("sh")
        .arg(record.get_program())
        .args(record.get_args())
        .args(args)
        .current_dir(dir);
    for (name, value) in record.get_envs() {
        match value {
            Some(value) => sh.env(name, value),
            None => sh.env_remove(name),
        };
    }
    sh.output().expect("run sh")
}

#[test]
fn the_run_directory_is_0700_and_the_index_0600_under_umask_0777() {
    let dir = Scratch::new("umask");
    // The program prints the index's mode (every process opens it to
    // append) on stdout, which is a pipe: nothing it creates is needed.
    let out = under_umask_0777(
        &[
            "--",
            "sh",
            "-c",
            "stat -c %a \"$ALLOCTRACE_INDEX\"; /bin/true",
        ],
        &dir.0,
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(text(&out.stdout), "600\n", "the index's mode; {err}");
    let run = run_dir(&dir.0);
    let mode = std::fs::metadata(&run)
        .expect("the run directory")
        .permissions()
        .mode();
    assert_eq!(
        format!("{:o}", mode & 0o7777),
        "700",
        "{}; {err}",
        run.display()
    );
    let traces = traces_in(&run);
    assert_eq!(traces.len(), 3, "{err}");
    for trace in &traces {
        let mode = std::fs::metadata(trace).unwrap().permissions().mode();
        assert_eq!(format!("{:o}", mode & 0o7777), "600", "{}", trace.display());
    }
    assert!(err.starts_with("alloctrace: 3 traces written\n"), "{err}");
}
