//! What the CLI's integration tests share: where the repository, the
//! binary and the shim are, compiling C programs, scratch directories and
//! `alloctrace record` under the shim. Each test file uses some of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

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
