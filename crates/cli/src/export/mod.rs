//! `alloctrace export FILE... --format pprof|chrome|parquet -o OUT`: the
//! traces in other tools' formats (docs/EXPORT.md).
//!
//! Every format is a visitor of one pass over the traces given
//! ([`run_pass`]): several traces are one program's processes, their
//! stacks shared.

mod parquet;

use std::path::PathBuf;

use crate::analyze::{inputs, run_pass, SymbolArgs};
use crate::Failure;

/// What `export` writes.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// profile.proto, gzipped, as Go's heap profiles (go tool pprof, Pyroscope, Parca, Perfetto UI).
    Pprof,
    /// Trace Event Format JSON with the live heap as counters (ui.perfetto.dev, chrome://tracing).
    Chrome,
    /// A directory of Parquet tables: allocation lifetimes, stacks, frames, modules, types (DuckDB, Spark, Trino).
    Parquet,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Trace files, directories of traces (their *.trace files), or - for standard input.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// The output format.
    #[arg(long, value_enum)]
    pub format: Format,
    /// The output: a file for pprof and chrome, a directory (created) for parquet.
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub output: PathBuf,
    #[command(flatten)]
    pub symbols: SymbolArgs,
}

/// Refuses an output that cannot be written before any trace is read.
fn check_output(args: &Args) -> Result<(), Failure> {
    let out = &args.output;
    if out.as_os_str().is_empty() {
        return Err(Failure::Io("-o: an empty path".to_string()));
    }
    match args.format {
        Format::Parquet => {
            if out.exists() && !out.is_dir() {
                return Err(Failure::Io(format!(
                    "-o {}: exists and is not a directory (parquet writes a directory of tables)",
                    out.display()
                )));
            }
        }
        Format::Pprof | Format::Chrome => {
            if out.is_dir() {
                return Err(Failure::Io(format!(
                    "-o {}: is a directory ({} writes one file)",
                    out.display(),
                    match args.format {
                        Format::Pprof => "pprof",
                        _ => "chrome",
                    }
                )));
            }
        }
    }
    Ok(())
}

pub fn run(args: &Args) -> Result<(), Failure> {
    check_output(args)?;
    let inputs = inputs(&args.files)?;
    match args.format {
        Format::Parquet => {
            let names = inputs.iter().map(|i| i.name()).collect();
            let mut export = parquet::ParquetExport::create(&args.output, names)?;
            let pass = run_pass(&inputs, &mut export)?;
            let mut resolver = args.symbols.resolver();
            export.finish(&pass.stacks, &mut resolver)
        }
        Format::Pprof | Format::Chrome => Err(Failure::Io(format!(
            "--format {:?}: not implemented yet",
            args.format
        ))),
    }
}
