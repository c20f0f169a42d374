//! Terminal safety: names from a hostile trace (type names, module paths,
//! registered frames, the command line) and hostile file names hold escape
//! sequences (the terminal's title, its clipboard), CR, LF, TAB, DEL and C1
//! characters. Every command's text output shows them escaped, never raw;
//! JSON output carries them as JSON escapes, the value unchanged.

use std::path::{Path, PathBuf};
use std::process::Command;

mod support;

use alloctrace_format::stacks::{FrameEntry, FrameWord, ModuleEntry};
use alloctrace_reader::testing::{
    info, node, sample_trace, stacks_trace, EventsBody, TraceBuilder,
};
use alloctrace_reader::{EventData, TypeInfo};
use serde_json::Value;
use support::Scratch;

const TYPE_NAME: &str = "node\x1b]0;type-title\x07\x7f\u{9b}\r\nFORGED type";
const FUNCTION: &[u8] = b"f\x1b]52;c;Zm9yZ2Vk\x07\r\nFORGED frame";
const FILE: &[u8] = b"a\x1b[2J\t.lua";
const MODULE: &[u8] = b"/lib/\x1b]0;module-title\x07lib\nFORGED.so";
// DEL, and CSI as a C1 character (U+009B, UTF-8 C2 9B).
const ARG: &str = "del\x7f c1\u{9b}31m\r\nFORGED arg";

/// A trace with every kind of name holding control characters: two leaked
/// objects of the hostile type, one allocated in a registered frame (called
/// from the hostile module), one in the module.
fn hostile_trace() -> Vec<u8> {
    let g = info(1);
    let module = ModuleEntry {
        id: 1,
        start: 0x40_0000,
        end: 0x50_0000,
        bias: 0x40_0000,
        eh_frame_hdr: 0,
        load_ticks: 0,
        unload_ticks: 0,
        build_id: &[],
        path: MODULE,
    };
    let frame = FrameEntry {
        id: 1,
        line: 7,
        func: FUNCTION,
        file: FILE,
    };
    let alloc = |size| EventData::HeapObjectAlloc { size, type_id: 1 };
    let mut events = EventsBody::new(1100);
    events
        .event_with_stack(&g, 1100, 0x10040, &alloc(16), 2)
        .event_with_stack(&g, 1200, 0x10080, &alloc(32), 1);
    let mut t = TraceBuilder::new();
    t.info(&g)
        .process(1, 0, &[b"/bin/app\x1b]0;cmd-title\x07", ARG.as_bytes()])
        .types(
            1,
            &[TypeInfo {
                id: 1,
                size: 16,
                ptr_bytes: 0,
                name: TYPE_NAME.to_string(),
            }],
        )
        .events(1, 1, &events)
        .modules(1, &[module])
        .frames(1, &[frame])
        .call_stacks(
            1,
            &[
                node(1, 0, FrameWord::Native(0x40_1100)),
                node(2, 1, FrameWord::Registered(1)),
            ],
        )
        .generation_end_v3(1, 5000, 5_004_000, 0, 0)
        .trace_end(1);
    t.finish()
}

/// What one command wrote.
struct Run {
    args: Vec<String>,
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Run {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

fn alloctrace(args: &[&Path]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .args(args)
        .output()
        .expect("run alloctrace");
    Run {
        args: args.iter().map(|a| a.display().to_string()).collect(),
        code: out.status.code(),
        stdout: out.stdout,
        stderr: out.stderr,
    }
}

/// The first byte of `bytes` a terminal takes as a control: C0 but LF,
/// DEL, or a C1 character (UTF-8 C2 80..C2 9F).
fn control_byte(bytes: &[u8]) -> Option<(usize, u8)> {
    bytes.iter().enumerate().find_map(|(i, &b)| {
        let c1 = b == 0xc2 && bytes.get(i + 1).is_some_and(|n| (0x80..=0x9f).contains(n));
        ((b < 0x20 && b != b'\n') || b == 0x7f || c1).then_some((i, b))
    })
}

/// A stand-in [`Run`] naming what was checked.
fn run_of(what: &str) -> Run {
    Run {
        args: vec![what.to_string()],
        code: Some(0),
        stdout: Vec::new(),
        stderr: Vec::new(),
    }
}

/// Runs commands and gathers what is wrong with their output, so that one
/// failure lists every command that misbehaves.
#[derive(Default)]
struct Checker {
    failures: Vec<String>,
}

impl Checker {
    /// Runs `args` (the trace substituted for `T`) and notes a non-zero
    /// exit, a raw control byte on stdout or stderr, or a forged line.
    fn run(&mut self, trace: &Path, args: &[&str]) -> Run {
        let args: Vec<PathBuf> = args
            .iter()
            .map(|&a| {
                if a == "T" {
                    trace.to_path_buf()
                } else {
                    PathBuf::from(a)
                }
            })
            .collect();
        let refs: Vec<&Path> = args.iter().map(PathBuf::as_path).collect();
        let run = alloctrace(&refs);
        if run.code != Some(0) {
            self.failures.push(format!(
                "{:?}: exit {:?}\n{}",
                run.args,
                run.code,
                String::from_utf8_lossy(&run.stderr)
            ));
        }
        for (stream, bytes) in [("stdout", &run.stdout), ("stderr", &run.stderr)] {
            if let Some((at, byte)) = control_byte(bytes) {
                self.failures.push(format!(
                    "{:?}: raw control byte {byte:#04x} at {at} of {stream}: {}",
                    run.args,
                    String::from_utf8_lossy(bytes).escape_debug()
                ));
            }
            let text = String::from_utf8_lossy(bytes);
            if text.lines().any(|l| l.trim_start().starts_with("FORGED")) {
                self.failures
                    .push(format!("{:?}: a forged line on {stream}", run.args));
            }
        }
        run
    }

    /// Notes each of `parts` that `text` (from `run`) lacks.
    fn holds(&mut self, run: &Run, text: &str, parts: &[&str]) {
        for part in parts {
            if !text.contains(part) {
                self.failures
                    .push(format!("{:?}: no {part:?} in {text:?}", run.args));
            }
        }
    }

    fn assert_none(&self) {
        assert!(
            self.failures.is_empty(),
            "{} failures:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}

const TYPE_ESCAPED: &str = r"node\u{1b}]0;type-title\u{7}\u{7f}\u{9b}\r\nFORGED type";
const FUNCTION_ESCAPED: &str = r"f\u{1b}]52;c;Zm9yZ2Vk\u{7}\r\nFORGED frame";
const FILE_ESCAPED: &str = r"a\u{1b}[2J\t.lua";
const MODULE_ESCAPED: &str = r"\u{1b}]0;module-title\u{7}lib\nFORGED.so";
const COMMAND_ESCAPED: &str = r"/bin/app\u{1b}]0;cmd-title\u{7}";
const ARG_ESCAPED: &str = r"del\u{7f} c1\u{9b}31m\r\nFORGED arg";

#[test]
fn text_outputs_escape_names_from_the_trace() {
    let dir = Scratch::new("text");
    let trace = dir.path("hostile.trace");
    std::fs::write(&trace, hostile_trace()).unwrap();
    let before = dir.path("before.trace");
    std::fs::write(&before, sample_trace()).unwrap();
    let t = trace.as_path();
    let mut c = Checker::default();

    let run = c.run(t, &["dump", "T"]);
    c.holds(&run, &run.text(), &[&format!("name={TYPE_ESCAPED}\n")]);
    let run = c.run(t, &["dump", "--stacks", "T"]);
    let module_line = format!("path=/lib/{MODULE_ESCAPED}\n");
    c.holds(
        &run,
        &run.text(),
        &[&module_line, FUNCTION_ESCAPED, FILE_ESCAPED],
    );
    for args in [&["stats", "T"][..], &["stats", "--all", "T"]] {
        let run = c.run(t, args);
        c.holds(
            &run,
            &run.text(),
            &[TYPE_ESCAPED, COMMAND_ESCAPED, ARG_ESCAPED],
        );
    }
    c.run(t, &["check", "T"]);
    c.run(t, &["pages", "T"]);
    let run = c.run(t, &["top", "T"]);
    c.holds(
        &run,
        &run.text(),
        &[FUNCTION_ESCAPED, FILE_ESCAPED, MODULE_ESCAPED],
    );
    let run = c.run(t, &["top", "--by", "function", "T"]);
    c.holds(&run, &run.text(), &[FUNCTION_ESCAPED, MODULE_ESCAPED]);
    let run = c.run(t, &["top", "--by", "type", "T"]);
    c.holds(&run, &run.text(), &[TYPE_ESCAPED]);
    let run = c.run(t, &["leaks", "T"]);
    c.holds(
        &run,
        &run.text(),
        &[FUNCTION_ESCAPED, FILE_ESCAPED, MODULE_ESCAPED],
    );
    let run = c.run(t, &["diff", before.to_str().unwrap(), "T"]);
    c.holds(&run, &run.text(), &[FUNCTION_ESCAPED, MODULE_ESCAPED]);
    // `;` is the folded format's separator: `:` in a name.
    let run = c.run(t, &["flamegraph", "--collapsed", "T"]);
    c.holds(
        &run,
        &run.text(),
        &[r"f\u{1b}]52:c:Zm9yZ2Vk\u{7}\r\nFORGED frame"],
    );
    // The symbolizer's warnings name the module's missing file.
    let run = c.run(t, &["symbolize", "T"]);
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    c.holds(&run, &stderr, &[MODULE_ESCAPED]);
    let svg = dir.path("out.svg");
    c.run(t, &["flamegraph", "T", "-o", svg.to_str().unwrap()]);
    // An SVG is XML, which allows no C0 but TAB, CR and LF.
    let svg_bytes = std::fs::read(&svg).unwrap_or_default();
    if let Some(at) = svg_bytes
        .iter()
        .position(|&b| b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r'))
    {
        c.failures
            .push(format!("the SVG holds {:#04x} at {at}", svg_bytes[at]));
    }
    let svg_text = String::from_utf8_lossy(&svg_bytes).into_owned();
    c.holds(&run_of("flamegraph SVG"), &svg_text, &["FORGED frame"]);
    let html = dir.path("out.html");
    c.run(t, &["report", "T", "-o", html.to_str().unwrap()]);
    c.assert_none();
}

#[test]
fn hostile_file_names_are_escaped_in_labels() {
    let dir = Scratch::new("labels");
    let traces = dir.path("traces");
    std::fs::create_dir(&traces).unwrap();
    let name = "a\x1b]0;file-title\x07\nFORGED.trace";
    std::fs::write(traces.join(name), sample_trace()).unwrap();
    let escaped = r"a\u{1b}]0;file-title\u{7}\nFORGED.trace";
    let d = traces.as_path();
    let mut c = Checker::default();
    for args in [
        &["dump", "T"][..],
        &["dump", "--stacks", "T"],
        &["stats", "T"],
        &["pages", "T"],
        &["check", "T"],
        &["top", "T"],
    ] {
        let run = c.run(d, args);
        c.holds(&run, &run.text(), &[escaped]);
    }
    c.assert_none();
}

#[test]
fn json_outputs_escape_controls_and_keep_the_names() {
    let dir = Scratch::new("json");
    let trace = dir.path("hostile.trace");
    std::fs::write(&trace, hostile_trace()).unwrap();
    let t = trace.as_path();
    let function = String::from_utf8(FUNCTION.to_vec()).unwrap();
    let file = String::from_utf8(FILE.to_vec()).unwrap();
    let module = String::from_utf8(MODULE.to_vec()).unwrap();
    let mut c = Checker::default();
    // Every line one JSON value: control characters (DEL and C1 too) as
    // JSON escapes, which decode to the trace's own names.
    let mut json = |args: &[&str]| -> Vec<Value> {
        let run = c.run(t, args);
        run.text()
            .lines()
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("{:?}: not JSON: {e}\n{l}", run.args))
            })
            .collect()
    };
    let v = &json(&["stats", "--json", "T"])[0];
    assert_eq!(v["per_type"][0]["name"], TYPE_NAME);
    assert_eq!(v["command"][1], ARG);
    let v = &json(&["top", "--by", "type", "--json", "T"])[0];
    assert_eq!(v["sites"][0]["key"], TYPE_NAME);
    let v = &json(&["top", "--json", "T"])[0];
    assert_eq!(v["sites"].as_array().map(Vec::len), Some(2), "{v}");
    let v = &json(&["leaks", "--json", "T"])[0];
    let frames: Vec<&Value> = v["leaks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|l| l["stack"].as_array().unwrap())
        .collect();
    assert!(
        frames
            .iter()
            .any(|f| f["function"] == function.as_str() && f["file"] == file.as_str()),
        "{v}"
    );
    assert!(frames.iter().any(|f| f["module"] == module.as_str()), "{v}");
    let lines = json(&["dump", "--stacks", "--json", "T"]);
    assert_eq!(lines[0]["module"]["path"], module.as_str());
    assert_eq!(lines.len(), 3);
    assert_eq!(json(&["dump", "--json", "T"]).len(), 2);
    assert_eq!(json(&["check", "--json", "T"])[0]["status"], "ok");
    json(&["pages", "--json", "T"]);
    let before = dir.path("before.trace");
    std::fs::write(&before, sample_trace()).unwrap();
    let v = &json(&["diff", "--json", before.to_str().unwrap(), "T"])[0];
    assert!(v["sites"].as_array().is_some_and(|s| !s.is_empty()), "{v}");
    let v = &json(&["export", "--format", "chrome", "-o", "-", "T"])[0];
    let names: Vec<&str> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(names.iter().any(|n| n.contains(TYPE_NAME)), "{names:?}");
    c.assert_none();
}

#[test]
fn json_outputs_escape_hostile_file_names() {
    let dir = Scratch::new("json-labels");
    let traces = dir.path("traces");
    std::fs::create_dir(&traces).unwrap();
    let name = "a\x1b]0;file-title\x07\x7f\u{9b}\nFORGED.trace";
    std::fs::write(traces.join(name), stacks_trace()).unwrap();
    let mut c = Checker::default();
    for args in [
        &["dump", "--json", "T"][..],
        &["dump", "--stacks", "--json", "T"],
        &["stats", "--json", "T"],
        &["pages", "--json", "T"],
        &["check", "--json", "T"],
    ] {
        let run = c.run(&traces, args);
        let first = run.text().lines().next().map(serde_json::from_str::<Value>);
        let Some(Ok(first)) = first else {
            c.failures.push(format!("{:?}: no JSON line", run.args));
            continue;
        };
        let file = first["file"].as_str().unwrap_or_default();
        if !file.ends_with(name) {
            c.failures.push(format!("{:?}: file {file:?}", run.args));
        }
    }
    c.assert_none();
}

#[test]
fn record_summary_escapes_the_program_name() {
    let dir = Scratch::new("record");
    let prog = dir.path("t\x1b]0;program-title\x07");
    std::fs::copy("/bin/true", &prog).unwrap();
    let out = support::record_command()
        .arg("-o")
        .arg(dir.path("out.trace"))
        .arg("--")
        .arg(&prog)
        .output()
        .expect("run alloctrace record");
    let run = Run {
        args: vec!["record".to_string()],
        code: out.status.code(),
        stdout: out.stdout,
        stderr: out.stderr,
    };
    assert_eq!(
        run.code,
        Some(0),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let summary = String::from_utf8_lossy(&run.stderr).into_owned();
    assert_eq!(control_byte(&run.stderr), None, "{summary:?}");
    assert!(
        summary.contains(r"t\u{1b}]0;program-title\u{7})"),
        "{summary}"
    );
}
