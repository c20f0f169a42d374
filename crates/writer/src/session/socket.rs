//! The control socket's mechanics: its private directory, the listening
//! socket, and the peer check of each connection. What the socket answers
//! is channel.rs's; the names and words are the format crate's
//! (`alloctrace_format::control`, shared with the `alloctrace` command).
//!
//! ## Invariants
//!
//! 1. The directory MUST be a real directory (not a symbolic link) owned by
//!    the effective uid, mode 0700 (set when it is ours and looser, e.g.
//!    made under a umask that left it 0000). Otherwise another user could
//!    plant or read the socket: no socket is made.
//! 2. Every connection's peer uid (SO_PEERCRED) MUST pass
//!    `control::peer_allowed` before its request is read (a refused
//!    peer's is drained unread, so that closing does not reset the
//!    connection before the refusal arrives).
//!    Otherwise another user could read the process's heap layout; the
//!    directory's mode is the first fence, this the second (a descriptor
//!    passed on, a directory made by hand).
//! 3. A listening descriptor in the program's table (no private table:
//!    unshare refused) MUST be checked (fstat: the inode the socket had)
//!    before each use, and never closed once it is found replaced: the
//!    number is the program's then. Otherwise the tracer would accept on,
//!    or close, a descriptor of the program's.
//! 4. The socket's file MUST be removed only while it is the one this
//!    listener bound (same inode). Otherwise a process's exit could remove
//!    the socket of a later process that reused the pid.

use std::cell::Cell;
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::{FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use alloctrace_format::control;

/// The effective uid.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// The directory of this user's sockets: `$XDG_RUNTIME_DIR/alloctrace`
/// when `XDG_RUNTIME_DIR` names a directory (it is often set but missing
/// under sudo or in containers), else `/tmp/alloctrace-UID` (format
/// crate, `control`).
pub(crate) fn directory() -> PathBuf {
    let runtime =
        std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty() && Path::new(d).is_dir());
    match runtime {
        Some(runtime) => Path::new(&runtime).join(control::XDG_DIR_NAME),
        None => PathBuf::from(format!("{}{}", control::TMP_DIR_PREFIX, euid())),
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn c_path(path: &Path) -> Option<CString> {
    CString::new(path.as_os_str().as_bytes()).ok()
}

/// Makes `dir` (mode 0700) if it is missing, and checks it (invariant 1).
pub(crate) fn private_directory(dir: &Path) -> Result<(), String> {
    let c = c_path(dir).ok_or("a NUL in the directory's path")?;
    // SAFETY: c is a NUL-terminated path.
    if unsafe { libc::mkdir(c.as_ptr(), 0o700) } != 0 && errno() != libc::EEXIST {
        return Err(format!(
            "cannot make {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: an all-zero stat is a valid value to fill.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: c is a path, st a stat to fill.
    if unsafe { libc::lstat(c.as_ptr(), &mut st) } != 0 {
        return Err(format!(
            "cannot stat {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        ));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if st.st_uid != euid() {
        return Err(format!("{} belongs to another user", dir.display()));
    }
    if st.st_mode & 0o777 != 0o700 {
        // SAFETY: c is a path; the directory is ours (checked above).
        if unsafe { libc::chmod(c.as_ptr(), 0o700) } != 0 {
            return Err(format!("cannot make {} private", dir.display()));
        }
    }
    Ok(())
}

/// `fstat`'s (st_dev, st_ino) of `fd`, or of `path` by `lstat`.
fn identity(fd: Option<RawFd>, path: Option<&CString>) -> Option<(u64, u64)> {
    // SAFETY: an all-zero stat is a valid value to fill.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    let ok = match (fd, path) {
        // SAFETY: fstat of a number; an error is returned, not raised.
        (Some(fd), _) => unsafe { libc::fstat(fd, &mut st) == 0 },
        // SAFETY: path is NUL-terminated, st a stat to fill.
        (None, Some(p)) => unsafe { libc::lstat(p.as_ptr(), &mut st) == 0 },
        (None, None) => false,
    };
    ok.then_some((st.st_dev, st.st_ino))
}

/// A listening control socket.
pub(crate) struct Listener {
    fd: RawFd,
    /// The address it was bound to.
    addr: libc::sockaddr_un,
    /// The socket's file.
    path: CString,
    /// What `fd` names (fstat), to tell it from a descriptor the program
    /// put at its number (invariant 3).
    fd_identity: Option<(u64, u64)>,
    /// What the socket's file is (lstat), to remove only our own
    /// (invariant 4).
    file_identity: Option<(u64, u64)>,
    /// In the program's descriptor table: checked before each use.
    shared: bool,
}

impl Listener {
    /// Binds `DIR/PID.sock` and listens. A file left there (a process of
    /// that pid that died without removing it) is replaced. `shared`: the
    /// calling thread's descriptor table is the program's, so the
    /// descriptor moves to a high number (writer/output.rs).
    pub(crate) fn bind(dir: &Path, pid: u32, shared: bool) -> Result<Listener, String> {
        let path = dir.join(format!("{pid}{}", control::SOCKET_SUFFIX));
        let c = c_path(&path).ok_or("a NUL in the socket's path")?;
        // SAFETY: an all-zero sockaddr_un is valid.
        let mut addr: libc::sockaddr_un = unsafe { core::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let bytes = c.as_bytes();
        if bytes.len() >= addr.sun_path.len() {
            return Err(format!(
                "{}: the path is too long for a socket",
                path.display()
            ));
        }
        for (d, &b) in addr.sun_path.iter_mut().zip(bytes) {
            *d = b as libc::c_char;
        }
        // SAFETY: plain socket creation.
        let mut fd =
            unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(format!("socket: {}", std::io::Error::last_os_error()));
        }
        if shared {
            let base = crate::writer::output::high_fd_base();
            // SAFETY: fd is ours; F_DUPFD_CLOEXEC takes an int.
            let moved = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, base) };
            if moved >= 0 {
                // SAFETY: fd is ours, replaced by `moved`.
                unsafe { libc::close(fd) };
                fd = moved;
            }
        }
        // SAFETY: c is a path. The pid is ours, so the file is a dead
        // process's, or ours from an earlier session.
        unsafe { libc::unlink(c.as_ptr()) };
        let len = core::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        // SAFETY: addr is a filled sockaddr_un of `len` bytes.
        let bound = unsafe { libc::bind(fd, (&addr as *const libc::sockaddr_un).cast(), len) } == 0;
        // SAFETY: listen on our socket.
        if !bound || unsafe { libc::listen(fd, 16) } != 0 {
            let err = std::io::Error::last_os_error();
            // SAFETY: fd is ours.
            unsafe { libc::close(fd) };
            if bound {
                // SAFETY: c is the path we bound.
                unsafe { libc::unlink(c.as_ptr()) };
            }
            return Err(format!("cannot listen on {}: {err}", path.display()));
        }
        Ok(Listener {
            fd,
            addr,
            fd_identity: identity(Some(fd), None),
            file_identity: identity(None, Some(&c)),
            path: c,
            shared,
        })
    }

    /// The socket's file.
    pub(crate) fn path(&self) -> &Path {
        Path::new(OsStr::from_bytes(self.path.as_bytes()))
    }

    /// The address it listens at.
    pub(crate) fn addr(&self) -> libc::sockaddr_un {
        self.addr
    }

    /// The listening descriptor, while it is still ours (invariant 3).
    pub(crate) fn fd(&self) -> Option<RawFd> {
        (!self.shared || identity(Some(self.fd), None) == self.fd_identity).then_some(self.fd)
    }

    /// The number, if it is in the program's table (the fork handler of a
    /// child closes its copy).
    pub(crate) fn shared_fd(&self) -> Option<RawFd> {
        self.shared.then_some(self.fd)
    }

    /// Whether the socket's file is still the one this listener bound.
    pub(crate) fn file_is_ours(&self) -> bool {
        self.file_identity.is_some() && identity(None, Some(&self.path)) == self.file_identity
    }

    /// Accepts one connection and checks its peer (invariant 2). `Ok(None)`
    /// when nothing was waiting; `Err` with the refused peer's uid, the
    /// connection answered with an error line and closed.
    pub(crate) fn accept(&self) -> Result<Option<Connection>, u32> {
        let Some(fd) = self.fd() else {
            return Ok(None);
        };
        // SAFETY: accept4 on our listening socket, no address wanted.
        let conn = unsafe {
            libc::accept4(
                fd,
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if conn < 0 {
            return Ok(None);
        }
        let conn = Connection(conn, Cell::new(None));
        let uid = conn.peer_uid();
        match uid {
            Some(uid) if control::peer_allowed(uid, euid()) => Ok(Some(conn)),
            _ => {
                let _ = conn.write_all(
                    format!("{} another user's connection is refused\n", control::ERROR).as_bytes(),
                );
                conn.discard_request();
                Err(uid.unwrap_or(u32::MAX))
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if self.file_is_ours() {
            // SAFETY: the path is our socket's file (invariant 4).
            unsafe { libc::unlink(self.path.as_ptr()) };
        }
        if let Some(fd) = self.fd() {
            // SAFETY: still our descriptor (invariant 3).
            unsafe { libc::close(fd) };
        }
    }
}

/// Connects to `addr` and closes at once: wakes a thread polling its
/// listener. Allocates nothing (stop calls it with tracing on).
pub(crate) fn poke(addr: &libc::sockaddr_un) {
    // SAFETY: plain socket creation.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return;
    }
    let len = core::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: addr is a filled sockaddr_un of `len` bytes; fd is ours.
    unsafe {
        libc::connect(fd, (addr as *const libc::sockaddr_un).cast(), len);
        libc::close(fd);
    }
}

/// One accepted connection, closed on drop, and the descriptor its
/// request passed (SCM_RIGHTS), if any.
pub(crate) struct Connection(RawFd, Cell<Option<OwnedFd>>);

impl Connection {
    /// The peer's uid (SO_PEERCRED).
    fn peer_uid(&self) -> Option<u32> {
        // SAFETY: an all-zero ucred is valid.
        let mut cred: libc::ucred = unsafe { core::mem::zeroed() };
        let mut len = core::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: cred and len describe a ucred-sized buffer.
        let ok = unsafe {
            libc::getsockopt(
                self.0,
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        } == 0;
        ok.then_some(cred.uid)
    }

    /// Reads the request line (up to its newline, at most
    /// `control::MAX_REQUEST` bytes), waiting at most about a second for
    /// it: a client that connects and says nothing holds nobody up long.
    /// A descriptor passed with the request (`save` passes its output
    /// file's) is kept for [`Connection::take_passed`]; any other is
    /// closed.
    pub(crate) fn read_request(&self) -> Vec<u8> {
        let mut line = Vec::new();
        let mut buf = [0u8; 64];
        let timeout = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        // SAFETY: a timeval of its size for SO_RCVTIMEO.
        unsafe {
            libc::setsockopt(
                self.0,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                core::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        while line.len() < control::MAX_REQUEST && !line.contains(&b'\n') {
            let n = self.receive(&mut buf);
            if n == 0 {
                break;
            }
            line.extend_from_slice(&buf[..n]);
        }
        line
    }

    /// One recvmsg into `buf`: the bytes read (0 at the end or on an
    /// error), and the descriptors passed with them taken out of the
    /// ancillary data (close-on-exec; the first kept, the rest closed).
    fn receive(&self, buf: &mut [u8]) -> usize {
        /// Room for the ancillary data of a few descriptors, aligned as
        /// cmsghdr wants.
        #[repr(C, align(8))]
        struct Control([u8; 64]);
        let mut control = Control([0; 64]);
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: an all-zero msghdr is valid (no name, no buffers).
        let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.0.as_mut_ptr().cast();
        msg.msg_controllen = control.0.len() as _;
        // SAFETY: msg points at buffers alive for the call, of their
        // lengths.
        let n = unsafe { libc::recvmsg(self.0, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        // SAFETY: the kernel filled msg_control up to msg_controllen;
        // CMSG_FIRSTHDR and CMSG_NXTHDR stay inside it.
        let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
        while !cmsg.is_null() {
            // SAFETY: cmsg is a header inside the filled control data.
            let (level, kind, len) =
                unsafe { ((*cmsg).cmsg_level, (*cmsg).cmsg_type, (*cmsg).cmsg_len) };
            if level == libc::SOL_SOCKET && kind == libc::SCM_RIGHTS {
                // SAFETY: as above; the data follows the header.
                let data = unsafe { libc::CMSG_DATA(cmsg) };
                let header = data as usize - cmsg as usize;
                let count = len.saturating_sub(header) / core::mem::size_of::<RawFd>();
                for i in 0..count {
                    // SAFETY: an SCM_RIGHTS payload is `count` whole
                    // descriptors, each installed in our table for us.
                    let fd = unsafe {
                        OwnedFd::from_raw_fd(data.cast::<RawFd>().add(i).read_unaligned())
                    };
                    // The first is kept; any other is closed (dropped).
                    match self.1.take() {
                        Some(first) => self.1.set(Some(first)),
                        None => self.1.set(Some(fd)),
                    }
                }
            }
            // SAFETY: as for CMSG_FIRSTHDR.
            cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
        }
        n.max(0) as usize
    }

    /// The descriptor the request passed, if any (once).
    pub(crate) fn take_passed(&self) -> Option<OwnedFd> {
        self.1.take()
    }

    /// After a refusal: ends the writing side and drops what the peer
    /// sent (at most a request's length, a second at most), so that the
    /// close does not reset the connection and lose the refusal.
    fn discard_request(&self) {
        // SAFETY: shutdown of our connection's writing side.
        unsafe { libc::shutdown(self.0, libc::SHUT_WR) };
        drop(self.read_request());
    }

    /// Writes all of `bytes` (MSG_NOSIGNAL: a client gone is no SIGPIPE).
    pub(crate) fn write_all(&self, mut bytes: &[u8]) -> Result<(), i32> {
        while !bytes.is_empty() {
            // SAFETY: bytes is readable for its length.
            let n = unsafe {
                libc::send(
                    self.0,
                    bytes.as_ptr().cast(),
                    bytes.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if n < 0 {
                let e = errno();
                if e == libc::EINTR {
                    continue;
                }
                return Err(e);
            }
            bytes = &bytes[n as usize..];
        }
        Ok(())
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // SAFETY: the accepted descriptor is ours alone.
        unsafe { libc::close(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("alloctrace-sock-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn the_directory_is_made_private_and_a_link_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("dir");
        private_directory(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_directory(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "a looser mode is tightened");
        let link = scratch("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(
            private_directory(&link).is_err(),
            "a symbolic link is refused"
        );
        std::fs::remove_file(&link).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_listener_removes_its_file_only_while_it_is_its_own() {
        let dir = scratch("listen");
        private_directory(&dir).unwrap();
        let first = Listener::bind(&dir, 4242, false).unwrap();
        assert!(first.file_is_ours());
        let second = Listener::bind(&dir, 4242, false).unwrap();
        assert!(!first.file_is_ours(), "replaced by the second");
        drop(first);
        assert!(second.path().exists(), "the first leaves the second's file");
        let path = second.path().to_path_buf();
        drop(second);
        assert!(!path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_shared_listener_gives_up_a_number_the_program_reused() {
        let dir = scratch("shared");
        private_directory(&dir).unwrap();
        let listener = Listener::bind(&dir, 4343, true).unwrap();
        let fd = listener.fd().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        use std::os::unix::io::AsRawFd;
        // The program puts a file of its own at the socket's number.
        // SAFETY: dup2 onto the listener's number, as a program might.
        assert_eq!(unsafe { libc::dup2(file.as_raw_fd(), fd) }, fd);
        assert_eq!(listener.fd(), None, "found replaced");
        assert!(matches!(listener.accept(), Ok(None)));
        drop(listener);
        // SAFETY: fcntl on a number: still open, the listener left it.
        assert!(unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0);
        // SAFETY: the program's copy, ours to close here.
        unsafe { libc::close(fd) };
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
