//! `alloctrace leaks`: what was still live at the end, grouped by stack,
//! largest first, with LeakSanitizer-style suppressions.

use std::fmt::Write as _;
use std::path::PathBuf;

use alloctrace_analysis::Breakdowns;
use serde_json::json;

use super::suppressions::Suppressions;
use super::{frame_text, stack_json, Output, Profiled, NO_STACK};
use crate::analyze::SymbolArgs;
use crate::failure::Failure;
use crate::print::print_stdout;
use crate::units::{self, Decimals};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Trace files, directories of traces (their *.trace files), or - for standard input; several are one program's traces, summed.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// {"leaks": [...], "objects": N, "bytes": N} as JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// A LeakSanitizer suppressions file: `leak:PATTERN` lines hide the leaks with a frame whose function, file or module matches.
    #[arg(long, value_name = "FILE")]
    pub suppressions: Option<PathBuf>,
    #[command(flatten)]
    pub symbols: SymbolArgs,
}

pub fn run(args: &Args) -> Result<(), Failure> {
    // A bad suppressions file is refused before the trace is read.
    let suppressions = match &args.suppressions {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Failure::Io(format!("cannot read {}: {e}", path.display())))?;
            Some(Suppressions::parse(&text).map_err(|e| {
                Failure::Io(format!("bad suppressions file {}: {e}", path.display()))
            })?)
        }
        None => None,
    };
    let mut p = Profiled::read(&args.files, Breakdowns::default(), &args.symbols)?;
    let mut leaks: Vec<(u32, u64, u64)> = p
        .profile
        .sites()
        .filter(|(_, s)| s.leaked_objects > 0)
        .map(|(id, s)| (id, s.leaked_objects, s.leaked_bytes))
        .collect();
    leaks.sort_by_key(|&(_, objects, bytes)| std::cmp::Reverse((bytes, objects)));
    // Each leak's frames are resolved when it is checked and again when it
    // is written, never all kept at once: a trace of many deep stacks
    // (up to 1,024 frames each, FORMAT.md section 10) would need memory
    // far beyond the file's size.
    let mut shown = Vec::new();
    let (mut suppressed, mut suppressed_objects, mut suppressed_bytes) = (0u64, 0u64, 0u64);
    for (id, objects, bytes) in leaks {
        if let Some(s) = &suppressions {
            if s.suppresses(&p.frames(id)) {
                suppressed += 1;
                suppressed_objects += objects;
                suppressed_bytes += bytes;
                continue;
            }
        }
        shown.push((id, objects, bytes));
    }
    p.print_warnings();
    let objects: u64 = shown.iter().map(|l| l.1).sum();
    let bytes: u64 = shown.iter().map(|l| l.2).sum();
    let suppressed_note = format!(
        "{suppressed} leak{} suppressed ({} in {} objects)",
        if suppressed == 1 { "" } else { "s" },
        units::bytes(suppressed_bytes, Decimals::Three),
        units::count_compact(suppressed_objects)
    );
    let mut out = Output::default();
    if args.json {
        if suppressions.is_some() {
            eprintln!("{suppressed_note}");
        }
        // {"bytes", "leaks", "objects"}: the keys in serde_json's order,
        // the leaks written one at a time.
        let _ = write!(out.text, "{{\"bytes\":{bytes},\"leaks\":[");
        for (i, &(id, objects, bytes)) in shown.iter().enumerate() {
            if i > 0 {
                out.text.push(',');
            }
            let leak =
                json!({"stack": stack_json(&p.frames(id)), "objects": objects, "bytes": bytes});
            out.text.push_str(&crate::print::json_text(&leak));
            out.flush_some()?;
        }
        let sampled = crate::print::json_text(&super::sampled_json(p.profile.sampling()));
        let _ = writeln!(out.text, "],\"objects\":{objects},\"sampled\":{sampled}}}");
    } else {
        if let Some(line) = super::sampled_line(p.profile.sampling()) {
            out.text.push_str(&line);
        }
        for &(id, objects, bytes) in &shown {
            let _ = writeln!(
                out.text,
                "{} in {} object{} leaked at:",
                units::bytes(bytes, Decimals::Three),
                units::count_compact(objects),
                if objects == 1 { "" } else { "s" }
            );
            let frames = p.frames(id);
            if frames.is_empty() {
                let _ = writeln!(out.text, "    {NO_STACK}");
            }
            for f in &frames {
                let _ = writeln!(out.text, "    {}", frame_text(f));
            }
            out.text.push('\n');
            out.flush_some()?;
        }
        if shown.is_empty() && suppressed == 0 {
            let _ = writeln!(
                out.text,
                "No leaks: nothing allocated in the trace was live at its end."
            );
        }
        let _ = writeln!(
            out.text,
            "{} leaked in {} objects from {} stack{}",
            units::bytes(bytes, Decimals::Three),
            units::count_compact(objects),
            shown.len(),
            if shown.len() == 1 { "" } else { "s" }
        );
        if suppressions.is_some() {
            let _ = writeln!(out.text, "{suppressed_note}");
        }
    }
    print_stdout(&out.text)
}
