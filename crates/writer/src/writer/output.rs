//! Where the trace goes: the output descriptor, which the writer thread
//! (writer/mod.rs) writes the full batches through.
//!
//! ## Design
//!
//! The descriptor is the program's neighbour, not the program's: it lives
//! in the same descriptor table, and a program may close descriptors it
//! did not open or reuse their numbers. So:
//!
//! - Every descriptor the core opens (`Output::create`, `create_new`, so
//!   the C API's `trace_config.path` and the LD_PRELOAD shim's files) is
//!   moved, close-on-exec, to a high number ([`high_fd_base`]): the lowest
//!   free at or above 1024 when the `RLIMIT_NOFILE` soft limit is at least
//!   2048 (above the `for (fd = 3; fd < 1024; fd++) close(fd)` loops of
//!   daemons and test runners, and far from the numbers a program gets by
//!   opening files one after the other); else the lowest free at or above
//!   7/8 of the limit (896 for the common 1024); if nothing is free up
//!   there, the lowest free at or above 3. It is never 0, 1 or 2, so a
//!   program started with stdout closed (`exec >&-`) never prints into the
//!   trace. The limit is read, never changed.
//! - The writer thread writes through a descriptor table of its own
//!   ([`Output::make_private`]: `unshare(CLONE_FILES)` when it starts,
//!   then every descriptor but the trace's closed in that table). Nothing
//!   the program does to its own table (close every descriptor, dup2 a
//!   file over the trace's number, close_range) reaches the descriptor the
//!   writer writes through: the program's files never get trace bytes and
//!   the trace goes on, complete. The trace's number stays open in the
//!   program's table (that copy is the one `trace_stop` closes, and only
//!   if it still names the trace).
//! - Where unshare is refused (a seccomp filter), the writer writes
//!   through the shared table and checks before every write, with fstat
//!   (one syscall per batch written, on the writer thread, never on the
//!   event path), that the descriptor still has the `st_dev`/`st_ino` it
//!   had when opened. A descriptor found closed or naming another file is
//!   *gone*: nothing is written to it again, the writer keeps draining (so
//!   producers never block), stderr gets one line saying so and where the
//!   trace is cut, `trace_stop` does not close the number (it is the
//!   program's now) and reports EBADF. The trace ends at its last complete
//!   batch, which a reader reads as cut.
//! - A descriptor the caller passed (`Output::borrowed_fd`, the C API's
//!   `trace_config.fd`) keeps its number (the caller chose it) and stays
//!   open after stop, and is protected the same way: the writer writes
//!   through its private copy, or checks it before every write.
//! - Files the core opens are mode 0600 whatever the umask (fchmod after
//!   open, regular files only), so a trace, which holds addresses, is
//!   readable by its owner alone, and a umask of 0777 does not produce a
//!   trace nobody can read. An existing regular file that is truncated
//!   gets 0600 too (when the caller owns it).
//! - `Output::create` opens with O_NONBLOCK and clears it at once: on an
//!   existing FIFO the open does not wait for a reader, it fails with
//!   ENXIO when there is none ("No such device or address").
//!
//! In a version-2 trace (FORMAT.md section 2) every batch written to the
//! file is followed by its CRC32C; the writer thread computes it and writes
//! batch and trailer with one writev.
//!
//! ## Corner cases
//!
//! - Without a private table, the check and the write are two syscalls: a
//!   program that replaces the descriptor exactly between them gets one
//!   batch (seen in a test that dup2's over the number while the writer is
//!   busy, on a loaded machine: the reason for the private table); a write
//!   that then fails with EBADF still stops the trace.
//! - Between the unshare and the closing of the copies, the writer's table
//!   holds the program's descriptors for a few microseconds, once, when
//!   tracing starts.
//! - A forked child closes its copy of the parent's descriptor, when the
//!   core opened it and the number still names the trace
//!   ([`Output::close_in_forked_child`], from fork.rs): the core forgets the
//!   parent's session in the child (session/mod.rs), so the child never writes
//!   to the parent's trace, nor holds it open (a pipe's reader waiting for
//!   its end, a file a tool waits to be closed). A descriptor the caller
//!   passed is the caller's, and stays.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use alloctrace_format::{batch_checksum, BATCH_PREFIX_LEN, TRAILER_LEN};

/// Where the trace's descriptor goes when the `RLIMIT_NOFILE` soft limit
/// leaves room above it: just past the classic `FD_SETSIZE` range that
/// programs close in a loop.
const HIGH_FD_BASE: u64 = 1024;

/// The lowest descriptor number the core moves its descriptors to (module
/// docs): 1024 with a soft limit of at least 2048, else 7/8 of the limit
/// (at least 3).
pub fn high_fd_base() -> RawFd {
    let soft = soft_limit();
    let base = if soft == libc::RLIM_INFINITY || soft >= 2 * HIGH_FD_BASE {
        HIGH_FD_BASE
    } else {
        soft - soft / 8
    };
    base.clamp(3, i32::MAX as u64) as RawFd
}

/// The `RLIMIT_NOFILE` soft limit (1024 if it cannot be read).
fn soft_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: lim is a valid rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur
    } else {
        HIGH_FD_BASE
    }
}

/// Gives the calling thread a descriptor table of its own
/// (`unshare(CLONE_FILES)`) holding `keep` alone: the copies of the
/// program's other descriptors the unshare made are closed at once
/// (close_range; else those /proc/thread-self/fd lists; else every number
/// below the soft limit), so no pipe of the program stays open because of
/// the tracer's threads. Returns false, changing nothing, where unshare is
/// refused (a seccomp filter). For the tracer's own threads (the writer,
/// the control thread), before tracing needs them: it allocates.
pub(crate) fn private_table(keep: Option<RawFd>) -> bool {
    // SAFETY: unshare(CLONE_FILES) only copies this thread's table.
    if unsafe { libc::unshare(libc::CLONE_FILES) } != 0 {
        return false;
    }
    let close_range = |first: u32, last: u32| {
        // SAFETY: closes descriptors of this thread's private table.
        unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) == 0 }
    };
    let mut closed = match keep {
        None => close_range(0, u32::MAX),
        Some(keep) => {
            (keep == 0 || close_range(0, keep as u32 - 1)) && close_range(keep as u32 + 1, u32::MAX)
        }
    };
    if !closed {
        // Kernels before 5.9.
        if let Ok(dir) = std::fs::read_dir("/proc/thread-self/fd") {
            let fds: Vec<RawFd> = dir
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect();
            for fd in fds.into_iter().filter(|&fd| Some(fd) != keep) {
                // SAFETY: a descriptor of this thread's private table.
                unsafe { libc::close(fd) };
            }
            closed = true;
        }
    }
    if !closed {
        let limit = soft_limit().clamp(keep.map_or(0, |k| k as u64 + 1), 1 << 20) as RawFd;
        for fd in (0..limit).filter(|&fd| Some(fd) != keep) {
            // SAFETY: as above.
            unsafe { libc::close(fd) };
        }
    }
    true
}

/// Moves `fd` to a high number, close-on-exec (module docs).
fn move_high(fd: OwnedFd) -> Result<OwnedFd, i32> {
    for base in [high_fd_base(), 3] {
        // SAFETY: fd is open; F_DUPFD_CLOEXEC takes an int argument.
        let moved = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, base) };
        if moved >= 0 {
            // SAFETY: fcntl returned a new descriptor, ours alone. The old
            // one is closed as `fd` drops.
            return Ok(unsafe { OwnedFd::from_raw_fd(moved) });
        }
        let e = errno();
        if e != libc::EMFILE && e != libc::EINVAL {
            return Err(e);
        }
    }
    // Nothing free at or above 3: keep the number open() gave, unless it
    // is one of the standard three.
    if fd.as_raw_fd() >= 3 {
        Ok(fd)
    } else {
        Err(libc::EMFILE)
    }
}

/// What a descriptor names: `st_dev`, `st_ino`.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
}

/// fstat of `fd`, or errno.
fn fstat(fd: RawFd) -> Result<libc::stat, i32> {
    // SAFETY: an all-zero stat is a valid value to overwrite.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: st is a valid stat to fill; a bad fd gives EBADF.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(errno());
    }
    Ok(st)
}

fn identity(fd: RawFd) -> Result<Identity, i32> {
    fstat(fd).map(|st| Identity {
        dev: st.st_dev,
        ino: st.st_ino,
    })
}

/// The trace's output descriptor.
pub struct Output {
    /// The descriptor written to.
    fd: RawFd,
    /// The same descriptor when the core opened it: closed at stop (or
    /// when the output is dropped) if it is still ours. `None` for a
    /// descriptor the caller passed, and once closed. Only stop and drop
    /// lock it, never the writer.
    owned: Mutex<Option<OwnedFd>>,
    /// What the descriptor named when the output got it; `None` for a
    /// caller's descriptor fstat could not look at (then its writes fail
    /// as they would have).
    identity: Option<Identity>,
    /// Set once the descriptor was found closed or naming another file:
    /// nothing is written to it again, and it is never closed.
    gone: AtomicBool,
    /// Bytes written to the file so far.
    written: AtomicU64,
}

thread_local! {
    /// Set on the writer thread once it has a descriptor table of its own
    /// ([`Output::make_private`]): the program cannot close or replace the
    /// descriptor there, so its writes need no check. Any other thread
    /// that writes (none today) shares the program's table and checks.
    static PRIVATE_TABLE: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

fn in_private_table() -> bool {
    PRIVATE_TABLE.with(|p| p.get())
}

impl Output {
    /// Creates the file at `path`: mode 0600, truncating an existing regular
    /// file, never following a symlink in the last component, at a high
    /// descriptor number (module docs). On an existing FIFO without a
    /// reader it fails at once with ENXIO rather than wait for one.
    /// Returns errno.
    pub fn create(path: &CStr) -> Result<Output, i32> {
        Output::open(
            path,
            libc::O_WRONLY
                | libc::O_CREAT
                | libc::O_TRUNC
                | libc::O_CLOEXEC
                | libc::O_NOFOLLOW
                | libc::O_NONBLOCK,
        )
    }

    /// Creates a new file at `path`, mode 0600, failing with EEXIST if
    /// anything (a file, a symlink) is there already: for output paths in
    /// directories others can write to. At a high descriptor number, as
    /// `create`. Returns errno.
    pub fn create_new(path: &CStr) -> Result<Output, i32> {
        Output::open(
            path,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC | libc::O_NOFOLLOW,
        )
    }

    fn open(path: &CStr, flags: libc::c_int) -> Result<Output, i32> {
        // SAFETY: path is a valid NUL-terminated string.
        let raw = unsafe { libc::open(path.as_ptr(), flags, 0o600 as libc::c_uint) };
        if raw < 0 {
            return Err(errno());
        }
        // SAFETY: open returned a new descriptor, ours alone.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let fd = move_high(fd)?;
        if flags & libc::O_NONBLOCK != 0 {
            // The writer blocks on a full pipe like on a slow disk.
            // SAFETY: fd is open; F_GETFL/F_SETFL take an int.
            unsafe {
                let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
                if fl < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK) != 0
                {
                    return Err(errno());
                }
            }
        }
        let st = fstat(fd.as_raw_fd())?;
        if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_mode & 0o7777 != 0o600 {
            // Whatever the umask; an existing file of another owner keeps
            // its mode (EPERM), as nothing else about it changes either.
            // SAFETY: fd is open.
            unsafe { libc::fchmod(fd.as_raw_fd(), 0o600) };
        }
        Ok(Output {
            fd: fd.as_raw_fd(),
            owned: Mutex::new(Some(fd)),
            identity: Some(Identity {
                dev: st.st_dev,
                ino: st.st_ino,
            }),
            gone: AtomicBool::new(false),
            written: AtomicU64::new(0),
        })
    }

    /// Writes to a descriptor the caller owns: it keeps its number and
    /// stays open after stop, and is checked before every write like the
    /// core's own (module docs).
    pub fn borrowed_fd(fd: libc::c_int) -> Output {
        Output {
            fd,
            owned: Mutex::new(None),
            identity: identity(fd).ok(),
            gone: AtomicBool::new(false),
            written: AtomicU64::new(0),
        }
    }

    /// Bytes written so far (a `save` answers how many its dump took).
    pub(crate) fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// In a forked child (fork.rs, which then forgets the session): closes
    /// the child's copy of the descriptor if the core opened it and the
    /// number still names the trace. No lock is waited for (no other
    /// thread exists; one that held it at the fork is not in the child).
    pub(crate) fn close_in_forked_child(&self) {
        let Ok(mut owned) = self.owned.try_lock() else {
            return;
        };
        if let Some(fd) = owned.take() {
            if self.still_ours() {
                drop(fd);
            } else {
                // The program's now: not ours to close.
                let _ = fd.into_raw_fd();
            }
        }
    }

    /// The descriptor number (for tests and messages).
    pub fn raw_fd(&self) -> RawFd {
        self.fd
    }

    /// Writer thread, before tracing is on: gives the calling thread a
    /// descriptor table of its own (`unshare(CLONE_FILES)`) holding the
    /// trace's descriptor alone, so nothing the program does to its
    /// descriptors (close, dup2, close_range) reaches the one the writer
    /// writes through: the trace goes on, complete. The copies of the
    /// program's other descriptors the unshare made are closed at once
    /// (close_range; else those /proc/thread-self/fd lists; else every
    /// number below the soft limit), so no pipe of the program stays open
    /// because of us. Returns false, changing nothing, where unshare is
    /// refused (a seccomp filter): then every write is checked instead.
    pub(crate) fn make_private(&self) -> bool {
        if !private_table(Some(self.fd)) {
            return false;
        }
        PRIVATE_TABLE.with(|p| p.set(true));
        true
    }

    /// The file offset the next write goes to (`None` for a pipe or a
    /// socket). Writer thread.
    pub(crate) fn position(&self) -> Option<u64> {
        // SAFETY: lseek on a descriptor; an error is returned, not raised.
        let pos = unsafe { libc::lseek(self.fd, 0, libc::SEEK_CUR) };
        u64::try_from(pos).ok()
    }

    /// Empties a regular file and moves back to its start, for a flight
    /// recorder's later dump, which replaces the earlier one. On a pipe or
    /// a socket nothing happens (the later dump follows). Writer thread.
    pub(crate) fn rewind(&self) {
        if self.check().is_err() {
            return;
        }
        // SAFETY: lseek and ftruncate on a descriptor; errors are
        // returned, not raised, and leave the file as it was.
        unsafe {
            if libc::lseek(self.fd, 0, libc::SEEK_SET) == 0 {
                libc::ftruncate(self.fd, 0);
            }
        }
    }

    /// A descriptor of the caller's own for the trace (close-on-exec, at a
    /// high number) and what it names (st_dev, st_ino), when the output's
    /// descriptor, in the calling thread's table, still names the trace.
    pub(crate) fn duplicate_if_ours(&self) -> Option<(RawFd, u64, u64)> {
        let id = self.identity?;
        if self.gone.load(Ordering::Relaxed) || !self.still_ours() {
            return None;
        }
        // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor, ours alone.
        let fd = unsafe { libc::fcntl(self.fd, libc::F_DUPFD_CLOEXEC, high_fd_base()) };
        (fd >= 0).then_some((fd, id.dev, id.ino))
    }

    /// Whether the descriptor, in the calling thread's table, still names
    /// the file it named at open.
    fn still_ours(&self) -> bool {
        match self.identity {
            Some(expected) => identity(self.fd) == Ok(expected),
            None => false,
        }
    }

    /// Checks, before a write, that the descriptor still names the file it
    /// named at open (needless in a private table); the first time it does
    /// not, says so on stderr. Err(EBADF) once gone.
    fn check(&self) -> Result<(), i32> {
        if self.gone.load(Ordering::Relaxed) {
            return Err(libc::EBADF);
        }
        let Some(expected) = self.identity else {
            return Ok(());
        };
        if in_private_table() {
            return Ok(());
        }
        match identity(self.fd) {
            Ok(now) if now == expected => Ok(()),
            Ok(_) | Err(libc::EBADF) => {
                self.lose();
                Err(libc::EBADF)
            }
            Err(e) => Err(e),
        }
    }

    /// Marks the descriptor gone and says so, once.
    fn lose(&self) {
        if self.gone.swap(true, Ordering::Relaxed) {
            return;
        }
        let mut msg = Message::new();
        msg.push(b"alloctrace: the trace file's descriptor ");
        msg.number(self.fd as u64);
        msg.push(b" was closed or replaced by the program; tracing stopped writing, the trace is cut at byte ");
        msg.number(self.written.load(Ordering::Relaxed));
        msg.push(b"\n");
        // SAFETY: one write of a valid buffer to stderr; its result does
        // not matter.
        unsafe { libc::write(2, msg.buf.as_ptr().cast(), msg.len) };
    }

    /// Writes all of `bytes` (the file header: no trailer).
    pub(crate) fn write_all(&self, bytes: &[u8]) -> Result<(), i32> {
        self.write_parts(&[bytes], false)
    }

    /// Writes one batch (its parts one after the other) and its trailer,
    /// in one writev.
    pub(crate) fn write_batch(&self, parts: &[&[u8]]) -> Result<(), i32> {
        self.write_parts(parts, true)
    }

    /// Writes whole batches laid one after the other (as the staged
    /// batches of the compressor are), each followed by its trailer, up to
    /// [`BATCHES_PER_WRITE`] per writev. Bytes that do not frame as a
    /// batch (never written by the core) go out as one batch.
    pub(crate) fn write_batches(&self, mut bytes: &[u8]) -> Result<(), i32> {
        while !bytes.is_empty() {
            let mut batches: [&[u8]; BATCHES_PER_WRITE] = [&[]; BATCHES_PER_WRITE];
            let mut n = 0;
            while n < BATCHES_PER_WRITE && !bytes.is_empty() {
                let len = match bytes.get(1..BATCH_PREFIX_LEN) {
                    Some(l) => {
                        BATCH_PREFIX_LEN + u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize
                    }
                    None => bytes.len(),
                };
                let (batch, rest) = bytes.split_at(len.min(bytes.len()));
                batches[n] = batch;
                bytes = rest;
                n += 1;
            }
            self.write_each(&batches[..n])?;
        }
        Ok(())
    }

    /// Writes `batches`, each with its trailer, in one writev.
    fn write_each(&self, batches: &[&[u8]]) -> Result<(), i32> {
        let mut trailers = [[0u8; TRAILER_LEN]; BATCHES_PER_WRITE];
        let mut iov = [EMPTY_IOVEC; 2 * BATCHES_PER_WRITE];
        for (i, batch) in batches.iter().enumerate().take(BATCHES_PER_WRITE) {
            trailers[i] = batch_checksum(&[batch]).to_le_bytes();
        }
        for (i, batch) in batches.iter().enumerate().take(BATCHES_PER_WRITE) {
            iov[2 * i] = iovec(batch);
            iov[2 * i + 1] = iovec(&trailers[i]);
        }
        self.check()?;
        self.writev_all(&mut iov[..2 * batches.len().min(BATCHES_PER_WRITE)])
    }

    fn write_parts(&self, parts: &[&[u8]], trailer: bool) -> Result<(), i32> {
        const MAX_PARTS: usize = 4;
        let crc = batch_checksum(parts).to_le_bytes();
        let mut iov = [EMPTY_IOVEC; MAX_PARTS + 1];
        let mut n = 0;
        for part in parts.iter().take(MAX_PARTS) {
            iov[n] = iovec(part);
            n += 1;
        }
        debug_assert!(parts.len() <= MAX_PARTS);
        if trailer {
            iov[n] = iovec(&crc);
            n += 1;
        }
        self.check()?;
        self.writev_all(&mut iov[..n])
    }

    /// Writes every byte of `iov`, retrying on EINTR and short writes.
    fn writev_all(&self, iov: &mut [libc::iovec]) -> Result<(), i32> {
        let mut first = 0;
        while first < iov.len() {
            if iov[first].iov_len == 0 {
                first += 1;
                continue;
            }
            let rest = &iov[first..];
            // SAFETY: every iovec points into a live slice of its length.
            let n = unsafe { libc::writev(self.fd, rest.as_ptr(), rest.len() as libc::c_int) };
            if n < 0 {
                let e = errno();
                if e == libc::EINTR || e == libc::EAGAIN {
                    continue;
                }
                if e == libc::EBADF && self.identity.is_some() && !in_private_table() {
                    // Closed between the check and the write.
                    self.lose();
                }
                return Err(e);
            }
            if n == 0 {
                return Err(libc::EIO);
            }
            self.written.fetch_add(n as u64, Ordering::Relaxed);
            let mut n = n as usize;
            while n > 0 && first < iov.len() {
                let len = iov[first].iov_len;
                if n >= len {
                    n -= len;
                    first += 1;
                } else {
                    // SAFETY: n < len: still inside the same slice.
                    iov[first].iov_base = unsafe { iov[first].iov_base.cast::<u8>().add(n) }.cast();
                    iov[first].iov_len = len - n;
                    n = 0;
                }
            }
        }
        Ok(())
    }

    /// Closes the descriptor if it is ours and still names the trace; a
    /// descriptor found gone is left alone (its number is the program's).
    pub(crate) fn close(&self) -> Result<(), i32> {
        let Some(fd) = self.owned.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return Ok(());
        };
        if self.gone.load(Ordering::Relaxed) || !self.still_ours() {
            let _ = fd.into_raw_fd();
            return Ok(());
        }
        // SAFETY: the descriptor is ours and nothing writes to it any more.
        if unsafe { libc::close(fd.into_raw_fd()) } != 0 {
            return Err(errno());
        }
        Ok(())
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if let Some(fd) = self
            .owned
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            if self.gone.load(Ordering::Relaxed) || !self.still_ours() {
                // Not ours any more: never close the program's descriptor.
                let _ = fd.into_raw_fd();
            }
        }
    }
}

/// Batches per writev in [`Output::write_batches`]: two iovecs each, well
/// under IOV_MAX (1024), on the stack.
const BATCHES_PER_WRITE: usize = 64;

const EMPTY_IOVEC: libc::iovec = libc::iovec {
    iov_base: core::ptr::null_mut(),
    iov_len: 0,
};

fn iovec(bytes: &[u8]) -> libc::iovec {
    libc::iovec {
        iov_base: bytes.as_ptr().cast_mut().cast(),
        iov_len: bytes.len(),
    }
}

/// A line for stderr built without allocating (the writer thread must not).
struct Message {
    buf: [u8; 256],
    len: usize,
}

impl Message {
    fn new() -> Message {
        Message {
            buf: [0; 256],
            len: 0,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    fn number(&mut self, mut v: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

#[cfg(test)]
mod tests {
    use super::Output;
    use std::os::fd::AsRawFd;

    const TRACE_END: &[u8] = &[5, 3, 0, 0, 0, 1, 0, 0];

    /// Without a private table (the writer's fallback, and any thread but
    /// the writer): a descriptor the program closed or replaced is never
    /// written to again, nor closed.
    #[test]
    fn a_closed_or_replaced_descriptor_is_never_written_nor_closed() {
        let dir = std::env::temp_dir().join(format!("alloctrace-output-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = std::ffi::CString::new(dir.join("t.trace").to_str().unwrap()).unwrap();

        let out = Output::create(&path).unwrap();
        assert!(out.raw_fd() >= super::high_fd_base());
        out.write_batch(&[TRACE_END]).unwrap();
        let victim = std::fs::File::create(dir.join("victim")).unwrap();
        assert_eq!(
            // SAFETY: replaces the output's number with the victim, as a
            // program could.
            unsafe { libc::dup2(victim.as_raw_fd(), out.raw_fd()) },
            out.raw_fd()
        );
        assert_eq!(out.write_batch(&[TRACE_END]), Err(libc::EBADF));
        assert_eq!(
            out.write_batch(&[TRACE_END]),
            Err(libc::EBADF),
            "gone for good"
        );
        assert_eq!(
            std::fs::metadata(dir.join("victim")).unwrap().len(),
            0,
            "the victim got nothing"
        );
        assert_eq!(
            std::fs::metadata(dir.join("t.trace")).unwrap().len(),
            12,
            "the batch and its trailer"
        );
        let fd = out.raw_fd();
        out.close().unwrap();
        assert!(
            // SAFETY: only asks whether the number is open.
            unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0,
            "the program's descriptor was closed"
        );
        // SAFETY: the test's own dup.
        unsafe { libc::close(fd) };

        let out = Output::create(&path).unwrap();
        // SAFETY: closes the output's number behind its back.
        unsafe { libc::close(out.raw_fd()) };
        assert_eq!(out.write_batch(&[TRACE_END]), Err(libc::EBADF));
        drop(out);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
