//! `alloctrace leaks`: what was still live at the end, grouped by stack,
//! largest first, with LeakSanitizer-style suppressions.

use std::fmt::Write as _;
use std::path::PathBuf;

use alloctrace_analysis::Breakdowns;
use serde_json::{json, Value};

use super::suppressions::Suppressions;
use super::{frame_text, stack_json, Profiled, NO_STACK};
use crate::analyze::SymbolArgs;
use crate::units::{self, Decimals};
use crate::{print_stdout, Failure};

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
    let mut shown = Vec::new();
    let (mut suppressed, mut suppressed_objects, mut suppressed_bytes) = (0u64, 0u64, 0u64);
    for (id, objects, bytes) in leaks {
        let frames = p.frames(id);
        if suppressions.as_ref().is_some_and(|s| s.suppresses(&frames)) {
            suppressed += 1;
            suppressed_objects += objects;
            suppressed_bytes += bytes;
            continue;
        }
        shown.push((frames, objects, bytes));
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
    let text = if args.json {
        if suppressions.is_some() {
            eprintln!("{suppressed_note}");
        }
        let leaks: Vec<Value> = shown
            .iter()
            .map(|(frames, objects, bytes)| {
                json!({"stack": stack_json(frames), "objects": objects, "bytes": bytes})
            })
            .collect();
        let mut out = crate::json_text(&json!({
            "leaks": leaks,
            "objects": objects,
            "bytes": bytes,
        }));
        out.push('\n');
        out
    } else {
        let mut out = String::new();
        for (frames, objects, bytes) in &shown {
            let _ = writeln!(
                out,
                "{} in {} object{} leaked at:",
                units::bytes(*bytes, Decimals::Three),
                units::count_compact(*objects),
                if *objects == 1 { "" } else { "s" }
            );
            if frames.is_empty() {
                let _ = writeln!(out, "    {NO_STACK}");
            }
            for f in frames {
                let _ = writeln!(out, "    {}", frame_text(f));
            }
            out.push('\n');
        }
        if shown.is_empty() && suppressed == 0 {
            let _ = writeln!(
                out,
                "No leaks: nothing allocated in the trace was live at its end."
            );
        }
        let _ = writeln!(
            out,
            "{} leaked in {} objects from {} stack{}",
            units::bytes(bytes, Decimals::Three),
            units::count_compact(objects),
            shown.len(),
            if shown.len() == 1 { "" } else { "s" }
        );
        if suppressions.is_some() {
            let _ = writeln!(out, "{suppressed_note}");
        }
        out
    };
    print_stdout(&text)
}
