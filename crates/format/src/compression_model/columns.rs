//! The columns of a modeled stream: their order, and the writer and
//! reader of one column's bytes.

use alloc::vec::Vec;

use crate::varint::{get_uvarint, put_uvarint, MAX_VARINT_LEN};

/// Number of columns of a modeled stream. In stream order:
///
/// 0. batches: per batch its form, and a modeled batch's header;
/// 1. verbatim: the bytes of batches copied as they are;
/// 2. kinds: one kind byte per event;
/// 3. times: time deltas;
/// 4. ids: modeled heap-object IDs (kinds 4, 5, 6 and 11), 0 for an
///    escape;
/// 5. escapes: the raw value of every escaped heap-object ID;
/// 6. sizes: sizes of heap-object allocations and exists events;
/// 7. args: every other argument (a stack event's stack ID among them);
/// 8. tags: entry tags, XORed with the previous tag of the same kind byte.
pub const COLUMNS: usize = 9;
pub(super) const BATCHES: usize = 0;
pub(super) const VERBATIM: usize = 1;

/// Batch forms in the BATCHES column.
pub(super) const FORM_VERBATIM: u64 = 0;
pub(super) const FORM_EVENTS: u64 = 1;

/// Reads a varint, with the one-byte case inline.
#[inline(always)]
pub(super) fn read_varint(buf: &[u8], pos: &mut usize) -> Result<u64, crate::varint::VarintError> {
    match buf.get(*pos) {
        Some(&b) if b < 0x80 => {
            *pos += 1;
            Ok(u64::from(b))
        }
        _ => get_uvarint(buf, pos),
    }
}

/// Reads a varint that must be in its shortest form (one of more than a
/// byte whose last byte is 0 is not); `Err` for any other.
#[inline(always)]
pub(super) fn read_canonical_varint(buf: &[u8], pos: &mut usize) -> Result<u64, NotExact> {
    let start = *pos;
    let v = read_varint(buf, pos).map_err(|_| NotExact)?;
    if *pos - start > 1 && buf.get(*pos - 1) == Some(&0) {
        return Err(NotExact);
    }
    Ok(v)
}

#[inline]
pub(super) fn push_varint(out: &mut Vec<u8>, v: u64) {
    let mut buf = [0u8; MAX_VARINT_LEN];
    let n = put_uvarint(&mut buf, 0, v);
    out.extend_from_slice(buf.get(..n).unwrap_or(&buf));
}

/// A batch the encoder must copy verbatim: it does not parse exactly.
#[derive(Debug)]
pub(super) struct NotExact;

/// Most bytes any column gains from a modeled events batch of payload
/// length `len`, plus its batch header. Every event takes at least 3
/// bytes of payload; the widest growth is an entry tag (1 byte) whose
/// XOR takes 10, or an allocation (at least 5 bytes) whose escape takes
/// 10: under 3 bytes per payload byte.
pub(super) const fn column_room(len: usize) -> usize {
    3 * len + 64
}

/// A column being written: a slice with room for the batch and a cursor
/// kept in a local, so byte stores need not reload it.
pub(super) struct ColumnWriter<'a> {
    pub(super) bytes: &'a mut [u8],
    pub(super) pos: usize,
}

impl ColumnWriter<'_> {
    #[inline(always)]
    pub(super) fn byte(&mut self, b: u8) {
        if let Some(slot) = self.bytes.get_mut(self.pos) {
            *slot = b;
        }
        self.pos += 1;
    }

    #[inline(always)]
    pub(super) fn varint(&mut self, v: u64) {
        if v < 0x80 {
            self.byte(v as u8);
        } else {
            self.pos = put_uvarint(self.bytes, self.pos, v);
        }
    }
}

/// Where and why a modeled stream is malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelError {
    /// Offset in the modeled stream of the byte the decoder could not use.
    pub at: u64,
    /// What is wrong, for messages.
    pub what: &'static str,
}

/// One column of a stream being decoded.
pub(super) struct Column<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) pos: usize,
    /// Offset of the column in the stream, for errors.
    pub(super) start: u64,
}

impl<'a> Column<'a> {
    #[inline]
    pub(super) fn error(&self, what: &'static str) -> ModelError {
        ModelError {
            at: self.start + self.pos as u64,
            what,
        }
    }

    #[inline]
    pub(super) fn varint(&mut self, what: &'static str) -> Result<u64, ModelError> {
        read_varint(self.bytes, &mut self.pos).map_err(|_| self.error(what))
    }

    #[inline]
    pub(super) fn byte(&mut self, what: &'static str) -> Result<u8, ModelError> {
        let b = *self.bytes.get(self.pos).ok_or_else(|| self.error(what))?;
        self.pos += 1;
        Ok(b)
    }

    #[inline]
    pub(super) fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], ModelError> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n));
        let bytes = end
            .and_then(|end| self.bytes.get(self.pos..end))
            .ok_or_else(|| self.error(what))?;
        self.pos += bytes.len();
        Ok(bytes)
    }

    pub(super) fn done(&self) -> bool {
        self.pos == self.bytes.len()
    }
}
