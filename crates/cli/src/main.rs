//! `alloctrace`: reads alloctrace traces. See docs/CLI.md.
//!
//! Exit codes of the reading commands: 0 success, 1 usage or I/O error (the
//! file cannot be opened or read), 2 malformed trace. `check` adds 3
//! (truncated) and 4 (inconsistent). `record` has its own (record.rs,
//! docs/CLI.md): 2 is its usage error.

#![forbid(unsafe_code)]

mod check;
mod dump;
mod pages;
mod progress;
mod record;
mod stats;

use std::fs::File;
use std::io::{self, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use alloctrace_reader::{ReadError, TraceReader};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "alloctrace",
    version,
    about = "Reads alloctrace allocation traces."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Prints every event in time order, one per line, each generation's type table before its events.
    Dump {
        /// The trace file.
        file: PathBuf,
        /// One JSON object per event instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Counts events, threads, types, live and peak heap, lost events and anomalies.
    Stats {
        file: PathBuf,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Page-tracer events: pages allocated, freed, scavenged, in use, peak, anomalies.
    Pages {
        file: PathBuf,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Checks that the trace is well formed, complete and consistent (exit 0, 2, 3 or 4).
    Check {
        file: PathBuf,
        /// The verdict as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Runs a program under the LD_PRELOAD shim and traces it (exit status passed through).
    Record(record::Args),
}

/// Why a command failed, which decides the exit code.
pub enum Failure {
    /// Usage, open or I/O error: exit 1.
    Io(String),
    /// The trace breaks the format: exit 2.
    Malformed(ReadError),
    /// `check` found a problem and printed it: exit with this code.
    Verdict(u8),
}

impl From<ReadError> for Failure {
    fn from(err: ReadError) -> Failure {
        if err.is_malformed() {
            Failure::Malformed(err)
        } else {
            Failure::Io(err.to_string())
        }
    }
}

pub type Reader = TraceReader<BufReader<File>>;

/// Opens a trace and reads its header.
pub fn open(path: &Path) -> Result<Reader, Failure> {
    let file = File::open(path)
        .map_err(|e| Failure::Io(format!("cannot open {}: {e}", path.display())))?;
    let reader = TraceReader::new(BufReader::with_capacity(8 * 1024, file)).map_err(|e| {
        if e.is_malformed() {
            Failure::Malformed(e)
        } else {
            Failure::Io(format!("cannot read {}: {e}", path.display()))
        }
    })?;
    Ok(reader)
}

/// The warning every command prints for a cut-off trace.
pub fn truncation_warning(offset: u64) -> String {
    format!(
        "warning: trace truncated at byte offset {offset} (the process was probably killed); showing every complete batch before it"
    )
}

/// Maps a failed write to stdout: a closed pipe (`| head`) ends quietly.
pub fn output_error(err: io::Error) -> Failure {
    if err.kind() == io::ErrorKind::BrokenPipe {
        Failure::Verdict(0)
    } else {
        Failure::Io(format!("cannot write the output: {err}"))
    }
}

/// Writes to stdout without panicking on a closed pipe (print! would).
pub fn print_stdout(text: &str) -> Result<(), Failure> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(output_error)
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // --help and --version are not errors. A reading command's
            // usage error exits 1 (2 means "malformed trace"); `record`'s
            // exits 2, as usage errors do elsewhere, and never runs the
            // program.
            let record = std::env::args_os().nth(1).is_some_and(|a| a == "record");
            let code = match (err.use_stderr(), record) {
                (false, _) => 0,
                (true, false) => 1,
                (true, true) => 2,
            };
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    let result = match &cli.command {
        Command::Dump { file, json } => dump::run(file, *json),
        Command::Stats { file, json } => stats::run(file, *json),
        Command::Pages { file, json } => pages::run(file, *json),
        Command::Check { file, json } => check::run(file, *json),
        Command::Record(args) => record::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Io(msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(1)
        }
        Err(Failure::Malformed(err)) => {
            eprintln!("error: {err}");
            eprintln!(
                "The file is damaged or is not an alloctrace trace; everything before that offset was read (`alloctrace dump` shows it)."
            );
            ExitCode::from(2)
        }
        Err(Failure::Verdict(code)) => ExitCode::from(code),
    }
}
