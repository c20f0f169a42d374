//! `alloctrace dump`: one line per event. The text form is parsed by the C
//! tests with sscanf, so its fields and spacing are fixed (docs/CLI.md).

use std::io::{self, BufWriter, IsTerminal, Write};

use alloctrace_reader::{Event, EventData, Record, TypeInfo};

use crate::failure::Failure;
use crate::input::{open, Input};
use crate::print::{output_error, prefix, printable, truncation_warning};
use crate::progress::Progress;

/// Dumps one trace; a labelled one (one of several) gets a `==> NAME <==`
/// line before its text, or a `"file"` key first in each JSON object.
pub fn run(input: &Input, json: bool, label: Option<&str>) -> Result<(), Failure> {
    let mut reader = open(input)?;
    // A bar only when the events go elsewhere than the terminal.
    let mut progress = if io::stdout().is_terminal() {
        Progress::hidden()
    } else {
        Progress::new(input.size())
    };
    let mut records = 0u64;
    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(256 * 1024, stdout.lock());
    let file_key = match label {
        Some(name) if json => format!("\"file\":{},", crate::print::json_text(&name.into())),
        _ => String::new(),
    };
    if let (Some(name), false) = (label, json) {
        writeln!(out, "==> {} <==", printable(name)).map_err(output_error)?;
    }
    // Print what was read before an error, then the error.
    let result = loop {
        match reader.next_record() {
            Ok(Some(Record::GenerationStart { generation })) => {
                if !json {
                    for t in reader.types().values() {
                        write_type(&mut out, generation, t).map_err(output_error)?;
                    }
                }
            }
            Ok(Some(Record::Event(event))) => {
                let written = if json {
                    write_json(&mut out, &file_key, &event)
                } else {
                    write_text(&mut out, &event)
                };
                written.map_err(output_error)?;
            }
            Ok(None) => break Ok(()),
            Err(err) => break Err(Failure::from(err)),
        }
        records += 1;
        if records & 0xffff == 0 {
            progress.update(reader.bytes_read());
        }
    };
    progress.finish();
    out.flush().map_err(output_error)?;
    if result.is_ok() {
        if let Some(offset) = reader.truncated() {
            eprintln!("{}{}", prefix(label), truncation_warning(offset));
        }
    }
    result
}

/// `type gen=G id=ID size=S ptr_bytes=P name=NAME`; control characters in
/// the name are escaped ([`printable`]) so every type stays on one line.
fn write_type(out: &mut impl Write, generation: u64, t: &TypeInfo) -> io::Result<()> {
    let name = printable(&t.name);
    writeln!(
        out,
        "type gen={generation} id={} size={} ptr_bytes={} name={name}",
        t.id, t.size, t.ptr_bytes
    )
}

/// `TIME_NS gen=G thread=T KIND addr=0xHEX [args] [stack=ID] [entry=F] [long]`.
fn write_text(out: &mut impl Write, e: &Event) -> io::Result<()> {
    write!(
        out,
        "{} gen={} thread={} {} addr={:#x}",
        e.time_ns,
        e.generation,
        e.thread,
        e.data.name(),
        e.addr
    )?;
    match e.data {
        EventData::SpanExists { npages, kind_class }
        | EventData::SpanAlloc { npages, kind_class } => {
            write!(out, " npages={npages} class={kind_class}")?
        }
        EventData::HeapObjectExists { size, type_id }
        | EventData::HeapObjectAlloc { size, type_id } => {
            write!(out, " size={size} type={type_id}")?
        }
        EventData::StackExists { size } | EventData::StackAlloc { size } => {
            write!(out, " size={size}")?
        }
        EventData::PageAlloc { npages }
        | EventData::PageFree { npages }
        | EventData::PageScav { npages } => write!(out, " npages={npages}")?,
        EventData::SpanFree
        | EventData::HeapObjectFree
        | EventData::StackFree
        | EventData::Call => {}
    }
    if e.stack_id != 0 {
        write!(out, " stack={}", e.stack_id)?;
    }
    if let Some(entry) = e.entry {
        write!(out, " entry={}", entry.name())?;
    }
    if e.long_form {
        out.write_all(b" long")?;
    }
    out.write_all(b"\n")
}

/// One JSON object; written by hand because every value is a number or a
/// fixed identifier, and dumps can have millions of lines.
fn write_json(out: &mut impl Write, file_key: &str, e: &Event) -> io::Result<()> {
    write!(
        out,
        "{{{file_key}\"time_ns\":{},\"gen\":{},\"thread\":{},\"kind\":\"{}\",\"addr\":{},\"long_form\":{}",
        e.time_ns,
        e.generation,
        e.thread,
        e.data.name(),
        e.addr,
        e.long_form
    )?;
    match e.data {
        EventData::SpanExists { npages, kind_class }
        | EventData::SpanAlloc { npages, kind_class } => {
            write!(out, ",\"npages\":{npages},\"class\":{kind_class}")?
        }
        EventData::HeapObjectExists { size, type_id }
        | EventData::HeapObjectAlloc { size, type_id } => {
            write!(out, ",\"size\":{size},\"type\":{type_id}")?
        }
        EventData::StackExists { size } | EventData::StackAlloc { size } => {
            write!(out, ",\"size\":{size}")?
        }
        EventData::PageAlloc { npages }
        | EventData::PageFree { npages }
        | EventData::PageScav { npages } => write!(out, ",\"npages\":{npages}")?,
        EventData::SpanFree
        | EventData::HeapObjectFree
        | EventData::StackFree
        | EventData::Call => {}
    }
    if e.stack_id != 0 {
        write!(out, ",\"stack\":{}", e.stack_id)?;
    }
    if let Some(entry) = e.entry {
        write!(out, ",\"entry\":\"{}\"", entry.name())?;
    }
    out.write_all(b"}\n")
}
