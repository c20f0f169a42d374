//! `alloctrace symbolize` end to end: a C program run under `alloctrace
//! record --stacks full`, its trace symbolized into `TRACE.symbols`, and
//! the allocation's stack read back through that file alone (the program
//! deleted first): the program's functions, inlined frame included, with
//! their files and lines.
//!
//! Needs the shim (liballoctrace_preload.so) next to the `alloctrace`
//! binary under test, as tests/stacks.rs does (`cargo build -p
//! alloctrace-preload`; `cargo test --workspace` builds it), and gcc
//! (without it the test says so and passes).

use std::path::PathBuf;
use std::process::Command;

mod support;

use alloctrace_reader::{EventData, Frame, Record, TraceReader};
use alloctrace_symbolize::{sidecar_path, ModuleKey, Options, Quality, Symbolizer};
use support::{compile, record, shim};

const PROGRAM: &str = r#"#include <stdio.h>
#include <stdlib.h>

static inline __attribute__((always_inline)) void *sym_inline(size_t n) {
    return malloc(n); /* LINE_MALLOC */
}

__attribute__((noinline)) void *sym_leaf(size_t n) {
    void *p = sym_inline(n); /* LINE_INLINE */
    if (p == NULL)
        abort();
    return p;
}

__attribute__((noinline)) void *sym_mid(size_t n) {
    void *p = sym_leaf(n + 1); /* LINE_LEAF */
    __asm__ volatile("" ::: "memory");
    return p;
}

int main(void) {
    void *p = sym_mid(12344); /* LINE_MID */
    printf("%p\n", p);
    free(p);
    return 0;
}
"#;

fn line_of(marker: &str) -> u32 {
    PROGRAM
        .lines()
        .position(|l| l.contains(marker))
        .map(|i| i as u32 + 1)
        .unwrap()
}

fn alloctrace() -> Command {
    Command::new(env!("CARGO_BIN_EXE_alloctrace"))
}

#[test]
fn symbolize_writes_a_symbols_file_that_reports_use_without_the_binary() {
    let have_gcc = Command::new("gcc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_gcc {
        eprintln!("skipped: gcc is not installed");
        return;
    }
    // Fail early, before building anything, without the shim.
    shim();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("symbolize-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("prog.c");
    std::fs::write(&src, PROGRAM).unwrap();
    let prog = dir.join("prog");
    compile(
        "gcc",
        &[
            "-g",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            src.to_str().unwrap(),
            "-o",
            prog.to_str().unwrap(),
        ],
    );

    let trace = dir.join("t.trace");
    record(&["--stacks", "full"], &trace, &prog, &[]);

    // A bad option is refused before anything is written.
    let out = alloctrace()
        .args(["symbolize", "--debug-dir"])
        .arg(dir.join("no-such-dir"))
        .arg(&trace)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a directory"));
    assert!(!sidecar_path(&trace).exists());

    let out = alloctrace().arg("symbolize").arg(&trace).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("with source lines"), "{stdout}");
    assert!(
        stdout.contains(&format!("wrote {}", sidecar_path(&trace).display())),
        "{stdout}"
    );

    // The binary is gone: only the symbols file can name its frames.
    std::fs::remove_file(&prog).unwrap();
    // Symbolizing again without it loses nothing: the file is merged.
    let again = alloctrace().arg("symbolize").arg(&trace).output().unwrap();
    assert!(again.status.success());
    assert_eq!(String::from_utf8_lossy(&again.stdout), stdout);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(
        stderr.contains(&format!("warning: {}: cannot open", prog.display())),
        "{stderr}"
    );
    let mut symbolizer = Symbolizer::new(Options::default());
    assert_eq!(symbolizer.load_symbols(&sidecar_path(&trace)), Ok(true));

    let file = std::fs::File::open(&trace).unwrap();
    let mut reader = TraceReader::new(std::io::BufReader::new(file)).unwrap();
    let mut found = None;
    while let Some(record) = reader.next_record().unwrap() {
        let Record::Event(event) = record else {
            continue;
        };
        let EventData::HeapObjectAlloc { size: 12345, .. } = event.data else {
            continue;
        };
        let mut frames = Vec::new();
        for f in reader
            .stacks()
            .frames_at(event.stack_id, event.ticks)
            .unwrap()
        {
            if let Frame::Native {
                addr,
                module: Some(m),
            } = f
            {
                let key = ModuleKey {
                    path: m.path.clone(),
                    build_id: m.build_id.clone(),
                };
                let (quality, symbols) = symbolizer.resolve(&key, m.offset(addr));
                if m.path == prog.to_str().unwrap() {
                    // `_start` has a symbol but no DWARF.
                    assert_ne!(quality, Quality::Module, "{symbols:?}");
                }
                frames.extend(symbols.iter().cloned());
            }
        }
        found = Some(frames);
    }
    let frames = found.expect("the allocation of 12345 bytes");
    let ours: Vec<(String, Option<String>, Option<u32>)> = frames
        .iter()
        .filter(|f| f.function.starts_with("sym_") || f.function == "main")
        .map(|f| (f.function.clone(), f.file.clone(), f.line))
        .collect();
    let file = Some(src.to_str().unwrap().to_string());
    assert_eq!(
        ours,
        vec![
            (
                "sym_inline".to_string(),
                file.clone(),
                Some(line_of("LINE_MALLOC"))
            ),
            (
                "sym_leaf".to_string(),
                file.clone(),
                Some(line_of("LINE_INLINE"))
            ),
            (
                "sym_mid".to_string(),
                file.clone(),
                Some(line_of("LINE_LEAF"))
            ),
            ("main".to_string(), file, Some(line_of("LINE_MID"))),
        ],
        "{frames:?}"
    );
    // Every frame came from the file: a lookup on disk would have warned
    // that the program is missing.
    assert!(
        symbolizer.warnings().is_empty(),
        "{:?}",
        symbolizer.warnings()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
