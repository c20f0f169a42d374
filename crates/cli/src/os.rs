//! The few operating-system calls `record` needs that the safe crates do
//! not offer: which of the standard descriptors were closed when this
//! program was started, closing them again in CMD, and sending a signal
//! given by its number (the real-time ones included). The only unsafe
//! code of the crate.
//!
//! Rust's runtime, before `main`, opens /dev/null on each of descriptors
//! 0, 1 and 2 that is closed (std's `sanitize_standard_fds`), so that
//! this program's own files never land there. Without more, CMD would
//! inherit those /dev/nulls: its first `open` would no longer return 1
//! when started with stdout closed, and what it writes there would vanish
//! instead of failing. So a constructor in `.init_array`, which the C
//! runtime runs before `main` (and so before std's sanitising, which runs
//! inside `main`), notes which were closed; `record` closes them again in
//! CMD's process between fork and exec. This program keeps the /dev/nulls.

#![allow(unsafe_code)]

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicU8, Ordering};

/// Bit `fd` set: descriptor `fd` (0, 1 or 2) was closed when the program
/// started. Written once by `note_closed_standard_fds`, before `main`.
static CLOSED_AT_START: AtomicU8 = AtomicU8::new(0);

/// Runs before `main`: the C runtime calls every function of the
/// executable's `.init_array` before it calls `main`, and std's runtime
/// fills closed standard descriptors from `main` (lang_start).
#[used]
#[link_section = ".init_array"]
static NOTE_CLOSED: extern "C" fn() = note_closed_standard_fds;

extern "C" fn note_closed_standard_fds() {
    let mut closed = 0u8;
    for fd in 0..3 {
        // SAFETY: fcntl(F_GETFD) only reads the descriptor's flags; on a
        // closed descriptor it fails with EBADF and changes nothing.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF) {
            closed |= 1 << fd;
        }
    }
    CLOSED_AT_START.store(closed, Ordering::Relaxed);
}

/// Which of 0, 1 and 2 were closed when this program started.
pub fn closed_at_start() -> Vec<i32> {
    let closed = CLOSED_AT_START.load(Ordering::Relaxed);
    (0..3).filter(|fd| closed & (1 << fd) != 0).collect()
}

/// Makes `command` close, in its process just before the exec, the
/// standard descriptors that were closed when this program started, so
/// the program sees them closed as this one was started.
pub fn pass_closed_standard_fds(command: &mut Command) {
    let closed = closed_at_start();
    if closed.is_empty() {
        return;
    }
    // SAFETY: the closure runs in the forked child before exec, where only
    // async-signal-safe calls are allowed: it calls close(2) only, on
    // descriptors 0 to 2 that hold this program's /dev/null (std's
    // stdio set-up for an inherited stdio does not touch them), and
    // allocates nothing (the Vec was built before the fork).
    unsafe {
        command.pre_exec(move || {
            for &fd in &closed {
                libc::close(fd);
            }
            Ok(())
        });
    }
}

/// Sends signal `signal` (any number, real-time signals included) to
/// process `pid`; errors (the process is gone) are ignored.
pub fn send_signal(pid: u32, signal: i32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    if pid <= 0 {
        return;
    }
    // SAFETY: kill(2) takes plain integers and touches no memory of ours;
    // pid is a positive process ID, never a group or "every process".
    unsafe {
        libc::kill(pid, signal);
    }
}

/// The real-time signals, SIGRTMIN to SIGRTMAX as the C library counts
/// them (it keeps the first few for itself).
pub fn realtime_signals() -> std::ops::RangeInclusive<i32> {
    libc::SIGRTMIN()..=libc::SIGRTMAX()
}

/// Whether `signal` is ignored (SIG_IGN) in this process, as it is when
/// the program was started under `nohup` or as a shell's background job
/// (SIGINT, SIGQUIT). An ignored signal is inherited ignored across exec,
/// a caught one is not: `record` leaves such a signal alone, so the
/// program inherits it ignored as it would without `record`.
pub fn ignored(signal: i32) -> bool {
    let mut old = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
    // SAFETY: with a null new action, sigaction(2) only writes the current
    // action into `old`, a zeroed sigaction of the right type; on failure
    // (an invalid number) it writes nothing and we say "not ignored".
    let old = unsafe {
        if libc::sigaction(signal, std::ptr::null(), old.as_mut_ptr()) != 0 {
            return false;
        }
        old.assume_init()
    };
    old.sa_sigaction == libc::SIG_IGN
}
