//! `alloctrace record [OPTIONS] -- CMD [ARGS...]`: runs CMD under the
//! LD_PRELOAD shim (liballoctrace_preload.so), passes its exit status
//! through, and then says on stderr where each trace went, with a short
//! summary per trace. See docs/CLI.md.
//!
//! The shim is configured through environment variables
//! (docs/PRELOAD.md, "Configuration"); this command checks every option
//! with the grammar the shim uses (the alloctrace-options crate) before
//! anything runs, and sets the variables. Every process of the run appends
//! lines to an index file that this command creates (ALLOCTRACE_INDEX; the
//! line formats are documented at the shim's `append_index`): a line when
//! a session starts, one when it ends (with the totals the report shows
//! for traces too large to read), one for a process that could not be
//! traced (with the reason) or that `--only` leaves untraced.
//!
//! Signals: every signal that would end this command is caught while
//! CMD runs (`forwarded` lists them and says which are left alone: those
//! that cannot be caught, the job-control ones, those that report a fault
//! of this command, those ignored when it started). Sent by a process
//! (`kill`), it is forwarded to CMD;
//! sent by the kernel (a terminal's Ctrl-C or Ctrl-\, a hangup), it
//! reaches CMD directly, as it reaches every process of the terminal's
//! foreground group, and is not sent twice. Either way this command
//! waits for CMD, reports and cleans up, and exits with CMD's status.
//!
//! Descriptors: 0, 1 and 2 that were closed when this command started
//! are closed in CMD too (crate::os says how); the report never fails
//! this command (a closed or full stderr loses the report, not CMD's
//! status).

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions, Permissions};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use alloctrace_options::{env, Clock, Compression, Families, Stacks};

use crate::failure::Failure;
use crate::units::{self, Decimals};

/// The shim's file name.
pub const SHIM: &str = "liballoctrace_preload.so";

/// Exit status when no process of the run was traced (as `timeout` and
/// `env`, a code of the tool itself; the report says why and gives CMD's
/// own status).
pub const NOTHING_TRACED: u8 = 125;

/// How much trace the report reads to count events and heap bytes: traces
/// are read in the order they started while their sizes add up to at most
/// this (1 MiB for compressed traces, which hold many more events per
/// byte); the others are summed up from the totals their shim wrote into
/// the index. About a tenth of a second of reading at most.
pub const REPORT_READ_BYTES: u64 = 16 << 20;
pub const REPORT_READ_BYTES_COMPRESSED: u64 = 1 << 20;

/// A run of up to this many traces gets a paragraph per trace. A larger
/// one (a wrapper script's, a version manager's shim, a build) is summed
/// up by program (the first `REPORT_PROGRAMS`, most bytes first), with a
/// paragraph for each of its `REPORT_LARGEST` largest traces and for each
/// of the first `REPORT_UNCLEAN` that did not end cleanly, and the others
/// counted with the command that lists them all.
pub const REPORT_EVERY_TRACE_UP_TO: usize = 8;
pub const REPORT_LARGEST: usize = 5;
pub const REPORT_UNCLEAN: usize = 5;
pub const REPORT_PROGRAMS: usize = 10;

#[derive(clap::Args)]
#[command(after_help = "\
Where traces go: without -o, into a new directory alloctrace-CMD-N/ in the current \
directory (CMD the command's file name, N this command's process ID), one file PID.trace per \
traced process (PID.1.trace, ... for the programs a process execs). The directory is removed \
again when no trace was written.

Signals that would end this command are passed on to CMD (see docs/CLI.md); closed \
descriptors 0, 1, 2 stay closed in CMD.

Exit status: CMD's (128 + N when signal N ended it), even when the report cannot be written; 2 for a bad option (nothing runs); 1 when \
the shim cannot be found or -o exists; 125 when no process of the run could be traced; 126/127 \
when CMD cannot be run or found.")]
pub struct Args {
    /// Trace file; %p stands for the process ID (each traced process writes
    /// its own file), %% for a %. Default: alloctrace-CMD-N/%p.trace (see below)
    #[arg(short = 'o', long = "output", value_name = "FILE", value_parser = clap::builder::TypedValueParser::try_map(clap::builder::OsStringValueParser::new(), parse_output))]
    output: Option<PathBuf>,
    /// Bytes per thread buffer, 4096 to 16M (k and m suffixes allowed).
    #[arg(long, value_name = "N", value_parser = |v: &str| alloctrace_options::parse_buffer_size(v.as_bytes()))]
    buffer_size: Option<usize>,
    /// What to record: a comma-separated list of heap, mmap, stacks, all.
    #[arg(long, value_name = "LIST", value_parser = |v: &str| Families::parse(v.as_bytes()))]
    record: Option<Families>,
    /// Event clock.
    #[arg(long, value_name = "KIND", value_enum, default_value_t = Clock::Precise)]
    clock: Clock,
    /// Batch compression (zstd: traces several times smaller; see docs/PRELOAD.md, "Compression").
    #[arg(long, value_name = "KIND", value_enum, default_value_t = Compression::Zstd)]
    compression: Compression,
    /// Call stacks of allocations: full (default) unwinds every frame by
    /// the DWARF unwind tables (.eh_frame), right on code built without
    /// frame pointers; none records no stacks. (fast was removed.) See
    /// docs/PRELOAD.md, "Call stacks", for what each costs.
    #[arg(long, value_name = "MODE", default_value = Stacks::DEFAULT.name(), value_parser = parse_stacks)]
    stacks: Stacks,
    /// Most frames kept per call stack, 1 to 256; deeper stacks keep their
    /// innermost frames and are marked truncated.
    #[arg(long, value_name = "N", default_value_t = alloctrace_options::DEFAULT_STACK_DEPTH, value_parser = |v: &str| alloctrace_options::parse_stack_depth(v.as_bytes()))]
    stack_depth: usize,
    /// Sampling mode, for leaving it on in production: record only the
    /// allocations a per-thread countdown of about N bytes samples (with
    /// their full call stacks) and the frees of those; exact totals are
    /// still counted. N is bytes with an optional KiB or MiB suffix
    /// (512KiB is the production setting); default off (every allocation).
    /// The reading commands then show estimates. See docs/CLI.md.
    #[arg(long, value_name = "N", value_parser = |v: &str| alloctrace_options::parse_sample_bytes(v.as_bytes()))]
    sample_bytes: Option<u64>,
    /// Flight-recorder mode: keep only the last generations in a ring of
    /// SIZE bytes in memory (1MiB to 1TiB; KiB, MiB, GiB suffixes), or
    /// those of the last DURATION (1s to 7 days: 30s, 5min, 2h; in a 256
    /// MiB ring, or give both: 30s,1GiB), and write the trace only on a
    /// trigger: a fatal signal, --dump-on-rss, `alloctrace save PID -o
    /// FILE`, SIGUSR2.
    /// Nothing is written at a normal exit. See docs/PRELOAD.md, "Flight
    /// recorder".
    #[arg(long, value_name = "SIZE|DURATION", value_parser = |v: &str| alloctrace_options::parse_flight_recorder(v.as_bytes()))]
    flight_recorder: Option<alloctrace_options::FlightRecorder>,
    /// With --flight-recorder: write the ring to the trace file once, the
    /// first time the process's resident memory reaches SIZE (e.g. 2GiB).
    #[arg(long, value_name = "SIZE", requires = "flight_recorder", value_parser = |v: &str| alloctrace_options::parse_dump_on_rss(v.as_bytes()))]
    dump_on_rss: Option<u64>,
    /// Replace FILE if it exists (only the first process's trace; others
    /// never overwrite).
    #[arg(long)]
    overwrite: bool,
    /// Trace only programs of this name (the file name they were started as,
    /// or their executable's); may be repeated or comma-separated. The others
    /// run untraced, but the programs they start are still traced if they match.
    #[arg(long, value_name = "NAME", value_delimiter = ',', value_parser = parse_program_name)]
    only: Vec<String>,
    /// Trace only CMD's own process, and the programs it execs (the same
    /// process), not its children.
    #[arg(long)]
    no_follow: bool,
    /// No summary of each trace: only where the traces are, and what could not be traced.
    #[arg(long)]
    no_report: bool,
    /// The command to run and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// `-o`: the pattern's grammar (the shim's), made absolute (so a process
/// that changes directory still writes there), not a directory, in a
/// directory that exists.
fn parse_output(value: OsString) -> Result<PathBuf, String> {
    alloctrace_options::check_pattern(value.as_bytes()).map_err(str::to_string)?;
    let plain = !value.as_bytes().contains(&b'%');
    let path = PathBuf::from(value);
    let path = if path.is_absolute() {
        path
    } else {
        std::env::current_dir()
            .map_err(|e| format!("cannot read the current directory: {e}"))?
            .join(path)
    };
    if plain && path.is_dir() {
        return Err(format!(
            "{} is a directory: give a file name, such as {}",
            path.display(),
            path.join("%p.trace").display()
        ));
    }
    match path.parent() {
        Some(parent) if !parent.as_os_str().as_bytes().contains(&b'%') && !parent.is_dir() => {
            Err(format!("{}: no such directory", parent.display()))
        }
        _ => Ok(path),
    }
}

/// `--stacks`: `fast` is refused with the reason.
fn parse_stacks(value: &str) -> Result<Stacks, String> {
    Stacks::parse(value.as_bytes()).map_err(|why| match value {
        "fast" => format!("--stacks {why}"),
        _ => why.to_string(),
    })
}

fn parse_program_name(value: &str) -> Result<String, String> {
    alloctrace_options::check_program_name(value.trim().as_bytes()).map_err(str::to_string)?;
    Ok(value.trim().to_string())
}

/// Where the shim is: $ALLOCTRACE_PRELOAD, else next to this executable,
/// else in ../lib (where `make install` puts it).
fn find_shim() -> Result<PathBuf, Failure> {
    if let Some(path) = std::env::var_os("ALLOCTRACE_PRELOAD").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return match path.canonicalize() {
            Ok(abs) => Ok(abs),
            Err(e) => Err(Failure::Io(format!(
                "ALLOCTRACE_PRELOAD={}: {e}",
                path.display()
            ))),
        };
    }
    let exe = std::env::current_exe()
        .map_err(|e| Failure::Io(format!("cannot find this executable: {e}")))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [dir.join(SHIM), dir.join("../lib").join(SHIM)];
    for candidate in &candidates {
        if candidate.is_file() {
            return candidate
                .canonicalize()
                .map_err(|e| Failure::Io(format!("{}: {e}", candidate.display())));
        }
    }
    Err(Failure::Io(format!(
        "cannot find {SHIM} in {} or {}: build it with `make` (or `make install`), or set ALLOCTRACE_PRELOAD to its path",
        dir.display(),
        dir.join("../lib").display()
    )))
}

/// A fresh index file in the temporary directory, mode 0600 whatever the
/// umask (every process of the run opens it to append).
fn create_index() -> Result<(PathBuf, File), Failure> {
    let dir = std::env::temp_dir();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    for attempt in 0..100u32 {
        let path = dir.join(format!(
            "alloctrace-record-{}-{nanos}-{attempt}.index",
            std::process::id()
        ));
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(file) => {
                if let Err(e) = file.set_permissions(Permissions::from_mode(0o600)) {
                    let _ = std::fs::remove_file(&path);
                    return Err(Failure::Io(format!("cannot chmod {}: {e}", path.display())));
                }
                return Ok((path, file));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(Failure::Io(format!(
                    "cannot create an index file in {}: {e}",
                    dir.display()
                )))
            }
        }
    }
    Err(Failure::Io(format!(
        "cannot create an index file in {}",
        dir.display()
    )))
}

/// Bytes for people: "512 bytes", "1.5 KiB", "12.0 MiB".
fn human_bytes(n: u64) -> String {
    if n < 1024 {
        format!("{n} bytes")
    } else {
        units::bytes(n, Decimals::Fixed(1))
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!(
        "{} {}",
        units::thousands(n),
        if n == 1 { one } else { many }
    )
}

/// What the index says about the run (see the shim's `append_index`).
#[derive(Default)]
struct Index {
    /// Sessions in the order they started.
    traces: Vec<Trace>,
    /// Processes that could not be traced: pid, program, reason.
    untraced: Vec<(String, String, String)>,
    /// Programs `--only` left untraced: name -> processes.
    skipped: BTreeMap<String, u64>,
}

/// One session, as the shim listed it.
struct Trace {
    pid: String,
    program: String,
    path: PathBuf,
    end: Option<End>,
}

/// A session's `end` line.
struct End {
    status: String,
    generations: u64,
    lost: u64,
    bytes: u64,
    duration_ns: u64,
}

fn read_index(file: &mut File) -> Index {
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let mut index = Index::default();
    for line in text.lines() {
        let fields: Vec<&str> = line.splitn(8, '\t').collect();
        match fields[..] {
            ["end", pid, status, generations, lost, bytes, duration, path] => {
                let number = |s: &str| s.parse::<u64>().unwrap_or(0);
                let path = PathBuf::from(path);
                if let Some(t) = index
                    .traces
                    .iter_mut()
                    .rev()
                    .find(|t| t.pid == pid && t.path == path)
                {
                    t.end = Some(End {
                        status: status.to_string(),
                        generations: number(generations),
                        lost: number(lost),
                        bytes: number(bytes),
                        duration_ns: number(duration),
                    });
                }
            }
            ["untraced", pid, program, ref why @ ..] if !why.is_empty() => {
                index
                    .untraced
                    .push((pid.to_string(), program.to_string(), why.join("\t")));
            }
            ["skipped", _, ref program @ ..] if !program.is_empty() => {
                *index.skipped.entry(program.join("\t")).or_insert(0) += 1;
            }
            [pid, program, ref path @ ..]
                if !path.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) =>
            {
                index.traces.push(Trace {
                    pid: pid.to_string(),
                    program: program.to_string(),
                    path: PathBuf::from(path.join("\t")),
                    end: None,
                });
            }
            _ => {}
        }
    }
    index
}

/// Whether process `pid` still exists.
fn alive(pid: &str) -> bool {
    pid.parse::<i32>()
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .is_some_and(|p| rustix::process::test_kill_process(p).is_ok())
}

/// The paragraph about one trace: read whole when `read` (counts of
/// events and heap bytes), else from the index's totals.
fn summary(trace: &Trace, read: bool) -> String {
    let head = format!(
        "  {} (pid {}, {})",
        crate::print::printable(&trace.path.display().to_string()),
        trace.pid,
        crate::print::printable(&trace.program)
    );
    let running = trace.end.is_none() && alive(&trace.pid);
    if running {
        return format!(
            "{head}\n    still running: a process of the run that outlived the command; its trace is complete once it exits."
        );
    }
    if std::fs::metadata(&trace.path).is_ok_and(|m| m.len() == 0) {
        // Only the flight recorder leaves its file empty: it writes on a
        // trigger alone.
        return format!(
            "{head}
    empty: nothing was written (with --flight-recorder a trace is written only on a trigger: a fatal signal, --dump-on-rss)."
        );
    }
    if let Some(end) = trace.end.as_ref().filter(|e| e.status != "ok") {
        return format!(
            "{head}\n    {}: the trace is cut there (`alloctrace check` says where).",
            end.status
        );
    }
    if !read {
        return match &trace.end {
            Some(end) => {
                let mut text = format!(
                    "{head}\n    {} in {} over {}",
                    human_bytes(end.bytes),
                    plural(end.generations, "generation", "generations"),
                    units::duration_ms(end.duration_ns)
                );
                if end.lost > 0 {
                    text.push_str(&format!("; {} lost", plural(end.lost, "event", "events")));
                }
                text.push_str("; complete (not read for this report: `alloctrace stats` counts its events).");
                text
            }
            None => format!(
                "{head}\n    cut short: the process ended without completing its trace (killed, or it ended without running exit handlers); every complete batch is readable, `alloctrace check` says where it was cut."
            ),
        };
    }
    let stats = match crate::stats::collect(&crate::input::Input::file(&trace.path)) {
        Ok(stats) => stats,
        Err(Failure::Malformed(err)) => return format!("{head}\n    malformed: {err}"),
        Err(Failure::Io(msg)) => return format!("{head}\n    cannot read it: {msg}"),
        Err(Failure::Verdict(_)) => return head,
    };
    let mut text = format!(
        "{head}\n    {}{} in {} from {}; peak live heap {}; {} {} ({}) still live",
        if stats.flight_window {
            "a flight-recorder window (the last generations of the run): "
        } else {
            ""
        },
        plural(stats.total_events, "event", "events"),
        plural(stats.generations, "generation", "generations"),
        plural(stats.threads(), "thread", "threads"),
        human_bytes(stats.peak_live_bytes()),
        if stats.flight_window {
            "at its end"
        } else {
            "at exit"
        },
        plural(stats.live_objects(), "heap object", "heap objects"),
        human_bytes(stats.live_bytes()),
    );
    if stats.sample_bytes > 0 {
        // The figures above count the samples; the exact totals beside.
        text.push_str(&format!(
            "; sampled every {} (--sample-bytes: the figures above are the samples' own, `alloctrace top` estimates), of {} allocated in {} exactly",
            human_bytes(stats.sample_bytes),
            human_bytes(stats.totals.alloc_bytes),
            plural(stats.totals.allocs, "allocation", "allocations"),
        ));
    }
    if stats.lost_events > 0 {
        text.push_str(&format!(
            "; {} lost",
            plural(stats.lost_events, "event", "events")
        ));
    }
    if stats.anomalies() > 0 {
        text.push_str(&format!(
            "; {} (see `alloctrace check`)",
            plural(stats.anomalies(), "anomaly", "anomalies")
        ));
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

/// A trace's paragraph, read whole while its size fits in what is left
/// of the `budget` (which it then takes).
fn paragraph(trace: &Trace, budget: &mut u64) -> String {
    let size = std::fs::metadata(&trace.path).map_or(u64::MAX, |m| m.len());
    let read = size <= *budget;
    if read {
        *budget -= size;
    }
    let mut text = summary(trace, read);
    text.push('\n');
    text
}

/// Whether the index says the trace did not end cleanly: its process is
/// still running or ended without completing it, or its writes failed.
fn unclean(trace: &Trace) -> bool {
    trace.end.as_ref().is_none_or(|end| end.status != "ok")
}

/// `path` as a word a shell reads back as it is: single-quoted unless
/// every character is plain, control characters escaped.
fn shell_word(path: &Path) -> String {
    let text = path.to_string_lossy();
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._+-,:=@%".contains(c));
    if plain {
        text.into_owned()
    } else {
        crate::print::printable(&format!("'{}'", text.replace('\'', r"'\''"))).into_owned()
    }
}

/// How to list every trace of the run: `alloctrace check` on the run's
/// own directory (relative to the current directory `cwd` when inside
/// it), or on the one directory an `-o` pattern put them all in.
fn listing(index: &Index, run_dir: Option<&Path>, cwd: &Path) -> String {
    // Never a word that starts with `-`, which would read as an option.
    let short = |dir: &Path| -> PathBuf {
        match dir.strip_prefix(cwd) {
            Ok(rel) if rel.as_os_str().is_empty() => PathBuf::from("."),
            Ok(rel) if rel.as_os_str().as_bytes().starts_with(b"-") => Path::new(".").join(rel),
            Ok(rel) => rel.to_path_buf(),
            Err(_) => dir.to_path_buf(),
        }
    };
    if let Some(dir) = run_dir {
        return format!(
            "`alloctrace check {}` lists them all",
            shell_word(&short(dir))
        );
    }
    let parent = index.traces[0].path.parent();
    let one_dir = index
        .traces
        .iter()
        .all(|t| t.path.parent() == parent && t.path.extension().is_some_and(|e| e == "trace"));
    match parent {
        Some(dir) if one_dir => format!(
            "`alloctrace check {}` lists them, with any other trace there",
            shell_word(&short(dir))
        ),
        _ => "not listed here (`--no-report` lists every trace's path)".to_string(),
    }
}

/// The report of a run of many traces (more than
/// `REPORT_EVERY_TRACE_UP_TO`): its traces by program, the largest and
/// those that did not end cleanly, and the command that lists the others.
fn grouped(index: &Index, run_dir: Option<&Path>, cwd: &Path, budget: &mut u64) -> String {
    let sizes: Vec<u64> = index
        .traces
        .iter()
        .map(|t| std::fs::metadata(&t.path).map_or(0, |m| m.len()))
        .collect();
    // Program -> (traces, bytes), most bytes first.
    let mut by_program: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for (trace, size) in index.traces.iter().zip(&sizes) {
        let entry = by_program.entry(trace.program.as_str()).or_default();
        entry.0 += 1;
        entry.1 += size;
    }
    let mut programs: Vec<(String, u64, u64)> = by_program
        .into_iter()
        .map(|(p, (n, bytes))| (crate::print::printable(p).into_owned(), n, bytes))
        .collect();
    programs.sort_by(|a, b| b.2.cmp(&a.2).then(b.1.cmp(&a.1)).then(a.0.cmp(&b.0)));
    let mut rows: Vec<[String; 3]> = vec![[
        "program".to_string(),
        "traces".to_string(),
        "on disk".to_string(),
    ]];
    for (program, n, bytes) in programs.iter().take(REPORT_PROGRAMS) {
        rows.push([program.clone(), units::thousands(*n), human_bytes(*bytes)]);
    }
    if programs.len() > REPORT_PROGRAMS {
        let rest = &programs[REPORT_PROGRAMS..];
        rows.push([
            plural(rest.len() as u64, "other program", "other programs"),
            units::thousands(rest.iter().map(|p| p.1).sum()),
            human_bytes(rest.iter().map(|p| p.2).sum()),
        ]);
    }
    let width = |k: usize| rows.iter().map(|r| r[k].chars().count()).max().unwrap_or(0);
    let (w0, w1, w2) = (width(0), width(1), width(2));
    let mut out = String::new();
    for [program, n, bytes] in &rows {
        out.push_str(&format!("  {program:<w0$}  {n:>w1$}  {bytes:>w2$}\n"));
    }

    // The largest (ties in the order they started), then the first
    // few of the others that did not end cleanly.
    let mut order: Vec<usize> = (0..index.traces.len()).collect();
    order.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]).then(a.cmp(&b)));
    let mut shown: Vec<usize> = order[..REPORT_LARGEST.min(order.len())].to_vec();
    let unclean_rest: Vec<usize> = (0..index.traces.len())
        .filter(|i| !shown.contains(i) && unclean(&index.traces[*i]))
        .collect();
    let extra = unclean_rest.len().min(REPORT_UNCLEAN);
    shown.extend(&unclean_rest[..extra]);
    let largest = REPORT_LARGEST.min(order.len());
    out.push_str(&format!("alloctrace: the {largest} largest traces"));
    if extra > 0 {
        out.push_str(&format!(
            ", and {} that did not end cleanly",
            plural(extra as u64, "other", "others")
        ));
    }
    out.push_str(":\n");
    for &i in &shown {
        out.push_str(&paragraph(&index.traces[i], budget));
    }
    let more = index.traces.len() - shown.len();
    if more > 0 {
        let also_unclean = unclean_rest.len() - extra;
        let unclean_note = if also_unclean > 0 {
            format!(" ({also_unclean} of them did not end cleanly)")
        } else {
            String::new()
        };
        out.push_str(&format!(
            "alloctrace: {} more {}{unclean_note}: {}\n",
            units::thousands(more as u64),
            if more == 1 { "trace" } else { "traces" },
            listing(index, run_dir, cwd)
        ));
    }
    out
}

/// The report: where the traces are, what was not traced and why, and
/// (unless `brief`) a summary of each trace, or of a run of many traces
/// by program (`grouped`). `run_dir` is the run's own directory, `cwd`
/// the current one.
fn report(
    index: &Index,
    name: &str,
    status_text: &str,
    args: &Args,
    brief: bool,
    (run_dir, cwd): (Option<&Path>, &Path),
) -> String {
    let mut out = String::new();
    let budget_limit = if args.compression == Compression::None {
        REPORT_READ_BYTES
    } else {
        REPORT_READ_BYTES_COMPRESSED
    };
    let mut budget = budget_limit;
    if index.traces.is_empty() {
        out.push_str(&format!(
            "alloctrace: no trace was written; {name} {status_text}\n"
        ));
    } else {
        out.push_str(&format!(
            "alloctrace: {} written\n",
            plural(index.traces.len() as u64, "trace", "traces")
        ));
        if brief {
            for trace in &index.traces {
                out.push_str(&format!(
                    "  {} (pid {}, {})\n",
                    crate::print::printable(&trace.path.display().to_string()),
                    trace.pid,
                    crate::print::printable(&trace.program)
                ));
            }
        } else if index.traces.len() <= REPORT_EVERY_TRACE_UP_TO {
            for trace in &index.traces {
                out.push_str(&paragraph(trace, &mut budget));
            }
        } else {
            out.push_str(&grouped(index, run_dir, cwd, &mut budget));
        }
    }
    for (pid, program, why) in &index.untraced {
        out.push_str(&format!(
            "alloctrace: pid {pid} ({program}) was not traced: {why}\n"
        ));
    }
    if !index.skipped.is_empty() {
        let n: u64 = index.skipped.values().sum();
        let names: Vec<String> = index
            .skipped
            .iter()
            .map(|(p, k)| {
                if *k > 1 {
                    format!("{p} ({k})")
                } else {
                    p.clone()
                }
            })
            .collect();
        out.push_str(&format!(
            "alloctrace: {} untraced, not named by --only {}: {}\n",
            plural(n, "process ran", "processes ran"),
            args.only.join(","),
            names.join(", ")
        ));
    }
    if index.traces.is_empty() && index.untraced.is_empty() && index.skipped.is_empty() {
        out.push_str(&format!(
            "alloctrace: {name} did not load {SHIM}: a statically linked or setuid program ignores LD_PRELOAD\n"
        ));
    }
    out
}

/// A directory of its own for the run's traces: alloctrace-CMD-PID in the
/// current directory (-2, -3, ... if that exists), mode 0700 whatever the
/// umask (under umask 0777 mkdir alone would make it 0000: no process of
/// the run could write its trace there).
fn create_run_dir(cwd: &Path, command: &OsStr) -> Result<PathBuf, Failure> {
    let name: String = String::from_utf8_lossy(alloctrace_options::file_name(command.as_bytes()))
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._+-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let base = format!("alloctrace-{name}-{}", std::process::id());
    for k in 1..1000 {
        let dir = cwd.join(if k == 1 {
            base.clone()
        } else {
            format!("{base}-{k}")
        });
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {
                return match std::fs::set_permissions(&dir, Permissions::from_mode(0o700)) {
                    Ok(()) => Ok(dir),
                    Err(e) => {
                        let _ = std::fs::remove_dir(&dir);
                        Err(Failure::Io(format!("cannot chmod {}: {e}", dir.display())))
                    }
                };
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Failure::Io(format!("cannot create {}: {e}", dir.display()))),
        }
    }
    Err(Failure::Io(format!(
        "cannot create a directory {base} in {}",
        cwd.display()
    )))
}

/// The signals caught while CMD runs: every one whose default action
/// ends the process, except SIGKILL and SIGSTOP (which cannot be caught)
/// and those that report a fault of this command itself (SIGILL, SIGTRAP,
/// SIGABRT, SIGBUS, SIGFPE, SIGSEGV, SIGSYS: a handler that returns
/// would fault again, forever). The job-control signals (SIGTSTP,
/// SIGTTIN, SIGTTOU) keep stopping this command with CMD, and those
/// ignored by default (SIGCHLD, SIGWINCH, SIGURG, SIGCONT) or by Rust's
/// runtime (SIGPIPE) cannot end it. A signal ignored when this command
/// started (`nohup`, a shell's background job) is left ignored, so the
/// program inherits it ignored, as it would without `record`.
fn forwarded() -> Vec<i32> {
    use libc::*;
    let mut signals = vec![
        SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGTERM, SIGSTKFLT, SIGXCPU, SIGXFSZ,
        SIGVTALRM, SIGPROF, SIGIO, SIGPWR,
    ];
    signals.extend(crate::os::realtime_signals());
    signals.retain(|&signal| !crate::os::ignored(signal));
    signals
}

/// Forwards the signals a process sent to this command to `pid`, until
/// `handle` is closed. Those the kernel sent (a terminal's Ctrl-C, Ctrl-\
/// or hangup, which the whole foreground process group gets) are not
/// forwarded: the program has its own.
fn forward_signals(
    mut signals: signal_hook::iterator::SignalsInfo<signal_hook::iterator::exfiltrator::WithOrigin>,
    pid: u32,
) {
    use signal_hook::low_level::siginfo::Cause;
    for origin in signals.forever() {
        if origin.cause != Cause::Kernel {
            crate::os::send_signal(pid, origin.signal);
        }
    }
}

/// What `path` is when something other than a regular file is there (a
/// FIFO would block the traced program at open; a device or a socket is
/// no place for a trace), without following a symlink.
fn not_a_regular_file(path: &Path) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let kind = std::fs::symlink_metadata(path).ok()?.file_type();
    if kind.is_file() {
        None
    } else if kind.is_fifo() {
        Some("a FIFO")
    } else if kind.is_symlink() {
        Some("a symbolic link")
    } else if kind.is_socket() {
        Some("a socket")
    } else if kind.is_char_device() || kind.is_block_device() {
        Some("a device")
    } else {
        Some("not a file")
    }
}

pub fn run(args: &Args) -> Result<(), Failure> {
    let shim = find_shim()?;
    let cwd = std::env::current_dir()
        .map_err(|e| Failure::Io(format!("cannot read the current directory: {e}")))?;
    let (output, run_dir) = match &args.output {
        Some(output) => {
            let pattern = output.as_os_str().as_bytes();
            if !pattern.windows(2).any(|w| w == b"%p") && output.exists() && !args.overwrite {
                return Err(Failure::Io(format!(
                    "{} exists: choose another -o, or add --overwrite to replace it",
                    output.display()
                )));
            }
            if let Some(kind) = not_a_regular_file(output) {
                if !pattern.windows(2).any(|w| w == b"%p") && args.overwrite {
                    return Err(Failure::Io(format!(
                        "{} is {kind}, not a regular file: --overwrite replaces only a regular file; choose another -o",
                        output.display()
                    )));
                }
            }
            (output.clone(), None)
        }
        None => {
            let dir = create_run_dir(&cwd, &args.command[0])?;
            (dir.join("%p.trace"), Some(dir))
        }
    };
    let cleanup_dir = |dir: &Option<PathBuf>| {
        if let Some(dir) = dir {
            // Only when empty: nothing was written.
            let _ = std::fs::remove_dir(dir);
        }
    };

    let (index_path, mut index) = match create_index() {
        Ok(x) => x,
        Err(e) => {
            cleanup_dir(&run_dir);
            return Err(e);
        }
    };
    let mut preload = shim.as_os_str().to_owned();
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|p| !p.is_empty()) {
        preload.push(":");
        preload.push(existing);
    }
    let mut command = Command::new(&args.command[0]);
    command.args(&args.command[1..]).env("LD_PRELOAD", preload);
    // Every variable the shim reads is this command's: none is inherited.
    for name in env::ALL {
        command.env_remove(name);
    }
    command
        .env(env::OUTPUT, &output)
        .env(env::INDEX, &index_path)
        .env(env::CLOCK, args.clock.name())
        .env(env::COMPRESSION, args.compression.name())
        .env(env::STACKS, args.stacks.name())
        .env(env::STACK_DEPTH, args.stack_depth.to_string());
    if let Some(size) = args.buffer_size {
        command.env(env::BUFFER_SIZE, size.to_string());
    }
    if let Some(n) = args.sample_bytes.filter(|&n| n > 0) {
        command.env(env::SAMPLE_BYTES, n.to_string());
    }
    if let Some(ring) = args.flight_recorder {
        let value = match ring.age_ms {
            0 => ring.bytes.to_string(),
            ms => format!("{ms}ms,{}", ring.bytes),
        };
        command.env(env::FLIGHT_RECORDER, value);
    }
    if let Some(size) = args.dump_on_rss {
        command.env(env::DUMP_ON_RSS, size.to_string());
    }
    if let Some(families) = args.record {
        command.env(env::RECORD, families.value());
    }
    if args.overwrite {
        command.env(env::OVERWRITE, "1");
    }
    if !args.only.is_empty() {
        command.env(env::ONLY, args.only.join(","));
    }
    if args.no_follow {
        command.env(env::FOLLOW, "0");
    }
    crate::os::pass_closed_standard_fds(&mut command);

    let name = args.command[0].to_string_lossy().into_owned();
    // Registered before the program starts, so no signal sent meanwhile
    // ends this command without its report.
    let signals = signal_hook::iterator::SignalsInfo::<
        signal_hook::iterator::exfiltrator::WithOrigin,
    >::new(forwarded())
    .map_err(|e| Failure::Io(format!("cannot handle signals: {e}")));
    let signals = match signals {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_file(&index_path);
            cleanup_dir(&run_dir);
            return Err(e);
        }
    };
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let _ = std::fs::remove_file(&index_path);
            cleanup_dir(&run_dir);
            crate::print::print_stderr(&format!("error: cannot run {name}: {e}\n"));
            // As env(1) and the shells: 127 not found, 126 not runnable.
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return Err(Failure::Verdict(code));
        }
    };
    let handle = signals.handle();
    let pid = child.id();
    let forwarder = std::thread::spawn(move || forward_signals(signals, pid));
    let status = child.wait();
    handle.close();
    let _ = forwarder.join();
    let status = status.map_err(|e| Failure::Io(format!("cannot wait for {name}: {e}")));

    let found = read_index(&mut index);
    let _ = std::fs::remove_file(&index_path);
    let status = status?;
    let code = match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 1,
    };
    let status_text = match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was ended by signal {signal}"),
        (None, None) => "ended".to_string(),
    };
    // Never a panic (as eprint! on a closed pipe or a full disk): the
    // status is CMD's whatever happens to the report.
    crate::print::print_stderr(&report(
        &found,
        &name,
        &status_text,
        args,
        args.no_report,
        (run_dir.as_deref(), &cwd),
    ));
    if found.traces.is_empty() {
        cleanup_dir(&run_dir);
        return Err(Failure::Verdict(NOTHING_TRACED));
    }
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
        assert_eq!(human_bytes(512), "512 bytes");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(12 << 20), "12.0 MiB");
        assert_eq!(plural(1, "trace", "traces"), "1 trace");
        assert_eq!(plural(2000, "trace", "traces"), "2,000 traces");
    }

    #[test]
    fn shell_words() {
        assert_eq!(
            shell_word(Path::new("alloctrace-sh-12")),
            "alloctrace-sh-12"
        );
        assert_eq!(shell_word(Path::new("/a b/it's")), r"'/a b/it'\''s'");
        assert_eq!(shell_word(Path::new("x\ny")), r"'x\ny'");
    }

    fn traces(paths: &[&str]) -> Index {
        Index {
            traces: paths
                .iter()
                .map(|p| Trace {
                    pid: "1".to_string(),
                    program: "sh".to_string(),
                    path: PathBuf::from(p),
                    end: None,
                })
                .collect(),
            ..Index::default()
        }
    }

    #[test]
    fn the_listing_command() {
        let cwd = Path::new("/home/me");
        let run = traces(&["/home/me/alloctrace-sh-7/7.trace"]);
        let dir = Path::new("/home/me/alloctrace-sh-7");
        assert_eq!(
            listing(&run, Some(dir), cwd),
            "`alloctrace check alloctrace-sh-7` lists them all"
        );
        assert_eq!(
            listing(&run, Some(dir), Path::new("/tmp")),
            "`alloctrace check /home/me/alloctrace-sh-7` lists them all"
        );
        let here = traces(&["/home/me/a.1.trace", "/home/me/a.2.trace"]);
        assert_eq!(
            listing(&here, None, cwd),
            "`alloctrace check .` lists them, with any other trace there"
        );
        let dashed = traces(&["/home/me/-x/a.1.trace", "/home/me/-x/a.2.trace"]);
        assert!(listing(&dashed, None, cwd).starts_with("`alloctrace check ./-x` lists them"));
        let apart = traces(&["/home/me/1/a.trace", "/home/me/2/a.trace"]);
        assert!(listing(&apart, None, cwd).starts_with("not listed here"));
        let other_names = traces(&["/home/me/a.1.out", "/home/me/a.2.out"]);
        assert!(listing(&other_names, None, cwd).starts_with("not listed here"));
    }

    #[test]
    fn index_lines() {
        let (path, mut file) = create_index().map_err(|_| "index").unwrap();
        std::fs::write(
            &path,
            "12\tsh\t/tmp/a.12.trace\n13\tmy prog\t/tmp/dir with\ttab/b.trace\nbad line\n\
             end\t12\tok\t2\t5\t4096\t1500000\t/tmp/a.12.trace\n\
             untraced\t14\tcat\tcannot create the trace file /proc/x: No such file or directory\n\
             skipped\t15\tbash\nskipped\t16\tbash\nskipped\t17\tenv\n",
        )
        .unwrap();
        let index = read_index(&mut file);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(index.traces.len(), 2);
        assert_eq!(index.traces[0].pid, "12");
        let end = index.traces[0].end.as_ref().unwrap();
        assert_eq!(
            (
                end.status.as_str(),
                end.generations,
                end.lost,
                end.bytes,
                end.duration_ns
            ),
            ("ok", 2, 5, 4096, 1500000)
        );
        assert!(index.traces[1].end.is_none());
        assert_eq!(index.traces[1].program, "my prog");
        assert_eq!(
            index.traces[1].path,
            PathBuf::from("/tmp/dir with\ttab/b.trace")
        );
        assert_eq!(
            index.untraced,
            vec![(
                "14".to_string(),
                "cat".to_string(),
                "cannot create the trace file /proc/x: No such file or directory".to_string()
            )]
        );
        assert_eq!(index.skipped.get("bash"), Some(&2));
        assert_eq!(index.skipped.get("env"), Some(&1));
    }
}
