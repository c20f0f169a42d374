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
//! A snapshot (what is live now and where it was allocated) is read from
//! the trace itself: the thread ends the current generation, waits until
//! the trace file holds it whole ([`Writer::in_file`]), and answers the
//! trace's path, that generation and the byte count that holds it. The
//! `alloctrace` command reads those first bytes, which are a trace cut at
//! a batch boundary, as any cut trace. So the program's threads pay
//! nothing (no live table on the event path, none on the writer thread),
//! and the command pays a read of the trace so far.
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
//!
//! [`Writer::in_file`]: crate::writer::Writer::in_file

use core::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use alloctrace_format::control;

use crate::session::socket::{self, Connection, Listener};
use crate::session::Session;
use crate::shared::SHARED;
use crate::thread::{spawn_ready, InternalThread, ThreadSignals};
use crate::writer::output::Output;

/// How long the thread waits for a connection before it checks its socket
/// (socket.rs invariant 3) and its exit flag; stop wakes it at once.
const POLL_MS: i32 = 500;

/// How long a snapshot waits for the writer thread to write its
/// generation out.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(30);

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
    /// Whether the trace is a regular file (a snapshot reads it).
    trace_is_file: bool,
    /// The listening socket is in the program's table.
    shared: bool,
    /// lifecycle.rs's `advance`, passed down (lifecycle starts this
    /// thread; importing it back would make a cycle).
    advance: fn() -> Result<(), crate::session::Error>,
    /// lifecycle.rs's `flight_recorder_write` (a `save`), passed down
    /// likewise.
    save: Save,
}

/// lifecycle.rs's `flight_recorder_write`.
type Save = fn(&Output) -> Result<(u64, u64), crate::session::Error>;

/// Starts the control thread of `session` and returns once it listens (or
/// gave up: no socket). Called by start while tracing is off; `advance`
/// ends the current generation (a snapshot's first step).
pub(crate) fn spawn(
    session: &Arc<Session>,
    advance: fn() -> Result<(), crate::session::Error>,
    save: Save,
) -> std::io::Result<InternalThread> {
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
                trace_is_file,
                shared,
                advance,
                save,
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
    while !channel.exit.load(Ordering::Acquire) {
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
    SHARED_LISTENER.store(-1, Ordering::Relaxed);
    // Dropping the listener removes the socket's file (socket.rs).
    drop(served.listener.take());
}

/// The answer's status line and payload.
type Answer = Result<String, String>;

fn serve(session: &Session, served: &Served, conn: &Connection) {
    let line = conn.read_request();
    let answer = match control::request_word(&line) {
        Some(control::INFO) => Ok(info(session, served)),
        Some(control::SNAPSHOT) if session.writer.flight.is_some() => Err(
            "flight-recorder mode: the trace file holds nothing until a dump, so there is no snapshot to read".to_string(),
        ),
        Some(control::SNAPSHOT) => snapshot(session, served),
        Some(control::SAVE) if session.writer.flight.is_some() => save(served, conn),
        Some(control::SAVE) => Err(control::NOT_FLIGHT_RECORDER.to_string()),
        Some(other) => Err(format!("unknown request {other:?}")),
        None => Err("no request".to_string()),
    };
    let bytes = match answer {
        Ok(payload) => format!("{} {}\n{payload}", control::OK, payload.len()),
        Err(why) => format!("{} {}\n", control::ERROR, why.replace('\n', " ")),
    };
    let _ = conn.write_all(bytes.as_bytes());
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

/// Ends the current generation and answers once the file holds it.
fn snapshot(session: &Session, served: &Served) -> Answer {
    if !served.trace_is_file {
        return Err(format!(
            "the trace ({}) is not a regular file: a snapshot reads it",
            served.trace
        ));
    }
    let writer = &session.writer;
    let failed = || writer.io_error.load(Ordering::Relaxed) != 0;
    if failed() {
        return Err("the trace could not be written".to_string());
    }
    let wanted = SHARED.generation.load(Ordering::Acquire);
    (served.advance)().map_err(|e| format!("cannot end the generation: {e}"))?;
    let deadline = Instant::now() + SNAPSHOT_WAIT;
    loop {
        let (generation, bytes) = *writer.in_file.lock().unwrap_or_else(|p| p.into_inner());
        if generation >= wanted {
            let mut out = String::new();
            field(&mut out, control::KEY_TRACE, &served.trace);
            field(&mut out, control::KEY_GENERATION, &generation.to_string());
            field(&mut out, control::KEY_BYTES, &bytes.to_string());
            return Ok(out);
        }
        if failed() {
            return Err("the trace could not be written".to_string());
        }
        if session.channel.exit.load(Ordering::Acquire) {
            return Err("tracing stopped".to_string());
        }
        if Instant::now() > deadline {
            return Err("the writer thread did not write the generation in time".to_string());
        }
        writer.wake();
        std::thread::sleep(Duration::from_millis(1));
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
fn save(served: &Served, conn: &Connection) -> Answer {
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
    let (first, last) = (served.save)(&out).map_err(|e| format!("cannot save: {e}"))?;
    let mut answer = String::new();
    field(&mut answer, control::KEY_FIRST, &first.to_string());
    field(&mut answer, control::KEY_GENERATION, &last.to_string());
    field(&mut answer, control::KEY_BYTES, &out.written().to_string());
    Ok(answer)
}
