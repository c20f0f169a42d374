//! `alloctrace ps`: the traced processes this user may talk to, through
//! their control sockets (control.rs): pid, mode, trace path, command.
//! Sockets nobody listens on (a process killed without removing its own)
//! are skipped, and removed once their pid is gone.

use std::fmt::Write as _;

use alloctrace_format::control::{self as words};
use serde_json::json;

use crate::control::{self, AskError};
use crate::failure::Failure;
use crate::print::print_stdout;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// {"processes": [{"pid", "mode", "trace", "command"}...]} as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One process's answer to `info`.
struct Row {
    pid: u32,
    mode: String,
    trace: String,
    command: String,
}

pub fn run(args: &Args) -> Result<(), Failure> {
    let mut rows = Vec::new();
    for found in control::sockets() {
        match control::ask(&found, words::INFO) {
            Ok(answer) => {
                let get = |key: &str| answer.get(key).cloned().unwrap_or_default();
                rows.push(Row {
                    pid: found.pid,
                    mode: get(words::KEY_MODE),
                    trace: get(words::KEY_TRACE),
                    command: get(words::KEY_COMMAND),
                });
            }
            Err(AskError::Stale) => {}
            Err(AskError::Refused(why) | AskError::Io(why)) => {
                eprintln!(
                    "warning: process {} did not answer: {}",
                    found.pid,
                    crate::print::printable(&why)
                );
            }
        }
    }
    let mut out = String::new();
    if args.json {
        let processes: Vec<_> = rows
            .iter()
            .map(|r| json!({"pid": r.pid, "mode": r.mode, "trace": r.trace, "command": r.command}))
            .collect();
        let _ = writeln!(
            out,
            "{}",
            crate::print::json_text(&json!({ "processes": processes }))
        );
    } else if rows.is_empty() {
        out.push_str("No traced process of yours is running.\n");
    } else {
        let mode_width = rows.iter().map(|r| r.mode.len()).max().unwrap_or(0).max(4);
        let trace_width = rows.iter().map(|r| r.trace.len()).max().unwrap_or(0).max(5);
        let _ = writeln!(
            out,
            "{:>8}  {:mode_width$}  {:trace_width$}  COMMAND",
            "PID", "MODE", "TRACE"
        );
        for r in &rows {
            let _ = writeln!(
                out,
                "{:>8}  {:mode_width$}  {:trace_width$}  {}",
                r.pid,
                crate::print::printable(&r.mode),
                crate::print::printable(&r.trace),
                crate::print::printable(&r.command)
            );
        }
    }
    print_stdout(&out)
}
