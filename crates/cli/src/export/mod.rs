//! `alloctrace export FILE... --format pprof|chrome|parquet|dhat -o OUT`: the
//! traces in other tools' formats (docs/EXPORT.md).
//!
//! Every format is a visitor of one pass over the traces given
//! ([`run_pass`]): several traces are one program's processes, their
//! stacks shared.

mod chrome;
mod dhat;
mod parquet;
pub(crate) mod pprof;

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use alloctrace_analysis::{Both, Breakdowns, Profile, Summary, Timeline};

use crate::analyze::{inputs, run_pass, SymbolArgs};
use crate::failure::Failure;
use crate::output::{files_in, refuse_inputs};
use crate::print::output_error;

/// What `export` writes.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// profile.proto, gzipped, as Go's heap profiles (go tool pprof, Pyroscope, Parca, Perfetto UI).
    Pprof,
    /// Trace Event Format JSON with the live heap as counters (ui.perfetto.dev, chrome://tracing).
    Chrome,
    /// A directory of Parquet tables: allocation lifetimes, stacks, frames, modules, types (DuckDB, Spark, Trino).
    Parquet,
    /// DHAT's JSON (dhatFileVersion 2), for DHAT's viewer (dh_view.html).
    Dhat,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Trace files, directories of traces (their *.trace files), or - for standard input.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// The output format.
    #[arg(long, value_enum)]
    pub format: Format,
    /// The output: a file for pprof and chrome (- for standard output), a directory (created) for parquet.
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub output: PathBuf,
    #[command(flatten)]
    pub symbols: SymbolArgs,
}

/// Refuses a one-file output (`snapshot -o`, `save -o`) that cannot be
/// written, before anything is asked: `-` passes.
pub(crate) fn check_one_file_output(out: &Path, command: &str) -> Result<(), Failure> {
    if out.as_os_str().is_empty() {
        return Err(Failure::Io("-o: an empty path".to_string()));
    }
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty());
    if out.as_os_str() != "-" && parent.is_some_and(|p| !p.is_dir()) {
        return Err(Failure::Io(format!(
            "-o {}: no such directory {}",
            out.display(),
            parent.map_or(String::new(), |p| p.display().to_string())
        )));
    }
    if out.is_dir() {
        return Err(Failure::Io(format!(
            "-o {}: is a directory ({command} writes one file)",
            out.display()
        )));
    }
    Ok(())
}

/// Refuses an output that cannot be written before any trace is read.
fn check_output(args: &Args) -> Result<(), Failure> {
    let out = &args.output;
    if out.as_os_str().is_empty() {
        return Err(Failure::Io("-o: an empty path".to_string()));
    }
    match args.format {
        Format::Parquet => {
            if out.as_os_str() == "-" {
                return Err(Failure::Io(
                    "-o -: parquet writes a directory of tables, not standard output".to_string(),
                ));
            }
            if out.exists() && !out.is_dir() {
                return Err(Failure::Io(format!(
                    "-o {}: exists and is not a directory (parquet writes a directory of tables)",
                    out.display()
                )));
            }
        }
        Format::Pprof => check_one_file_output(out, "pprof")?,
        Format::Chrome => check_one_file_output(out, "chrome")?,
        Format::Dhat => check_one_file_output(out, "dhat")?,
    }
    Ok(())
}

/// Writes a one-file output to `path`, or to standard output for `-`.
pub(crate) fn write_output(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<(), Failure> {
    if path.as_os_str() == "-" {
        let mut out = io::stdout().lock();
        return write(&mut out).map_err(output_error);
    }
    let file = File::create(path)
        .map_err(|e| Failure::Io(format!("cannot create {}: {e}", path.display())))?;
    write(&mut BufWriter::new(file))
        .map_err(|e| Failure::Io(format!("cannot write {}: {e}", path.display())))
}

pub fn run(args: &Args) -> Result<(), Failure> {
    check_output(args)?;
    let inputs = inputs(&args.files)?;
    let written = match args.format {
        Format::Parquet => files_in(&args.output, &parquet::TABLES),
        Format::Pprof | Format::Chrome | Format::Dhat => vec![args.output.clone()],
    };
    refuse_inputs(&written, &inputs, "choose another -o")?;
    match args.format {
        Format::Parquet => {
            let names = inputs.iter().map(|i| i.name()).collect();
            let mut export = parquet::ParquetExport::create(&args.output, names)?;
            let pass = run_pass(&inputs, &mut export)?;
            if export.sampling().estimated() {
                eprintln!(
                    "Estimates: the traces were sampled (--sample-bytes); each heap row of allocations.parquet stands for 1 / (1 - exp(-size / sample_bytes)) allocations, sample_bytes in traces.parquet (see docs/EXPORT.md)."
                );
            }
            let mut resolver = args.symbols.resolver(&inputs);
            export.finish(&pass.stacks, &mut resolver)
        }
        Format::Pprof => {
            let mut visitor = Both(Profile::new(Breakdowns::default()), Summary::new());
            let pass = run_pass(&inputs, &mut visitor)?;
            let Both(profile, summary) = visitor;
            let times = pprof::Times::of(&summary);
            let mut resolver = args.symbols.resolver(&inputs);
            if let Some(line) = crate::answers::sampled_line(profile.sampling()) {
                eprint!("{line}");
            }
            let proto = pprof::build(&profile, &pass.stacks, &mut resolver, &times);
            write_output(&args.output, |out| pprof::write(&proto, out))
        }
        Format::Dhat => {
            let mut visitor = Both(
                Both(Profile::new(Breakdowns::default()), Summary::new()),
                dhat::Lifetimes::default(),
            );
            let pass = run_pass(&inputs, &mut visitor)?;
            let Both(Both(profile, summary), lifetimes) = visitor;
            if let Some(line) = crate::answers::sampled_line(profile.sampling()) {
                eprint!("{line}");
            }
            let mut resolver = args.symbols.resolver(&inputs);
            let doc = dhat::build(&profile, &lifetimes, &summary, &pass.stacks, &mut resolver);
            write_output(&args.output, |out| dhat::write(&doc, out))
        }
        Format::Chrome => {
            let mut visitor = Both(
                Both(Timeline::new(chrome::BUCKETS), Summary::new()),
                chrome::TypeTimelines::default(),
            );
            run_pass(&inputs, &mut visitor)?;
            let Both(Both(timeline, summary), types) = visitor;
            let processes: Vec<chrome::ProcessName> = inputs
                .iter()
                .zip(&summary.runs)
                .map(|(input, run)| chrome::ProcessName {
                    pid: run.pid,
                    name: format!("{} (pid {})", input.name(), run.pid),
                })
                .collect();
            let events = chrome::events(&timeline, &types, &processes);
            let sampled = crate::answers::sampled_json(timeline.sampling());
            if let Some(line) = crate::answers::sampled_line(timeline.sampling()) {
                eprint!("{line}");
            }
            write_output(&args.output, |out| chrome::write(&events, sampled, out))
        }
    }
}
