//! The shim's lifecycle: one tracing session per process image, started by
//! the constructor, by a forked child and after a failed exec; stopped at
//! exit and before exec.
//!
//! The state machine is [`LIFECYCLE`], which lives in state.rs (with the
//! other flags the wrappers read) so that the wrappers never depend on this
//! module:
//!
//! ```text
//! UNINIT --constructor--> RUNNING --exec, fatal signal--> STOPPED
//!    |                       |\--exit, _exit, quick_exit--> EXITED (late.rs)
//!    |                       ^  \--fork (child)--> RUNNING (new file)
//!    |                       |   \-fork, FOLLOW=0-> DISABLED
//!    |                       \--- failed exec ---- STOPPED
//!    \--disabled, bad value, not in ONLY, not the FOLLOW=0 root--> DISABLED
//!                                                (open failed: FAILED)
//! ```
//!
//! This module makes every transition but one: signals.rs's fatal-signal
//! handler moves RUNNING to STOPPED when the core has ended the session.
//! Before a session turns events on, [`start_session`] writes state.rs's
//! FILTER, EPOCH and SESSION_PID; the constructor writes HEAP, MMAP and
//! STACKS once, before the first session. RUNNING is stored (Release)
//! last, and a wrapper that reads it (Acquire) sees them.
//!
//! Every transition runs as the shim's own code (reentrancy state OWN), so
//! the allocations of start and stop (threads, file names, the index line)
//! are never traced.
//!
//! Which processes are traced (the constructor decides, per process image):
//! all, unless ALLOCTRACE_ONLY names programs (then those whose name
//! matches, `not_traced_here`) or ALLOCTRACE_FOLLOW=0 (then the first
//! process, whose pid the shim writes into ALLOCTRACE_ROOT_PID for the
//! images after it, and the programs it execs; its fork children are
//! DISABLED). An untraced image still captures the configuration, so the
//! exec wrappers carry it into the programs it starts.
//!
//! The run's index (ALLOCTRACE_INDEX, [`append_index`]) gets a line when a
//! session starts, one when it ends (with the totals `alloctrace record`
//! reports without reading the trace), one when a process could not be
//! traced (with the reason in words) and one when ALLOCTRACE_ONLY leaves a
//! process out.

use core::sync::atomic::{AtomicPtr, Ordering};
use std::cell::Cell;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;

use alloctrace_writer::capture::StackMode;
use alloctrace_writer::{ClockKind, Config, Error, Output};

use crate::config::{self, Parsed, Settings};
use crate::real::write_stderr;
use crate::state::{
    DISABLED, EPOCH, EXITED, FAILED, FILTER, HEAP, LIFECYCLE, MMAP, RUNNING, SESSION_PID, STACKS,
    STOPPED, UNINIT,
};
use crate::{boundary, liveset, reentrancy, spans, stacks};

/// The settings, leaked once by the constructor.
static SETTINGS: AtomicPtr<Settings> = AtomicPtr::new(core::ptr::null_mut());

/// The current trace file's path, for messages (leaked per session).
static TRACE_PATH: AtomicPtr<CString> = AtomicPtr::new(core::ptr::null_mut());

fn settings() -> Option<&'static Settings> {
    // SAFETY: set once, to a leaked Box, never freed.
    unsafe { SETTINGS.load(Ordering::Acquire).as_ref() }
}

/// Why a session starts: decides the file name rule and the live set.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The first session of a process image (the constructor).
    Root,
    /// A forked child.
    ForkChild,
    /// After an exec that failed.
    AfterExec,
}

fn message(msg: &str) {
    write_stderr(format!("alloctrace: {msg}\n").as_bytes());
}

/// The constructor's work. Runs as the shim's own code.
pub fn init() {
    reentrancy::own(|| {
        if LIFECYCLE.load(Ordering::Acquire) != UNINIT {
            return;
        }
        crate::real::resolve_all();
        let mut settings = match config::from_env() {
            Parsed::Disabled => {
                LIFECYCLE.store(DISABLED, Ordering::Release);
                return;
            }
            Parsed::Bad(why) => {
                message(&format!("{why}; running untraced"));
                if let Some(index) =
                    std::env::var_os(config::INDEX).and_then(|v| CString::new(v.as_bytes()).ok())
                {
                    // SAFETY: getpid has no preconditions.
                    let pid = unsafe { libc::getpid() };
                    untraced_line(&index, pid, &why);
                }
                LIFECYCLE.store(DISABLED, Ordering::Release);
                // Children inherit the environment, bad value included:
                // they stay untraced and silent, so the message shows once.
                std::env::set_var(config::DISABLE, "1");
                return;
            }
            Parsed::Ok(s) => s,
        };
        if settings.overwrite {
            // Only this process may replace an existing file: a child or an
            // exec'd program must never truncate a trace of this run.
            std::env::remove_var(config::OVERWRITE);
        }
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        if !settings.follow && settings.root_pid.is_none() {
            // The first process of a run that follows no children: its pid
            // marks the images to trace (this one and what it execs).
            std::env::set_var(config::ROOT_PID, pid.to_string());
            settings.root_pid = Some(pid);
        }
        crate::run_env::capture_environment();
        if let Some(why) = not_traced_here(&settings, pid) {
            // Untraced, but the exec wrappers still carry the configuration,
            // so the programs this one starts are traced if they match.
            if let (Some(index), Some(program)) = (&settings.index, why) {
                append_index(
                    index,
                    &[
                        b"skipped\t",
                        pid.to_string().as_bytes(),
                        b"\t",
                        &clean(&program),
                    ]
                    .concat(),
                );
            }
            LIFECYCLE.store(DISABLED, Ordering::Release);
            return;
        }
        HEAP.store(settings.heap, Ordering::Relaxed);
        MMAP.store(settings.mmap, Ordering::Relaxed);
        STACKS.store(settings.stacks, Ordering::Relaxed);
        SETTINGS.store(Box::into_raw(Box::new(settings)), Ordering::Release);
        if start_session(Kind::Root) {
            // Registered for the process (no DSO handle), not for the
            // shim as atexit would: the shim's own destructor must not run
            // it (see `at_exit`).
            // SAFETY: at_exit is an extern "C" fn taking one pointer, which
            // it ignores; the shim is never unloaded (build.rs: -z nodelete).
            unsafe { __cxa_atexit(at_exit, core::ptr::null_mut(), core::ptr::null_mut()) };
            // After the core's first start, which registered its own
            // handlers: child handlers run in registration order, so ours
            // runs after the core has reset itself.
            // SAFETY: the handlers are extern "C" fns without arguments.
            unsafe {
                libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child))
            };
        }
    });
}

/// Whether this process image is left untraced by ALLOCTRACE_ONLY or
/// ALLOCTRACE_FOLLOW=0: `None` to trace it; `Some(Some(name))` when its
/// name is not in ALLOCTRACE_ONLY (it gets a `skipped` index line);
/// `Some(None)` when it is not the first process of a run that follows no
/// children.
///
/// The names ALLOCTRACE_ONLY is matched against: the name the program was
/// started as (the file name of its argv\[0\]) and its executable's file
/// name (/proc/self/exe), so `python3` matches a python3 started through
/// a symbolic link to python3.12, and a script matches by its
/// interpreter's name (a `#!/bin/sh` script is `sh`).
fn not_traced_here(s: &Settings, pid: i32) -> Option<Option<Vec<u8>>> {
    if !s.follow && s.root_pid != Some(pid) {
        return Some(None);
    }
    if s.only.is_empty() {
        return None;
    }
    let started_as = program_name();
    let exe = std::fs::read_link("/proc/self/exe")
        .map(|p| p.as_os_str().as_bytes().to_vec())
        .unwrap_or_default();
    let exe_name = alloctrace_options::file_name(&exe);
    if alloctrace_options::only_matches(&s.only, &[&started_as, exe_name]) {
        return None;
    }
    let mut name = started_as.clone();
    if exe_name != &started_as[..] && !exe_name.is_empty() {
        name.extend_from_slice(b" (");
        name.extend_from_slice(exe_name);
        name.push(b')');
    }
    Some(Some(name))
}

/// Opens the trace file of a session: the pattern expanded for this pid; if
/// that exists, the first free of NAME.1.EXT, NAME.2.EXT, ... (a fork child
/// of a pattern without %p, a program exec'd by a traced process with the
/// same pid). Never follows a symlink; files are created 0600 with O_EXCL.
///
/// Only the root session with ALLOCTRACE_OVERWRITE=1 replaces an existing
/// file (the exec wrappers remove the variable from every new program's
/// environment, so that is the run's first process): it unlinks the file
/// and creates a new one, so the new file is 0600 whatever the old one's
/// mode, and a process still writing the old file writes into the unlinked
/// one, never into the new trace. Only a regular file is replaced: anything
/// else (a FIFO, a device, a directory, a socket, a symlink) is refused,
/// never opened, so a FIFO cannot block the program. Errors carry the name
/// (with the reason, for a refusal) and errno.
fn open_output(s: &Settings, kind: Kind, pid: u32) -> Result<(Output, CString), (Vec<u8>, i32)> {
    let name = config::expand(&s.pattern, pid);
    let cname = |n: &[u8]| CString::new(n.to_vec()).map_err(|_| (n.to_vec(), libc::EINVAL));
    if kind == Kind::Root && s.overwrite {
        let c = cname(&name)?;
        // SAFETY: an all-zero stat is a valid out-buffer.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: c is NUL-terminated; st is a valid out-pointer.
        if unsafe { libc::lstat(c.as_ptr(), &mut st) } == 0 {
            let what = match st.st_mode & libc::S_IFMT {
                libc::S_IFREG => None,
                libc::S_IFIFO => Some("a FIFO"),
                libc::S_IFDIR => Some("a directory"),
                libc::S_IFSOCK => Some("a socket"),
                libc::S_IFLNK => Some("a symlink"),
                libc::S_IFCHR | libc::S_IFBLK => Some("a device"),
                _ => Some("not a regular file"),
            };
            if let Some(what) = what {
                let mut shown = name.clone();
                shown.extend_from_slice(
                    format!(" (it is {what}: ALLOCTRACE_OVERWRITE replaces only a regular file)")
                        .as_bytes(),
                );
                // errno 0: the name carries the whole reason.
                return Err((shown, 0));
            }
            // SAFETY: c is NUL-terminated.
            if unsafe { libc::unlink(c.as_ptr()) } != 0 {
                let e = std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO);
                if e != libc::ENOENT {
                    return Err((name, e));
                }
            }
        }
        match Output::create_new(&c) {
            Ok(o) => return Ok((o, c)),
            // Created meanwhile by another process: take a name of its own,
            // as without overwrite.
            Err(libc::EEXIST) => {}
            Err(e) => return Err((name, e)),
        }
    }
    for k in 0..1000 {
        let candidate = if k == 0 {
            name.clone()
        } else {
            config::with_suffix(&name, k)
        };
        let c = cname(&candidate)?;
        match Output::create_new(&c) {
            Ok(o) => return Ok((o, c)),
            Err(libc::EEXIST) => continue,
            Err(e) => return Err((candidate, e)),
        }
    }
    Err((name, libc::EEXIST))
}

/// errno in words ("No space left on device"), without std's
/// " (os error 28)".
fn strerror(e: i32) -> String {
    let text = std::io::Error::from_raw_os_error(e).to_string();
    match text.find(" (os error ") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

/// Starts a session. Runs as the shim's own code. Returns whether tracing
/// is on.
fn start_session(kind: Kind) -> bool {
    let Some(s) = settings() else { return false };
    // SAFETY: getpid and getauxval have no preconditions.
    let pid = unsafe { libc::getpid() };
    // SAFETY: as above.
    let page_size = match unsafe { libc::getauxval(libc::AT_PAGESZ) } {
        0 => 4096,
        p => p,
    };
    // The writer core reads the command line (/proc/self/cmdline) as the
    // session starts, here, outside any traced call, and records it in
    // every generation's process batch (alloctrace-writer's process.rs):
    // a forked child's session reads it again, an exec'd program's its own.
    let config = Config {
        page_size,
        // glibc's malloc returns 16-byte-aligned blocks on 64-bit targets:
        // object IDs are addresses / 16.
        min_heap_align: 2 * core::mem::size_of::<usize>() as u64,
        min_stack_align: page_size,
        buffer_size: s.buffer_size,
        clock: if s.coarse_clock {
            ClockKind::Coarse
        } else {
            ClockKind::Precise
        },
        compress: s.compress,
        stacks: match s.call_stacks {
            alloctrace_options::Stacks::None => StackMode::None,
            alloctrace_options::Stacks::Full => StackMode::Full,
        },
        stack_depth: s.stack_depth,
        sample_bytes: s.sample_bytes,
        sample_seed: s.sample_seed,
        // Flight-recorder mode: a dump reaches the trace file on a fatal
        // signal (signals.rs flushes) or at the RSS threshold, nothing at
        // a normal exit.
        flight_recorder: s.flight_recorder,
        dump_on_rss: s.dump_on_rss,
        flight_recorder_age_ms: s.flight_recorder_age_ms,
        ..Config::default()
    };
    alloctrace_writer::capture::set_check_stacks(s.check_stacks);
    crate::state::SNAPSHOT_SIGNAL.store(s.snapshot_signal, Ordering::Relaxed);
    let filter = kind != Kind::Root && s.heap;
    if filter && !liveset::reset(kind == Kind::ForkChild) {
        let why = "cannot map the live-object set of a new session (out of memory)";
        message(&format!("{why}; running untraced"));
        if let Some(index) = &s.index {
            untraced_line(index, pid, why);
        }
        LIFECYCLE.store(FAILED, Ordering::Release);
        return false;
    }
    FILTER.store(filter, Ordering::Release);
    let epoch = EPOCH.fetch_add(1, Ordering::AcqRel) + 1;
    SESSION_PID.store(pid, Ordering::Release);

    let mut opened: Option<CString> = None;
    let mut open_error: Option<(Vec<u8>, i32)> = None;
    // Hold the span table from before tracing turns on until the snapshot
    // has listed it: a span mapped meanwhile by another thread then comes
    // after its "exists" events, never twice.
    let mut table = spans::SPANS.lock();
    let mut snapshot = || {
        // This thread's slot, claimed as the shim's own code (see the
        // trampoline in stacks.rs).
        alloctrace_writer::events::thread_id();
        stacks::note_bounds();
        if kind == Kind::Root && s.heap {
            crate::early::replay(|addr, size| {
                let prev = reentrancy::replace(reentrancy::IN_EVENT);
                alloctrace_writer::events::heap_object_exists(addr, size as u64, 0);
                reentrancy::replace(prev);
            });
        }
        if s.mmap {
            crate::maps::snapshot(table.table());
        }
        if s.stacks {
            stacks::snapshot(epoch);
        }
    };
    let result = alloctrace_writer::start_with(
        &config,
        || match open_output(s, kind, pid as u32) {
            Ok((output, path)) => {
                opened = Some(path);
                Ok(output)
            }
            Err((name, e)) => {
                open_error = Some((name, e));
                Err(Error::Io(e))
            }
        },
        Some(&mut snapshot),
    );
    drop(table);
    match result {
        Ok(()) => {
            let path = opened.unwrap_or_default();
            let full = absolute(&path);
            if let Some(index) = &s.index {
                let program = clean(&program_name());
                append_index(
                    index,
                    &[pid.to_string().as_bytes(), b"\t", &program, b"\t", &full].concat(),
                );
            }
            let record = SessionRecord {
                path: CString::new(full).unwrap_or_default(),
                start_ns: monotonic_ns(),
                base: alloctrace_writer::written_totals(),
            };
            // The old record is leaked on purpose, as TRACE_PATH's.
            let _ = RECORD.swap(Box::into_raw(Box::new(record)), Ordering::AcqRel);
            let old = TRACE_PATH.swap(Box::into_raw(Box::new(path)), Ordering::AcqRel);
            // The old path's box is leaked on purpose: a message may be
            // reading it on another thread.
            let _ = old;
            LIFECYCLE.store(RUNNING, Ordering::Release);
            true
        }
        Err(err) => {
            let what = match (open_error, err) {
                (Some((name, e)), _) => format!(
                    "cannot create the trace file {}{}",
                    String::from_utf8_lossy(&name),
                    match e {
                        0 => String::new(),
                        libc::EEXIST => ": it exists, and so do its 999 alternatives".to_string(),
                        e => format!(": {}", strerror(e)),
                    }
                ),
                (None, e) => format!("cannot start tracing: {}", e),
            };
            message(&format!("{what}; running untraced"));
            if let Some(index) = &s.index {
                untraced_line(index, pid, &what);
            }
            LIFECYCLE.store(FAILED, Ordering::Release);
            false
        }
    }
}

/// What the index's `end` line of a session needs: its trace's absolute
/// path, when it started, and the core's totals then.
struct SessionRecord {
    path: CString,
    start_ns: u64,
    base: alloctrace_writer::WrittenTotals,
}

/// The running session's record (leaked per session, as TRACE_PATH).
static RECORD: AtomicPtr<SessionRecord> = AtomicPtr::new(core::ptr::null_mut());

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// Stops the running session: flushes every thread and closes the file.
/// Then appends the session's `end` line to the index. Runs as the shim's
/// own code. `at_exit`: the process is exiting; the state becomes EXITED
/// before events turn off, so every call from then on is either recorded
/// or counted (late.rs).
fn stop_session(at_exit: bool) {
    let next = if at_exit { EXITED } else { STOPPED };
    if LIFECYCLE
        .compare_exchange(RUNNING, next, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let result = if at_exit {
        alloctrace_writer::stop_at_exit()
    } else {
        alloctrace_writer::stop()
    };
    if let Err(e) = result {
        // SAFETY: TRACE_PATH holds null or a leaked box.
        let path = unsafe { TRACE_PATH.load(Ordering::Acquire).as_ref() };
        let path = path
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        message(&format!("writing the trace {path} failed: {}", e));
    }
    for line in alloctrace_writer::capture::check_stacks_report().unwrap_or_default() {
        message(&line);
    }
    // SAFETY: RECORD holds null or a leaked box.
    let record = unsafe { RECORD.load(Ordering::Acquire).as_ref() };
    if let (Some(index), Some(record)) = (settings().and_then(|s| s.index.as_ref()), record) {
        let now = alloctrace_writer::written_totals();
        let status = match result {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("writing failed: {}", e),
        };
        // SAFETY: a zeroed stat is a valid out-parameter; the path is
        // NUL-terminated.
        let bytes = unsafe {
            let mut st: libc::stat = core::mem::zeroed();
            if libc::stat(record.path.as_ptr(), &mut st) == 0 {
                st.st_size as u64
            } else {
                0
            }
        };
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        let line = format!(
            "end\t{pid}\t{}\t{}\t{}\t{bytes}\t{}\t",
            String::from_utf8_lossy(&clean(status.as_bytes())),
            now.generations.wrapping_sub(record.base.generations),
            now.lost_events.wrapping_sub(record.base.lost_events),
            monotonic_ns().saturating_sub(record.start_ns),
        );
        append_index(index, &[line.as_bytes(), record.path.as_bytes()].concat());
    }
}

/// `bytes` with tabs and line breaks replaced, for one index field.
fn clean(bytes: &[u8]) -> Vec<u8> {
    bytes
        .iter()
        .map(|&c| if c == b'\t' || c == b'\n' { b'?' } else { c })
        .collect()
}

/// `path` made absolute with the current directory.
fn absolute(path: &CString) -> Vec<u8> {
    let mut full = Vec::new();
    if !path.as_bytes().starts_with(b"/") {
        if let Ok(cwd) = std::env::current_dir() {
            full.extend_from_slice(cwd.as_os_str().as_bytes());
            full.push(b'/');
        }
    }
    full.extend_from_slice(path.as_bytes());
    full
}

/// Appends an `untraced` line: this process could not be traced, and why.
fn untraced_line(index: &CString, pid: i32, why: &str) {
    let program = clean(&program_name());
    append_index(
        index,
        &[
            b"untraced\t",
            pid.to_string().as_bytes(),
            b"\t",
            &program,
            b"\t",
            &clean(why.as_bytes()),
        ]
        .concat(),
    );
}

/// Appends one line (`line` and a line break) to ALLOCTRACE_INDEX, the
/// run's index that `alloctrace record` reads. Its lines, fields separated
/// by tabs (the last field may hold tabs; the others never do):
///
/// - `PID  PROGRAM  PATH`: a session started tracing into PATH (absolute);
/// - `end  PID  STATUS  GENERATIONS  LOST  BYTES  DURATION_NS  PATH`: the
///   session tracing into PATH ended; STATUS is `ok` (the trace is
///   complete) or `writing failed: REASON`; GENERATIONS and LOST are the
///   core's counts ([`alloctrace_writer::written_totals`]), BYTES the file's
///   size after the stop, DURATION_NS the session's length;
/// - `untraced  PID  PROGRAM  REASON`: the process could not be traced
///   (REASON in words: a bad setting, a trace file that cannot be created);
/// - `skipped  PID  PROGRAM`: the process runs untraced because
///   ALLOCTRACE_ONLY does not name it.
///
/// A process killed by a signal has a start line and no `end` line.
fn append_index(index: &CString, line: &[u8]) {
    let mut line = line.to_vec();
    line.push(b'\n');
    // SAFETY: index is NUL-terminated; the descriptor is ours and closed
    // below. O_APPEND makes the one write atomic with respect to other
    // processes appending lines.
    unsafe {
        let fd = libc::open(
            index.as_ptr(),
            libc::O_WRONLY | libc::O_APPEND | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        );
        if fd < 0 {
            return;
        }
        libc::write(fd, line.as_ptr().cast(), line.len());
        libc::close(fd);
    }
}

extern "C" {
    static program_invocation_short_name: *const libc::c_char;
}

fn program_name() -> Vec<u8> {
    // SAFETY: glibc sets this to a NUL-terminated string before any
    // constructor runs; it is never freed.
    unsafe {
        let p = program_invocation_short_name;
        if p.is_null() {
            return Vec::new();
        }
        core::ffi::CStr::from_ptr(p).to_bytes().to_vec()
    }
}

extern "C" {
    /// glibc's: `atexit` is `__cxa_atexit(f, NULL, __dso_handle)`.
    fn __cxa_atexit(
        f: extern "C" fn(*mut libc::c_void),
        arg: *mut libc::c_void,
        dso: *mut libc::c_void,
    ) -> libc::c_int;
}

/// The exit handler that ends the session: runs on whichever thread calls
/// exit, after every library's destructor. exit runs its handlers in
/// reverse order of registration, and this one is registered by the
/// constructor, before `__libc_start_main` registers ld.so's `_dl_fini`,
/// which runs the destructors (`.fini_array`, and through each library's
/// `__cxa_finalize` its C++ static destructors and the atexit handlers it
/// registered). Registered with `atexit` (the shim's DSO handle), it would
/// run inside `_dl_fini` at the shim's turn, which comes before that of
/// the libraries the program links (the first sessions did: their
/// destructors' frees were missed). What runs after it: handlers
/// registered without a DSO handle before the shim's constructor, and
/// stdio's flush; threads still running. Their calls are counted as lost
/// events of the trace (late.rs).
extern "C" fn at_exit(_: *mut libc::c_void) {
    reentrancy::own(|| boundary::quietly(|| stop_session(true)));
}

thread_local! {
    /// Set by fork_prepare when it took the span table lock.
    static FORK_HOLDS_SPANS: Cell<bool> = const { Cell::new(false) };
    /// The forking thread's state before fork_prepare.
    static FORK_PREV_STATE: Cell<u8> = const { Cell::new(reentrancy::NORMAL) };
}

/// Runs first of the prepare handlers (they run in reverse order of
/// registration, and ours was registered after the core's): the rest of
/// fork's handlers, the core's included, run as the shim's own code, so
/// what they allocate (the core's first fork registers a thread-local
/// destructor, which callocs) is never traced as the program's. Also keeps
/// the span table whole across fork: no thread is inside it when the
/// address space is copied.
extern "C" fn fork_prepare() {
    let prev = reentrancy::replace(reentrancy::OWN);
    FORK_PREV_STATE.with(|s| s.set(prev));
    // A fork from a signal handler that interrupted this thread inside the
    // shim must not wait for a lock this thread may hold.
    if LIFECYCLE.load(Ordering::Acquire) == RUNNING
        && matches!(prev, reentrancy::NORMAL | reentrancy::DISABLED)
    {
        core::mem::forget(spans::SPANS.lock());
        FORK_HOLDS_SPANS.with(|f| f.set(true));
    }
}

/// Runs last of the parent handlers.
extern "C" fn fork_parent() {
    if FORK_HOLDS_SPANS.with(|f| f.replace(false)) {
        spans::SPANS.force_unlock();
    }
    reentrancy::replace(FORK_PREV_STATE.with(|s| s.get()));
}

/// Runs last of the child handlers, after the core's has turned tracing off
/// and forgotten the parent's session: a new session with a file of its own.
extern "C" fn fork_child() {
    FORK_HOLDS_SPANS.with(|f| f.set(false));
    spans::SPANS.reset_after_fork();
    if LIFECYCLE.load(Ordering::Acquire) == RUNNING {
        if settings().is_some_and(|s| !s.follow) {
            // ALLOCTRACE_FOLLOW=0: children run untraced.
            LIFECYCLE.store(DISABLED, Ordering::Release);
        } else {
            LIFECYCLE.store(STOPPED, Ordering::Release);
            reentrancy::own(|| {
                boundary::quietly(|| {
                    start_session(Kind::ForkChild);
                })
            });
        }
    }
    reentrancy::replace(FORK_PREV_STATE.with(|s| s.get()));
}

/// Before exec (`at_exit` false), _exit or quick_exit's end (true): ends
/// the session so its trace is complete (both discard the writer thread
/// and every buffer). Returns whether it stopped one. Leaves a vfork
/// child's parent session alone.
pub fn stop_if_ours(at_exit: bool) -> bool {
    if LIFECYCLE.load(Ordering::Acquire) != RUNNING {
        return false;
    }
    // SAFETY: getpid has no preconditions.
    if unsafe { libc::getpid() } != SESSION_PID.load(Ordering::Acquire) {
        return false;
    }
    reentrancy::own(|| stop_session(at_exit));
    true
}

/// After an exec that failed: the program goes on, traced into a new file.
pub fn after_failed_exec() {
    reentrancy::own(|| start_session(Kind::AfterExec));
}
