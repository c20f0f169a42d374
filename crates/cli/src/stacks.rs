//! `alloctrace dump --stacks`: each generation's modules and interned call
//! stacks (FORMAT.md section 10), one frame per line, instead of the
//! events. The events are still read (and checked: an event naming a stack
//! its generation does not define is a malformed trace), not printed.

use std::fmt::Write as _;
use std::io::{self, BufWriter, Write};

use alloctrace_reader::{Frame, Module, Stacks, Step};
use serde_json::{json, Value};

use crate::failure::Failure;
use crate::input::{open, Input};
use crate::print::{output_error, prefix, printable, truncation_warning};

/// Lists one trace's stacks; a labelled one gets a `==> NAME <==` line, or
/// a `"file"` key in each JSON object.
pub fn run(input: &Input, json: bool, label: Option<&str>) -> Result<(), Failure> {
    let mut reader = open(input)?;
    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(64 * 1024, stdout.lock());
    if let (Some(name), false) = (label, json) {
        writeln!(out, "==> {} <==", printable(name)).map_err(output_error)?;
    }
    let result = loop {
        match reader.next_step(1 << 16, |_| {}) {
            Ok(Step::Events(_)) => {}
            Ok(Step::GenerationStart { generation }) => {
                let stacks = reader.stacks();
                let written = if json {
                    write_json(&mut out, label, generation, stacks)
                } else {
                    write_text(&mut out, generation, stacks)
                };
                written.map_err(output_error)?;
            }
            Ok(Step::End) => break Ok(()),
            Err(err) => break Err(Failure::from(err)),
        }
    };
    out.flush().map_err(output_error)?;
    if result.is_ok() {
        if let Some(offset) = reader.truncated() {
            eprintln!("{}{}", prefix(label), truncation_warning(offset));
        }
    }
    result
}

/// A frame as one line's text: `libfoo.so+0x1234` (the module's file name
/// and the address's ELF virtual address in it), the bare address when no
/// module holds it, `function file:line` for a registered frame, or
/// `[truncated]`.
pub fn frame_text(frame: Frame<'_>) -> String {
    match frame {
        Frame::Native {
            addr,
            module: Some(m),
        } => format!("{}+{:#x}", m.file_name(), m.offset(addr)),
        Frame::Native { addr, module: None } => format!("{addr:#x}"),
        Frame::Registered(r) => {
            let mut s = r.function.clone();
            if !r.file.is_empty() {
                s.push(' ');
                s.push_str(&r.file);
                if r.line != 0 {
                    let _ = write!(s, ":{}", r.line);
                }
            }
            s
        }
        Frame::Truncated => "[truncated]".to_string(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// `module gen=G id=ID start=0x.. end=0x.. bias=0x.. build_id=HEX load=T
/// unload=T path=PATH`, then per stack `stack gen=G id=ID frames=N` and its
/// frames, innermost first, as `  #I FRAME`.
fn write_text(out: &mut impl Write, generation: u64, stacks: &Stacks) -> io::Result<()> {
    for m in stacks.modules() {
        writeln!(
            out,
            "module gen={generation} id={} start={:#x} end={:#x} bias={:#x} build_id={} load={} unload={} path={}",
            m.id,
            m.start,
            m.end,
            m.bias,
            if m.build_id.is_empty() { "-".to_string() } else { hex(&m.build_id) },
            m.load_ticks,
            m.unload_ticks,
            printable(&m.path)
        )?;
    }
    for id in stacks.ids() {
        let frames: Vec<String> = stacks
            .frames(id)
            .map(|f| f.map(frame_text).collect())
            .unwrap_or_default();
        writeln!(
            out,
            "stack gen={generation} id={id} frames={}",
            frames.len()
        )?;
        for (i, f) in frames.iter().enumerate() {
            writeln!(out, "  #{i} {}", printable(f))?;
        }
    }
    Ok(())
}

fn module_json(m: &Module) -> Value {
    json!({
        "id": m.id,
        "path": m.path,
        "start": m.start,
        "end": m.end,
        "bias": m.bias,
        "eh_frame_hdr": m.eh_frame_hdr,
        "build_id": hex(&m.build_id),
        "load_ticks": m.load_ticks,
        "unload_ticks": m.unload_ticks,
    })
}

fn frame_json(frame: Frame<'_>) -> Value {
    match frame {
        Frame::Native { addr, module } => json!({
            "addr": addr,
            "module": module.map(|m| m.path.as_str()),
            "offset": module.map(|m| m.offset(addr)),
        }),
        Frame::Registered(r) => json!({
            "function": r.function,
            "file": r.file,
            "line": r.line,
        }),
        Frame::Truncated => json!({ "truncated": true }),
    }
}

/// One JSON object per module (`{"gen", "module": {...}}`) and per stack
/// (`{"gen", "stack": ID, "frames": [...]}`), a line each.
fn write_json(
    out: &mut impl Write,
    label: Option<&str>,
    generation: u64,
    stacks: &Stacks,
) -> io::Result<()> {
    let mut line = |mut v: Value| {
        if let (Some(name), Some(map)) = (label, v.as_object_mut()) {
            map.insert("file".into(), Value::from(name));
        }
        writeln!(out, "{}", crate::print::json_text(&v))
    };
    for m in stacks.modules() {
        line(json!({ "gen": generation, "module": module_json(m) }))?;
    }
    for id in stacks.ids() {
        let frames: Vec<Value> = stacks
            .frames(id)
            .map(|f| f.map(frame_json).collect())
            .unwrap_or_default();
        line(json!({ "gen": generation, "stack": id, "frames": frames }))?;
    }
    Ok(())
}
