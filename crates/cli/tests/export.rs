//! `alloctrace export` end to end (issue 13, "Tests").
//!
//! c_tests/reports/leaky.c runs under `alloctrace record` (built with and
//! without frame pointers); its header gives the exact facts checked here:
//!
//! | function | allocations | bytes each | leaked | live at the peak |
//! |---|---|---|---|---|
//! | make_name | 100 | 32 | all | 100 |
//! | scratch | 50 | 64 | none | 0 |
//! | fill_cache | 20 | 65,536 | none | 20 |
//! | build_table | 7 | 1,000 | all | 0 |
//!
//! - parquet: the DuckDB queries of docs/EXPORT.md (read from the file,
//!   so the documented queries are the tested ones) give those facts, and
//!   agree with `leaks --json` and `top --json`. Needs Python's duckdb
//!   (`pip install duckdb`); without it the test says so and checks only
//!   the files' presence and magic.
//! - pprof: `go tool pprof -top` lists the functions with their exact
//!   counts (Debian's golang-go; skipped with a message without `go`).
//! - chrome: valid JSON with the live-memory counters, whose heap
//!   maximum is the program's peak; a long synthetic trace gives a file of
//!   bounded size.
//!
//! Needs the shim (liballoctrace_preload.so) next to the binary under test
//! (`cargo build -p alloctrace-preload`) and gcc.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

mod support;

use alloctrace_reader::testing::{info, EventsBody, TraceBuilder};
use alloctrace_reader::{EventData, TypeInfo};
use serde_json::Value;
use support::{compile, repo, traces_in, Scratch};

fn alloctrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run alloctrace")
}

/// Runs `alloctrace args`, which must succeed.
fn alloctrace_ok(args: &[&str]) -> String {
    let out = alloctrace(args);
    assert!(
        out.status.success(),
        "alloctrace {}: exit {:?}\n{}",
        args.join(" "),
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// leaky.c's builds: -O0 with frame pointers, -O2 without.
fn leaky_builds() -> &'static [PathBuf] {
    static BUILDS: OnceLock<Vec<PathBuf>> = OnceLock::new();
    BUILDS.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("export-programs");
        std::fs::create_dir_all(&dir).expect("create the programs' directory");
        let src = repo().join("c_tests/reports/leaky.c");
        [
            ("leaky_fp", "-O0", "-fno-omit-frame-pointer"),
            ("leaky_nofp", "-O2", "-fomit-frame-pointer"),
        ]
        .iter()
        .map(|(name, opt, fp)| {
            let out = dir.join(name);
            compile(
                "gcc",
                &[
                    "-Wall",
                    "-Wextra",
                    "-Werror",
                    "-g",
                    opt,
                    fp,
                    s(&src),
                    "-o",
                    s(&out),
                ],
            );
            out
        })
        .collect()
    })
}

/// Records `program` under the shim into `dir`; returns the trace.
fn record(dir: &Scratch, program: &Path) -> PathBuf {
    support::record(&[], &dir.path("t.%p.trace"), program, &[]);
    let traces = traces_in(&dir.0);
    assert_eq!(traces.len(), 1, "{traces:?}");
    traces[0].clone()
}

/// leaky.c's own functions, as the tests name them (gcc's clone suffixes,
/// `.constprop.0` and the like, dropped).
const FUNCTIONS: [&str; 4] = ["make_name", "scratch", "fill_cache", "build_table"];

fn own_function(name: &str) -> Option<&'static str> {
    let base = name.split('.').next().unwrap_or(name);
    FUNCTIONS.iter().copied().find(|f| *f == base)
}

/// Per leaky.c function: (allocations, bytes, leaked objects, leaked bytes).
fn expected_sites() -> BTreeMap<&'static str, [u64; 4]> {
    BTreeMap::from([
        ("make_name", [100, 3200, 100, 3200]),
        ("scratch", [50, 3200, 0, 0]),
        ("fill_cache", [20, 1_310_720, 0, 0]),
        ("build_table", [7, 7000, 7, 7000]),
    ])
}

// ---------------------------------------------------------------------------
// Parquet and DuckDB.

/// The ```sql blocks of docs/EXPORT.md that start with `-- NAME`, in order.
fn documented_queries() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(repo().join("docs/EXPORT.md")).expect("docs/EXPORT.md");
    let mut out = Vec::new();
    let mut rest = doc.as_str();
    while let Some(start) = rest.find("```sql\n-- ") {
        let block = &rest[start + "```sql\n".len()..];
        let end = block.find("```").expect("a closed sql block");
        let sql = &block[..end];
        let name = sql["-- ".len()..]
            .lines()
            .next()
            .unwrap()
            .trim()
            .to_string();
        out.push((name, sql.to_string()));
        rest = &block[end..];
    }
    out
}

/// Runs the queries in one DuckDB session from `cwd`; `None` (with a
/// message) without Python's duckdb. The `live` query's time is set to the
/// `peak` query's answer for trace 0.
const DUCKDB_RUNNER: &str = r#"
import json, re, sys
try:
    import duckdb
except ImportError:
    print(json.dumps({"skip": "the duckdb Python package is not installed (pip install duckdb)"}))
    sys.exit(0)
con = duckdb.connect()
out = {}
peak = None
for name, sql in json.load(sys.stdin):
    if name == "live" and peak is not None:
        sql = re.sub(r"SET VARIABLE t = \d+;", "SET VARIABLE t = %d;" % peak, sql)
    cur = con.execute(sql)
    cols = [d[0] for d in cur.description]
    out[name] = [dict(zip(cols, r)) for r in cur.fetchall()]
    if name == "peak":
        peak = out[name][0]["peak_time_ns"]
print(json.dumps(out, default=str))
"#;

fn duckdb(cwd: &Path, queries: &[(String, String)]) -> Option<Value> {
    use std::io::Write;
    let child = Command::new("python3")
        .arg("-c")
        .arg(DUCKDB_RUNNER)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            eprintln!("export tests: skipped the DuckDB queries: cannot run python3: {e}");
            return None;
        }
    };
    let input = serde_json::to_vec(queries).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the DuckDB queries failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("the runner's JSON");
    if let Some(why) = v["skip"].as_str() {
        eprintln!("export tests: skipped the DuckDB queries: {why}");
        return None;
    }
    Some(v)
}

fn num(v: &Value) -> u64 {
    match v {
        Value::Number(n) => n.as_u64().expect("a count"),
        // DuckDB's HUGEINT sums come back as text from the runner.
        Value::String(s) => s.parse().expect("a count"),
        Value::Null => 0,
        other => panic!("not a number: {other}"),
    }
}

/// The rows of `rows` whose `function` is one of leaky.c's, keyed by it,
/// with the values of `columns`.
fn by_own_function(rows: &Value, columns: &[&str]) -> BTreeMap<&'static str, Vec<u64>> {
    let mut out = BTreeMap::new();
    for row in rows.as_array().expect("rows") {
        let Some(f) = row["function"].as_str().and_then(own_function) else {
            continue;
        };
        let values: Vec<u64> = columns.iter().map(|c| num(&row[*c])).collect();
        assert!(out.insert(f, values).is_none(), "{f} twice in {rows}");
    }
    out
}

/// `alloctrace CMD TRACE --json ...` if this build has CMD (the report
/// commands land separately); `None` with a message otherwise.
fn report_json(cmd: &str, trace: &Path, extra: &[&str]) -> Option<Value> {
    let mut args = vec![cmd, s(trace), "--json"];
    args.extend_from_slice(extra);
    let out = alloctrace(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && stderr.contains("unrecognized subcommand") {
        eprintln!("export tests: skipped the comparison with `{cmd} --json`: no such command in this build");
        return None;
    }
    assert!(out.status.success(), "{cmd} --json: {stderr}");
    Some(serde_json::from_slice(&out.stdout).expect("JSON"))
}

/// A report's entries (`leaks` or `sites`) keyed by their innermost
/// function when it is one of leaky.c's.
fn report_by_function(v: &Value, list: &str, keys: &[&str]) -> BTreeMap<&'static str, Vec<u64>> {
    let mut out = BTreeMap::new();
    for entry in v[list].as_array().expect("a list") {
        let Some(f) = entry["stack"][0]["function"]
            .as_str()
            .and_then(own_function)
        else {
            continue;
        };
        let values: Vec<u64> = keys.iter().map(|k| num(&entry[*k])).collect();
        assert!(out.insert(f, values).is_none(), "{f} twice");
    }
    out
}

#[test]
fn parquet_export_answers_the_documented_queries_exactly() {
    let queries = documented_queries();
    let names: Vec<&str> = queries.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["leaks", "top", "peak", "live", "live_sites", "stack"],
        "the documented queries"
    );
    for program in leaky_builds() {
        let dir = Scratch::new("parquet");
        let trace = record(&dir, program);
        let out = dir.path("out");
        alloctrace_ok(&["export", s(&trace), "--format", "parquet", "-o", s(&out)]);
        for table in [
            "allocations",
            "stacks",
            "frames",
            "modules",
            "types",
            "traces",
        ] {
            let bytes = std::fs::read(out.join(format!("{table}.parquet"))).unwrap();
            assert!(
                bytes.starts_with(b"PAR1") && bytes.ends_with(b"PAR1"),
                "{table}"
            );
        }
        let Some(answers) = duckdb(&dir.0, &queries) else {
            return;
        };
        let want = expected_sites();

        let leaks = by_own_function(&answers["leaks"], &["objects", "bytes"]);
        let want_leaks: BTreeMap<_, _> = want
            .iter()
            .filter(|(_, v)| v[2] > 0)
            .map(|(f, v)| (*f, vec![v[2], v[3]]))
            .collect();
        assert_eq!(leaks, want_leaks, "{}: leaks", program.display());

        let cols = ["allocations", "bytes", "leaked_objects", "leaked_bytes"];
        let top = by_own_function(&answers["top"], &cols);
        let want_top: BTreeMap<_, _> = want.iter().map(|(f, v)| (*f, v.to_vec())).collect();
        assert_eq!(top, want_top, "{}: top", program.display());

        // At the peak: make_name's names and fill_cache's blocks, nothing
        // of scratch (freed at once) or build_table (made after).
        let live = by_own_function(&answers["live_sites"], &["objects", "bytes"]);
        let want_live = BTreeMap::from([
            ("fill_cache", vec![20, 1_310_720]),
            ("make_name", vec![100, 3200]),
        ]);
        assert_eq!(live, want_live, "{}: live at the peak", program.display());
        let heap = answers["live"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["memory"] == "heap")
            .expect("live heap at the peak");
        assert!(num(&heap["bytes"]) >= 1_313_920, "{heap}");
        assert!(!answers["stack"].as_array().unwrap().is_empty());

        // The same facts as the report commands give.
        if let Some(v) = report_json("leaks", &trace, &[]) {
            let l = report_by_function(&v, "leaks", &["objects", "bytes"]);
            assert_eq!(l, leaks, "leaks --json and DuckDB");
        }
        if let Some(v) = report_json("top", &trace, &["-n", "1000"]) {
            let t = report_by_function(&v, "sites", &cols);
            assert_eq!(t, top, "top --json and DuckDB");
        }
    }
}

#[test]
fn parquet_export_of_several_traces_and_types() {
    let dir = Scratch::new("parquet-types");
    let a = dir.path("a.trace");
    let b = dir.path("b.trace");
    std::fs::write(&a, typed_trace(3, 1000)).unwrap();
    std::fs::write(&b, typed_trace(2, 500)).unwrap();
    let out = dir.path("out");
    alloctrace_ok(&["export", s(&a), s(&b), "--format", "parquet", "-o", s(&out)]);
    let queries = vec![
        (
            "per_trace".to_string(),
            "SELECT trace, count(*) AS n, count(*) FILTER (WHERE free_time_ns IS NULL) AS live, \
             count(DISTINCT type_id) AS types FROM 'out/allocations.parquet' \
             GROUP BY trace ORDER BY trace"
                .to_string(),
        ),
        (
            "types".to_string(),
            "SELECT trace, type_id, name FROM 'out/types.parquet' ORDER BY trace, type_id"
                .to_string(),
        ),
        (
            "traces".to_string(),
            "SELECT trace, file, process FROM 'out/traces.parquet' ORDER BY trace".to_string(),
        ),
    ];
    let Some(v) = duckdb(&dir.0, &queries) else {
        return;
    };
    // typed_trace(k, n): n allocations of k types, every other one freed.
    let per_trace: Vec<Vec<u64>> = v["per_trace"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            vec![
                num(&r["trace"]),
                num(&r["n"]),
                num(&r["live"]),
                num(&r["types"]),
            ]
        })
        .collect();
    assert_eq!(per_trace, vec![vec![0, 1000, 500, 3], vec![1, 500, 250, 2]]);
    assert_eq!(v["types"].as_array().unwrap().len(), 5);
    assert_eq!(v["types"][0]["name"], "struct t1");
    assert_eq!(v["traces"][1]["file"], s(&b));
    assert_eq!(num(&v["traces"][0]["process"]), 4242);
}

// ---------------------------------------------------------------------------
// pprof.

/// `go tool pprof -top` of `profile` for one sample type: function to
/// flat value. `None` (with a message) without `go`.
fn pprof_top(profile: &Path, sample_index: &str) -> Option<BTreeMap<String, u64>> {
    let out = Command::new("go")
        .args([
            "tool",
            "pprof",
            "-top",
            "-nodefraction=0",
            "-nodecount=10000",
        ])
        .arg(format!("-sample_index={sample_index}"))
        .arg(profile)
        .env("PPROF_TMPDIR", std::env::temp_dir())
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            eprintln!("export tests: skipped go tool pprof: cannot run go: {e} (apt-get install golang-go)");
            return None;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "go tool pprof: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut flat = BTreeMap::new();
    let mut in_table = false;
    for line in text.lines() {
        if line.trim_start().starts_with("flat") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        // flat flat% sum% cum cum% name
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() >= 6 {
            let value = fields[0].parse().unwrap_or(u64::MAX);
            flat.insert(fields[5..].join(" "), value);
        }
    }
    Some(flat)
}

#[test]
fn pprof_export_lists_the_functions_with_their_counts() {
    for program in leaky_builds() {
        let dir = Scratch::new("pprof");
        let trace = record(&dir, program);
        let profile = dir.path("heap.pb.gz");
        alloctrace_ok(&["export", s(&trace), "--format", "pprof", "-o", s(&profile)]);
        let bytes = std::fs::read(&profile).unwrap();
        assert_eq!(&bytes[..2], &[0x1f, 0x8b], "gzip");
        let Some(alloc) = pprof_top(&profile, "alloc_objects") else {
            return;
        };
        let own = |top: &BTreeMap<String, u64>| -> BTreeMap<&'static str, u64> {
            top.iter()
                .filter_map(|(f, v)| own_function(f).map(|f| (f, *v)))
                .filter(|(_, v)| *v > 0)
                .collect()
        };
        let want = expected_sites();
        let want_alloc: BTreeMap<_, _> = want.iter().map(|(f, v)| (*f, v[0])).collect();
        assert_eq!(
            own(&alloc),
            want_alloc,
            "{}: alloc_objects",
            program.display()
        );
        let inuse = pprof_top(&profile, "inuse_objects").unwrap();
        let want_inuse: BTreeMap<_, _> = want
            .iter()
            .filter(|(_, v)| v[2] > 0)
            .map(|(f, v)| (*f, v[2]))
            .collect();
        assert_eq!(
            own(&inuse),
            want_inuse,
            "{}: inuse_objects",
            program.display()
        );
    }
}

// ---------------------------------------------------------------------------
// Chrome trace.

fn chrome(path: &Path) -> Vec<Value> {
    let v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).expect("valid JSON");
    v["traceEvents"].as_array().expect("traceEvents").clone()
}

#[test]
fn chrome_export_has_the_live_memory_counters() {
    let dir = Scratch::new("chrome");
    let trace = record(&dir, &leaky_builds()[0]);
    let out = dir.path("heap.json");
    alloctrace_ok(&["export", s(&trace), "--format", "chrome", "-o", s(&out)]);
    let events = chrome(&out);
    let named = events
        .iter()
        .find(|e| e["ph"] == "M" && e["name"] == "process_name")
        .expect("a process_name event");
    assert!(named["args"]["name"].as_str().unwrap().contains(s(&trace)));
    let counters: Vec<&Value> = events
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "live memory (bytes)")
        .collect();
    assert!(!counters.is_empty());
    for c in &counters {
        assert!(
            c["ts"].as_f64().is_some() && c["pid"] == named["pid"],
            "{c}"
        );
    }
    // The bucket maxima keep the peak exact: the C library allocates
    // nothing else in leaky.c, so the peak is the table's 1,313,920 B.
    let peak = counters.iter().map(|c| num(&c["args"]["heap"])).max();
    assert_eq!(peak, Some(1_313_920));
    let last = counters.last().unwrap();
    assert_eq!(num(&last["args"]["heap"]), 3200 + 7000, "leaked at the end");
    assert!(events
        .iter()
        .any(|e| e["ph"] == "C" && e["name"] == "live objects"));
}

/// A trace of `n` heap allocations of `types` types (type k: 16k bytes),
/// 1 µs apart, every other one freed right after, in batches of 500
/// allocations.
fn typed_trace(types: u64, n: u64) -> Vec<u8> {
    let g = info(1);
    let mut t = TraceBuilder::new();
    t.info(&g);
    let infos: Vec<TypeInfo> = (1..=types)
        .map(|id| TypeInfo {
            id,
            size: 16 * id,
            ptr_bytes: 0,
            name: format!("struct t{id}"),
        })
        .collect();
    t.types(1, &infos);
    let mut tick = 1000;
    let mut i = 0;
    while i < n {
        let mut b = EventsBody::new(tick);
        for _ in 0..500.min(n - i) {
            let addr = 0x10000 + 16 * i;
            // Pairs of one type: the first stays, the second is freed.
            let type_id = 1 + (i / 2) % types;
            tick += 1000;
            b.event(
                &g,
                tick,
                addr,
                &EventData::HeapObjectAlloc {
                    size: 16 * type_id,
                    type_id,
                },
            );
            if i % 2 == 1 {
                tick += 1000;
                b.event(&g, tick, addr, &EventData::HeapObjectFree);
            }
            i += 1;
        }
        t.events(1, 1, &b);
    }
    t.generation_end(1, tick + 1, 5_000_000 + tick, 0)
        .trace_end(1);
    t.finish()
}

#[test]
fn chrome_export_stays_small_on_a_long_trace() {
    let dir = Scratch::new("chrome-long");
    let trace = dir.path("long.trace");
    // 300,000 events over 0.3 s.
    std::fs::write(&trace, typed_trace(20, 200_000)).unwrap();
    let out = dir.path("long.json");
    alloctrace_ok(&["export", s(&trace), "--format", "chrome", "-o", s(&out)]);
    let size = std::fs::metadata(&out).unwrap().len();
    let events = chrome(&out);
    let live: Vec<&Value> = events
        .iter()
        .filter(|e| e["name"] == "live memory (bytes)")
        .collect();
    // At most 2000 buckets and the final value.
    assert!(live.len() <= 2001 && live.len() > 100, "{}", live.len());
    let type_tracks: std::collections::BTreeSet<&str> = events
        .iter()
        .filter_map(|e| e["name"].as_str())
        .filter(|n| n.starts_with("type "))
        .collect();
    // The 10 types with the highest peak: the largest (t11..t20).
    assert_eq!(type_tracks.len(), 10, "{type_tracks:?}");
    assert!(type_tracks.contains("type struct t20 (bytes)"));
    assert!(!type_tracks.contains("type struct t1 (bytes)"));
    assert!(size < 2_000_000, "{size} bytes");
}

// ---------------------------------------------------------------------------
// Options.

#[test]
fn bad_options_are_refused_before_reading() {
    let dir = Scratch::new("options");
    let file = dir.path("file");
    std::fs::write(&file, b"not a directory").unwrap();
    let missing = dir.path("missing.trace");
    let nowhere = dir.path("no/such/dir/x.json");
    let cases: [(&[&str], &str); 7] = [
        (&["--format", "svg", "-o", "x"], "svg"),
        (
            &["--format", "chrome", "-o", s(&nowhere)],
            "no such directory",
        ),
        (&["--format", "parquet", "-o", "-"], "not standard output"),
        (&["--format", "pprof"], "--output"),
        (&["-o", "x"], "--format"),
        (&["--format", "parquet", "-o", s(&file)], "not a directory"),
        (&["--format", "chrome", "-o", s(&dir.0)], "is a directory"),
    ];
    for (extra, says) in cases {
        let mut args = vec!["export", s(&missing)];
        args.extend_from_slice(extra);
        let out = alloctrace(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        // The option was refused, not the missing trace.
        assert!(!err.contains("cannot open"), "{args:?}: {err}");
    }
    // A malformed trace: exit 2 with the offset.
    std::fs::write(&missing, b"ALLOCTRC garbage").unwrap();
    let out = alloctrace(&[
        "export",
        s(&missing),
        "--format",
        "pprof",
        "-o",
        s(&dir.path("p")),
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn standard_input_is_read_as_a_file_is() {
    let dir = Scratch::new("stdin");
    let bytes = typed_trace(2, 100);
    let trace = dir.path("t.trace");
    std::fs::write(&trace, &bytes).unwrap();
    let from_file = dir.path("file.json");
    let from_stdin = dir.path("stdin.json");
    alloctrace_ok(&[
        "export",
        s(&trace),
        "--format",
        "chrome",
        "-o",
        s(&from_file),
    ]);
    let status = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .args(["export", "-", "--format", "chrome", "-o", s(&from_stdin)])
        .stdin(std::fs::File::open(&trace).unwrap())
        .status()
        .unwrap();
    assert!(status.success());
    // The same events; the process is named after the input as given.
    let a = chrome(&from_file);
    let b = chrome(&from_stdin);
    assert_eq!(a.len(), b.len());
    assert_eq!(a[2..], b[2..]);
    // `-o -`: the one-file formats go to standard output.
    let out = alloctrace(&["export", s(&trace), "--format", "pprof", "-o", "-"]);
    assert!(out.status.success());
    assert_eq!(&out.stdout[..2], &[0x1f, 0x8b], "gzip on stdout");
    let out = alloctrace(&["export", s(&trace), "--format", "chrome", "-o", "-"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(v["traceEvents"].as_array().unwrap().len(), a.len());
}
