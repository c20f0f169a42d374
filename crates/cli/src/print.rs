//! Writing to the terminal: text from a trace made safe to show
//! ([`printable`], [`json_text`]), the labels and warnings every reading
//! command prints, and writes to stdout and stderr that a closed pipe does
//! not turn into a panic.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::{self, Write};

use crate::failure::Failure;

/// `label: ` before a message about a labelled trace.
pub fn prefix(label: Option<&str>) -> String {
    label
        .map(|l| format!("{}: ", printable(l)))
        .unwrap_or_default()
}

/// `text` with its control characters escaped (`\n`, `\t`, `\u{1b}`,
/// `\u{7f}`, `\u{9b}`: C0, DEL and C1), for every text output that shows
/// a string from a trace (a name, a path, the command line) or a file
/// name: it cannot then break a line of the output, forge one, or drive
/// the terminal (set its title, write its clipboard). Invalid UTF-8 never
/// reaches it: the reader decodes names lossily (U+FFFD). JSON outputs do
/// not use it: serde_json escapes, and the value stays the trace's own.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `value` as one line of JSON (no newline), for the `--json` outputs.
/// serde_json escapes C0 (`\u001b`, `\n`) but leaves DEL and C1 raw,
/// which JSON allows; they are escaped too (`\u007f`, `\u009b`), so the
/// line is as safe on a terminal as the text output, and decodes to the
/// same value. They can only occur inside strings: JSON's own syntax is
/// ASCII.
pub fn json_text(value: &serde_json::Value) -> String {
    let text = value.to_string();
    if !text.chars().any(char::is_control) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// The warning every command prints for a cut-off trace.
pub fn truncation_warning(offset: u64) -> String {
    format!(
        "warning: trace truncated at byte offset {offset} (the process was probably killed); showing every complete batch before it"
    )
}

/// Maps a failed write to stdout: a closed pipe (`| head`) ends quietly.
pub fn output_error(err: io::Error) -> Failure {
    if err.kind() == io::ErrorKind::BrokenPipe {
        Failure::Verdict(0)
    } else {
        Failure::Io(format!("cannot write the output: {err}"))
    }
}

/// Writes to stdout without panicking on a closed pipe (print! would).
pub fn print_stdout(text: &str) -> Result<(), Failure> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(output_error)
}

/// Writes to stderr without panicking (eprint! panics when stderr is a
/// closed pipe or a full disk): a message that cannot be written is lost,
/// and the exit status stays the command's.
pub fn print_stderr(text: &str) {
    let mut err = io::stderr().lock();
    let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_escapes_c0_del_and_c1_only() {
        let hostile = "a\u{1b}]0;t\u{7}\r\n\tb\u{7f}\u{9b}\u{a0}é\\";
        assert_eq!(
            printable(hostile),
            r"a\u{1b}]0;t\u{7}\r\n\tb\u{7f}\u{9b}".to_string() + "\u{a0}é\\"
        );
        assert!(matches!(printable("plain é"), Cow::Borrowed(_)));
    }

    #[test]
    fn json_text_escapes_every_control_and_keeps_the_value() {
        let value = serde_json::Value::from("a\u{1b}\n\u{7f}\u{9b}\u{a0}\"\\");
        let text = json_text(&value);
        assert_eq!(
            text,
            r#""a\u001b\n\u007f\u009b"#.to_string() + "\u{a0}\\\"\\\\\""
        );
        assert!(!text.chars().any(char::is_control), "{text}");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&text).unwrap(),
            value
        );
    }
}
