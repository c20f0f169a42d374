//! Outputs never destroy inputs (issue 20, item 2).
//!
//! Every command that writes a file (`export` in each format,
//! `flamegraph`, `report`, `symbolize`) refuses, with exit 1 and before
//! opening it, an output that is one of the files it reads: the trace by
//! the same path, by `./path`, through a symbolic link, as a hard link,
//! redirected to standard input, among several traces or a directory of
//! them, or the trace's FILE.symbols; for parquet, a directory where a
//! table it writes is a trace. Each case checks the exit code, the
//! message, and that every input is byte-identical afterwards; and that a
//! distinct output is still written.

use std::path::Path;
use std::process::{Command, Output, Stdio};

mod support;

use alloctrace_reader::testing::{info, EventsBody, TraceBuilder};
use alloctrace_reader::EventData;
use support::Scratch;

/// A small well-formed trace: 20 allocations, 5 of them freed.
fn trace() -> Vec<u8> {
    let g = info(1);
    let mut t = TraceBuilder::new();
    t.info(&g);
    let mut b = EventsBody::new(1000);
    let mut tick = 1000;
    for i in 0..20u64 {
        tick += 10;
        b.event(
            &g,
            tick,
            0x10000 + 0x100 * i,
            &EventData::HeapObjectAlloc {
                size: 32,
                type_id: 0,
            },
        );
    }
    for i in 0..5u64 {
        tick += 10;
        b.event(&g, tick, 0x10000 + 0x100 * i, &EventData::HeapObjectFree);
    }
    t.events(1, 1, &b);
    t.generation_end(1, tick + 1, 5_000_000 + tick, 0)
        .trace_end(1);
    t.finish()
}

/// The writing commands, each with `OUT` standing for its output.
const COMMANDS: [&[&str]; 5] = [
    &["export", "--format", "pprof", "-o", "OUT"],
    &["export", "--format", "chrome", "-o", "OUT"],
    &["flamegraph", "-o", "OUT"],
    &["flamegraph", "--collapsed", "-o", "OUT"],
    &["report", "-o", "OUT"],
];

/// Runs `alloctrace` in `cwd` with `command` (`OUT` replaced by `out`) on
/// `inputs`, standard input from `stdin` (or empty).
fn run(cwd: &Path, command: &[&str], inputs: &[&str], out: &str, stdin: Option<&Path>) -> Output {
    let args: Vec<&str> = command
        .iter()
        .map(|a| if *a == "OUT" { out } else { a })
        .collect();
    Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .current_dir(cwd)
        .arg(args[0])
        .args(inputs)
        .args(&args[1..])
        .stdin(match stdin {
            Some(path) => Stdio::from(std::fs::File::open(path).unwrap()),
            None => Stdio::null(),
        })
        .output()
        .expect("run alloctrace")
}

/// `out` must have been refused with `says` in the message, every file of
/// `untouched` left as it was.
fn assert_refused(out: &Output, what: &str, says: &str, untouched: &[(&Path, &[u8])]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{what}: {err}");
    assert!(err.contains(says), "{what}: {err}");
    for (path, bytes) in untouched {
        assert!(
            std::fs::read(path).unwrap() == *bytes,
            "{what}: {} changed",
            path.display()
        );
    }
}

#[test]
fn every_writing_command_refuses_its_input_by_any_name() {
    let dir = Scratch::new("names");
    let bytes = trace();
    let t = dir.path("t.trace");
    std::fs::write(&t, &bytes).unwrap();
    std::os::unix::fs::symlink("t.trace", dir.path("link.trace")).unwrap();
    std::fs::hard_link(&t, dir.path("hard.trace")).unwrap();
    let symbols = dir.path("t.trace.symbols");
    let symbols_bytes = b"not even symbols".to_vec();
    std::fs::write(&symbols, &symbols_bytes).unwrap();
    let untouched: [(&Path, &[u8]); 2] = [(&t, &bytes), (&symbols, &symbols_bytes)];
    let abs = t.to_str().unwrap();
    // (input, output, what the message says the output is)
    let forms: [(&str, &str, &str); 6] = [
        (abs, abs, &format!("output {abs} is the input trace {abs}")),
        (
            "t.trace",
            "./t.trace",
            "output ./t.trace is the input trace t.trace; choose another -o",
        ),
        (
            "t.trace",
            "link.trace",
            "output link.trace is the input trace t.trace; choose another -o",
        ),
        (
            "t.trace",
            "hard.trace",
            "output hard.trace is the input trace t.trace; choose another -o",
        ),
        (
            "-",
            "t.trace",
            "output t.trace is the input trace (the file on standard input); choose another -o",
        ),
        (
            "t.trace",
            "t.trace.symbols",
            "output t.trace.symbols is t.trace.symbols, the symbols of the input trace t.trace; choose another -o",
        ),
    ];
    for command in COMMANDS {
        for (input, output, says) in forms {
            let what = format!("{command:?} {input} -o {output}");
            let out = run(&dir.0, command, &[input], output, Some(&t));
            assert_refused(&out, &what, says, &untouched);
        }
        // The trace among several, or in a directory given as the input.
        let other = dir.path("other.trace");
        std::fs::write(&other, &bytes).unwrap();
        let out = run(
            &dir.0,
            command,
            &["other.trace", "t.trace"],
            "t.trace",
            None,
        );
        assert_refused(&out, "several", "is the input trace t.trace", &untouched);
        let out = run(&dir.0, command, &["."], "t.trace", None);
        // (hard.trace comes first in the directory: the same file.)
        assert_refused(
            &out,
            "directory",
            "output t.trace is the input trace ./",
            &untouched,
        );
        std::fs::remove_file(&other).unwrap();
        // A distinct output is written.
        let out = run(&dir.0, command, &["t.trace"], "written", None);
        assert!(
            out.status.success(),
            "{command:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(std::fs::metadata(dir.path("written")).unwrap().len() > 0);
        std::fs::remove_file(dir.path("written")).unwrap();
    }
}

#[test]
fn parquet_refuses_a_directory_where_a_table_is_an_input() {
    let dir = Scratch::new("parquet");
    let bytes = trace();
    let out_dir = dir.path("tables");
    std::fs::create_dir(&out_dir).unwrap();
    let t = out_dir.join("stacks.parquet");
    std::fs::write(&t, &bytes).unwrap();
    let parquet = ["export", "--format", "parquet", "-o", "OUT"];
    let out = run(&dir.0, &parquet, &["tables/stacks.parquet"], "tables", None);
    assert_refused(
        &out,
        "trace named as a table",
        "output tables/stacks.parquet is the input trace tables/stacks.parquet; choose another -o",
        &[(&t, &bytes)],
    );
    // A hard link to the trace where a table goes, a symbolic link to the
    // directory as the output.
    std::fs::remove_file(&t).unwrap();
    let trace = dir.path("t.trace");
    std::fs::write(&trace, &bytes).unwrap();
    std::fs::hard_link(&trace, out_dir.join("allocations.parquet")).unwrap();
    std::os::unix::fs::symlink("tables", dir.path("via")).unwrap();
    for output in ["tables", "./tables/", "via"] {
        let out = run(&dir.0, &parquet, &["t.trace"], output, None);
        assert_refused(
            &out,
            output,
            "allocations.parquet is the input trace t.trace; choose another -o",
            &[(&trace, &bytes)],
        );
    }
    // A directory that merely holds the trace is written into.
    std::fs::remove_file(out_dir.join("allocations.parquet")).unwrap();
    let out = run(&dir.0, &parquet, &["t.trace"], ".", None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.path("traces.parquet").exists());
    assert_eq!(std::fs::read(&trace).unwrap(), bytes);
}

#[test]
fn symbolize_refuses_a_trace_where_a_symbols_file_goes() {
    let dir = Scratch::new("symbolize");
    let bytes = trace();
    let a = dir.path("a");
    std::fs::write(&a, &bytes).unwrap();
    for sidecar in ["a.symbols", "a.symbols.tmp"] {
        let b = dir.path(sidecar);
        std::fs::write(&b, &bytes).unwrap();
        let out = run(&dir.0, &["symbolize"], &["a", sidecar], "", None);
        assert_refused(
            &out,
            sidecar,
            &format!("output {sidecar} is the input trace {sidecar}; symbolize writes FILE.symbols beside each trace FILE: rename that trace"),
            &[(&a, &bytes), (&b, &bytes)],
        );
        std::fs::remove_file(&b).unwrap();
    }
    // Its own FILE.symbols is rewritten, as always.
    std::fs::write(dir.path("a.symbols"), b"").unwrap();
    let out = run(&dir.0, &["symbolize"], &["a"], "", None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&a).unwrap(), bytes);
}
