//! The control channel's names and words (docs/PRELOAD.md, "The control
//! socket"), shared by the traced process (the writer core answers) and
//! the `alloctrace` command (`ps`, `snapshot`, `save` ask), so the two
//! cannot drift apart. Not part of the trace format: a traced process
//! speaks it over a unix stream socket, never into a trace.
//!
//! ## Where
//!
//! One socket per traced process, `PID.sock`, in a private directory
//! (mode 0700, owned by the user): `$XDG_RUNTIME_DIR/alloctrace` when
//! `XDG_RUNTIME_DIR` names a directory, else `/tmp/alloctrace-UID` (the effective
//! uid). A reader looks in both, since a service and the shell asking
//! about it may not share `XDG_RUNTIME_DIR`.
//!
//! ## The protocol
//!
//! The client sends one request line, a word ([`INFO`], [`SNAPSHOT`],
//! [`SAVE`]) and a newline, at most [`MAX_REQUEST`] bytes; [`SAVE`]
//! passes a descriptor with it (SCM_RIGHTS, in the same sendmsg). The process
//! answers one status line, `ok LEN` (then exactly `LEN` bytes of
//! payload) or `error MESSAGE`, and closes the connection. The payload of
//! every answer so far is text, one `key value` per line ([`KEY_PID`]...);
//! a client ignores keys it does not know, so answers may grow.

/// The directory under `$XDG_RUNTIME_DIR`.
pub const XDG_DIR_NAME: &str = "alloctrace";
/// The directory without `XDG_RUNTIME_DIR`: this, then the effective uid.
pub const TMP_DIR_PREFIX: &str = "/tmp/alloctrace-";
/// A socket's name: the pid, then this.
pub const SOCKET_SUFFIX: &str = ".sock";

/// Request: who the process is. Payload keys: [`KEY_PID`],
/// [`KEY_COMMAND`], [`KEY_MODE`], [`KEY_TRACE`].
pub const INFO: &str = "info";
/// Request: what is live now, and where it was allocated. The process
/// ends its current generation and, once its writer thread has moved it,
/// answers with a *snapshot trace* as the payload (binary, not `key
/// value` lines): a trace of its own (file header, one generation
/// numbered as the one ended, an event per live object, the call stacks
/// they use, the trace end) written from the writer thread's live table.
/// Its length may pass [`MAX_PAYLOAD`]: a client accepts up to
/// [`MAX_SNAPSHOT_PAYLOAD`] for it.
pub const SNAPSHOT: &str = "snapshot";
/// Request: write the flight recorder's generations, a trace of their
/// own, into the descriptor passed with the request (SCM_RIGHTS: the
/// client opens the output file, so its path, permissions and mount
/// namespace are the client's, and the dump goes from the ring straight
/// into it, no copy through the socket). Answered once written:
/// [`KEY_FIRST`] and [`KEY_GENERATION`] (the first and last generations,
/// both 0 when none was complete) and [`KEY_BYTES`] (the bytes written).
/// An error outside flight-recorder mode ([`NOT_FLIGHT_RECORDER`]),
/// without a descriptor, or with one that is not a regular file's.
pub const SAVE: &str = "save";

/// The status word of a successful answer.
pub const OK: &str = "ok";
/// The status word of a refusal; the rest of the line says why.
pub const ERROR: &str = "error";

/// The longest request line, newline included.
pub const MAX_REQUEST: usize = 256;
/// The longest answer payload a client accepts (but for [`SNAPSHOT`]).
pub const MAX_PAYLOAD: u64 = 1 << 20;
/// The longest snapshot trace a client accepts: read as it comes, never
/// allocated up front.
pub const MAX_SNAPSHOT_PAYLOAD: u64 = 1 << 36;

/// Payload key: the process ID.
pub const KEY_PID: &str = "pid";
/// Payload key: the command line, arguments separated by spaces.
pub const KEY_COMMAND: &str = "command";
/// Payload key: one of [`MODE_FULL`], [`MODE_NO_STACKS`],
/// [`MODE_SAMPLING`], [`MODE_FLIGHT_RECORDER`].
pub const KEY_MODE: &str = "mode";
/// Payload key: the trace's path (`/proc/PID/fd` names it; a pipe or a
/// socket reads as `pipe:[N]` or `socket:[N]`).
pub const KEY_TRACE: &str = "trace";
/// Payload key: a generation.
pub const KEY_GENERATION: &str = "generation";
/// Payload key: the first generation of a range ([`KEY_GENERATION`] its
/// last).
pub const KEY_FIRST: &str = "first";
/// Payload key: a byte count.
pub const KEY_BYTES: &str = "bytes";

/// Mode: every event, with call stacks.
pub const MODE_FULL: &str = "full";
/// Mode: every event, no call stacks.
pub const MODE_NO_STACKS: &str = "no stacks";
/// Mode: sampled allocations.
pub const MODE_SAMPLING: &str = "sampling";
/// Mode: the flight recorder (generations kept in memory).
pub const MODE_FLIGHT_RECORDER: &str = "flight-recorder";

/// The answer to [`SAVE`] outside flight-recorder mode.
pub const NOT_FLIGHT_RECORDER: &str = "not in flight-recorder mode";

/// Whether a peer of uid `peer` may talk to a process of effective uid
/// `own`: the same user only. Root is no exception: the socket answers
/// with the process's memory layout, and root can ask as the user.
pub fn peer_allowed(peer: u32, own: u32) -> bool {
    peer == own
}

/// The pid a socket's file name stands for (`1234.sock`), if it is one.
pub fn pid_of_socket_name(name: &str) -> Option<u32> {
    let digits = name.strip_suffix(SOCKET_SUFFIX)?;
    if digits.is_empty() || digits.len() > 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&pid| pid > 0)
}

/// A request line's word (`info\n` gives `info`), if the line is one:
/// trimmed of its newline and blanks, ASCII letters only.
pub fn request_word(line: &[u8]) -> Option<&str> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let word = core::str::from_utf8(line).ok()?.trim();
    (!word.is_empty() && word.bytes().all(|b| b.is_ascii_lowercase())).then_some(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_user_is_allowed() {
        assert!(peer_allowed(1000, 1000));
        assert!(!peer_allowed(1001, 1000));
        assert!(!peer_allowed(0, 1000), "root asks as the user");
        assert!(!peer_allowed(65534, 0));
        assert!(peer_allowed(0, 0));
    }

    #[test]
    fn socket_names() {
        assert_eq!(pid_of_socket_name("1234.sock"), Some(1234));
        assert_eq!(pid_of_socket_name("0.sock"), None);
        assert_eq!(pid_of_socket_name(".sock"), None);
        assert_eq!(pid_of_socket_name("12a.sock"), None);
        assert_eq!(pid_of_socket_name("1234"), None);
        assert_eq!(pid_of_socket_name("99999999999.sock"), None);
    }

    #[test]
    fn request_words() {
        assert_eq!(request_word(b"info\n"), Some("info"));
        assert_eq!(request_word(b" snapshot \n"), Some("snapshot"));
        assert_eq!(request_word(b"save"), Some("save"));
        assert_eq!(request_word(b"\n"), None);
        assert_eq!(request_word(b"INFO\n"), None);
        assert_eq!(request_word(b"in fo\n"), None);
        assert_eq!(request_word(&[0xff, b'\n']), None);
    }
}
