//! `alloctrace report FILE... -o OUT.html`: one self-contained HTML page
//! (no network access needed to view it) with the live memory over time,
//! the peak and what was live at it (flamegraph and table), leaks,
//! temporary allocations, the size and lifetime histograms, the per-thread
//! and per-type breakdowns and the run's facts.
//!
//! One pass feeds three visitors: [`Profile`] (per stack, thread and type),
//! [`Timeline`] (downsampled to at most 2,000 buckets) and [`Summary`]
//! (histograms, run facts). The page's size is bounded whatever the
//! trace's length: the timeline has a bounded number of points, every
//! table at most `-n` rows, every stack in a table at most
//! [`MAX_FRAMES`] frames, every name at most [`MAX_NAME`] characters, and
//! the flamegraph at most [`FLAME_STACKS`] stacks of [`FLAME_DEPTH`]
//! frames.
//!
//! Every string that comes from the trace (function, file, module and
//! type names) is escaped for HTML; the charts (plotters, SVG) hold only
//! numbers, and the flamegraph (inferno) escapes its own text.

mod charts;
mod document;

use std::io::Write;
use std::path::PathBuf;

use alloctrace_analysis::{Both, Breakdowns, Profile, Summary, Timeline};

use crate::analyze::{inputs, run_pass, SymbolArgs};
use crate::failure::Failure;
use crate::output::refuse_inputs;

/// Frames shown per stack in a table.
pub const MAX_FRAMES: usize = 48;
/// Characters shown of a name (function, file, module, type).
pub const MAX_NAME: usize = 400;
/// Stacks in the flamegraph (the largest at the peak), and frames of each.
pub const FLAME_STACKS: usize = 400;
pub const FLAME_DEPTH: usize = 64;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Trace files, directories of traces (their *.trace files), or - for standard input (several: one program's processes).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// The HTML file to write.
    #[arg(short = 'o', long = "output", value_name = "OUT.html")]
    output: PathBuf,
    /// Rows per table (stacks at the peak, leaks, temporaries, threads, types).
    #[arg(short = 'n', long = "rows", value_name = "N", default_value_t = 50,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    rows: u32,
    #[command(flatten)]
    symbols: SymbolArgs,
}

pub fn run(args: &Args) -> Result<(), Failure> {
    let inputs = inputs(&args.files)?;
    refuse_inputs(
        std::slice::from_ref(&args.output),
        &inputs,
        "choose another -o",
    )?;
    // An output that cannot be written is refused before the pass.
    let cannot =
        |e: std::io::Error| Failure::Io(format!("cannot write {}: {e}", args.output.display()));
    let mut out = std::fs::File::create(&args.output).map_err(cannot)?;
    let result = write_report(args, &inputs, &mut out);
    if result.is_err() {
        let _ = std::fs::remove_file(&args.output);
    }
    result
}

fn write_report(
    args: &Args,
    inputs: &[crate::input::Input],
    out: &mut std::fs::File,
) -> Result<(), Failure> {
    let cannot =
        |e: std::io::Error| Failure::Io(format!("cannot write {}: {e}", args.output.display()));
    let profile = Profile::new(Breakdowns {
        threads: true,
        types: true,
        sizes: false,
    });
    let mut visitor = Both(profile, Both(Timeline::default(), Summary::new()));
    let pass = run_pass(inputs, &mut visitor)?;
    let Both(profile, Both(timeline, summary)) = visitor;
    let mut resolver = args.symbols.resolver(inputs);
    let names: Vec<String> = inputs.iter().map(|i| i.name()).collect();
    let html = document::render(&mut document::Model {
        files: &names,
        pass: &pass,
        profile: &profile,
        timeline: &timeline,
        summary: &summary,
        rows: args.rows as usize,
        resolver: &mut resolver,
    });
    for warning in resolver.symbolizer.warnings() {
        eprintln!("warning: {}", crate::print::printable(&warning));
    }
    out.write_all(html.as_bytes()).map_err(cannot)?;
    out.flush().map_err(cannot)
}
