//! `alloctrace`: reads alloctrace traces. See docs/CLI.md.
//!
//! Exit codes of the reading commands: 0 success, 1 usage or I/O error (the
//! file cannot be opened or read), 2 malformed trace. `check` adds 3
//! (truncated) and 4 (inconsistent). `record` has its own (record.rs,
//! docs/CLI.md): 2 is its usage error.

// Unsafe code only in os.rs, which says why.
#![deny(unsafe_code)]

mod analyze;
mod answers;
mod check;
mod control;
mod dump;
mod export;
mod failure;
mod generate;
mod html;
mod input;
mod os;
mod output;
mod pages;
mod print;
mod progress;
mod ps;
mod record;
mod save;
mod snapshot;
mod stacks;
mod stats;
mod symbolize;
mod units;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use failure::Failure;
use input::run_each;
use print::{print_stderr, printable};

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
        /// Trace files, directories of traces (their *.trace files), or - for standard input.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// One JSON object per event instead of text.
        #[arg(long)]
        json: bool,
        /// Instead of the events: each generation's modules and call stacks, one frame per line (module+offset, or a registered frame's function file:line).
        #[arg(long)]
        stacks: bool,
    },
    /// Counts events, threads, types, live and peak heap and spans, lost events and anomalies; names the process.
    Stats {
        /// Trace files, directories of traces (their *.trace files), or - for standard input.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// One JSON object (per trace) instead of a table.
        #[arg(long)]
        json: bool,
        /// In the table, every row: event kinds and entry points with no events, every thread and type.
        #[arg(long)]
        all: bool,
    },
    /// Page-tracer events: pages allocated, freed, scavenged, in use, peak, anomalies.
    Pages {
        /// Trace files, directories of traces (their *.trace files), or - for standard input.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// One JSON object (per trace) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Checks that the trace is well formed, complete and consistent (exit 0, 2, 3 or 4).
    Check {
        /// Trace files, directories of traces (their *.trace files), or - for standard input.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
        /// The verdict as one JSON object (per trace).
        #[arg(long)]
        json: bool,
    },
    /// Runs a program under the LD_PRELOAD shim and traces it (exit status passed through).
    Record(record::Args),
    /// Writes one self-contained HTML page: live memory over time, the peak and what was live at it, leaks, temporaries, sizes, lifetimes, threads, types.
    Report(html::Args),
    /// The allocation sites (by stack, function, type, size or thread), largest first.
    Top(answers::top::Args),
    /// Memory still live at the end, grouped by stack, largest first.
    Leaks(answers::leaks::Args),
    /// The allocation sites as an interactive flame graph SVG, or folded stacks.
    Flamegraph(answers::flamegraph::Args),
    /// The sites whose allocations, peak or leaks changed between two traces.
    Diff(answers::diff::Args),
    /// Resolves the native frames of each trace's call stacks into FILE.symbols beside it (functions, files, lines), for reports on another machine.
    Symbolize(symbolize::Args),
    /// Writes the traces in another tool's format: pprof, Chrome trace JSON or Parquet tables.
    Export(export::Args),
    /// Lists your running traced processes: pid, mode, trace, command.
    Ps(ps::Args),
    /// Writes what a running traced process has live now, and where it was allocated (pprof or JSON).
    Snapshot(snapshot::Args),
    /// Writes a running flight recorder's generations (the last ones, up to now) as a trace.
    Save(save::Args),
}

fn main() -> ExitCode {
    // `alloctrace __generate DIR`, for `make install` only: outside the
    // clap definition, so that the man pages and completions it writes do
    // not list it.
    let args: Vec<_> = std::env::args_os().collect();
    if args.len() == 3 && args[1] == "__generate" {
        return match generate::run(Path::new(&args[2]), Cli::command()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(Failure::Io(msg)) => {
                eprintln!("error: {msg}");
                ExitCode::from(1)
            }
            Err(_) => ExitCode::from(1),
        };
    }
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
        Command::Dump {
            files,
            json,
            stacks: false,
        } => run_each(files, |input, label| dump::run(input, *json, label)),
        Command::Dump {
            files,
            json,
            stacks: true,
        } => run_each(files, |input, label| stacks::run(input, *json, label)),
        Command::Stats { files, json, all } => {
            run_each(files, |input, label| stats::run(input, *json, *all, label))
        }
        Command::Pages { files, json } => {
            run_each(files, |input, label| pages::run(input, *json, label))
        }
        Command::Check { files, json } => {
            run_each(files, |input, label| check::run(input, *json, label))
        }
        Command::Record(args) => record::run(args),
        Command::Report(args) => html::run(args),
        Command::Top(args) => answers::top::run(args),
        Command::Leaks(args) => answers::leaks::run(args),
        Command::Flamegraph(args) => answers::flamegraph::run(args),
        Command::Diff(args) => answers::diff::run(args),
        Command::Symbolize(args) => symbolize::run(args),
        Command::Export(args) => export::run(args),
        Command::Ps(args) => ps::run(args),
        Command::Snapshot(args) => snapshot::run(args),
        Command::Save(args) => save::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Io(msg)) => {
            print_stderr(&format!("error: {}\n", printable(&msg)));
            ExitCode::from(1)
        }
        Err(Failure::Malformed(err)) => {
            print_stderr(&format!(
                "error: {err}\nThe file is damaged or is not an alloctrace trace; everything before that offset was read (`alloctrace dump` shows it).\n"
            ));
            ExitCode::from(2)
        }
        Err(Failure::Verdict(code)) => ExitCode::from(code),
    }
}
