//! The one error type of the reader: what went wrong and at which byte.

use std::fmt;
use std::io;

/// Why a trace could not be read, and the byte offset (from the start of the
/// file) of the item that was bad.
///
/// Display gives `malformed trace at byte offset N: what` for a file that
/// breaks the format, and `I/O error at byte offset N: ...` when the input
/// itself failed.
#[derive(Debug)]
pub struct ReadError {
    offset: u64,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Malformed(String),
    Io(io::Error),
}

impl ReadError {
    pub(crate) fn malformed(offset: u64, what: impl Into<String>) -> ReadError {
        ReadError {
            offset,
            kind: Kind::Malformed(what.into()),
        }
    }

    pub(crate) fn io(offset: u64, err: io::Error) -> ReadError {
        ReadError {
            offset,
            kind: Kind::Io(err),
        }
    }

    /// Byte offset from the start of the file where the bad item starts (for
    /// an I/O error: where reading failed).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// True when the trace breaks the format; false for an I/O error.
    pub fn is_malformed(&self) -> bool {
        matches!(self.kind, Kind::Malformed(_))
    }

    /// What was wrong, without the offset prefix.
    pub fn what(&self) -> String {
        match &self.kind {
            Kind::Malformed(what) => what.clone(),
            Kind::Io(err) => err.to_string(),
        }
    }

    /// This error, found in the decompressed data of the compressed batch
    /// at file offset `batch_offset`, where `self.offset()` counts from the
    /// start of that data: reported at the compressed batch, which is in
    /// the file (FORMAT.md section 2.1), naming the inner byte.
    pub(crate) fn inside_compressed(self, batch_offset: u64) -> ReadError {
        ReadError::malformed(
            batch_offset,
            format!(
                "inside the compressed batch, at byte {} of its decompressed data: {}",
                self.offset,
                self.what()
            ),
        )
    }

    /// A copy, returned again by a reader that already failed (io::Error is
    /// not Clone, so an I/O error keeps its kind and message only).
    pub(crate) fn replay(&self) -> ReadError {
        let kind = match &self.kind {
            Kind::Malformed(what) => Kind::Malformed(what.clone()),
            Kind::Io(err) => Kind::Io(io::Error::new(err.kind(), err.to_string())),
        };
        ReadError {
            offset: self.offset,
            kind,
        }
    }
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Malformed(what) => write!(
                f,
                "malformed trace at byte offset {}: {}",
                self.offset, what
            ),
            Kind::Io(err) => write!(f, "I/O error at byte offset {}: {}", self.offset, err),
        }
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            Kind::Malformed(_) => None,
            Kind::Io(err) => Some(err),
        }
    }
}
