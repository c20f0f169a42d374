//! `alloctrace record [-o FILE] [options] -- CMD [ARGS...]`: runs CMD under
//! the LD_PRELOAD shim (liballoctrace_preload.so), passes its exit status
//! through, and then says on stderr where each trace went, with a
//! one-paragraph summary per trace. See docs/CLI.md.
//!
//! The shim is configured through environment variables (README.md,
//! "Tracing any program: LD_PRELOAD"); this command sets them. Every
//! traced process (the command, its forked children, the programs they
//! exec) appends a line `pid<TAB>program<TAB>trace path` to an index file
//! that this command creates (ALLOCTRACE_INDEX) and reads at the end, so
//! it reports exactly the traces of this run.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Failure;

/// The shim's file name.
pub const SHIM: &str = "liballoctrace_preload.so";

#[derive(clap::Args)]
pub struct Args {
    /// Trace file; %p stands for the process ID (each traced process writes
    /// its own file), %% for a %. Default: alloctrace.%p.trace
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// Bytes per thread buffer, 4096 to 16M (k and m suffixes allowed).
    #[arg(long, value_name = "N")]
    buffer_size: Option<String>,
    /// What to record: a comma-separated list of heap, mmap, stacks, all.
    #[arg(long, value_name = "LIST")]
    record: Option<String>,
    /// Event clock: precise (a clock read per event) or coarse (cheaper).
    #[arg(long, value_name = "KIND")]
    clock: Option<String>,
    /// Batch compression: none or zstd.
    #[arg(long, value_name = "KIND")]
    compression: Option<String>,
    /// Replace FILE if it exists (only the first process's trace; others
    /// never overwrite).
    #[arg(long)]
    overwrite: bool,
    /// The command to run and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// Where the shim is: $ALLOCTRACE_PRELOAD, else next to this executable,
/// else in ../lib (where `make install` puts it).
fn find_shim() -> Result<PathBuf, Failure> {
    if let Some(path) = std::env::var_os("ALLOCTRACE_PRELOAD").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return match path.canonicalize() {
            Ok(abs) => Ok(abs),
            Err(e) => Err(Failure::Io(format!("ALLOCTRACE_PRELOAD={}: {e}", path.display()))),
        };
    }
    let exe = std::env::current_exe().map_err(|e| Failure::Io(format!("cannot find this executable: {e}")))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [dir.join(SHIM), dir.join("../lib").join(SHIM)];
    for candidate in &candidates {
        if candidate.is_file() {
            return candidate.canonicalize().map_err(|e| Failure::Io(format!("{}: {e}", candidate.display())));
        }
    }
    Err(Failure::Io(format!(
        "cannot find {SHIM} in {} or {}: build it with `make` (or `make install`), or set ALLOCTRACE_PRELOAD to its path",
        dir.display(),
        dir.join("../lib").display()
    )))
}

/// A fresh index file in the temporary directory, created 0600.
fn create_index() -> Result<(PathBuf, File), Failure> {
    let dir = std::env::temp_dir();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    for attempt in 0..100u32 {
        let path = dir.join(format!("alloctrace-record-{}-{nanos}-{attempt}.index", std::process::id()));
        match OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(&path) {
            Ok(file) => return Ok((path, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Failure::Io(format!("cannot create an index file in {}: {e}", dir.display()))),
        }
    }
    Err(Failure::Io(format!("cannot create an index file in {}", dir.display())))
}

/// One traced process, as the shim listed it.
struct Trace {
    pid: String,
    program: String,
    path: PathBuf,
}

fn read_index(file: &mut File) -> Vec<Trace> {
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, '\t');
            let (pid, program, path) = (fields.next()?, fields.next()?, fields.next()?);
            Some(Trace { pid: pid.to_string(), program: program.to_string(), path: PathBuf::from(path) })
        })
        .collect()
}

/// 1234567 -> "1,234,567".
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes for people: "512 bytes", "1.5 KiB", "12.0 MiB".
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", thousands(n), if n == 1 { one } else { many })
}

/// The paragraph about one trace.
fn summary(trace: &Trace) -> String {
    let head = format!("  {} (pid {}, {})", trace.path.display(), trace.pid, trace.program);
    let stats = match crate::stats::collect(&trace.path) {
        Ok(stats) => stats,
        Err(Failure::Malformed(err)) => return format!("{head}\n    malformed: {err}"),
        Err(Failure::Io(msg)) => return format!("{head}\n    cannot read it: {msg}"),
        Err(Failure::Verdict(_)) => return head,
    };
    let mut text = format!(
        "{head}\n    {} in {} from {}; peak live heap {}; at exit {} ({}) still live",
        plural(stats.total_events, "event", "events"),
        plural(stats.generations, "generation", "generations"),
        plural(stats.threads(), "thread", "threads"),
        human_bytes(stats.peak_live_bytes()),
        plural(stats.live_objects(), "heap object", "heap objects"),
        human_bytes(stats.live_bytes()),
    );
    if stats.lost_events > 0 {
        text.push_str(&format!("; {} lost", plural(stats.lost_events, "event", "events")));
    }
    if stats.anomalies() > 0 {
        text.push_str(&format!("; {} (see `alloctrace check`)", plural(stats.anomalies(), "anomaly", "anomalies")));
    }
    match stats.truncated_at {
        Some(offset) => text.push_str(&format!(
            "; cut short at byte {offset} (the process was killed, or ended without running exit handlers): every complete batch before it was read"
        )),
        None => text.push_str("; complete"),
    }
    text.push('.');
    text
}

pub fn run(args: &Args) -> Result<(), Failure> {
    let shim = find_shim()?;
    let cwd = std::env::current_dir().map_err(|e| Failure::Io(format!("cannot read the current directory: {e}")))?;
    let output = args.output.clone().unwrap_or_else(|| PathBuf::from("alloctrace.%p.trace"));
    // Absolute, so a process that changes directory still writes here.
    let output = if output.is_absolute() { output } else { cwd.join(output) };
    let pattern = output.as_os_str().to_string_lossy().into_owned();
    if !pattern.contains("%p") && output.exists() && !args.overwrite {
        return Err(Failure::Io(format!(
            "{} exists: choose another -o, or add --overwrite to replace it",
            output.display()
        )));
    }
    if let Some(parent) = output.parent() {
        if !parent.is_dir() {
            return Err(Failure::Io(format!("{}: no such directory", parent.display())));
        }
    }

    let (index_path, mut index) = create_index()?;
    let mut preload = shim.as_os_str().to_owned();
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|p| !p.is_empty()) {
        preload.push(":");
        preload.push(existing);
    }
    let mut command = Command::new(&args.command[0]);
    command
        .args(&args.command[1..])
        .env("LD_PRELOAD", preload)
        .env("ALLOCTRACE_OUTPUT", &output)
        .env("ALLOCTRACE_INDEX", &index_path)
        .env_remove("ALLOCTRACE_DISABLE");
    match &args.buffer_size {
        Some(size) => command.env("ALLOCTRACE_BUFFER_SIZE", size),
        None => command.env_remove("ALLOCTRACE_BUFFER_SIZE"),
    };
    match &args.record {
        Some(list) => command.env("ALLOCTRACE_RECORD", list),
        None => command.env_remove("ALLOCTRACE_RECORD"),
    };
    for (name, value) in [("ALLOCTRACE_CLOCK", &args.clock), ("ALLOCTRACE_COMPRESSION", &args.compression)] {
        match value {
            Some(v) => command.env(name, v),
            None => command.env_remove(name),
        };
    }
    if args.overwrite {
        command.env("ALLOCTRACE_OVERWRITE", "1");
    } else {
        command.env_remove("ALLOCTRACE_OVERWRITE");
    }

    let name = args.command[0].to_string_lossy().into_owned();
    let status = match command.status() {
        Ok(status) => status,
        Err(e) => {
            let _ = std::fs::remove_file(&index_path);
            eprintln!("error: cannot run {name}: {e}");
            // As env(1) and the shells: 127 not found, 126 not runnable.
            let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            return Err(Failure::Verdict(code));
        }
    };
    let traces = read_index(&mut index);
    let _ = std::fs::remove_file(&index_path);

    let mut report = String::new();
    if traces.is_empty() {
        report.push_str(&format!(
            "alloctrace: no trace was written: {name} did not load {SHIM} (a statically linked or setuid program ignores LD_PRELOAD), or the shim said why on stderr\n"
        ));
    } else {
        report.push_str(&format!("alloctrace: {} written\n", plural(traces.len() as u64, "trace", "traces")));
        for trace in &traces {
            report.push_str(&summary(trace));
            report.push('\n');
        }
    }
    eprint!("{report}");

    let code = match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 1,
    };
    match code {
        0 => Ok(()),
        code => Err(Failure::Verdict(u8::try_from(code).unwrap_or(255))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(human_bytes(512), "512 bytes");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(12 << 20), "12.0 MiB");
        assert_eq!(plural(1, "trace", "traces"), "1 trace");
        assert_eq!(plural(2000, "trace", "traces"), "2,000 traces");
    }

    #[test]
    fn index_lines() {
        let (path, mut file) = create_index().map_err(|_| "index").unwrap();
        std::fs::write(&path, "12\tsh\t/tmp/a.12.trace\n13\tmy prog\t/tmp/dir with\ttab/b.trace\nbad line\n").unwrap();
        let traces = read_index(&mut file);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(traces.len(), 2);
        assert_eq!(traces[0].pid, "12");
        assert_eq!(traces[1].program, "my prog");
        assert_eq!(traces[1].path, PathBuf::from("/tmp/dir with\ttab/b.trace"));
    }
}
