//! The few operating-system calls `record` needs that the safe crates do
//! not offer: which of the standard descriptors were closed when this
//! program was started, closing them again in CMD, and sending a signal
//! given by its number (the real-time ones included); and for `save`,
//! passing a descriptor over a unix socket (SCM_RIGHTS). The only unsafe
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

use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
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

/// Sends all of `bytes` on `stream`, the descriptor `fd` passed with the
/// first of them (SCM_RIGHTS: the peer gets a descriptor of its own for
/// the same open file).
pub fn send_with_fd(stream: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> std::io::Result<()> {
    const FD_LEN: usize = std::mem::size_of::<libc::c_int>();
    /// Room for one descriptor's control message, aligned as cmsghdr wants.
    #[repr(C, align(8))]
    struct Control([u8; 64]);
    let mut control = Control([0; 64]);
    // SAFETY: CMSG_SPACE only computes a length.
    let space = unsafe { libc::CMSG_SPACE(FD_LEN as u32) } as usize;
    assert!(space <= control.0.len());
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    };
    // SAFETY: an all-zero msghdr is valid (no name, no buffers).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control holds `space` bytes, room for one header and
    // one descriptor (CMSG_SPACE); CMSG_FIRSTHDR points at its start and
    // CMSG_DATA inside it.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(FD_LEN as u32) as _;
        libc::CMSG_DATA(cmsg)
            .cast::<libc::c_int>()
            .write_unaligned(fd.as_raw_fd());
    }
    let sent = loop {
        // SAFETY: msg points at buffers alive for the call, of their
        // lengths; MSG_NOSIGNAL: a peer gone is an error, not SIGPIPE.
        let n = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            break n as usize;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // The descriptor went with the first bytes; the rest (a request line
    // is short: never in practice) as plain bytes.
    std::io::Write::write_all(&mut &*stream, &bytes[sent..])
}
