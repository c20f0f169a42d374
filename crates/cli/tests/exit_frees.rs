//! Frees made at exit are traced (issue 20, item 4): the session ends
//! after the destructors of the program's libraries, so the frees of
//! their `__attribute__((destructor))` functions, of their C++ static
//! destructors and of the atexit handlers they registered before the
//! shim's constructor ran are in the trace, and `leaks` does not report
//! those objects (it reported 30 of them when the session ended in the
//! shim's atexit handler, inside ld.so's `_dl_fini` at the shim's turn).
//! What comes after the end (here the frees of an exit handler registered
//! for the process before the shim's, which runs after it) is counted in
//! the trace's lost events: it used to be lost silently.
//!
//! The program is c_tests/exit/exit_frees.c with its libraries
//! libexitfree.c and (when g++ is installed) libexitcxx.cc. Needs the shim
//! next to the binary, and gcc.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

mod support;

use support::{compile, record, repo, Scratch};

/// Blocks of each kind of exit-time free (c_tests/exit/exitfree.h).
const EXIT_BLOCKS: u64 = 10;
/// Blocks freed after the session ended, and their size.
const LATE_BLOCKS: u64 = 7;
const LATE_BLOCK_SIZE: u64 = 1234;

/// The program, built once per test run, and the kinds of exit-time frees
/// it makes (3, or 4 with the C++ library).
fn program() -> &'static (PathBuf, u64) {
    static PROGRAM: OnceLock<(PathBuf, u64)> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("exit-frees-program");
        std::fs::create_dir_all(&dir).expect("create the program's directory");
        let src = repo().join("c_tests/exit");
        let s = |p: &Path| p.to_str().unwrap().to_string();
        let warn = ["-Wall", "-Wextra", "-Wpedantic", "-Werror", "-O1", "-g"];
        let lib = |compiler: &str, std: &str, name: &str, file: &str| {
            let mut args: Vec<String> = warn.iter().map(|a| a.to_string()).collect();
            args.extend([std.to_string(), "-fPIC".into(), "-shared".into()]);
            args.extend([s(&src.join(file)), "-o".into(), s(&dir.join(name))]);
            compile(
                compiler,
                &args.iter().map(String::as_str).collect::<Vec<_>>(),
            );
        };
        lib("gcc", "-std=c11", "libexitfree.so", "libexitfree.c");
        let cxx = Command::new("g++")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if cxx {
            lib("g++", "-std=c++11", "libexitcxx.so", "libexitcxx.cc");
        }
        let out = dir.join("exit_frees");
        let mut args: Vec<String> = warn.iter().map(|a| a.to_string()).collect();
        args.push("-std=c11".into());
        if cxx {
            args.push("-DWITH_CXX".into());
        }
        args.extend([s(&src.join("exit_frees.c")), "-o".into(), s(&out)]);
        args.extend([format!("-L{}", s(&dir)), "-lexitfree".into()]);
        if cxx {
            args.push("-lexitcxx".into());
        }
        args.push(format!("-Wl,-rpath,{}", s(&dir)));
        compile("gcc", &args.iter().map(String::as_str).collect::<Vec<_>>());
        (out, if cxx { 4 } else { 3 })
    })
}

/// `alloctrace COMMAND --json TRACE`, parsed.
fn json(command: &str, trace: &Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .args([command, "--json"])
        .arg(trace)
        .output()
        .expect("run alloctrace");
    assert!(
        out.status.success(),
        "{command}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[test]
fn frees_of_library_destructors_and_early_atexit_handlers_are_traced() {
    let (program, kinds) = program();
    let dir = Scratch::new("exit-frees");
    let trace = dir.path("t.trace");
    record(&[], &trace, program, &[]);
    let check = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .arg("check")
        .arg(&trace)
        .output()
        .expect("run check");
    assert!(
        check.status.success(),
        "check: {}",
        String::from_utf8_lossy(&check.stdout)
    );

    let stats = json("stats", &trace);
    let blocks = kinds * EXIT_BLOCKS;
    assert_eq!(
        stats["events"]["heap_object_alloc"],
        blocks + LATE_BLOCKS,
        "{stats}"
    );
    assert_eq!(stats["events"]["heap_object_free"], blocks, "{stats}");
    assert_eq!(stats["entry_points"]["free"], blocks, "{stats}");
    // The frees after the end: not in the trace, counted.
    assert_eq!(stats["lost_events"], LATE_BLOCKS, "{stats}");

    // What leaks reports: the blocks freed after the end alone.
    let leaks = json("leaks", &trace);
    let reported = leaks["leaks"].as_array().expect("a list of leaks");
    assert_eq!(reported.len(), 1, "{leaks}");
    assert_eq!(reported[0]["objects"], LATE_BLOCKS, "{leaks}");
    assert_eq!(
        reported[0]["bytes"],
        LATE_BLOCKS * LATE_BLOCK_SIZE,
        "{leaks}"
    );
    assert_eq!(leaks["objects"], LATE_BLOCKS, "{leaks}");
}
