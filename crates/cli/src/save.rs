//! `alloctrace save PID -o FILE`: writes a running flight recorder's
//! generations (the ones its ring holds, up to now) as a trace of their
//! own, through the process's control socket (control.rs).
//!
//! This command opens FILE and passes its descriptor with the request
//! (SCM_RIGHTS); the process writes its dump straight into it and
//! answers the generations and bytes written
//! (crates/writer/src/session/channel.rs). Why not stream the dump over
//! the socket: passing the descriptor copies nothing (the ring's bytes
//! go to the file in the process's own writes), FILE is opened here, by
//! the user, in this shell's directory, permissions and mount namespace
//! (a service in a container sees none of these), and the answer comes
//! after the write, so what it says (bytes, generations, or the write's
//! error, a full disk) is the outcome, not a promise. FILE must be a
//! regular file: the process holds its ring while it writes, so a pipe
//! whose reader stalls would stall the program (the process checks too).

use std::fs::OpenOptions;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use alloctrace_format::control as words;
use serde_json::json;

use crate::export::check_one_file_output;
use crate::failure::Failure;
use crate::print::{json_text, print_stdout};

/// Why `-o` must name a regular file.
const NOT_A_FILE: &str = "save writes a regular file: the process writes the dump into it itself, holding its flight recorder meanwhile, and a pipe's reader could make it wait (and the program with it)";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The traced process, in flight-recorder mode (`alloctrace ps` lists them).
    #[arg(value_name = "PID")]
    pub pid: u32,
    /// The trace file to write (mode 0600; a regular file).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
    /// {"pid", "file", "bytes", "first", "last"} as JSON instead of a sentence.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args) -> Result<(), Failure> {
    check_one_file_output(&args.output, "save")?;
    if args.output.as_os_str() == "-" {
        return Err(Failure::Io(NOT_A_FILE.to_string()));
    }
    if std::fs::metadata(&args.output).is_ok_and(|m| !m.is_file()) {
        return Err(Failure::Io(format!(
            "-o {}: not a regular file; {NOT_A_FILE}",
            args.output.display()
        )));
    }
    let found = crate::control::find(args.pid)?;
    // Asked first, so that FILE is not touched when the process refuses.
    let info = crate::control::ask_found(&found, words::INFO, None)?;
    if info.get(words::KEY_MODE).map(String::as_str) != Some(words::MODE_FLIGHT_RECORDER) {
        return Err(Failure::Io(format!(
            "process {}: {}",
            args.pid,
            words::NOT_FLIGHT_RECORDER
        )));
    }
    let existed = std::fs::symlink_metadata(&args.output).is_ok();
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&args.output)
        .map_err(|e| Failure::Io(format!("cannot create {}: {e}", args.output.display())))?;
    let answer = crate::control::ask_found(&found, words::SAVE, Some(file.as_fd()));
    if answer.is_err() && !existed {
        let _ = std::fs::remove_file(&args.output);
    }
    let answer = answer?;
    let number = |key: &str| -> Result<u64, Failure> {
        answer
            .get(key)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| Failure::Io(format!("process {}: no {key} in its answer", args.pid)))
    };
    let bytes = number(words::KEY_BYTES)?;
    let first = number(words::KEY_FIRST)?;
    let last = number(words::KEY_GENERATION)?;
    let file = args.output.display().to_string();
    if args.json {
        let doc = json!({
            "pid": args.pid,
            "file": file,
            "bytes": bytes,
            "first": first,
            "last": last,
        });
        return print_stdout(&format!("{}\n", json_text(&doc)));
    }
    let generations = if last == 0 {
        "no complete generation yet".to_string()
    } else if first == last {
        format!("generation {first}")
    } else {
        format!("generations {first}-{last}")
    };
    print_stdout(&format!("saved {bytes} bytes ({generations}) to {file}\n"))
}
