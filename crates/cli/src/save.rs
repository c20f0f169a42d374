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
//! error, a full disk) is the outcome, not a promise.

use std::fs::OpenOptions;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use alloctrace_format::control as words;
use serde_json::json;

use crate::export::check_one_file_output;
use crate::failure::Failure;
use crate::print::{json_text, print_stderr, print_stdout};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The traced process, in flight-recorder mode (`alloctrace ps` lists them).
    #[arg(value_name = "PID")]
    pub pid: u32,
    /// The trace file to write (mode 0600; - for standard output).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
    /// {"pid", "file", "bytes", "first", "last"} as JSON instead of a sentence.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args) -> Result<(), Failure> {
    check_one_file_output(&args.output, "save")?;
    let to_stdout = args.output.as_os_str() == "-";
    if to_stdout && args.json {
        return Err(Failure::Io(
            "--json with -o -: the trace goes to standard output, so there is no room for the JSON"
                .to_string(),
        ));
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
    let answer = if to_stdout {
        crate::control::ask_found(&found, words::SAVE, Some(std::io::stdout().as_fd()))?
    } else {
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
        answer?
    };
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
    let to = if to_stdout { "standard output" } else { &file };
    let line = format!("saved {bytes} bytes ({generations}) to {to}\n");
    if to_stdout {
        print_stderr(&line);
        Ok(())
    } else {
        print_stdout(&line)
    }
}
