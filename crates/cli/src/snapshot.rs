//! `alloctrace snapshot PID -o FILE`: what a running traced process has
//! live now, and where it was allocated, asked through its control socket
//! (control.rs).
//!
//! The process ends its current generation and answers once its trace
//! file holds it: the trace's path, that generation, and the byte count
//! of the trace's first bytes that hold it (whole batches;
//! crates/writer/src/session/channel.rs). Those bytes are read as a trace
//! cut there (no truncation warning: the cut is the point), and what was
//! live at the cut is written: a pprof heap profile whose `inuse_*`
//! samples are the live objects (the `alloc_*` ones everything allocated
//! until then), or JSON.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::PathBuf;

use alloctrace_analysis::{Both, Breakdowns, Pass, Profile, Summary};
use alloctrace_format::control as words;
use alloctrace_reader::TraceReader;
use serde_json::json;

use crate::analyze::SymbolArgs;
use crate::answers::stack_json;
use crate::export::{check_one_file_output, pprof, write_output};
use crate::failure::Failure;
use crate::input::Input;

/// What `snapshot` writes.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// profile.proto, gzipped (go tool pprof, Pyroscope, Parca, Perfetto UI): inuse_* are the live objects.
    Pprof,
    /// {"pid", "generation", "objects", "bytes", "live": [{"stack", "objects", "bytes"}...]}, largest first.
    Json,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The traced process (`alloctrace ps` lists them).
    #[arg(value_name = "PID")]
    pub pid: u32,
    /// The output file (- for standard output).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
    /// The output format.
    #[arg(long, value_enum, default_value = "pprof")]
    pub format: Format,
    #[command(flatten)]
    pub symbols: SymbolArgs,
}

pub fn run(args: &Args) -> Result<(), Failure> {
    check_one_file_output(&args.output, "snapshot")?;
    let answer = crate::control::ask_pid(args.pid, words::SNAPSHOT)?;
    let field = |key: &str| {
        answer
            .get(key)
            .cloned()
            .ok_or_else(|| Failure::Io(format!("process {}: no {key} in its answer", args.pid)))
    };
    let trace = PathBuf::from(field(words::KEY_TRACE)?);
    let bytes: u64 = field(words::KEY_BYTES)?
        .parse()
        .map_err(|_| Failure::Io(format!("process {}: a bad byte count", args.pid)))?;
    let generation: u64 = field(words::KEY_GENERATION)?.parse().unwrap_or(0);
    let file = File::open(&trace)
        .map_err(|e| Failure::Io(format!("cannot open {}: {e}", trace.display())))?;
    let source: Box<dyn Read + Send> = Box::new(file.take(bytes));
    let mut reader = TraceReader::new(BufReader::with_capacity(64 * 1024, source))
        .map_err(|e| Failure::Io(format!("cannot read {}: {e}", trace.display())))?;
    let mut pass = Pass::new();
    let mut visitor = Both(Profile::new(Breakdowns::default()), Summary::new());
    pass.run(&mut reader, &mut visitor, |_| {})
        .map_err(Failure::from)?;
    let Both(profile, summary) = visitor;
    let mut resolver = args.symbols.resolver(&[Input::file(&trace)]);
    match args.format {
        Format::Pprof => {
            let times = pprof::Times::of(&summary);
            let proto = pprof::build(&profile, &pass.stacks, &mut resolver, &times);
            write_output(&args.output, |out| pprof::write(&proto, out))
        }
        Format::Json => {
            let mut live: Vec<(u32, u64, u64)> = profile
                .sites()
                .filter(|(_, s)| s.leaked_objects > 0)
                .map(|(id, s)| (id, s.leaked_objects, s.leaked_bytes))
                .collect();
            live.sort_by_key(|&(_, objects, bytes)| std::cmp::Reverse((bytes, objects)));
            let objects: u64 = live.iter().map(|l| l.1).sum();
            let total: u64 = live.iter().map(|l| l.2).sum();
            let sites: Vec<_> = live
                .iter()
                .map(|&(id, objects, bytes)| {
                    let frames = resolver.stack(&pass.stacks, id);
                    json!({"stack": stack_json(&frames), "objects": objects, "bytes": bytes})
                })
                .collect();
            let doc = json!({
                "pid": args.pid,
                "generation": generation,
                "objects": objects,
                "bytes": total,
                "live": sites,
            });
            let mut text = String::new();
            let _ = writeln!(text, "{}", crate::print::json_text(&doc));
            write_output(&args.output, |out| out.write_all(text.as_bytes()))
        }
    }
}
