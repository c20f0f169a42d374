//! What the CLI's integration tests share: where the repository, the
//! binary and the shim are, compiling C programs, scratch directories and
//! `alloctrace record` under the shim. Each test file uses some of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

// Shared with the shim's tests (crates/preload/tests/shim), which
// include scratch.rs by path.
mod scratch;
#[allow(unused_imports)] // each test file uses some of it
pub use scratch::{traces_in, Scratch};

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The directory of the `alloctrace` binary under test (target/debug or
/// target/release), where cargo also puts the shim and the C library.
pub fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_alloctrace"))
        .parent()
        .expect("the binary's directory")
        .to_path_buf()
}

/// A file cargo builds next to the binary, or a panic saying how to build it.
pub fn built_by_cargo(name: &str, package: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.is_file(),
        "{} is missing: build it first with `cargo build -p {package}` (add --release for a release test run)",
        path.display()
    );
    path
}

/// The LD_PRELOAD shim, or a panic saying how to build it.
pub fn shim() -> PathBuf {
    built_by_cargo("liballoctrace_preload.so", "alloctrace-preload")
}

/// `alloctrace record` under the shim, with the stack options of the
/// environment removed; the caller adds the options and the program.
pub fn record_command() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_alloctrace"));
    cmd.env("ALLOCTRACE_PRELOAD", shim())
        .env_remove("ALLOCTRACE_STACKS")
        .env_remove("ALLOCTRACE_STACK_DEPTH")
        .arg("record");
    cmd
}

/// Writes `bytes` to a fresh file, `PREFIX-PID-N.EXT`, under the tests'
/// target directory.
pub fn temp_file(prefix: &str, bytes: &[u8], ext: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{prefix}-{}-{n}.{ext}", std::process::id()));
    std::fs::write(&path, bytes).expect("write a file for the test");
    path
}

/// `alloctrace ARGS`, its output.
pub fn alloctrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .args(args)
        .output()
        .expect("run alloctrace")
}

/// `alloctrace ARGS`, which must succeed: its stdout as JSON.
pub fn alloctrace_json(args: &[&str]) -> serde_json::Value {
    let out = alloctrace(args);
    assert!(
        out.status.success(),
        "alloctrace {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// The C program `c_tests/SRC`, compiled by gcc (warnings are errors,
/// -O1, `flags` added) into `DIR/NAME` under the tests' target directory,
/// NAME being the source's stem. Callers build it once (a `OnceLock`).
pub fn gcc_program(src: &str, dir: &str, flags: &[&str]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(dir);
    std::fs::create_dir_all(&dir).expect("create the program's directory");
    let src = repo().join("c_tests").join(src);
    let out = dir.join(src.file_stem().expect("a source file"));
    let mut args = vec!["-Wall", "-Wextra", "-Werror", "-O1"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&[src.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    compile("gcc", &args);
    out
}

/// Runs a compiler; panics with its output when it fails.
pub fn compile(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `alloctrace record --no-report OPTIONS -o OUTPUT -- PROG ARGS` under
/// the shim, which must succeed.
pub fn record(options: &[&str], output: &Path, prog: &Path, args: &[&str]) {
    let out = record_command()
        .arg("--no-report")
        .args(options)
        .arg("-o")
        .arg(output)
        .arg("--")
        .arg(prog)
        .args(args)
        .output()
        .expect("run alloctrace record");
    assert!(
        out.status.success(),
        "record {}: {}",
        prog.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}
