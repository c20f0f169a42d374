//! The process batch's content (docs/FORMAT.md, "Process"): the traced
//! program's command line, read once when a session starts, written by
//! meta.rs at the start of every generation (so that each generation
//! stays self-contained, as its modules do).
//!
//! Read from `/proc/self/cmdline` for every session, the C API's and the
//! LD_PRELOAD shim's alike: a forked child's session reads it again, an
//! exec'd program's first session reads its own. Where `/proc` cannot be
//! read (not mounted, a sandbox), the session has no command line and its
//! generations no process batch.

use alloctrace_format::MAX_COMMAND_LINE;

/// The command line as Linux keeps it: each argument followed by a NUL
/// (`alloctrace_format::command_line_args` splits it).
pub(crate) struct CommandLine {
    /// At most `MAX_COMMAND_LINE` bytes.
    pub(crate) raw: Box<[u8]>,
    /// There was more than `MAX_COMMAND_LINE` bytes: `raw` is the start.
    pub(crate) truncated: bool,
}

impl CommandLine {
    /// Reads `/proc/self/cmdline` with plain system calls (open, read,
    /// close), keeping the first `MAX_COMMAND_LINE` bytes; `None` when it
    /// cannot be read. `errno` is left as it was.
    ///
    /// Runs at session start only (under CONTROL, never inside the host's
    /// malloc); it allocates the one buffer it returns.
    pub(crate) fn read() -> Option<CommandLine> {
        // SAFETY: __errno_location returns the calling thread's errno,
        // valid for the thread's lifetime.
        let errno = unsafe { *libc::__errno_location() };
        let result = Self::read_file();
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = errno };
        result
    }

    fn read_file() -> Option<CommandLine> {
        let max = MAX_COMMAND_LINE as usize;
        // SAFETY: the path is a NUL-terminated string.
        let fd = unsafe {
            libc::open(
                c"/proc/self/cmdline".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return None;
        }
        // One byte more than kept: whether there was more.
        let mut buf = vec![0u8; max + 1];
        let mut len = 0;
        let ok = loop {
            let Some(rest) = buf.get_mut(len..) else {
                break true;
            };
            if rest.is_empty() {
                break true;
            }
            // SAFETY: `rest` is writable for its length.
            let n = unsafe { libc::read(fd, rest.as_mut_ptr().cast(), rest.len()) };
            match n {
                0 => break true,
                n if n > 0 => len += n as usize,
                // SAFETY: as in `read`.
                _ if unsafe { *libc::__errno_location() } == libc::EINTR => {}
                _ => break false,
            }
        };
        // SAFETY: fd is the descriptor opened above, closed once.
        unsafe { libc::close(fd) };
        if !ok {
            return None;
        }
        let truncated = len > max;
        buf.truncate(len.min(max));
        Some(CommandLine {
            raw: buf.into_boxed_slice(),
            truncated,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::CommandLine;

    #[test]
    fn the_command_line_is_this_process_s() {
        let cmd = CommandLine::read().expect("/proc/self/cmdline");
        let args: Vec<_> = alloctrace_format::command_line_args(&cmd.raw)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let want: Vec<_> = std::env::args().collect();
        assert_eq!(args, want);
        assert!(!cmd.truncated);
    }
}
