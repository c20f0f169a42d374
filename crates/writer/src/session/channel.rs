//! The control channel: a thread of the tracer's own that answers the
//! `alloctrace` command (`ps`, `snapshot`, `save`) on a unix socket, one
//! per traced process (socket.rs has the mechanics, the format crate's
//! `control` module the names and words; docs/PRELOAD.md "The control
//! socket" the user's view).
//!
//! ## Design
//!
//! start spawns the control thread after the writer, before tracing is
//! on; stop tells it to exit in its first phase (with the advancer's exit,
//! without `CONTROL`: the thread may be inside an advance) and joins it
//! with the other threads. The thread never touches the event path: it
//! runs `advance` (as `trace_advance` does) and reads what the writer
//! thread publishes. It works in a descriptor table of its own
//! (`unshare(CLONE_FILES)`, writer/output.rs `private_table`), so the
//! program's descriptors are not held open by it, and nothing the program
//! does to its descriptors (closing them all, dup2 over a number) reaches
//! the listening socket; where unshare is refused the socket sits at a
//! high number, close-on-exec, and is checked before each use
//! (socket.rs invariant 3).
//!
//! A snapshot (what is live now and where it was allocated) comes from
//! the writer thread's live table (writer/live.rs): the thread ends the
//! current generation, asks the writer thread for the table as a snapshot
//! trace once it has moved that generation (writer/snapshot.rs), and
//! answers with that trace as the payload. So the program's threads pay
//! nothing (the table is kept on the writer thread, from the batches it
//! moves), the trace need not be a regular file, and the command's work
//! is in proportion to what is live, not to the trace's length.
//!
//! A snapshot signal (SIGUSR2 under the shim, [`request_from_signal`])
//! only raises a flag: the handler may run inside malloc, on any thread.
//! The thread sees the flag at its next wake-up (at most [`POLL_MS`]) and
//! writes a file beside the trace ([`signal_file`]): the live heap's
//! snapshot, or in flight-recorder mode the recorder's dump.
//!
//! A save (flight-recorder mode) writes the flight recorder's dump
//! (lifecycle.rs `flight_recorder_write`, as `trace_flight_recorder_write`
//! does) into the file descriptor the client passed with its request
//! (SCM_RIGHTS), then answers the generations and bytes written.
//!
//! ## Corner cases
//!
//! - fork: the child has no control thread. Its copy of a listening
//!   descriptor in the shared table is closed by the fork handler
//!   (fork.rs). A child that traces (the LD_PRELOAD shim's children do)
//!   gets a socket of its own, by its pid, at its start; one that does not
//!   has none.
//! - exec: the descriptor is close-on-exec; the new image, traced, binds
//!   the same pid's name again, replacing the file.
//! - A process killed without a stop leaves its socket's file: nobody
//!   listens, so a connection is refused; `alloctrace ps` skips it and
//!   removes it once the pid is dead, and a later process of that pid
//!   replaces it.
//! - The listening descriptor found replaced (the shared table), or the
//!   file removed: the socket is made again; if that fails, the thread
//!   gives up (no socket) and tracing goes on.
//! - `ALLOCTRACE_CONTROL=off` (or `0`): no control thread, no socket.

use core::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use alloctrace_format::control;

use crate::session::socket::{self, Connection, Listener};
use crate::session::Session;
use crate::thread::{spawn_ready, InternalThread, ThreadSignals};
use crate::writer::output::Output;
use crate::writer::snapshot::SnapshotBytes;

/// How long the thread waits for a connection before it checks its socket
/// (socket.rs invariant 3) and its exit flag; stop wakes it at once.
const POLL_MS: i32 = 500;

/// What the control thread and the rest of the session tell each other.
pub(crate) struct ChannelSignals {
    /// Tells the control thread to exit.
    pub(crate) exit: AtomicBool,
    /// The control thread, once ready; done when it answers no more.
    pub(crate) thread: ThreadSignals,
    /// The socket's address, set by the thread when it listens (stop
    /// connects to it to wake the thread, allocating nothing).
    pub(crate) addr: Mutex<Option<libc::sockaddr_un>>,
}

impl ChannelSignals {
    pub(crate) fn new() -> ChannelSignals {
        ChannelSignals {
            exit: AtomicBool::new(false),
            thread: ThreadSignals::new(),
            addr: Mutex::new(None),
        }
    }
}

/// The listening descriptor when it is in the program's table (unshare
/// refused), else -1: a forked child closes its copy (fork.rs).
pub(crate) static SHARED_LISTENER: AtomicI32 = AtomicI32::new(-1);

/// Whether a control thread of this process runs and can serve a
/// snapshot signal: set once it listens, cleared as it exits.
static SERVING: AtomicBool = AtomicBool::new(false);
/// Set by a snapshot signal, taken by the control thread.
static SIGNALLED: AtomicBool = AtomicBool::new(false);

/// A snapshot signal's request (async-signal-safe: two atomics, no lock,
/// no allocation, no system call). True when a control thread will write
/// the file; false when there is none (`ALLOCTRACE_CONTROL=off`, no
/// socket, tracing off), and the caller lets the signal act as it would
/// untraced.
pub fn request_from_signal() -> bool {
    if !SERVING.load(Ordering::Acquire) {
        return false;
    }
    SIGNALLED.store(true, Ordering::Release);
    true
}

/// A forked child has no control thread until its own session starts one:
/// a snapshot signal before then acts as untraced.
pub(crate) fn forked_child() {
    SERVING.store(false, Ordering::Relaxed);
    SIGNALLED.store(false, Ordering::Relaxed);
}

/// What the control thread calls in lifecycle.rs, passed down by start
/// (lifecycle starts this thread; importing it back would make a cycle).
#[derive(Clone, Copy)]
pub(crate) struct Hooks {
    /// Writes the flight recorder's dump to an output.
    pub(crate) flight_dump:
        fn(&crate::writer::output::Output) -> Result<(u64, u64), crate::session::Error>,
    /// Makes a snapshot trace (lifecycle.rs `snapshot_bytes`).
    pub(crate) snapshot: Snapshot,
    /// Writes a snapshot trace made by `snapshot` to an output.
    pub(crate) snapshot_write:
        fn(&crate::writer::output::Output, &SnapshotBytes) -> Result<(), crate::session::Error>,
}

/// Whether the environment turns the control socket off
/// (`ALLOCTRACE_CONTROL=off` or `0`).
pub(crate) fn disabled() -> bool {
    std::env::var_os("ALLOCTRACE_CONTROL").is_some_and(|v| v == "off" || v == "0")
}

/// The mode `alloctrace ps` shows: the flight recorder first, then
/// sampling, then the call stacks' mode.
fn mode(session: &Session) -> &'static str {
    if session.writer.flight.is_some() {
        control::MODE_FLIGHT_RECORDER
    } else if crate::sampling::SAMPLE_BYTES.load(Ordering::Relaxed) != 0 {
        control::MODE_SAMPLING
    } else {
        match crate::stacks::capture::mode() {
            crate::stacks::capture::StackMode::None => control::MODE_NO_STACKS,
            crate::stacks::capture::StackMode::Full => control::MODE_FULL,
        }
    }
}

/// What the thread knows from its start.
struct Served {
    listener: Option<Listener>,
    /// The trace's path, as /proc names the output's descriptor.
    trace: String,
    /// The listening socket is in the program's table.
    shared: bool,
    /// Whether the trace is a regular file (a snapshot signal's file goes
    /// beside it).
    trace_is_file: bool,
    /// lifecycle.rs's functions the thread calls.
    hooks: Hooks,
    /// The number of the last file written for a snapshot signal.
    signal_files: u32,
}

/// How the thread gets a snapshot trace.
pub(crate) type Snapshot = fn() -> Result<SnapshotBytes, crate::session::Error>;

/// Starts the control thread of `session` and returns once it listens (or
/// gave up: no socket). Called by start while tracing is off.
pub(crate) fn spawn(session: &Arc<Session>, hooks: Hooks) -> std::io::Result<InternalThread> {
    spawn_ready(
        c"alloctrace-ctl",
        session,
        |s| &s.channel.thread,
        move |s| {
            let fd = s.writer.output.raw_fd();
            let trace = std::fs::read_link(format!("/proc/self/fd/{fd}"))
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| format!("fd {fd}"));
            let trace_is_file = std::fs::metadata(&trace).is_ok_and(|m| m.is_file());
            // The directory first, while stderr is still in this thread's
            // table to say what is wrong with it.
            let dir_ok = socket::private_directory(&socket::directory())
                .map_err(|why| eprintln!("alloctrace: no control socket: {why}"))
                .is_ok();
            let shared = !crate::writer::output::private_table(None);
            let listener = if dir_ok { listen(shared) } else { None };
            if let Some(l) = &listener {
                *s.channel.addr.lock().unwrap_or_else(|p| p.into_inner()) = Some(l.addr());
            }
            Served {
                listener,
                trace,
                shared,
                trace_is_file,
                hooks,
                signal_files: 0,
            }
        },
        run,
    )
}

/// Makes the directory and the socket; says on stderr why not (in a
/// private descriptor table stderr is closed: std drops the line).
fn listen(shared: bool) -> Option<Listener> {
    let dir = socket::directory();
    let made = socket::private_directory(&dir)
        .and_then(|()| Listener::bind(&dir, std::process::id(), shared));
    match made {
        Ok(l) => {
            SHARED_LISTENER.store(l.shared_fd().unwrap_or(-1), Ordering::Relaxed);
            Some(l)
        }
        Err(why) => {
            eprintln!("alloctrace: no control socket: {why}");
            None
        }
    }
}

/// Tells the control thread to exit and waits until it is done, without
/// joining (stop's first phase; the join comes with the other threads').
/// Allocates nothing: tracing is still on.
pub(crate) fn tell_exit(session: &Session) {
    let channel = &session.channel;
    channel.exit.store(true, Ordering::Release);
    if !channel.thread.started() {
        return;
    }
    let addr = *channel.addr.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(addr) = addr {
        // A connection wakes the thread's poll; it sees the flag first.
        socket::poke(&addr);
    }
    while !channel.thread.is_done() {
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn run(session: &Session, mut served: Served) {
    let channel = &session.channel;
    // A signal before this session's thread was ready asked nobody.
    SIGNALLED.store(false, Ordering::Relaxed);
    // A signal is taken only where it can be answered: a flight
    // recorder's dump, or a snapshot from the live table (sampling mode,
    // or ALLOCTRACE_LIVE_TABLE=on); elsewhere it acts as untraced.
    let answerable = session.writer.flight.is_some() || session.writer.snapshot.enabled;
    SERVING.store(answerable, Ordering::Release);
    while !channel.exit.load(Ordering::Acquire) {
        if SIGNALLED.swap(false, Ordering::AcqRel) {
            write_signal_file(session, &mut served);
        }
        let usable = served
            .listener
            .as_ref()
            .is_some_and(|l| l.fd().is_some() && l.path().exists());
        if !usable {
            // Replaced or removed: made again, or given up.
            served.listener = None;
            SHARED_LISTENER.store(-1, Ordering::Relaxed);
            served.listener = listen(served.shared);
            match &served.listener {
                Some(l) => {
                    *channel.addr.lock().unwrap_or_else(|p| p.into_inner()) = Some(l.addr());
                }
                None => break,
            }
        }
        let Some(listener) = served.listener.as_ref() else {
            break;
        };
        let Some(fd) = listener.fd() else {
            continue;
        };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, for its length.
        let ready = unsafe { libc::poll(&mut pfd, 1, POLL_MS) };
        if ready <= 0 || channel.exit.load(Ordering::Acquire) {
            continue;
        }
        if let Ok(Some(conn)) = listener.accept() {
            serve(session, &served, &conn);
        }
    }
    SERVING.store(false, Ordering::Release);
    SHARED_LISTENER.store(-1, Ordering::Relaxed);
    // Dropping the listener removes the socket's file (socket.rs).
    drop(served.listener.take());
}

/// An answer's payload: text, or a snapshot trace.
enum Payload {
    Text(String),
    Trace(SnapshotBytes),
}

fn serve(session: &Session, served: &Served, conn: &Connection) {
    let line = conn.read_request();
    let answer = match control::request_word(&line) {
        Some(control::INFO) => Ok(Payload::Text(info(session, served))),
        Some(control::SNAPSHOT) if session.writer.flight.is_some() => Err(
            "flight-recorder mode keeps no live table, so there is no snapshot (`alloctrace save` writes the recorder's generations)".to_string(),
        ),
        Some(control::SNAPSHOT) => (served.hooks.snapshot)()
            .map(Payload::Trace)
            .map_err(|e| format!("no snapshot: {e}")),
        Some(control::SAVE) if session.writer.flight.is_some() => {
            save(served, conn).map(Payload::Text)
        }
        Some(control::SAVE) => Err(control::NOT_FLIGHT_RECORDER.to_string()),
        Some(other) => Err(format!("unknown request {other:?}")),
        None => Err("no request".to_string()),
    };
    let _ = match answer {
        Ok(Payload::Text(text)) => {
            conn.write_all(format!("{} {}\n{text}", control::OK, text.len()).as_bytes())
        }
        Ok(Payload::Trace(trace)) => {
            let trace = trace.as_slice();
            conn.write_all(format!("{} {}\n", control::OK, trace.len()).as_bytes())
                .and_then(|()| conn.write_all(trace))
        }
        Err(why) => {
            conn.write_all(format!("{} {}\n", control::ERROR, why.replace('\n', " ")).as_bytes())
        }
    };
}

/// One line of a payload: the value's line breaks as spaces.
fn field(out: &mut String, key: &str, value: &str) {
    let value: String = value
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    out.push_str(key);
    out.push(' ');
    out.push_str(value.trim_end());
    out.push('\n');
}

fn info(session: &Session, served: &Served) -> String {
    let command = std::fs::read("/proc/self/cmdline")
        .map(|bytes| {
            let words: Vec<String> = bytes
                .split(|&b| b == 0)
                .filter(|w| !w.is_empty())
                .map(|w| String::from_utf8_lossy(w).into_owned())
                .collect();
            words.join(" ")
        })
        .unwrap_or_default();
    let mut out = String::new();
    field(&mut out, control::KEY_PID, &std::process::id().to_string());
    field(&mut out, control::KEY_COMMAND, &command);
    field(&mut out, control::KEY_MODE, mode(session));
    field(&mut out, control::KEY_TRACE, &served.trace);
    out
}

/// Where a snapshot signal's `n`th file goes: beside the trace, its name
/// less `.trace` then `.snapshot-N.trace` (`.flight-N.trace` for a flight
/// recorder's dump); in the working directory as
/// `alloctrace-snapshot-PID-N.trace` when the trace is not a regular file.
pub(crate) fn signal_file(trace: &str, trace_is_file: bool, flight: bool, n: u32) -> String {
    let kind = if flight { "flight" } else { "snapshot" };
    if trace_is_file {
        let stem = trace.strip_suffix(".trace").unwrap_or(trace);
        format!("{stem}.{kind}-{n}.trace")
    } else {
        format!("alloctrace-{kind}-{}-{n}.trace", std::process::id())
    }
}

/// Serves a snapshot signal: writes the next free file of
/// [`signal_file`]'s names (never replacing one). Nothing to report to:
/// a failure leaves no file (the descriptor table is the thread's own,
/// without stderr).
fn write_signal_file(session: &Session, served: &mut Served) {
    let flight = session.writer.flight.is_some();
    for _ in 0..1000 {
        served.signal_files += 1;
        let path = signal_file(
            &served.trace,
            served.trace_is_file,
            flight,
            served.signal_files,
        );
        let Ok(cpath) = std::ffi::CString::new(path) else {
            return;
        };
        let out = match crate::writer::output::Output::create_new(&cpath) {
            Ok(out) => out,
            Err(libc::EEXIST) => continue,
            Err(_) => return,
        };
        let written = if flight {
            (served.hooks.flight_dump)(&out).is_ok()
        } else {
            (served.hooks.snapshot)()
                .and_then(|bytes| (served.hooks.snapshot_write)(&out, &bytes))
                .is_ok()
        };
        let _ = out.close();
        if !written {
            // SAFETY: a valid NUL-terminated path.
            unsafe { libc::unlink(cpath.as_ptr()) };
        }
        return;
    }
}

/// Writes the flight recorder's dump into the file the client passed
/// with the request (SCM_RIGHTS), and answers what it wrote: the
/// generations and the byte count. The client opened the file, so its
/// path, permissions and namespace are the user's, and the dump goes
/// straight from the ring into it; the answer comes once it is written,
/// so a full disk is an error the user sees. Only into a regular file:
/// the dump holds the ring while it writes, so a pipe whose reader
/// stalls would stall the writer thread and then the program.
fn save(served: &Served, conn: &Connection) -> Result<String, String> {
    let fd = conn.take_passed().ok_or_else(|| {
        "save needs the output file's descriptor passed with the request (SCM_RIGHTS)".to_string()
    })?;
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    // SAFETY: an all-zero stat is valid; fstat fills it or fails.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: raw is the descriptor we own, st a stat to fill.
    let regular =
        unsafe { libc::fstat(raw, &mut st) } == 0 && st.st_mode & libc::S_IFMT == libc::S_IFREG;
    if !regular {
        // The dump holds the ring while it writes: a pipe whose reader
        // stalls would stall the writer thread, and the program with it.
        return Err("save writes into a regular file only".to_string());
    }
    let out = Output::borrowed_fd(raw);
    let (first, last) =
        (served.hooks.flight_dump)(&out).map_err(|e| format!("cannot save: {e}"))?;
    let mut answer = String::new();
    field(&mut answer, control::KEY_FIRST, &first.to_string());
    field(&mut answer, control::KEY_GENERATION, &last.to_string());
    field(&mut answer, control::KEY_BYTES, &out.written().to_string());
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::signal_file;

    #[test]
    fn signal_files_sit_beside_the_trace() {
        assert_eq!(
            signal_file("/t/run.trace", true, false, 1),
            "/t/run.snapshot-1.trace"
        );
        assert_eq!(
            signal_file("/t/run.trace", true, true, 2),
            "/t/run.flight-2.trace"
        );
        assert_eq!(
            signal_file("/t/run.out", true, false, 3),
            "/t/run.out.snapshot-3.trace"
        );
        let pid = std::process::id();
        assert_eq!(
            signal_file("pipe:[5]", false, false, 1),
            format!("alloctrace-snapshot-{pid}-1.trace")
        );
    }
}
