//! The site reports end to end (issue 13, "Tests"): c_tests/reports/leaky.c,
//! whose header lists its exact leaks, temporaries and peak, built with
//! and without frame pointers, recorded under the shim, and read back with
//! `top`, `leaks`, `flamegraph` and `diff`.
//!
//! Frames are checked by the function names the CLI gives them (the
//! programs are built with -g, so every frame of theirs is symbolized).
//!
//! Needs the shim (liballoctrace_preload.so) and liballoctrace.so next to
//! the `alloctrace` binary under test (`cargo build -p alloctrace-preload
//! -p alloctrace`; `cargo test --workspace` builds both) and gcc.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

mod support;

use alloctrace_reader::testing::sample_trace;
use serde_json::Value;
use support::{compile, repo};

// ---------------------------------------------------------------------------
// Building and recording.

fn scratch() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("reports");
    std::fs::create_dir_all(&dir).expect("create the scratch directory");
    dir
}

/// Records `prog` under the shim into `trace`.
fn record(prog: &Path, trace: &Path) {
    let _ = std::fs::remove_file(trace);
    support::record(&[], trace, prog, &[]);
    assert!(trace.is_file(), "no trace at {}", trace.display());
}

/// The traces of leaky.c, built and recorded once per test run.
struct Traces {
    /// -O0 -fno-omit-frame-pointer.
    fp: PathBuf,
    /// -O2 -fomit-frame-pointer.
    nofp: PathBuf,
    /// /bin/true's, a program with none of leaky.c's sites.
    other: PathBuf,
}

fn traces() -> &'static Traces {
    static TRACES: OnceLock<Traces> = OnceLock::new();
    TRACES.get_or_init(|| {
        let dir = scratch();
        let src = repo().join("c_tests/reports/leaky.c");
        let src = src.to_str().unwrap();
        let build = |name: &str, flags: &[&str]| {
            let prog = dir.join(name);
            let mut args = vec!["-Wall", "-Wextra", "-Werror", "-g"];
            args.extend_from_slice(flags);
            args.extend_from_slice(&[src, "-o", prog.to_str().unwrap()]);
            compile("gcc", &args);
            let trace = dir.join(format!("{name}.trace"));
            record(&prog, &trace);
            trace
        };
        let other = dir.join("true.trace");
        record(Path::new("/bin/true"), &other);
        Traces {
            fp: build("leaky_fp", &["-O0", "-fno-omit-frame-pointer"]),
            nofp: build("leaky_nofp", &["-O2", "-fomit-frame-pointer"]),
            other,
        }
    })
}

fn both() -> [&'static Path; 2] {
    let t = traces();
    [&t.fp, &t.nofp]
}

/// Runs alloctrace; (exit code, stdout, stderr).
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

/// Runs alloctrace, which must succeed, and parses its JSON output.
fn json(args: &[&str]) -> Value {
    let (code, out, err) = alloctrace(args);
    assert_eq!(code, 0, "alloctrace {}: {err}", args.join(" "));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

// ---------------------------------------------------------------------------
// Function names of the CLI's frames.

/// The function the CLI named a frame of its JSON.
fn function(frame: &Value) -> String {
    frame["function"].as_str().expect("function").to_string()
}

/// The innermost function of a JSON stack.
fn innermost(stack: &Value) -> Option<String> {
    stack.as_array().and_then(|s| s.first()).map(function)
}

const PROGRAM: [&str; 5] = ["make_name", "scratch", "fill_cache", "build_table", "touch"];

/// Per innermost function of the program, the `key` counts of `rows`,
/// summed; other rows' innermost functions must not be the program's.
fn by_program_function(rows: &Value, keys: &[&str]) -> BTreeMap<String, Vec<u64>> {
    let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for row in rows.as_array().expect("rows") {
        let Some(f) = innermost(&row["stack"]) else {
            continue;
        };
        if !PROGRAM.contains(&f.as_str()) {
            continue;
        }
        let counts = out.entry(f).or_insert_with(|| vec![0; keys.len()]);
        for (c, k) in counts.iter_mut().zip(keys) {
            *c += row[k].as_u64().expect(k);
        }
    }
    out
}

/// `function_name`, after checking that some site of `trace` has it as
/// its innermost frame.
fn shown_name(trace: &Path, function_name: &str) -> String {
    let v = json(&["top", "--json", "-n", "0", p(trace)]);
    let found = v["sites"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| innermost(&s["stack"]).as_deref() == Some(function_name));
    assert!(found, "no site of {function_name} in {v}");
    function_name.to_string()
}

// ---------------------------------------------------------------------------
// The reports on leaky.c.

#[test]
fn leaks_name_exactly_the_leaking_functions() {
    for trace in both() {
        let v = json(&["leaks", "--json", p(trace)]);
        let leaks = by_program_function(&v["leaks"], &["objects", "bytes"]);
        let expected: BTreeMap<String, Vec<u64>> = [
            ("build_table".to_string(), vec![7, 7000]),
            ("make_name".to_string(), vec![100, 3200]),
        ]
        .into();
        assert_eq!(leaks, expected, "{}", trace.display());
        // The totals are the sum of the leaks listed, largest first.
        let list = v["leaks"].as_array().unwrap();
        let bytes: Vec<u64> = list.iter().map(|l| l["bytes"].as_u64().unwrap()).collect();
        assert!(bytes.windows(2).all(|w| w[0] >= w[1]), "{bytes:?}");
        assert_eq!(v["bytes"].as_u64(), Some(bytes.iter().sum()));
        let objects: u64 = list.iter().map(|l| l["objects"].as_u64().unwrap()).sum();
        assert_eq!(v["objects"].as_u64(), Some(objects));
        // Every frame has the five keys.
        for frame in list[0]["stack"].as_array().unwrap() {
            for key in ["function", "file", "line", "module", "address"] {
                assert!(frame.get(key).is_some(), "{key} in {frame}");
            }
        }
    }
}

#[test]
fn top_attributes_the_peak_exactly() {
    for trace in both() {
        let v = json(&["top", "--json", "--sort", "peak", "-n", "0", p(trace)]);
        let sites = &v["sites"];
        let peak = by_program_function(sites, &["peak_bytes"]);
        let expected: BTreeMap<String, Vec<u64>> = [
            ("fill_cache".to_string(), vec![1_310_720]),
            ("make_name".to_string(), vec![3200]),
        ]
        .into();
        assert_eq!(peak, expected, "{}", trace.display());
        let peaks: Vec<u64> = sites
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["peak_bytes"].as_u64().unwrap())
            .collect();
        assert!(peaks.windows(2).all(|w| w[0] >= w[1]), "{peaks:?}");
        assert!(peaks.iter().all(|&b| b > 0), "{peaks:?}");
        for site in sites.as_array().unwrap() {
            let keys: Vec<&String> = site.as_object().unwrap().keys().collect();
            assert_eq!(
                keys,
                [
                    "allocations",
                    "bytes",
                    "leaked_bytes",
                    "leaked_objects",
                    "peak_bytes",
                    "stack",
                    "temporary"
                ]
            );
        }
    }
}

#[test]
fn top_counts_allocations_and_temporaries() {
    for trace in both() {
        let v = json(&[
            "top",
            "--json",
            "--sort",
            "allocations",
            "-n",
            "0",
            p(trace),
        ]);
        let counts = by_program_function(&v["sites"], &["allocations", "bytes", "temporary"]);
        let expected: BTreeMap<String, Vec<u64>> = [
            ("build_table".to_string(), vec![7, 7000, 0]),
            ("fill_cache".to_string(), vec![20, 1_310_720, 0]),
            ("make_name".to_string(), vec![100, 3200, 0]),
            ("scratch".to_string(), vec![50, 3200, 50]),
        ]
        .into();
        assert_eq!(counts, expected, "{}", trace.display());
        let v = json(&["top", "--json", "--sort", "temporary", "-n", "1", p(trace)]);
        let sites = v["sites"].as_array().unwrap();
        assert_eq!(sites.len(), 1);
        assert_eq!(innermost(&sites[0]["stack"]).as_deref(), Some("scratch"));
        assert_eq!(sites[0]["temporary"].as_u64(), Some(50));
    }
}

#[test]
fn top_by_function_size_and_thread() {
    let trace = &traces().fp;
    let v = json(&["top", "--json", "--by", "size", "-n", "0", p(trace)]);
    let sizes: HashMap<u64, &Value> = v["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["key"].as_u64().expect("a size key"), s))
        .collect();
    assert_eq!(sizes[&65536]["peak_bytes"].as_u64(), Some(1_310_720));
    assert_eq!(sizes[&64]["temporary"].as_u64(), Some(50));
    assert_eq!(sizes[&1000]["leaked_objects"].as_u64(), Some(7));
    let v = json(&["top", "--json", "--by", "thread", p(trace)]);
    let threads = v["sites"].as_array().unwrap();
    assert_eq!(threads.len(), 1, "{v}");
    assert!(threads[0]["allocations"].as_u64().unwrap() >= 177);
    // By function: the CLI's names of the innermost frames.
    let make_name = shown_name(trace, "make_name");
    let v = json(&[
        "top",
        "--json",
        "--by",
        "function",
        "--sort",
        "leaked",
        p(trace),
    ]);
    let row = v["sites"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == make_name.as_str())
        .unwrap_or_else(|| panic!("{make_name} in {v}"));
    assert_eq!(row["leaked_bytes"].as_u64(), Some(3200));
    assert!(row.get("stack").is_none());
}

#[test]
fn top_text_is_a_table_with_units() {
    let (code, out, err) = alloctrace(&["top", "--sort", "peak", p(&traces().fp)]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("Top stacks by bytes live at the peak"),
        "{out}"
    );
    assert!(out.contains("1.25 MiB"), "{out}");
    assert!(out.contains("3.12 KiB"), "{out}");
}

#[test]
fn flamegraph_and_collapsed_stacks_contain_the_functions() {
    let t = traces();
    let dir = scratch();
    for trace in both() {
        let names: Vec<String> = ["make_name", "fill_cache", "build_table", "scratch"]
            .iter()
            .map(|f| shown_name(trace, f))
            .collect();
        let (code, folded, err) = alloctrace(&["flamegraph", "--collapsed", p(trace)]);
        assert_eq!(code, 0, "{err}");
        // `outer;...;inner VALUE`, the allocating function last.
        let mut values = HashMap::new();
        for line in folded.lines() {
            let (stack, value) = line.rsplit_once(' ').expect("stack VALUE");
            let leaf = stack.rsplit(';').next().unwrap();
            *values.entry(leaf.to_string()).or_insert(0u64) += value.parse::<u64>().unwrap();
        }
        assert_eq!(values.get(&names[1]), Some(&1_310_720), "{folded}");
        assert_eq!(values.get(&names[0]), Some(&3200), "{folded}");
        let (_, leaked, _) = alloctrace(&[
            "flamegraph",
            "--collapsed",
            "--metric",
            "leaked",
            "--inverted",
            "-o",
            "-",
            p(trace),
        ]);
        // Inverted: the allocating function first.
        assert!(
            leaked
                .lines()
                .any(|l| l.starts_with(&format!("{};", names[2]))),
            "{leaked}"
        );
        assert!(!leaked.contains(&names[1]), "{leaked}");

        let svg = dir.join("flame.svg");
        let _ = std::fs::remove_file(&svg);
        let (code, _, err) = alloctrace(&[
            "flamegraph",
            "-o",
            p(&svg),
            "--metric",
            "allocations",
            p(trace),
        ]);
        assert_eq!(code, 0, "{err}");
        let svg = std::fs::read_to_string(&svg).unwrap();
        assert!(svg.starts_with("<?xml"), "{}", &svg[..100.min(svg.len())]);
        assert!(svg.contains("<script"), "interactive");
        assert!(svg.contains("Allocations"), "title");
        for name in &names {
            assert!(svg.contains(name.as_str()), "{name} in the SVG");
        }
    }
    // -o is required for the SVG, and refused before reading.
    let (code, _, err) = alloctrace(&["flamegraph", p(&t.fp)]);
    assert_eq!(code, 1);
    assert!(err.contains("-o"), "{err}");
}

#[test]
fn suppressions_hide_leaks_and_say_how_many() {
    let trace = &traces().fp;
    let dir = scratch();
    let make_name = shown_name(trace, "make_name");
    let supp = dir.join("make_name.supp");
    std::fs::write(
        &supp,
        format!("# the names are leaked on purpose\n\nleak:^{make_name}$\n"),
    )
    .unwrap();
    let (code, out, err) = alloctrace(&["leaks", "--json", "--suppressions", p(&supp), p(trace)]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let leaks = by_program_function(&v["leaks"], &["objects", "bytes"]);
    let expected: BTreeMap<String, Vec<u64>> = [("build_table".to_string(), vec![7, 7000])].into();
    assert_eq!(leaks, expected);
    assert!(err.contains("1 leak suppressed"), "{err}");
    let (_, text, _) = alloctrace(&["leaks", "--suppressions", p(&supp), p(trace)]);
    assert!(
        text.contains("1 leak suppressed (3.12 KiB in 100 objects)"),
        "{text}"
    );
    // The module's path matches every stack of the program.
    let module = trace.with_extension("");
    std::fs::write(&supp, format!("leak:{}\n", module.display())).unwrap();
    let v = json(&["leaks", "--json", "--suppressions", p(&supp), p(trace)]);
    assert!(
        by_program_function(&v["leaks"], &["objects"]).is_empty(),
        "{v}"
    );

    // A bad file is refused before the trace is read (here: none).
    std::fs::write(&supp, "leak:make_name\nmake_name\n").unwrap();
    let (code, out, err) = alloctrace(&["leaks", "--suppressions", p(&supp), "/nonexistent"]);
    assert_eq!((code, out.as_str()), (1, ""));
    assert!(err.contains("line 2"), "{err}");
    assert!(!err.contains("/nonexistent"), "{err}");
}

#[test]
fn diff_lists_the_sites_that_changed() {
    let t = traces();
    let same = json(&["diff", "--json", p(&t.fp), p(&t.fp)]);
    assert_eq!(same["sites"], Value::Array(vec![]), "{same}");
    assert_eq!(same["before"], same["after"]);
    // From /bin/true to leaky: leaky's sites appear from nothing.
    let v = json(&["diff", "--json", p(&t.other), p(&t.fp)]);
    let sites = v["sites"].as_array().unwrap();
    let fill = sites
        .iter()
        .find(|s| innermost(&s["stack"]).as_deref() == Some("fill_cache"))
        .expect("fill_cache changed");
    assert_eq!(fill["before"]["allocations"].as_u64(), Some(0));
    assert_eq!(fill["after"]["allocations"].as_u64(), Some(20));
    assert_eq!(fill["after"]["peak_bytes"].as_u64(), Some(1_310_720));
    // Largest change first: fill_cache's 1.25 MiB leads.
    assert_eq!(innermost(&sites[0]["stack"]).as_deref(), Some("fill_cache"));
    let back = json(&["diff", "--json", p(&t.fp), p(&t.other)]);
    let fill = &back["sites"][0];
    assert_eq!(fill["before"]["allocations"].as_u64(), Some(20));
    assert_eq!(fill["after"]["allocations"].as_u64(), Some(0));
}

/// Two builds of the program match by function chain: none of the
/// program's sites changed.
#[test]
fn diff_matches_two_builds_by_function() {
    let t = traces();
    let v = json(&["diff", "--json", p(&t.fp), p(&t.nofp)]);
    let program: Vec<&Value> = v["sites"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| innermost(&s["stack"]).is_some_and(|f| PROGRAM.contains(&f.as_str())))
        .collect();
    assert!(program.is_empty(), "{program:?}");
}

/// Several traces are one program's: counts summed, each trace's peak
/// composition added.
#[test]
fn several_traces_are_summed() {
    let t = traces();
    let v = json(&["leaks", "--json", p(&t.fp), p(&t.nofp)]);
    let leaks = by_program_function(&v["leaks"], &["objects", "bytes"]);
    let expected: BTreeMap<String, Vec<u64>> = [
        ("build_table".to_string(), vec![14, 14_000]),
        ("make_name".to_string(), vec![200, 6400]),
    ]
    .into();
    assert_eq!(leaks, expected);
    let v = json(&[
        "top",
        "--json",
        "--sort",
        "peak",
        "-n",
        "0",
        p(&t.fp),
        p(&t.nofp),
    ]);
    let peak = by_program_function(&v["sites"], &["peak_bytes", "temporary"]);
    let expected: BTreeMap<String, Vec<u64>> = [
        ("fill_cache".to_string(), vec![2 * 1_310_720, 0]),
        ("make_name".to_string(), vec![6400, 0]),
    ]
    .into();
    assert_eq!(peak, expected);
}

/// A trace's `.symbols` file (`alloctrace symbolize`) names the frames
/// once the program is gone.
#[test]
fn reports_read_the_symbols_file_beside_the_trace() {
    let dir = scratch();
    let prog = dir.join("leaky_gone");
    let src = repo().join("c_tests/reports/leaky.c");
    compile("gcc", &["-O0", "-g", src.to_str().unwrap(), "-o", p(&prog)]);
    let trace = dir.join("leaky_gone.trace");
    record(&prog, &trace);
    let symbols = dir.join("leaky_gone.trace.symbols");
    let _ = std::fs::remove_file(&symbols);
    let (code, _, err) = alloctrace(&["symbolize", p(&trace)]);
    assert_eq!(code, 0, "{err}");
    std::fs::remove_file(&prog).unwrap();
    let leaks = |v: &Value| by_program_function(&v["leaks"], &["objects"]);
    let v = json(&["leaks", "--json", p(&trace)]);
    let expected: BTreeMap<String, Vec<u64>> = [
        ("build_table".to_string(), vec![7]),
        ("make_name".to_string(), vec![100]),
    ]
    .into();
    assert_eq!(leaks(&v), expected, "{v}");
    // Without it, nothing names them.
    std::fs::remove_file(&symbols).unwrap();
    let v = json(&["leaks", "--json", p(&trace)]);
    assert!(leaks(&v).is_empty(), "{v}");
}

#[test]
fn reports_read_standard_input() {
    use std::io::Write;
    let trace = &traces().fp;
    let bytes = std::fs::read(trace).unwrap();
    let from_file = json(&["leaks", "--json", p(trace)]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .args(["leaks", "--json", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let from_stdin: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(from_file, from_stdin);
}

// ---------------------------------------------------------------------------
// Traces from the reader's test builder.

fn sample_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = scratch().join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn top_by_type_names_the_types() {
    let path = sample_file("sample.trace", &sample_trace());
    let v = json(&["top", "--json", "--by", "type", "-n", "0", p(&path)]);
    let types: HashMap<&str, &Value> = v["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["key"].as_str().expect("a type name"), s))
        .collect();
    assert_eq!(types["char[32]"]["bytes"].as_u64(), Some(32), "{v}");
    // A 24-byte object, a 3000-byte stack, a span of one 4096-byte page.
    assert_eq!(
        types["(no type)"]["bytes"].as_u64(),
        Some(24 + 3000 + 4096),
        "{v}"
    );
    assert_eq!(types["(no type)"]["allocations"].as_u64(), Some(3), "{v}");
    // struct node existed before tracing: not allocated (bytes 0, left out).
    assert!(!types.contains_key("struct node"), "{v}");
}

#[test]
fn malformed_traces_exit_2_with_the_offset() {
    let mut bytes = sample_trace();
    // The first batch's kind byte.
    bytes[16] = 13;
    let bad = sample_file("bad.trace", &bytes);
    let svg = scratch().join("bad.svg");
    let commands: [&[&str]; 5] = [
        &["top"],
        &["leaks", "--json"],
        &["flamegraph", "--collapsed"],
        &["flamegraph", "-o", p(&svg)],
        &["diff", p(&traces().other)],
    ];
    for cmd in commands {
        let mut args = cmd.to_vec();
        args.push(p(&bad));
        let (code, out, err) = alloctrace(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert!(err.contains("byte offset 16"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // Random damage anywhere in a recorded trace: an error, never a panic.
    let good = std::fs::read(&traces().fp).unwrap();
    for i in (0..good.len()).step_by(good.len() / 16 + 1) {
        let mut damaged = good.clone();
        damaged[i] ^= 0x5a;
        let path = sample_file("damaged.trace", &damaged);
        let (code, _, err) = alloctrace(&["top", "-n", "0", p(&path)]);
        assert!(code == 0 || code == 2, "byte {i}: exit {code}: {err}");
        assert!(!err.contains("panicked"), "byte {i}: {err}");
        if code == 2 {
            assert!(err.contains("byte offset"), "byte {i}: {err}");
        }
    }
}
