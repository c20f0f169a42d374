//! `alloctrace snapshot PID -o FILE`: what a running traced process has
//! live now, and where it was allocated, asked through its control socket
//! (control.rs).
//!
//! The process ends its current generation and answers, once its writer
//! thread has moved it, with a snapshot trace written from the writer
//! thread's live table (crates/writer/src/writer/snapshot.rs): one
//! generation holding an event per live object and the call stacks they
//! use. It is read as any trace, and what it holds live is written: a
//! pprof heap profile whose `inuse_*` samples are the live objects (and
//! so are its `alloc_*` ones: a snapshot knows nothing of what was freed),
//! or JSON. Its cost grows with what is live, not with the trace's length,
//! and the trace need not be a regular file.

use std::fmt::Write as _;
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
    let trace =
        crate::control::ask_pid_raw(args.pid, words::SNAPSHOT, words::MAX_SNAPSHOT_PAYLOAD)?;
    let bad = |e: &dyn std::fmt::Display| {
        Failure::Io(format!(
            "process {}: its snapshot does not read as a trace: {e}",
            args.pid
        ))
    };
    let generation = snapshot_generation(&trace).unwrap_or(0);
    let mut reader = TraceReader::new(&trace[..]).map_err(|e| bad(&e))?;
    // The sidecar of symbols next to the trace, if the process's trace
    // is a file that has one (written when recording ends).
    let sidecar_of: Vec<Input> = crate::control::ask_pid(args.pid, words::INFO)
        .ok()
        .and_then(|info| info.get(words::KEY_TRACE).cloned())
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .map(|p| Input::file(&p))
        .into_iter()
        .collect();
    let mut pass = Pass::new();
    let mut visitor = Both(Profile::new(Breakdowns::default()), Summary::new());
    pass.run(&mut reader, &mut visitor, |_| {})
        .map_err(Failure::from)?;
    let Both(profile, summary) = visitor;
    let mut resolver = args.symbols.resolver(&sidecar_of);
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

/// The generation a snapshot trace holds (the process's generation the
/// snapshot ended): its first batch's, after the file header.
fn snapshot_generation(trace: &[u8]) -> Option<u64> {
    let mut pos = alloctrace_format::FILE_HEADER_LEN + alloctrace_format::BATCH_PREFIX_LEN;
    alloctrace_format::get_uvarint(trace, &mut pos).ok()
}
