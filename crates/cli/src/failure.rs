//! Why a command failed, which decides its exit code (main.rs maps it).

use alloctrace_reader::ReadError;

/// Why a command failed, which decides the exit code.
pub enum Failure {
    /// Usage, open or I/O error: exit 1.
    Io(String),
    /// The trace breaks the format: exit 2.
    Malformed(ReadError),
    /// `check` found a problem and printed it: exit with this code.
    Verdict(u8),
}

impl From<ReadError> for Failure {
    fn from(err: ReadError) -> Failure {
        if err.is_malformed() {
            Failure::Malformed(err)
        } else {
            Failure::Io(err.to_string())
        }
    }
}
