//! The client side of the control channel (the traced process answers:
//! crates/writer/src/session/channel.rs; the names and words are the
//! format crate's `control` module): finding the sockets of this user's
//! traced processes, and asking one of them. Used by `ps`, `snapshot` and
//! `save`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use alloctrace_format::control;

use crate::failure::Failure;

/// How long an answer may take: a snapshot waits for the writer thread.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The directories a traced process of this user may have its socket in:
/// `$XDG_RUNTIME_DIR/alloctrace` (if set), then `/tmp/alloctrace-UID`.
/// Only directories owned by this user, mode 0700, count.
pub fn directories() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        dirs.push(Path::new(&runtime).join(control::XDG_DIR_NAME));
    }
    dirs.push(PathBuf::from(format!(
        "{}{}",
        control::TMP_DIR_PREFIX,
        euid()
    )));
    dirs.retain(|d| {
        std::fs::symlink_metadata(d)
            .is_ok_and(|m| m.is_dir() && m.uid() == euid() && m.mode() & 0o077 == 0)
    });
    dirs.dedup();
    dirs
}

/// A socket found: its pid and path.
pub struct Found {
    pub pid: u32,
    pub path: PathBuf,
}

/// Every socket of this user's traced processes, by pid (the first
/// directory's when two have one).
pub fn sockets() -> Vec<Found> {
    let mut found: BTreeMap<u32, PathBuf> = BTreeMap::new();
    for dir in directories() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.filter_map(|e| e.ok()) {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(control::pid_of_socket_name)
            else {
                continue;
            };
            if entry.file_type().is_ok_and(|t| t.is_socket()) {
                found.entry(pid).or_insert_with(|| entry.path());
            }
        }
    }
    found
        .into_iter()
        .map(|(pid, path)| Found { pid, path })
        .collect()
}

/// Whether process `pid` exists (its /proc directory).
fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Why a socket could not be asked.
pub enum AskError {
    /// Nobody listens (a process that died without removing its socket):
    /// the file was removed if its pid is gone.
    Stale,
    /// The process refused or failed the request; its words.
    Refused(String),
    /// The connection failed otherwise.
    Io(String),
}

/// Sends `request` to the socket at `path` and returns the answer's
/// payload as `key value` lines (unknown keys kept).
pub fn ask(found: &Found, request: &str) -> Result<BTreeMap<String, String>, AskError> {
    ask_passing(found, request, None)
}

/// [`ask`], passing the descriptor `fd` with the request (SCM_RIGHTS).
pub fn ask_passing(
    found: &Found,
    request: &str,
    fd: Option<BorrowedFd<'_>>,
) -> Result<BTreeMap<String, String>, AskError> {
    let payload = ask_raw_passing(found, request, control::MAX_PAYLOAD, fd)?;
    let text = String::from_utf8_lossy(&payload);
    Ok(text
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// Sends `request` to the socket at `path` and returns the answer's
/// payload as it is, refused when it says it is longer than `max`.
pub fn ask_raw(found: &Found, request: &str, max: u64) -> Result<Vec<u8>, AskError> {
    ask_raw_passing(found, request, max, None)
}

/// [`ask_raw`], passing the descriptor `fd` with the request.
fn ask_raw_passing(
    found: &Found,
    request: &str,
    max: u64,
    fd: Option<BorrowedFd<'_>>,
) -> Result<Vec<u8>, AskError> {
    let mut stream = match UnixStream::connect(&found.path) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ECONNREFUSED) | Some(libc::ENOENT)
            ) =>
        {
            // Nobody listens: a process gone without removing its socket
            // (SIGKILL, a crash). Removed once the pid is dead; a live pid
            // (reused, or binding right now) keeps it.
            if !alive(found.pid) {
                let _ = std::fs::remove_file(&found.path);
            }
            return Err(AskError::Stale);
        }
        Err(e) => return Err(AskError::Io(format!("{}: {e}", found.path.display()))),
    };
    let io = |e: std::io::Error| AskError::Io(format!("{}: {e}", found.path.display()));
    stream.set_read_timeout(Some(ANSWER_TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(ANSWER_TIMEOUT)).map_err(io)?;
    let line = format!("{request}\n");
    match fd {
        Some(fd) => crate::os::send_with_fd(&stream, line.as_bytes(), fd),
        None => stream.write_all(line.as_bytes()),
    }
    .map_err(io)?;
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    reader.read_line(&mut status).map_err(io)?;
    let status = status.trim_end_matches('\n');
    let (word, rest) = status.split_once(' ').unwrap_or((status, ""));
    match word {
        control::OK => {
            let len: u64 = rest
                .parse()
                .ok()
                .filter(|&n| n <= max)
                .ok_or_else(|| AskError::Io(format!("a bad answer: {status:?}")))?;
            // Read as it comes, not allocated up front at the length the
            // process claims.
            let mut payload = Vec::new();
            reader.take(len).read_to_end(&mut payload).map_err(io)?;
            if payload.len() as u64 != len {
                return Err(AskError::Io(format!(
                    "the answer ended after {} of its {len} bytes",
                    payload.len()
                )));
            }
            Ok(payload)
        }
        control::ERROR => Err(AskError::Refused(rest.to_string())),
        "" => Err(AskError::Io(
            "the process closed the connection".to_string(),
        )),
        _ => Err(AskError::Io(format!("a bad answer: {status:?}"))),
    }
}

/// The socket of process `pid`, or the error `snapshot` and `save` give.
pub fn find(pid: u32) -> Result<Found, Failure> {
    sockets().into_iter().find(|f| f.pid == pid).ok_or_else(|| {
        let dirs: Vec<String> = [
            std::env::var_os("XDG_RUNTIME_DIR")
                .filter(|d| !d.is_empty())
                .map(|d| Path::new(&d).join(control::XDG_DIR_NAME)),
            Some(PathBuf::from(format!("{}{}", control::TMP_DIR_PREFIX, euid()))),
        ]
        .into_iter()
        .flatten()
        .map(|d| d.display().to_string())
        .collect();
        Failure::Io(format!(
            "process {pid} is not traced by you (no control socket in {}); `alloctrace ps` lists those that are",
            dirs.join(" or ")
        ))
    })
}

/// `ask`, with its errors as the command's.
pub fn ask_pid(pid: u32, request: &str) -> Result<BTreeMap<String, String>, Failure> {
    ask_found(&find(pid)?, request, None)
}

/// `ask_raw`, with its errors as the command's.
pub fn ask_pid_raw(pid: u32, request: &str, max: u64) -> Result<Vec<u8>, Failure> {
    let found = find(pid)?;
    ask_raw(&found, request, max).map_err(|e| ask_failure(pid, e))
}

/// `ask_passing` of a socket `find` found, with its errors as the command's.
pub fn ask_found(
    found: &Found,
    request: &str,
    fd: Option<BorrowedFd<'_>>,
) -> Result<BTreeMap<String, String>, Failure> {
    let pid = found.pid;
    ask_passing(found, request, fd).map_err(|e| ask_failure(pid, e))
}

fn ask_failure(pid: u32, e: AskError) -> Failure {
    match e {
        AskError::Stale => Failure::Io(format!(
            "process {pid} no longer answers (its control socket is stale: the process ended without removing it)"
        )),
        AskError::Refused(why) => Failure::Io(format!("process {pid}: {why}")),
        AskError::Io(why) => Failure::Io(format!("process {pid}: {why}")),
    }
}
