//! Programs behave exactly as without the tracer (issue 19, "Tests"):
//! each program of c_tests/stacks/behaviour.c (and behaviour.cpp) runs
//! once on its own and once under `alloctrace record` with full stacks
//! (the default); both runs must print the same and exit the same, and
//! `alloctrace check` must pass on the trace. The scenarios are the ones
//! that stress a stack walk: C++ exceptions, longjmp and siglongjmp out
//! of nested calls, signal handlers that allocate while the main code
//! does, ucontext fibers on heap stacks, a stack deeper than the depth
//! limit, a garbage frame pointer, and a dlclose racing allocations.
//!
//! Stack correctness of the shim's newer wrappers is checked here too: a
//! library dlopened and at once allocating from its own function has
//! every allocation's stack go through that function and on to the
//! program's `main` (the dlopen wrapper refreshes the unwinder), and a
//! span mapped by mmap or mremap carries its call's stack.
//!
//! Needs the shim (liballoctrace_preload.so) next to the `alloctrace`
//! binary under test, and gcc; the C++ scenario is skipped, saying so,
//! without g++.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

mod support;

use alloctrace_reader::{EventData, Frame, Record, TraceReader};
use support::{compile, record_command, repo, traces_in, Scratch};

const CWARN: &[&str] = &["-Wall", "-Wextra", "-Werror", "-g"];

/// The programs, built once per test run.
struct Programs {
    /// behaviour.c at -O2.
    c: PathBuf,
    /// libbhplugin.c at -O2 without frame pointers.
    plugin: PathBuf,
    /// behaviour.cpp at -O2, when g++ is installed.
    cxx: Option<PathBuf>,
    /// behaviour.c with the RUNPATH `$ORIGIN/plugins`, in a directory of
    /// its own whose plugins/ holds libbhplugin.so (found only through the
    /// RUNPATH of dlopen's caller).
    c_runpath: PathBuf,
}

fn programs() -> &'static Programs {
    static PROGRAMS: OnceLock<Programs> = OnceLock::new();
    PROGRAMS.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("behaviour-programs");
        std::fs::create_dir_all(&dir).expect("create the programs' directory");
        let src = repo().join("c_tests/stacks");
        let s = |f: &str| src.join(f).to_str().unwrap().to_string();
        let o = |f: &str| dir.join(f).to_str().unwrap().to_string();
        let build = |program: &str, extra: &[&str], file: &str, out: &str| {
            let mut args: Vec<&str> = CWARN.to_vec();
            args.extend_from_slice(extra);
            let (file, out) = (s(file), o(out));
            args.extend_from_slice(&[&file, "-o", &out]);
            compile(program, &args);
        };
        build("gcc", &["-O2", "-pthread"], "behaviour.c", "behaviour");
        build(
            "gcc",
            &["-O2", "-fomit-frame-pointer", "-fPIC", "-shared"],
            "libbhplugin.c",
            "libbhplugin.so",
        );
        let have_cxx = Command::new("g++")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        let cxx = if have_cxx {
            build("g++", &["-O2"], "behaviour.cpp", "behaviour_cxx");
            Some(dir.join("behaviour_cxx"))
        } else {
            None
        };
        let plugins = dir.join("runpath/plugins");
        std::fs::create_dir_all(&plugins).expect("create runpath/plugins");
        std::fs::copy(dir.join("libbhplugin.so"), plugins.join("libbhplugin.so"))
            .expect("copy the plugin");
        build(
            "gcc",
            &[
                "-O2",
                "-pthread",
                "-Wl,--enable-new-dtags,-rpath,$ORIGIN/plugins",
            ],
            "behaviour.c",
            "runpath/behaviour",
        );
        Programs {
            c_runpath: dir.join("runpath/behaviour"),
            c: dir.join("behaviour"),
            plugin: dir.join("libbhplugin.so"),
            cxx,
        }
    })
}

/// What a run printed and how it ended.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    code: Option<i32>,
    stdout: String,
}

/// The program on its own.
fn plain(prog: &Path, args: &[&str]) -> Outcome {
    let out = Command::new(prog)
        .args(args)
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", prog.display()));
    Outcome {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
    }
}

/// The program under `alloctrace record --no-report [options]`; its
/// outcome (the record command exits with the program's status), the
/// trace and record's stderr.
fn traced(
    dir: &Scratch,
    options: &[&str],
    prog: &Path,
    args: &[&str],
) -> (Outcome, PathBuf, String) {
    let trace = dir.path("t.trace");
    let out = record_command()
        .arg("--no-report")
        .args(options)
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(prog)
        .args(args)
        .output()
        .expect("run alloctrace record");
    let traces = traces_in(&dir.0);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(traces, std::slice::from_ref(&trace), "{stderr}");
    (
        Outcome {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        },
        trace,
        stderr,
    )
}

/// `alloctrace check TRACE` passes.
fn check(trace: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .arg("check")
        .arg(trace)
        .output()
        .expect("run alloctrace check");
    assert!(
        out.status.success(),
        "check {}: {}{}",
        trace.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `prog args` on its own and under record with `options` (full
/// stacks unless they say otherwise): the same output and status (0), and
/// a trace that passes check. Returns the trace's path (in `dir`).
fn same_behaviour(dir: &Scratch, options: &[&str], prog: &Path, args: &[&str]) -> PathBuf {
    let alone = plain(prog, args);
    assert_eq!(
        alone.code,
        Some(0),
        "{} {args:?} on its own: {alone:?}",
        prog.display()
    );
    assert!(!alone.stdout.is_empty());
    let (under, trace, stderr) = traced(dir, options, prog, args);
    assert_eq!(
        under,
        alone,
        "{} {args:?} under record {options:?}: {stderr}",
        prog.display()
    );
    check(&trace);
    trace
}

#[test]
fn cxx_exceptions_through_several_frames() {
    let Some(cxx) = &programs().cxx else {
        eprintln!("behaviour tests: skipped the C++ exceptions scenario: g++ is not installed");
        return;
    };
    let dir = Scratch::new("cxx");
    same_behaviour(&dir, &[], cxx, &[]);
}

#[test]
fn longjmp_and_siglongjmp_out_of_nested_calls() {
    let dir = Scratch::new("longjmp");
    same_behaviour(&dir, &[], &programs().c, &["longjmp"]);
}

#[test]
fn signal_handlers_that_allocate() {
    let dir = Scratch::new("signals");
    same_behaviour(&dir, &[], &programs().c, &["signals"]);
}

#[test]
fn fibers_allocating_on_their_own_stacks() {
    let dir = Scratch::new("fibers");
    same_behaviour(&dir, &[], &programs().c, &["fibers"]);
}

#[test]
fn a_stack_deeper_than_the_depth_limit() {
    let dir = Scratch::new("deep");
    let trace = same_behaviour(&dir, &[], &programs().c, &["deep"]);
    let t = read(&trace);
    let deep: Vec<&Alloc> = t.heap.iter().filter(|a| a.size == 5333).collect();
    assert_eq!(deep.len(), 3);
    for a in deep {
        // Cut at the limit, under the truncation marker.
        assert!(a.truncated, "{a:?}");
        assert!(a.frames.len() >= 32, "{a:?}");
        assert!(a.frames.iter().any(|f| f == "bh_deep"), "{a:?}");
        assert!(!a.frames.iter().any(|f| f == "main"), "{a:?}");
    }
}

#[test]
fn a_garbage_frame_pointer() {
    let dir = Scratch::new("corrupt-full");
    same_behaviour(&dir, &["--stacks", "full"], &programs().c, &["corrupt"]);
}

#[test]
fn a_dlclose_racing_allocations_in_other_threads() {
    let p = programs();
    let lib = p.plugin.to_str().unwrap();
    for round in 0..3 {
        let dir = Scratch::new(&format!("dlrace-full-{round}"));
        same_behaviour(&dir, &["--stacks", "full"], &p.c, &["dlrace", lib, "400"]);
    }
}

#[test]
fn a_library_dlopened_then_allocating_unwinds_through_it() {
    let p = programs();
    let dir = Scratch::new("plugin");
    let trace = same_behaviour(
        &dir,
        &[],
        &p.c,
        &["plugin", p.plugin.to_str().unwrap(), "1000"],
    );
    let t = read(&trace);
    let blocks: Vec<&Alloc> = t.heap.iter().filter(|a| a.size == 7019).collect();
    assert_eq!(blocks.len(), 1000);
    for a in blocks {
        // The library's function, then the program's callers to main: not
        // cut at the library's frame.
        let got: Vec<&str> = a
            .frames
            .iter()
            .map(String::as_str)
            .filter(|f| f.starts_with("bh_") || *f == "main")
            .collect();
        assert_eq!(
            got,
            ["bh_plugin_alloc_many", "bh_call_plugin", "main"],
            "{a:?}"
        );
        assert!(!a.truncated, "{a:?}");
    }
}

/// The dlopen wrapper leaves glibc's search as the program's caller sees
/// it: a bare name found only in the caller's RUNPATH, and a `$ORIGIN`
/// name, load under the tracer as without it.
#[test]
fn dlopen_searches_the_callers_runpath_and_origin() {
    let p = programs();
    for name in ["libbhplugin.so", "$ORIGIN/plugins/libbhplugin.so"] {
        let dir = Scratch::new("runpath");
        let trace = same_behaviour(&dir, &[], &p.c_runpath, &["plugin", name, "1000"]);
        let t = read(&trace);
        assert_eq!(t.heap.iter().filter(|a| a.size == 7019).count(), 1000);
    }
}

#[test]
fn mapped_spans_carry_the_stack_of_their_call() {
    let dir = Scratch::new("mmap");
    let trace = same_behaviour(&dir, &[], &programs().c, &["mmap"]);
    let t = read(&trace);
    let page = t.page_size;
    let of = |bytes: u64| -> Vec<&Alloc> { t.spans.iter().filter(|a| a.size == bytes).collect() };
    let mapped = of(13 * page);
    assert_eq!(mapped.len(), 3, "{:?}", t.spans);
    for a in mapped {
        assert_eq!(
            a.frames.first().map(String::as_str),
            Some("bh_map_region"),
            "{a:?}"
        );
        assert!(a.frames.iter().any(|f| f == "main"), "{a:?}");
    }
    let remapped = of(17 * page);
    assert_eq!(remapped.len(), 1, "{:?}", t.spans);
    assert_eq!(
        remapped[0].frames.first().map(String::as_str),
        Some("bh_remap_region"),
        "{:?}",
        remapped[0]
    );
}

// ---------------------------------------------------------------------------
// Reading a trace, each stack symbolized.

/// An allocation (heap block or span) and its stack's function names,
/// innermost first ("?" where a frame has no symbol).
#[derive(Debug)]
struct Alloc {
    /// Bytes (a span's pages times the page size).
    size: u64,
    frames: Vec<String>,
    truncated: bool,
}

struct Trace {
    heap: Vec<Alloc>,
    spans: Vec<Alloc>,
    page_size: u64,
}

fn read(path: &Path) -> Trace {
    let file = std::fs::File::open(path).expect("open the trace");
    let mut reader = TraceReader::new(std::io::BufReader::new(file)).expect("trace header");
    let mut symbols = Symbols::default();
    let mut t = Trace {
        heap: Vec::new(),
        spans: Vec::new(),
        page_size: 4096,
    };
    while let Some(record) = reader
        .next_record()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    {
        let event = match record {
            Record::GenerationStart { .. } => {
                if let Some(info) = reader.info() {
                    t.page_size = info.page_size;
                }
                continue;
            }
            Record::Event(e) => e,
        };
        let (size, spans) = match event.data {
            EventData::HeapObjectAlloc { size, .. } => (size, false),
            EventData::SpanAlloc { npages, .. } => (npages * t.page_size, true),
            _ => continue,
        };
        let mut frames = Vec::new();
        let mut truncated = false;
        if event.stack_id != 0 {
            let stack = reader
                .stacks()
                .frames_at(event.stack_id, event.ticks)
                .unwrap_or_else(|| panic!("stack {} is not defined", event.stack_id));
            for f in stack {
                match f {
                    Frame::Native { addr, module } => frames.push(
                        module
                            .and_then(|m| symbols.lookup(&m.path, m.offset(addr).wrapping_sub(1)))
                            .unwrap_or_else(|| "?".to_string()),
                    ),
                    Frame::Registered(r) => frames.push(r.function.clone()),
                    Frame::Truncated => truncated = true,
                }
            }
        }
        let a = Alloc {
            size,
            frames,
            truncated,
        };
        if spans {
            t.spans.push(a);
        } else {
            t.heap.push(a);
        }
    }
    assert_eq!(reader.truncated(), None, "{} is cut short", path.display());
    t
}

/// Function symbols of the files frames point into: (start, end, name),
/// sorted by start.
#[derive(Default)]
struct Symbols(HashMap<String, Vec<(u64, u64, String)>>);

impl Symbols {
    fn lookup(&mut self, path: &str, vaddr: u64) -> Option<String> {
        let table = self.0.entry(path.to_string()).or_insert_with(|| {
            use object::{Object, ObjectSymbol, SymbolKind};
            let Ok(data) = std::fs::read(path) else {
                return Vec::new();
            };
            let Ok(file) = object::File::parse(&*data) else {
                return Vec::new();
            };
            let mut v: Vec<(u64, u64, String)> = file
                .symbols()
                .chain(file.dynamic_symbols())
                .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
                .filter_map(|s| {
                    Some((
                        s.address(),
                        s.address() + s.size(),
                        s.name().ok()?.to_string(),
                    ))
                })
                .collect();
            v.sort();
            v
        });
        let i = table.partition_point(|&(start, _, _)| start <= vaddr);
        let (_, end, name) = table.get(i.checked_sub(1)?)?;
        (vaddr < *end).then(|| name.clone())
    }
}
