//! Stack correctness (issue 19), end to end under the LD_PRELOAD shim:
//!
//! - a process killed by SIGKILL keeps the stacks of the allocations its
//!   cut trace holds (the writer lists the stack tables before the batches
//!   that use them, docs/FORMAT.md section 10), and `check` still says the
//!   trace is cut;
//! - two libraries loaded in turn at one address each get their own
//!   allocations (a module unload starts a new generation, so no stack
//!   spans two loads);
//! - a forked child holds no descriptor of its parent's trace.
//!
//! Needs the shim and the `alloctrace` binary of the same profile (`make
//! lib preload cli`, then `cargo test --release -p alloctrace-cli --test
//! stack_correctness`) and gcc. The C programs are in c_tests/stacks.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod support;

use alloctrace_reader::{Record, TraceReader};
use serde_json::Value;
use support::{compile, repo, shim, Scratch};

fn source(name: &str) -> String {
    repo()
        .join("c_tests/stacks")
        .join(name)
        .to_str()
        .unwrap()
        .to_string()
}

/// Builds `out` from `sources` with `flags`.
fn gcc(flags: &[&str], sources: &[String], out: &Path) {
    let mut args: Vec<&str> = vec![
        "-Wall",
        "-Wextra",
        "-Werror",
        "-O0",
        "-fno-omit-frame-pointer",
    ];
    args.extend_from_slice(flags);
    args.extend(sources.iter().map(String::as_str));
    args.extend_from_slice(&["-o", out.to_str().unwrap()]);
    compile("gcc", &args);
}

/// `prog args` under the shim with full stacks, into `output` (a pattern).
fn shimmed(prog: &Path, args: &[&str], output: &Path) -> Command {
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .env("LD_PRELOAD", shim())
        .env("ALLOCTRACE_OUTPUT", output)
        .env("ALLOCTRACE_STACKS", "full")
        .env_remove("ALLOCTRACE_FOLLOW")
        .env_remove("ALLOCTRACE_RECORD")
        .env_remove("ALLOCTRACE_STACK_DEPTH")
        .env_remove("ALLOCTRACE_DISABLE");
    cmd
}

/// `alloctrace ARGS`: exit code and stdout.
fn alloctrace(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .args(args)
        .output()
        .expect("run alloctrace");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `alloctrace top --json -n 0 TRACE`: per site, its allocations and the
/// functions of its stack.
fn top_sites(trace: &Path) -> Vec<(u64, Vec<String>)> {
    let (code, out, err) = alloctrace(&["top", "--json", "-n", "0", trace.to_str().unwrap()]);
    assert!(code == 0 || !out.is_empty(), "top exited {code}: {err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v["sites"]
        .as_array()
        .expect("sites")
        .iter()
        .map(|s| {
            let functions = s["stack"]
                .as_array()
                .map(|frames| {
                    frames
                        .iter()
                        .map(|f| f["function"].as_str().unwrap_or("").to_string())
                        .collect()
                })
                .unwrap_or_default();
            (s["allocations"].as_u64().unwrap_or(0), functions)
        })
        .collect()
}

/// Heap allocations in the trace (cut or not) and how many carry a stack.
fn allocations_with_stacks(trace: &Path) -> (u64, u64) {
    let bytes = std::fs::read(trace).unwrap();
    let mut reader = TraceReader::new(bytes.as_slice()).unwrap();
    let (mut all, mut stacked) = (0, 0);
    while let Ok(Some(record)) = reader.next_record() {
        let Record::Event(e) = record else { continue };
        if let alloctrace_reader::EventData::HeapObjectAlloc { .. } = e.data {
            all += 1;
            if e.stack_id != 0 {
                stacked += 1;
            }
        }
    }
    (all, stacked)
}

#[test]
fn a_process_killed_by_sigkill_keeps_its_stacks() {
    let dir = Scratch::new("killed");
    let prog = dir.path("killed");
    gcc(&[], &[source("killed.c")], &prog);
    let trace = dir.path("killed.trace");
    let n = 200_000u64;
    let mut child = shimmed(&prog, &[&n.to_string()], &trace)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the program");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    // The program goes on allocating; wait until the writer has written
    // most of what it made before the signal (the writer writes full
    // buffers as they come; nothing asks for a flush).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while allocations_with_stacks(&trace).0 < n / 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the trace never held {} allocations",
            n / 2
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    child.wait().unwrap();

    let (all, stacked) = allocations_with_stacks(&trace);
    assert!(all >= n / 2, "{all} allocations");
    assert_eq!(stacked, all, "every allocation written has its stack ID");
    // The tools resolve them: nearly every allocation to the site.
    let sites = top_sites(&trace);
    let total: u64 = sites.iter().map(|s| s.0).sum();
    let at_site: u64 = sites
        .iter()
        .filter(|s| s.1.iter().any(|f| f == "killed_alloc_site"))
        .map(|s| s.0)
        .sum();
    let unresolved: u64 = sites
        .iter()
        .filter(|s| s.1.is_empty() || s.1.iter().any(|f| f.contains("no stack")))
        .map(|s| s.0)
        .sum();
    assert!(
        at_site >= n / 2,
        "{at_site} of {total} at the site: {sites:?}"
    );
    assert!(
        unresolved * 100 <= total,
        "{unresolved} of {total} without a stack"
    );
    // And the trace still says it was cut (check's exit code 3).
    let (code, out, err) = alloctrace(&["check", trace.to_str().unwrap()]);
    assert_eq!(code, 3, "check: {out}{err}");
    assert!(
        format!("{out}{err}").contains("truncated"),
        "check: {out}{err}"
    );
}

#[test]
fn libraries_loaded_in_turn_at_one_address_get_their_own_allocations() {
    let dir = Scratch::new("dlswap");
    let prog = dir.path("dlswap");
    gcc(&[], &[source("dlswap.c"), "-ldl".into()], &prog);
    let libs: Vec<PathBuf> = (0..2)
        .map(|i| {
            let lib = dir.path(&format!("libinner{i}.so"));
            gcc(
                &["-fPIC", "-shared", &format!("-DINNER=inner{i}")],
                &[source("libinner.c")],
                &lib,
            );
            lib
        })
        .collect();
    let trace = dir.path("dlswap.trace");
    let out = shimmed(
        &prog,
        &[libs[0].to_str().unwrap(), libs[1].to_str().unwrap(), "1000"],
        &trace,
    )
    .output()
    .expect("run dlswap");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bases: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    assert_eq!(bases.len(), 2, "{stdout}");
    if bases[0] != bases[1] {
        eprintln!("note: the loader put the libraries at {bases:?}: the test shows less");
    }
    let sites = top_sites(&trace);
    let credited = |name: &str| -> u64 {
        sites
            .iter()
            .filter(|s| s.1.iter().any(|f| f == name))
            .map(|s| s.0)
            .sum()
    };
    assert_eq!(
        (credited("inner0"), credited("inner1")),
        (1000, 1000),
        "{sites:?}"
    );
}

/// The files the child's descriptors named, as fork_fd printed them, and
/// the parent's and child's pids.
fn fork_fd_run(dir: &Scratch, follow: &str) -> (Vec<String>, u32, u32) {
    let prog = dir.path("fork_fd");
    gcc(&[], &[source("fork_fd.c")], &prog);
    let out = shimmed(&prog, &[], &dir.path("t.%p.trace"))
        .env("ALLOCTRACE_FOLLOW", follow)
        .output()
        .expect("run fork_fd");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut files = Vec::new();
    let (mut parent, mut child) = (0, 0);
    for l in stdout.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        match w.as_slice() {
            ["fd", _, path] => files.push(path.to_string()),
            ["child", c, "parent", p] => {
                child = c.parse().unwrap();
                parent = p.parse().unwrap();
            }
            _ => {}
        }
    }
    assert!(parent != 0 && child != 0, "{stdout}");
    (files, parent, child)
}

#[test]
fn a_forked_child_holds_no_descriptor_of_its_parents_trace() {
    for follow in ["1", "0"] {
        let dir = Scratch::new(&format!("fork-fd-{follow}"));
        let (files, parent, child) = fork_fd_run(&dir, follow);
        let parent_trace = dir.path(&format!("t.{parent}.trace"));
        assert!(parent_trace.is_file(), "{}", parent_trace.display());
        assert!(
            !files.iter().any(|f| Path::new(f) == parent_trace.as_path()),
            "FOLLOW={follow}: the child holds the parent's trace: {files:?}"
        );
        let child_trace = dir.path(&format!("t.{child}.trace"));
        assert_eq!(
            child_trace.is_file(),
            follow == "1",
            "FOLLOW={follow}: {}",
            child_trace.display()
        );
    }
}
