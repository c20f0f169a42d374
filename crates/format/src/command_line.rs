//! The process batch's command line (FORMAT.md, "Process").

/// Most bytes of arguments, and most arguments, a process batch carries
/// (FORMAT.md, "Process"): the writer keeps the first 64 KiB of the
/// command line and sets [`PROCESS_TRUNCATED`] when there was more; readers
/// refuse a body above either limit, so a hostile batch cannot make them
/// allocate more.
pub const MAX_COMMAND_LINE: u64 = 64 << 10;

/// In a process batch's `flags`: the command line was longer than
/// [`MAX_COMMAND_LINE`] bytes and was cut (its last argument may be cut
/// too).
pub const PROCESS_TRUNCATED: u64 = 1;

/// The arguments of a command line as Linux keeps it (`/proc/PID/cmdline`):
/// each argument followed by a NUL byte. A last argument without its NUL
/// (a command line cut at [`MAX_COMMAND_LINE`]) counts as an argument; an
/// empty `raw` has none.
pub fn command_line_args(raw: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = (!raw.is_empty()).then(|| raw.strip_suffix(&[0]).unwrap_or(raw));
    core::iter::from_fn(move || {
        let r = rest?;
        match r.iter().position(|&b| b == 0) {
            Some(i) => {
                rest = Some(&r[i + 1..]);
                Some(&r[..i])
            }
            None => {
                rest = None;
                Some(r)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_args_split_at_nul() {
        let args = |raw: &'static [u8]| command_line_args(raw).collect::<alloc::vec::Vec<_>>();
        assert_eq!(args(b"ls\0-l\0"), [&b"ls"[..], b"-l"]);
        assert_eq!(args(b"ls\0\0x\0"), [&b"ls"[..], b"", b"x"]);
        // Cut: the last argument has no NUL.
        assert_eq!(args(b"ls\0-lon"), [&b"ls"[..], b"-lon"]);
        assert_eq!(args(b"\0"), [&b""[..]]);
        assert!(args(b"").is_empty());
    }
}
