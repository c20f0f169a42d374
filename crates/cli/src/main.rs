//! `alloctrace`: reads alloctrace traces. See docs/CLI.md.
//!
//! Exit codes of the reading commands: 0 success, 1 usage or I/O error (the
//! file cannot be opened or read), 2 malformed trace. `check` adds 3
//! (truncated) and 4 (inconsistent). `record` has its own (record.rs,
//! docs/CLI.md): 2 is its usage error.

// Unsafe code only in os.rs, which says why.
#![deny(unsafe_code)]

mod analyze;
mod check;
mod dump;
mod export;
mod generate;
mod os;
mod output;
mod pages;
mod progress;
mod record;
mod report;
mod reports;
mod stacks;
mod stats;
mod symbolize;
mod units;

use std::borrow::Cow;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, BufReader, Read, Write};
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
    Report(report::Args),
    /// The allocation sites (by stack, function, type, size or thread), largest first.
    Top(reports::top::Args),
    /// Memory still live at the end, grouped by stack, largest first.
    Leaks(reports::leaks::Args),
    /// The allocation sites as an interactive flame graph SVG, or folded stacks.
    Flamegraph(reports::flamegraph::Args),
    /// The sites whose allocations, peak or leaks changed between two traces.
    Diff(reports::diff::Args),
    /// Resolves the native frames of each trace's call stacks into FILE.symbols beside it (functions, files, lines), for reports on another machine.
    Symbolize(symbolize::Args),
    /// Writes the traces in another tool's format: pprof, Chrome trace JSON or Parquet tables.
    Export(export::Args),
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

/// One trace to read: a file, or standard input (`-`).
pub struct Input {
    /// `None`: standard input.
    path: Option<PathBuf>,
}

impl Input {
    pub fn file(path: &Path) -> Input {
        Input {
            path: Some(path.to_path_buf()),
        }
    }

    /// As the user gave it: the path, or `-`.
    pub fn name(&self) -> String {
        match &self.path {
            Some(path) => path.display().to_string(),
            None => "-".to_string(),
        }
    }

    /// The file's size (0 for standard input or when unknown).
    pub fn size(&self) -> u64 {
        self.path
            .as_ref()
            .and_then(|p| std::fs::metadata(p).ok())
            .map_or(0, |m| m.len())
    }
}

pub type Reader = TraceReader<BufReader<Box<dyn Read + Send>>>;

/// Opens a trace and reads its header.
pub fn open(input: &Input) -> Result<Reader, Failure> {
    let (source, name): (Box<dyn Read + Send>, String) = match &input.path {
        Some(path) => (
            Box::new(
                File::open(path)
                    .map_err(|e| Failure::Io(format!("cannot open {}: {e}", path.display())))?,
            ),
            path.display().to_string(),
        ),
        None => (Box::new(io::stdin()), "standard input".to_string()),
    };
    let reader = TraceReader::new(BufReader::with_capacity(8 * 1024, source)).map_err(|e| {
        if e.is_malformed() {
            Failure::Malformed(e)
        } else {
            Failure::Io(format!("cannot read {name}: {e}"))
        }
    })?;
    Ok(reader)
}

/// `a` before `b` in name order, digit runs compared as numbers (`9.trace`
/// before `10.trace`).
fn natural_order(a: &str, b: &str) -> std::cmp::Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    for (x, y) in chunks(a).iter().zip(chunks(b).iter()) {
        let order = match (x, y) {
            ((true, x), (true, y)) => {
                let (x, y) = (x.trim_start_matches('0'), y.trim_start_matches('0'));
                x.len().cmp(&y.len()).then_with(|| x.cmp(y))
            }
            ((_, x), (_, y)) => x.cmp(y),
        };
        if order.is_ne() {
            return order;
        }
    }
    chunks(a).len().cmp(&chunks(b).len()).then_with(|| a.cmp(b))
}

/// The traces named on the command line: files as given, `-` for
/// standard input (once), a directory for its `*.trace` files in name
/// order. The flag says whether outputs are labelled with the file's name
/// (several traces, or any directory).
fn expand_inputs(args: &[PathBuf]) -> Result<(Vec<Input>, bool), Failure> {
    let mut inputs = Vec::new();
    let mut labelled = args.len() > 1;
    let mut stdin = false;
    for arg in args {
        if arg.as_os_str() == "-" {
            if stdin {
                return Err(Failure::Io("- (standard input) given twice".to_string()));
            }
            stdin = true;
            inputs.push(Input { path: None });
        } else if arg.is_dir() {
            labelled = true;
            let entries = std::fs::read_dir(arg)
                .map_err(|e| Failure::Io(format!("cannot read {}: {e}", arg.display())))?;
            let mut names: Vec<String> = entries
                .filter_map(|e| e.ok())
                .filter(|e| e.path().is_file())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.ends_with(".trace"))
                .collect();
            if names.is_empty() {
                return Err(Failure::Io(format!(
                    "{}: a directory without .trace files",
                    arg.display()
                )));
            }
            names.sort_by(|a, b| natural_order(a, b));
            inputs.extend(names.iter().map(|n| Input::file(&arg.join(n))));
        } else {
            inputs.push(Input::file(arg));
        }
    }
    Ok((inputs, labelled))
}

/// Runs a reading command on every input. One unlabelled input: as before,
/// its failure is the command's. Several (or a directory): each trace in
/// turn, labelled with its name (`label`); a trace that cannot be read
/// says so and the others are still read; the exit code is the lowest
/// non-zero code of any trace (1 unreadable, 2 malformed, 3 truncated, 4
/// inconsistent), 0 if all succeeded.
fn run_each(
    args: &[PathBuf],
    mut f: impl FnMut(&Input, Option<&str>) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let (inputs, labelled) = expand_inputs(args)?;
    if !labelled {
        return f(&inputs[0], None);
    }
    let mut worst: Option<u8> = None;
    for input in &inputs {
        let name = input.name();
        let code = match f(input, Some(&name)) {
            Ok(()) => 0,
            // stdout was closed (`| head`): stop quietly.
            Err(Failure::Verdict(0)) => return Err(Failure::Verdict(0)),
            Err(Failure::Verdict(code)) => code,
            Err(Failure::Io(msg)) => {
                eprintln!("error: {}", printable(&msg));
                1
            }
            Err(Failure::Malformed(err)) => {
                eprintln!("error: {}: {err}", printable(&name));
                2
            }
        };
        if code != 0 {
            worst = Some(worst.map_or(code, |w| w.min(code)));
        }
    }
    match worst {
        None => Ok(()),
        Some(code) => Err(Failure::Verdict(code)),
    }
}

/// `label: ` before a message about a labelled trace.
pub fn prefix(label: Option<&str>) -> String {
    label
        .map(|l| format!("{}: ", printable(l)))
        .unwrap_or_default()
}

/// `text` with its control characters escaped (`\n`, `\t`, `\u{1b}`,
/// `\u{7f}`, `\u{9b}`: C0, DEL and C1), for every text output that shows
/// a string from a trace (a name, a path, the command line) or a file
/// name: it cannot then break a line of the output, forge one, or drive
/// the terminal (set its title, write its clipboard). Invalid UTF-8 never
/// reaches it: the reader decodes names lossily (U+FFFD). JSON outputs do
/// not use it: serde_json escapes, and the value stays the trace's own.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `value` as one line of JSON (no newline), for the `--json` outputs.
/// serde_json escapes C0 (`\u001b`, `\n`) but leaves DEL and C1 raw,
/// which JSON allows; they are escaped too (`\u007f`, `\u009b`), so the
/// line is as safe on a terminal as the text output, and decodes to the
/// same value. They can only occur inside strings: JSON's own syntax is
/// ASCII.
pub fn json_text(value: &serde_json::Value) -> String {
    let text = value.to_string();
    if !text.chars().any(char::is_control) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
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

/// Writes to stderr without panicking (eprint! panics when stderr is a
/// closed pipe or a full disk): a message that cannot be written is lost,
/// and the exit status stays the command's.
pub fn print_stderr(text: &str) {
    let mut err = io::stderr().lock();
    let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
}

fn main() -> ExitCode {
    // `alloctrace __generate DIR`, for `make install` only: outside the
    // clap definition, so that the man pages and completions it writes do
    // not list it.
    let args: Vec<_> = std::env::args_os().collect();
    if args.len() == 3 && args[1] == "__generate" {
        return match generate::run(Path::new(&args[2])) {
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
        Command::Report(args) => report::run(args),
        Command::Top(args) => reports::top::run(args),
        Command::Leaks(args) => reports::leaks::run(args),
        Command::Flamegraph(args) => reports::flamegraph::run(args),
        Command::Diff(args) => reports::diff::run(args),
        Command::Symbolize(args) => symbolize::run(args),
        Command::Export(args) => export::run(args),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_escapes_c0_del_and_c1_only() {
        let hostile = "a\u{1b}]0;t\u{7}\r\n\tb\u{7f}\u{9b}\u{a0}é\\";
        assert_eq!(
            printable(hostile),
            r"a\u{1b}]0;t\u{7}\r\n\tb\u{7f}\u{9b}".to_string() + "\u{a0}é\\"
        );
        assert!(matches!(printable("plain é"), Cow::Borrowed(_)));
    }

    #[test]
    fn json_text_escapes_every_control_and_keeps_the_value() {
        let value = serde_json::Value::from("a\u{1b}\n\u{7f}\u{9b}\u{a0}\"\\");
        let text = json_text(&value);
        assert_eq!(
            text,
            r#""a\u001b\n\u007f\u009b"#.to_string() + "\u{a0}\\\"\\\\\""
        );
        assert!(!text.chars().any(char::is_control), "{text}");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&text).unwrap(),
            value
        );
    }
}
