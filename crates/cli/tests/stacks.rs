//! Call stacks end to end (issue 12, "Tests"): C programs of c_tests/stacks
//! run under `alloctrace record --stacks MODE`, their traces read back with
//! the reader, every native frame symbolized here (its module's file, the
//! ELF symbol table read with the `object` crate, `addr - 1` looked up at
//! `addr - bias`), and each allocation attributed to the sequence of the
//! program's own functions (those named `sp_*`, and `main`) in its stack.
//!
//! The programs allocate on each call path a known number of blocks of a
//! size no other path uses: the size says which path made a block, and its
//! stack must say the same. The counts are distinct primes, so a stack
//! attributed to the wrong path shows in two counts.
//!
//! What each mode promises, and so what is asserted:
//! - `full` (DWARF CFI): every stack is exact, whatever the build; a
//!   thread's stacks end, complete, at its start routine.
//! - `none`: no stack IDs.
//! - `fast` was removed: `record --stacks fast` is refused before the
//!   program runs. (The C API's `TRACE_STACKS_FAST` is taken as full.)
//!
//! Needs the shim (liballoctrace_preload.so) and liballoctrace.so next to
//! the `alloctrace` binary under test (`cargo build -p alloctrace-preload
//! -p alloctrace`, with `--release` for a release run; `cargo test
//! --workspace` builds both), gcc and g++. The programs are built once per
//! test run into the test target's temporary directory.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::rc::Rc;
use std::sync::OnceLock;

mod support;

use alloctrace_format::EntryPoint;
use alloctrace_reader::{EventData, Frame, Record, TraceReader};
use support::{bin_dir, built_by_cargo, compile, record_command, repo, traces_in, Scratch};

// ---------------------------------------------------------------------------
// Where things are, and building the programs.

fn sources() -> PathBuf {
    repo().join("c_tests/stacks")
}

/// The programs of c_tests/stacks, built once.
struct Programs {
    /// paths.c + main.c at -O0 with frame pointers.
    paths_fp: PathBuf,
    /// paths.c + main.c at -O2 without frame pointers.
    paths_nofp: PathBuf,
    /// main.c linked against libpaths.so (paths.c + paths_cxx.cpp, -O2).
    paths_lib: PathBuf,
    /// scenarios.c at -O0 with frame pointers.
    scenarios: PathBuf,
    /// libdlalloc.so, which `scenarios dlopen` loads.
    libdlalloc: PathBuf,
}

const CWARN: &[&str] = &["-Wall", "-Wextra", "-Werror", "-g"];

/// Whether g++ is installed (the C++ operator new path needs it; without
/// it that path is skipped, and the test says so).
fn have_cxx() -> bool {
    static HAVE: OnceLock<bool> = OnceLock::new();
    *HAVE.get_or_init(|| {
        let ok = Command::new("g++")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            eprintln!("stacks tests: skipped the C++ operator new path: g++ is not installed");
        }
        ok
    })
}

fn programs() -> &'static Programs {
    static PROGRAMS: OnceLock<Programs> = OnceLock::new();
    PROGRAMS.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stacks-programs");
        std::fs::create_dir_all(&dir).expect("create the programs' directory");
        let src = sources();
        let s = |f: &str| src.join(f).to_str().unwrap().to_string();
        let o = |f: &str| dir.join(f).to_str().unwrap().to_string();
        let c = |extra: &[&str], files: &[String], out: &str| {
            let mut args: Vec<&str> = CWARN.to_vec();
            args.extend_from_slice(extra);
            args.extend(files.iter().map(String::as_str));
            args.extend_from_slice(&["-o", out]);
            compile("gcc", &args);
        };
        let main_paths = [s("main.c"), s("paths.c")];
        c(
            &["-O0", "-fno-omit-frame-pointer"],
            &main_paths,
            &o("paths_fp"),
        );
        c(
            &["-O2", "-fomit-frame-pointer"],
            &main_paths,
            &o("paths_nofp"),
        );
        let (lib_obj, lib) = (o("paths_lib.o"), o("libpaths.so"));
        if have_cxx() {
            c(
                &["-O2", "-fPIC", "-DWITH_CXX", "-c"],
                &[s("paths.c")],
                &o("paths_lib.o"),
            );
            let mut cxx: Vec<&str> = CWARN.to_vec();
            let (cxx_src, cxx_obj) = (s("paths_cxx.cpp"), o("paths_cxx.o"));
            cxx.extend_from_slice(&["-O2", "-fPIC", "-c", &cxx_src, "-o", &cxx_obj]);
            compile("g++", &cxx);
            compile("g++", &["-shared", &lib_obj, &cxx_obj, "-o", &lib]);
        } else {
            // No C++ compiler (gcc alone is what the README asks for): the
            // library without its operator new path.
            c(&["-O2", "-fPIC", "-shared"], &[s("paths.c")], &lib);
        }
        let rpath = format!("-Wl,-rpath,{}", dir.display());
        let libdir = format!("-L{}", dir.display());
        c(
            &["-O2", &libdir, &rpath],
            &[s("main.c"), "-lpaths".to_string()],
            &o("paths_lib"),
        );
        c(
            &["-O0", "-fno-omit-frame-pointer"],
            &[s("scenarios.c"), "-ldl".into(), "-lpthread".into()],
            &o("scenarios"),
        );
        c(
            &["-O0", "-fno-omit-frame-pointer", "-fPIC", "-shared"],
            &[s("libdlalloc.c")],
            &o("libdlalloc.so"),
        );
        Programs {
            paths_fp: dir.join("paths_fp"),
            paths_nofp: dir.join("paths_nofp"),
            paths_lib: dir.join("paths_lib"),
            scenarios: dir.join("scenarios"),
            libdlalloc: dir.join("libdlalloc.so"),
        }
    })
}

/// What one `alloctrace record` run left.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
    /// The trace files, in name order.
    traces: Vec<PathBuf>,
}

/// `alloctrace record --stacks MODE [extra...] -o DIR/t.%p.trace -- prog args`
/// (without `--stacks` when `mode` is empty).
fn record(dir: &Scratch, mode: &str, extra: &[&str], prog: &Path, args: &[&str]) -> Run {
    let pattern = dir.0.join("t.%p.trace");
    let mode_args: &[&str] = if mode.is_empty() {
        &[]
    } else {
        &["--stacks", mode]
    };
    let out = record_command()
        .args(mode_args)
        .arg("--no-report")
        .args(extra)
        .arg("-o")
        .arg(&pattern)
        .arg("--")
        .arg(prog)
        .args(args)
        .output()
        .expect("run alloctrace record");
    let traces = traces_in(&dir.0);
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        traces,
    }
}

/// [`record`] of a run that must exit with `code` and write one trace.
fn record_one(dir: &Scratch, mode: &str, extra: &[&str], prog: &Path, args: &[&str]) -> Trace {
    let run = record(dir, mode, extra, prog, args);
    assert_eq!(run.code, 0, "record exited {}: {}", run.code, run.stderr);
    assert_eq!(run.traces.len(), 1, "{:?}: {}", run.traces, run.stderr);
    read_trace(&run.traces[0], false)
}

// ---------------------------------------------------------------------------
// Symbols.

/// A file's function symbols: (start, end, name), sorted by start.
type SymbolTable = Vec<(u64, u64, String)>;

/// Symbol tables by file path, read once each.
#[derive(Default)]
struct Symbolizer {
    files: HashMap<String, Option<Rc<SymbolTable>>>,
}

impl Symbolizer {
    fn table(&mut self, path: &str) -> Option<Rc<SymbolTable>> {
        if let Some(t) = self.files.get(path) {
            return t.clone();
        }
        let table = std::fs::read(path).ok().and_then(|data| {
            use object::{Object, ObjectSymbol, SymbolKind};
            let file = object::File::parse(&*data).ok()?;
            let mut t: SymbolTable = file
                .symbols()
                .chain(file.dynamic_symbols())
                .filter(|s| s.kind() == SymbolKind::Text && s.is_definition() && s.size() > 0)
                .filter_map(|s| {
                    let name = s.name().ok()?;
                    // gcc's clones (sp_leaf.constprop.0, .isra.0, .part.0)
                    // are their function.
                    let name = name.split('.').next().unwrap_or(name);
                    Some((s.address(), s.address() + s.size(), name.to_string()))
                })
                .collect();
            t.sort();
            t.dedup();
            Some(Rc::new(t))
        });
        self.files.insert(path.to_string(), table.clone());
        table
    }

    /// The function holding ELF virtual address `vaddr` of file `path`.
    fn lookup(&mut self, path: &str, vaddr: u64) -> Option<String> {
        let table = self.table(path)?;
        let i = table.partition_point(|s| s.0 <= vaddr);
        let (start, end, name) = table.get(i.checked_sub(1)?)?;
        (*start <= vaddr && vaddr < *end).then(|| name.clone())
    }
}

// ---------------------------------------------------------------------------
// Traces.

/// A module of a trace's modules batch, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Module {
    id: u64,
    path: String,
    bias: u64,
    load_ticks: u64,
    unload_ticks: u64,
}

/// One frame of a stack, resolved and symbolized.
#[derive(Clone, Debug, PartialEq, Eq)]
enum F {
    Native {
        addr: u64,
        module: Option<Module>,
        /// The function holding `addr - 1` in the module's file.
        function: Option<String>,
    },
    Registered {
        function: String,
        file: String,
        line: u64,
    },
    Truncated,
}

impl F {
    fn function(&self) -> Option<&str> {
        match self {
            F::Native { function, .. } => function.as_deref(),
            _ => None,
        }
    }
}

/// A resolved stack, and the program's own functions in it.
#[derive(Debug)]
struct Stack {
    frames: Vec<F>,
    /// The `sp_*` functions and `main`, innermost first.
    path: Vec<String>,
}

impl Stack {
    fn truncated(&self) -> bool {
        self.frames.last() == Some(&F::Truncated)
    }
}

/// One heap allocation event.
#[derive(Debug)]
struct Alloc {
    size: u64,
    addr: u64,
    entry: Option<EntryPoint>,
    generation: u64,
    stack_id: u64,
    stack: Rc<Stack>,
}

/// What a trace holds: its heap allocations with their stacks.
struct Trace {
    allocs: Vec<Alloc>,
    generations: u64,
    lost_stacks: u64,
    /// Events the tracer could not record (a thread without a slot).
    lost_events: u64,
    pid: u64,
    /// Every module of every generation (each generation lists its own).
    modules: Vec<(u64, Module)>,
}

impl Trace {
    /// The allocations of `size`.
    fn of_size(&self, size: u64) -> Vec<&Alloc> {
        self.allocs.iter().filter(|a| a.size == size).collect()
    }
}

fn is_program_function(name: &str) -> bool {
    name.starts_with("sp_") || name == "main"
}

/// Reads a whole trace; with `by_ticks`, native frames resolve to the
/// module mapped at the event's time (dlopen), else stacks are resolved
/// once per generation and ID.
fn read_trace(path: &Path, by_ticks: bool) -> Trace {
    let file = std::fs::File::open(path).expect("open the trace");
    let mut reader = TraceReader::new(std::io::BufReader::new(file)).expect("trace header");
    let mut symbols = Symbolizer::default();
    let mut cache: HashMap<(u64, u64), Rc<Stack>> = HashMap::new();
    let mut trace = Trace {
        allocs: Vec::new(),
        generations: 0,
        lost_stacks: 0,
        lost_events: 0,
        pid: 0,
        modules: Vec::new(),
    };
    let empty = Rc::new(Stack {
        frames: Vec::new(),
        path: Vec::new(),
    });
    while let Some(record) = reader
        .next_record()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    {
        let event = match record {
            Record::GenerationStart { generation } => {
                trace.generations += 1;
                if let Some(info) = reader.info() {
                    trace.pid = info.pid;
                }
                for m in reader.stacks().modules() {
                    trace.modules.push((generation, own_module(m)));
                }
                continue;
            }
            Record::Event(e) => e,
        };
        let EventData::HeapObjectAlloc { size, .. } = event.data else {
            continue;
        };
        let stack = if event.stack_id == 0 {
            empty.clone()
        } else if let (false, Some(s)) = (by_ticks, cache.get(&(event.generation, event.stack_id)))
        {
            s.clone()
        } else {
            let stacks = reader.stacks();
            let frames: Vec<F> = stacks
                .frames_at(event.stack_id, event.ticks)
                .unwrap_or_else(|| {
                    panic!(
                        "{}: stack {} of generation {} is not defined",
                        path.display(),
                        event.stack_id,
                        event.generation
                    )
                })
                .map(|f| match f {
                    Frame::Native { addr, module } => F::Native {
                        addr,
                        function: module
                            .and_then(|m| symbols.lookup(&m.path, m.offset(addr).wrapping_sub(1))),
                        module: module.map(own_module),
                    },
                    Frame::Registered(r) => F::Registered {
                        function: r.function.clone(),
                        file: r.file.clone(),
                        line: r.line,
                    },
                    Frame::Truncated => F::Truncated,
                })
                .collect();
            let path = frames
                .iter()
                .filter_map(F::function)
                .filter(|n| is_program_function(n))
                .map(str::to_string)
                .collect();
            let s = Rc::new(Stack { frames, path });
            cache.insert((event.generation, event.stack_id), s.clone());
            s
        };
        trace.allocs.push(Alloc {
            size,
            addr: event.addr,
            entry: event.entry,
            generation: event.generation,
            stack_id: event.stack_id,
            stack,
        });
    }
    trace.lost_stacks = reader.lost_stacks();
    trace.lost_events = reader.lost_events();
    assert_eq!(reader.truncated(), None, "{} is cut short", path.display());
    trace
}

fn own_module(m: &alloctrace_reader::Module) -> Module {
    Module {
        id: m.id,
        path: m.path.clone(),
        bias: m.bias,
        load_ticks: m.load_ticks,
        unload_ticks: m.unload_ticks,
    }
}

/// `["sp_leaf", "sp_path_a", ...]` as owned names.
fn names(path: &[&str]) -> Vec<String> {
    path.iter().map(|s| s.to_string()).collect()
}

// ---------------------------------------------------------------------------
// The call paths of paths.c (paths.h has the same numbers).

struct Path_ {
    size: u64,
    count: usize,
    entry: EntryPoint,
    /// The program's functions, innermost first.
    path: Vec<String>,
    /// The allocation function is called by path[0] itself (not through a
    /// library function such as operator new).
    direct: bool,
}

fn paths_table(with_cxx: bool) -> Vec<Path_> {
    let p = |size, count, entry, path: &[&str], direct| Path_ {
        size,
        count,
        entry,
        path: names(path),
        direct,
    };
    let mut rec = vec!["sp_leaf"];
    rec.extend(std::iter::repeat_n("sp_rec", 10));
    rec.extend(["sp_run", "main"]);
    let mut t = vec![
        p(
            4001,
            3,
            EntryPoint::Malloc,
            &["sp_leaf", "sp_path_a", "sp_run", "main"],
            true,
        ),
        p(
            4003,
            5,
            EntryPoint::Malloc,
            &["sp_leaf", "sp_path_b", "sp_run", "main"],
            true,
        ),
        p(
            4007,
            11,
            EntryPoint::Malloc,
            &["sp_leaf", "sp_mid", "sp_path_b", "sp_run", "main"],
            true,
        ),
        p(4013, 7, EntryPoint::Malloc, &rec, true),
        p(
            4019,
            13,
            EntryPoint::Calloc,
            &["sp_path_c", "sp_run", "main"],
            true,
        ),
    ];
    let entries = [
        // realloc(NULL, n) is recorded as malloc (crates/preload/src/heap.rs).
        (4027, 19, EntryPoint::Malloc),
        (4049, 23, EntryPoint::PosixMemalign),
        (4051, 29, EntryPoint::AlignedAlloc),
        (4057, 31, EntryPoint::Memalign),
        (4073, 37, EntryPoint::Valloc),
        (4091, 41, EntryPoint::Reallocarray),
    ];
    for (size, count, entry) in entries {
        t.push(p(
            size,
            count,
            entry,
            &["sp_entries", "sp_run", "main"],
            true,
        ));
    }
    if with_cxx {
        t.push(p(
            4021,
            17,
            EntryPoint::Malloc,
            &["sp_cxx_leaf", "sp_path_cxx", "sp_run", "main"],
            false,
        ));
    }
    t
}

/// Every path's blocks have exactly their path's stack (the symbolized
/// innermost frame is the allocation's caller: no tracer frame above it,
/// and the walk reached the end of the stack), and the stacks that name
/// the program's functions are exactly these.
fn assert_exact(trace: &Trace, table: &[Path_]) {
    for p in table {
        let allocs = trace.of_size(p.size);
        assert_eq!(allocs.len(), p.count, "blocks of {} bytes", p.size);
        for a in allocs {
            assert_eq!(a.entry, Some(p.entry), "{a:?}");
            assert_ne!(a.stack_id, 0, "{a:?}");
            assert_eq!(a.stack.path, p.path, "{} bytes: {:#?}", p.size, a.stack);
            if p.direct {
                assert_eq!(
                    a.stack.frames[0].function(),
                    Some(p.path[0].as_str()),
                    "innermost frame: {:#?}",
                    a.stack
                );
            }
            assert!(!a.stack.truncated(), "{:#?}", a.stack);
        }
    }
    let mut by_path: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    for a in trace.allocs.iter().filter(|a| !a.stack.path.is_empty()) {
        *by_path.entry(a.stack.path.clone()).or_default() += 1;
    }
    let mut expected: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    for p in table {
        *expected.entry(p.path.clone()).or_default() += p.count;
    }
    assert_eq!(by_path, expected);
    assert_eq!(trace.lost_stacks, 0);
}

#[test]
fn full_stacks_are_exact_with_frame_pointers() {
    let dir = Scratch::new("full-fp");
    let t = record_one(&dir, "full", &[], &programs().paths_fp, &[]);
    assert_exact(&t, &paths_table(false));
}

#[test]
fn full_stacks_are_exact_without_frame_pointers() {
    let dir = Scratch::new("full-nofp");
    let t = record_one(&dir, "full", &[], &programs().paths_nofp, &[]);
    assert_exact(&t, &paths_table(false));
}

#[test]
fn full_stacks_are_exact_through_a_library_and_operator_new() {
    let dir = Scratch::new("full-lib");
    let t = record_one(&dir, "full", &[], &programs().paths_lib, &[]);
    let table = paths_table(have_cxx());
    assert_exact(&t, &table);
    // The frames of sp_* are in libpaths.so, main's in the program.
    let a = t.of_size(4001)[0];
    let module_of = |name: &str| {
        a.stack
            .frames
            .iter()
            .find(|f| f.function() == Some(name))
            .and_then(|f| match f {
                F::Native { module, .. } => module.clone(),
                _ => None,
            })
            .expect("a module")
    };
    assert!(module_of("sp_leaf").path.ends_with("/libpaths.so"));
    assert!(module_of("main").path.ends_with("/paths_lib"));
    if !have_cxx() {
        return;
    }
    // operator new's frame is libstdc++'s, between malloc and sp_cxx_leaf.
    let cxx = t.of_size(4021)[0];
    let first = &cxx.stack.frames[0];
    match first {
        F::Native {
            module: Some(m), ..
        } => assert!(m.path.contains("libstdc++"), "{first:?}"),
        other => panic!("innermost frame of operator new's block: {other:?}"),
    }
}

#[test]
fn record_takes_full_stacks_by_default() {
    let dir = Scratch::new("default");
    let t = record_one(&dir, "", &[], &programs().paths_nofp, &[]);
    assert_exact(&t, &paths_table(false));
}

#[test]
fn stacks_fast_is_refused_before_the_program_runs() {
    let dir = Scratch::new("fast-refused");
    let marker = dir.0.join("ran");
    let out = record_command()
        .arg("-o")
        .arg(dir.0.join("fast.trace"))
        .args(["--stacks", "fast", "--", "/bin/sh", "-c"])
        .arg(format!("touch {}", marker.display()))
        .output()
        .expect("run alloctrace record");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "--stacks fast was removed: full now costs about as little; use full or none"
        ),
        "{stderr}"
    );
    assert!(!marker.exists(), "the program ran");
}

#[test]
fn no_stacks_with_stacks_none() {
    let dir = Scratch::new("none");
    let t = record_one(&dir, "none", &[], &programs().paths_fp, &[]);
    for p in paths_table(false) {
        assert_eq!(t.of_size(p.size).len(), p.count);
    }
    assert!(t.allocs.iter().all(|a| a.stack_id == 0));
}

#[test]
fn stack_depth_limit_truncates_under_a_marker() {
    let dir = Scratch::new("depth4");
    let t = record_one(
        &dir,
        "full",
        &["--stack-depth", "4"],
        &programs().paths_fp,
        &[],
    );
    for p in paths_table(false) {
        let allocs = t.of_size(p.size);
        assert_eq!(allocs.len(), p.count, "blocks of {} bytes", p.size);
        for a in allocs {
            let frames = &a.stack.frames;
            // Every path is deeper than 4 frames (main's callers count).
            assert!(a.stack.truncated(), "{:#?}", a.stack);
            assert_eq!(frames.len() - 1, STACK_DEPTH_4_NATIVE, "{:#?}", a.stack);
            // The innermost frames, the program's as far as they go.
            let n = p.path.len().min(STACK_DEPTH_4_NATIVE);
            assert_eq!(a.stack.path[..], p.path[..n], "{:#?}", a.stack);
        }
    }
}

/// Native frames kept under the marker with `--stack-depth 4`.
const STACK_DEPTH_4_NATIVE: usize = 4;

// ---------------------------------------------------------------------------
// Scenarios (scenarios.c).

fn scenario(dir: &Scratch, mode: &str, args: &[&str]) -> Run {
    record(dir, mode, &[], &programs().scenarios, args)
}

/// The blocks of `size`: `count` of them, each with exactly `path`.
fn assert_path(t: &Trace, size: u64, count: usize, path: &[&str]) {
    let allocs = t.of_size(size);
    assert_eq!(allocs.len(), count, "blocks of {size} bytes");
    for a in allocs {
        assert_eq!(a.stack.path, names(path), "{size} bytes: {:#?}", a.stack);
    }
}

#[test]
fn stacks_across_generations() {
    let dir = Scratch::new("gens");
    // --compression none: every event's bytes count towards the
    // generation budget (16 MiB), so the churn fills several generations.
    let run = record(
        &dir,
        "full",
        &["--compression", "none"],
        &programs().scenarios,
        &["gens", &GEN_ROUNDS.to_string(), &GEN_CHURN.to_string()],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let t = read_trace(&run.traces[0], false);
    assert!(t.generations >= 2, "{} generations", t.generations);
    assert_path(
        &t,
        24,
        GEN_ROUNDS * GEN_CHURN,
        &["sp_gen_churn", "sp_scn_gens", "main"],
    );
    assert_path(
        &t,
        5003,
        GEN_ROUNDS * 3,
        &[
            "sp_leaf",
            "sp_alloc_n",
            "sp_gen_mark",
            "sp_scn_gens",
            "main",
        ],
    );
    // The same stacks, defined again in each generation that uses them.
    let mut gens: Vec<u64> = t.of_size(24).iter().map(|a| a.generation).collect();
    gens.dedup();
    assert!(gens.len() >= 2, "churn in generations {gens:?}");
    let mut marks: Vec<u64> = t.of_size(5003).iter().map(|a| a.generation).collect();
    marks.dedup();
    assert!(marks.len() >= 2, "marks in generations {marks:?}");
}

/// 8 rounds of 330,000 pairs: about 34 MB of events with their stacks
/// (6.5 bytes an event), twice the generation budget, so the first
/// advance comes about halfway through.
const GEN_ROUNDS: usize = 8;
const GEN_CHURN: usize = 330_000;

#[test]
fn stacks_of_threads_that_exit() {
    let dir = Scratch::new("threads-full");
    let run = scenario(&dir, "full", &["threads"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let t = read_trace(&run.traces[0], false);
    assert_path(&t, 5011, 24, &["sp_leaf", "sp_alloc_n", "sp_thread_body"]);
    // Each stack ends at the thread's start routine, complete: neither
    // the shim's trampoline nor start_thread and clone3 are in it.
    for a in t.of_size(5011) {
        assert!(!a.stack.truncated(), "{:#?}", a.stack);
        assert_eq!(
            a.stack.frames.last().and_then(F::function),
            Some("sp_thread_body"),
            "{:#?}",
            a.stack
        );
    }
}

/// Threads alive at once in `many_threads_alive_at_once_all_get_stacks`:
/// the 10,000 the tracer promises to give every allocation a stack (it has
/// 16,384 thread slots), well past the 4,096 full-size buffers of the
/// default memory bound (each idle thread holds a one-page one).
const MANY_THREADS: usize = 10_000;

#[test]
fn many_threads_alive_at_once_all_get_stacks() {
    // Each thread gets its capture state at thread start (the shim's
    // trampoline), not from the writer's small pool of spare ones: none
    // of 10,000 live threads allocates without its stack, and every one
    // has a thread slot (no event lost).
    let dir = Scratch::new("many-threads");
    let n = MANY_THREADS.to_string();
    let run = scenario(&dir, "full", &["many", &n]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let t = read_trace(&run.traces[0], false);
    assert_eq!(t.lost_stacks, 0);
    assert_eq!(t.lost_events, 0);
    let allocs = t.of_size(5107);
    assert_eq!(allocs.len(), MANY_THREADS);
    for a in allocs {
        assert_ne!(a.stack_id, 0, "{a:?}");
        assert_eq!(
            a.stack.path,
            names(&["sp_leaf", "sp_alloc_n", "sp_many_body"]),
            "{:#?}",
            a.stack
        );
        assert!(!a.stack.truncated(), "{:#?}", a.stack);
    }
}

#[test]
fn stacks_in_a_forked_child() {
    forked_child("full");
}

fn forked_child(mode: &str) {
    let dir = Scratch::new(&format!("fork-{mode}"));
    let run = scenario(&dir, mode, &["fork"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.traces.len(), 2, "{:?}", run.traces);
    let traces: Vec<Trace> = run.traces.iter().map(|p| read_trace(p, false)).collect();
    let (parent, child) = if traces[0].of_size(5021).is_empty() {
        (&traces[1], &traces[0])
    } else {
        (&traces[0], &traces[1])
    };
    assert_ne!(parent.pid, child.pid);
    assert_path(
        parent,
        5021,
        6,
        &[
            "sp_leaf",
            "sp_alloc_n",
            "sp_fork_parent",
            "sp_scn_fork",
            "main",
        ],
    );
    assert_path(parent, 5023, 0, &[]);
    assert_path(
        child,
        5023,
        5,
        &[
            "sp_leaf",
            "sp_alloc_n",
            "sp_fork_child",
            "sp_scn_fork",
            "main",
        ],
    );
    assert_path(child, 5021, 0, &[]);
}

const DL_PATH: [&str; 5] = [
    "sp_dl_leaf",
    "sp_dl_entry",
    "sp_dl_use",
    "sp_scn_dlopen",
    "main",
];

/// `scenarios dlopen`'s run: its trace, and the library's load address
/// for the blocks of each size, as the program printed it (dladdr).
fn dlopen_run(dir: &Scratch) -> (Trace, HashMap<u64, u64>) {
    let lib = programs().libdlalloc.to_str().unwrap();
    let run = scenario(dir, "full", &["dlopen", lib]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let bases = run
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("dl "))
        .map(|l| {
            let (size, base) = l.split_once(' ').expect("dl SIZE BASE");
            (size.parse().unwrap(), hex(base))
        })
        .collect();
    (read_trace(&run.traces[0], true), bases)
}

#[test]
fn stacks_through_a_library_loaded_unloaded_and_loaded_again() {
    let dir = Scratch::new("dlopen");
    let (t, bases) = dlopen_run(&dir);
    assert_eq!(bases.len(), 2, "{bases:?}");
    let lib = programs().libdlalloc.to_str().unwrap().to_string();
    let mut symbols = Symbolizer::default();
    for (size, count) in [(5039, 3), (5051, 5)] {
        let allocs = t.of_size(size);
        assert_eq!(allocs.len(), count, "blocks of {size} bytes");
        let base = bases[&size];
        for a in allocs {
            // The frames the trace does not attribute to a module,
            // symbolized in the library as this load mapped it.
            let path: Vec<String> = a
                .stack
                .frames
                .iter()
                .filter_map(|f| match f {
                    F::Native {
                        function: Some(name),
                        ..
                    } => Some(name.clone()),
                    F::Native {
                        addr, module: None, ..
                    } => symbols.lookup(&lib, addr.wrapping_sub(base).wrapping_sub(1)),
                    _ => None,
                })
                .filter(|n| is_program_function(n))
                .collect();
            assert_eq!(path, names(&DL_PATH), "{size} bytes: {:#?}", a.stack);
        }
    }
}

#[test]
fn a_dlopened_library_is_in_the_modules_batch_with_its_load_and_unload() {
    let dir = Scratch::new("dlopen-modules");
    let (t, _) = dlopen_run(&dir);
    assert_path(&t, 5039, 3, &DL_PATH);
    assert_path(&t, 5051, 5, &DL_PATH);
    // The library's frames resolve to the library as it was mapped then:
    // one module per load, each loaded (and unloaded) while tracing.
    let module_of = |a: &Alloc| match &a.stack.frames[0] {
        F::Native {
            module: Some(m), ..
        } => m.clone(),
        other => panic!("innermost frame {other:?}"),
    };
    let first = module_of(t.of_size(5039)[0]);
    let second = module_of(t.of_size(5051)[0]);
    for m in [&first, &second] {
        assert!(m.path.ends_with("/libdlalloc.so"), "{m:?}");
        assert_ne!(m.load_ticks, 0, "{m:?}");
        assert_ne!(m.unload_ticks, 0, "{m:?}");
        assert!(m.load_ticks < m.unload_ticks, "{m:?}");
    }
    assert_ne!(first.id, second.id);
    assert!(first.unload_ticks <= second.load_ticks);
    // The modules batches list both loads, and only them.
    let mut loads: Vec<u64> = t
        .modules
        .iter()
        .filter(|(_, m)| m.path.ends_with("/libdlalloc.so"))
        .map(|(_, m)| m.id)
        .collect();
    loads.sort();
    loads.dedup();
    let mut ids = vec![first.id, second.id];
    ids.sort();
    assert_eq!(loads, ids);
}

#[test]
fn stacks_of_a_signal_handler() {
    let dir = Scratch::new("signal-full");
    let run = scenario(&dir, "full", &["signal"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let t = read_trace(&run.traces[0], false);
    // Through the signal frame into the function it interrupted.
    let truth = [
        "sp_leaf",
        "sp_alloc_n",
        "sp_sig_handler",
        "sp_sig_spin",
        "sp_scn_signal",
        "main",
    ];
    assert_path(&t, 5059, 3, &truth);
}

#[test]
fn stacks_of_a_signal_handler_on_an_alternate_stack() {
    // The walk is bounded by the thread's stack, which the handler is not
    // on (alloctrace_writer::capture: "the allocation gets the truncation
    // marker only"): whatever it keeps, nothing is made up, and the
    // allocations are recorded.
    let truth = names(&[
        "sp_leaf",
        "sp_alloc_n",
        "sp_alt_handler",
        "sp_scn_altstack",
        "main",
    ]);
    {
        let mode = "full";
        let dir = Scratch::new(&format!("altstack-{mode}"));
        let run = scenario(&dir, mode, &["altstack"]);
        assert_eq!(run.code, 0, "{mode}: {}", run.stderr);
        let t = read_trace(&run.traces[0], false);
        let allocs = t.of_size(5101);
        assert_eq!(allocs.len(), 3, "{mode}");
        for a in allocs {
            assert!(truth.starts_with(&a.stack.path), "{mode}: {:#?}", a.stack);
            if a.stack_id != 0 {
                assert!(a.stack.truncated(), "{mode}: {:#?}", a.stack);
            }
        }
    }
}

/// Frames of a stack deeper than the limit: the default limit, 64, counts
/// native frames (alloctrace_writer::capture), then the truncation marker.
const DEFAULT_DEPTH_FRAMES: usize = 65;

#[test]
fn a_stack_deeper_than_the_limit() {
    {
        let mode = "full";
        let dir = Scratch::new(&format!("deep-{mode}"));
        let run = scenario(&dir, mode, &["deep"]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        let t = read_trace(&run.traces[0], false);
        let allocs = t.of_size(5077);
        assert_eq!(allocs.len(), 2);
        for a in allocs {
            let frames = &a.stack.frames;
            assert!(a.stack.truncated(), "{mode}: {:#?}", a.stack);
            assert_eq!(frames.len(), DEFAULT_DEPTH_FRAMES, "{mode}");
            // The innermost frames: sp_leaf, sp_alloc_n, then sp_deep to
            // the limit.
            let expected: Vec<Option<&str>> = ["sp_leaf", "sp_alloc_n"]
                .into_iter()
                .chain(std::iter::repeat("sp_deep"))
                .take(frames.len() - 1)
                .map(Some)
                .collect();
            let got: Vec<Option<&str>> =
                frames[..frames.len() - 1].iter().map(F::function).collect();
            assert_eq!(got, expected, "{mode}");
        }
    }
}

#[test]
fn a_corrupt_frame_pointer_chain_ends_the_walk() {
    {
        let mode = "full";
        let dir = Scratch::new(&format!("corrupt-{mode}"));
        let run = scenario(&dir, mode, &["corrupt"]);
        // The program's own exit status, and a whole trace.
        assert_eq!(run.code, 23, "{mode}: {}", run.stderr);
        let t = read_trace(&run.traces[0], false);
        let truth = names(&["sp_corrupt", "sp_scn_corrupt", "main"]);
        let allocs = t.of_size(5081);
        assert_eq!(allocs.len(), 5, "{mode}");
        for a in allocs {
            // The walk stops at the garbage: the frames before it are
            // right, none after it is made up.
            assert_ne!(a.stack_id, 0, "{mode}: {a:?}");
            assert_eq!(
                a.stack.frames[0].function(),
                Some("sp_corrupt"),
                "{mode}: {:#?}",
                a.stack
            );
            assert!(
                truth.starts_with(&a.stack.path),
                "{mode}: {:?}: {:#?}",
                a.stack.path,
                a.stack
            );
            assert!(a.stack.truncated(), "{mode}: {:#?}", a.stack);
        }
        // Stacks are right again after it.
        assert_path(
            &t,
            5087,
            2,
            &[
                "sp_leaf",
                "sp_alloc_n",
                "sp_after_corrupt",
                "sp_scn_corrupt",
                "main",
            ],
        );
    }
}

// ---------------------------------------------------------------------------
// The C API: a toy interpreter (capi_interp.c).

/// A C API program of c_tests/stacks (`name`.c; `name`_opt: the same
/// source built another way) linked against the
/// liballoctrace.so under test, built once per test run.
fn capi_program(name: &'static str, opt: &str) -> PathBuf {
    static BUILT: OnceLock<std::sync::Mutex<HashMap<&'static str, PathBuf>>> = OnceLock::new();
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(path) = built.get(name) {
        return path.clone();
    }
    let lib = built_by_cargo("liballoctrace.so", "alloctrace");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stacks-capi");
    std::fs::create_dir_all(&dir).expect("create the C API programs' directory");
    // Programs load the library by its SONAME (build.rs):
    // liballoctrace.so.N, here a link to the library under test.
    let build_rs = std::fs::read_to_string(repo().join("build.rs")).expect("build.rs");
    let soversion = build_rs
        .lines()
        .find_map(|l| l.strip_prefix("const SOVERSION: &str = \""))
        .and_then(|l| l.strip_suffix("\";"))
        .expect("SOVERSION in build.rs");
    let link = dir.join(format!("liballoctrace.so.{soversion}"));
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&lib, &link).expect("link the library");
    let out = dir.join(name);
    let include = format!("-I{}", repo().join("include").display());
    let libdir = format!("-L{}", bin_dir().display());
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    let src = sources().join(format!("{}.c", name.trim_end_matches("_opt")));
    let mut args = vec!["-std=c11", "-D_GNU_SOURCE"];
    args.extend_from_slice(CWARN);
    args.extend(opt.split(' '));
    args.extend_from_slice(&[
        &include,
        src.to_str().unwrap(),
        &libdir,
        "-lalloctrace",
        &rpath,
        "-lpthread",
        "-o",
        out.to_str().unwrap(),
    ]);
    compile("gcc", &args);
    built.insert(name, out.clone());
    out
}

#[test]
fn capi_native_stacks_across_generations() {
    native_stacks_across_generations("-O1 -fno-omit-frame-pointer");
}

/// At -O0 the header's plain-call wrapper (alloctrace_plain_heap_object_alloc_,
/// `static inline` without always_inline) is a function of its own: the
/// stack it captures starts in that wrapper, not in its caller.
#[test]
fn capi_native_stacks_across_generations_unoptimised() {
    native_stacks_across_generations("-O0 -fno-omit-frame-pointer");
}

fn native_stacks_across_generations(opt: &str) {
    let prog = capi_program(
        if opt.starts_with("-O0") {
            "capi_capture"
        } else {
            "capi_capture_opt"
        },
        opt,
    );
    let a = ["sp_cap_leaf", "sp_cap_path_a", "sp_cap_generation", "main"];
    let b = ["sp_cap_leaf", "sp_cap_path_b", "sp_cap_generation", "main"];
    let explicit = ["sp_cap_explicit", "sp_cap_generation", "main"];
    let c = [
        "sp_cap_leaf",
        "sp_cap_path_a",
        "sp_cap_path_c",
        "sp_cap_generation",
        "main",
    ];
    for mode in ["full", "fast"] {
        let dir = Scratch::new(&format!("capi-capture-{mode}"));
        let trace = dir.0.join("capture.trace");
        let second = dir.0.join("second.trace");
        let out = Command::new(&prog)
            .arg(&trace)
            .arg(mode)
            .arg(&second)
            .output()
            .expect("run capi_capture");
        assert!(
            out.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let t = read_trace(&trace, false);
        assert_eq!(t.generations, 3, "{mode}");
        for generation in 1..=3u64 {
            let c_count = if generation > 1 { 7 } else { 0 };
            for (size, count, path) in [
                (6007, 3, &a[..]),
                (6011, 5, &b[..]),
                (6029, 2, &explicit[..]),
                (6037, c_count, &c[..]),
            ] {
                let allocs: Vec<&Alloc> = t
                    .of_size(size)
                    .into_iter()
                    .filter(|a| a.generation == generation)
                    .collect();
                assert_eq!(
                    allocs.len(),
                    count,
                    "{mode}: generation {generation}, {size} bytes"
                );
                for al in allocs {
                    assert_ne!(al.stack_id, 0, "{mode}: {al:?}");
                    assert_eq!(
                        al.stack.path,
                        names(path),
                        "{mode}: {size} bytes: {:#?}",
                        al.stack
                    );
                    assert_eq!(
                        al.stack.frames[0].function(),
                        Some(path[0]),
                        "{mode}: {:#?}",
                        al.stack
                    );
                }
            }
        }
        assert_eq!(t.lost_stacks, 0, "{mode}");
        // A second session of the same process: the same stacks, right
        // again (nothing of the first session's tables is reused).
        let t = read_trace(&second, false);
        assert_eq!(t.generations, 1, "{mode}");
        for (size, count, path) in [
            (6007, 3, &a[..]),
            (6011, 5, &b[..]),
            (6029, 2, &explicit[..]),
            (6037, 7, &c[..]),
        ] {
            assert_path(&t, size, count, path);
            for al in t.of_size(size) {
                assert_eq!(al.stack.frames[0].function(), Some(path[0]), "{mode}");
            }
        }
        assert_eq!(t.lost_stacks, 0, "{mode}");
    }
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or_else(|e| panic!("{s}: {e}"))
}

#[test]
fn capi_mixed_stacks_round_trip() {
    let dir = Scratch::new("capi");
    let trace_path = dir.0.join("interp.trace");
    let out = Command::new(capi_program("capi_interp", "-O1"))
        .arg(&trace_path)
        .output()
        .expect("run capi_interp");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}{}",
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    // What the interpreter registered and recorded.
    let mut frames: HashMap<u64, (String, String, u64)> = HashMap::new();
    // addr -> (generation, size, stack ID, frame values)
    let mut allocs: HashMap<u64, (u64, u64, u64, Vec<u64>)> = HashMap::new();
    let mut generation = 1;
    for line in stdout.lines() {
        let w: Vec<&str> = line.split(' ').collect();
        match w[0] {
            "frame" => {
                frames.insert(
                    hex(w[1]),
                    (w[2].to_string(), w[3].to_string(), w[4].parse().unwrap()),
                );
            }
            "alloc" => {
                let values = w[4..].iter().map(|v| hex(v)).collect();
                allocs.insert(
                    hex(w[1]),
                    (generation, w[2].parse().unwrap(), hex(w[3]), values),
                );
            }
            "gen" => generation += 1,
            other => panic!("unexpected line {other}"),
        }
    }
    assert_eq!(frames.len(), 4);
    // fib(4): 9 calls, 5 of them fib(1) or fib(0) with a string; fib(3): 5, 3.
    assert_eq!(allocs.len(), 14 + 8);

    let t = read_trace(&trace_path, false);
    assert_eq!(t.generations, 2);
    assert_eq!(t.allocs.len(), allocs.len());
    let mut mixed = 0;
    for a in &t.allocs {
        let (generation, size, id, values) = allocs
            .get(&a.addr)
            .unwrap_or_else(|| panic!("no allocation at {:#x} was made", a.addr));
        assert_eq!(
            (a.generation, a.size, a.stack_id),
            (*generation, *size, *id)
        );
        let expected: Vec<F> = values
            .iter()
            .map(|&v| {
                if v & (1 << 63) != 0 {
                    let (function, file, line) = frames[&v].clone();
                    F::Registered {
                        function,
                        file,
                        line,
                    }
                } else {
                    F::Native {
                        addr: v,
                        module: None,
                        function: None,
                    }
                }
            })
            .collect();
        // Native frames compare by address (this trace has no modules).
        let got: Vec<F> = a
            .stack
            .frames
            .iter()
            .map(|f| match f {
                F::Native { addr, .. } => F::Native {
                    addr: *addr,
                    module: None,
                    function: None,
                },
                other => other.clone(),
            })
            .collect();
        assert_eq!(got, expected, "block at {:#x}", a.addr);
        // Native, registered, native, registered... in one stack.
        let kinds: Vec<bool> = got.iter().map(|f| matches!(f, F::Native { .. })).collect();
        if kinds.windows(2).filter(|w| w[0] != w[1]).count() >= 3 {
            mixed += 1;
        }
    }
    // Every string block's stack alternates: toy_alloc's caller, tostring,
    // the builtin's call site, fib..., main, the interpreter's entry.
    assert_eq!(mixed, 5 + 3);
}
