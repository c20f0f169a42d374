//! The decoder: a modeled stream back to the raw batches.

use alloc::vec::Vec;

use super::columns::{
    push_varint, Column, ModelError, BATCHES, COLUMNS, FORM_EVENTS, FORM_VERBATIM, VERBATIM,
};
use super::heap::Model;
use crate::batch::{BatchKind, BATCH_PREFIX_LEN, MAX_BATCH_PAYLOAD};
use crate::event::{encode_event, EventKind, ENTRY_TAG, EVENT_KIND_MASK, LONG_FORM, MAX_EVENT_LEN};
use crate::varint::{get_uvarint, unzigzag, zigzag};

/// Turns modeled streams back into raw batches; keeps its model from one
/// stream to the next.
pub struct Decoder {
    model: Model,
}

impl Default for Decoder {
    fn default() -> Decoder {
        Decoder::new()
    }
}

impl Decoder {
    /// A decoder (allocates its model, about 0.7 MiB).
    pub fn new() -> Decoder {
        Decoder {
            model: Model::new(false),
        }
    }

    /// Appends to `out` the `raw_len` bytes `stream` stands for. Any input
    /// is safe: a malformed stream, or one that does not give exactly
    /// `raw_len` bytes, is an error (and `out` holds some bytes), and `out`
    /// never grows by more than `raw_len` plus one event.
    pub fn decode(
        &mut self,
        stream: &[u8],
        raw_len: u64,
        out: &mut Vec<u8>,
    ) -> Result<(), ModelError> {
        self.model.reset();
        let mut pos = 0;
        let mut lens = [0u64; COLUMNS];
        for len in lens.iter_mut() {
            *len = get_uvarint(stream, &mut pos).map_err(|_| ModelError {
                at: pos as u64,
                what: "a column length is truncated or overflows",
            })?;
        }
        let mut columns: [Column<'_>; COLUMNS] = core::array::from_fn(|_| Column {
            bytes: &[],
            pos: 0,
            start: 0,
        });
        for (c, &len) in columns.iter_mut().zip(&lens) {
            let end = usize::try_from(len)
                .ok()
                .and_then(|len| pos.checked_add(len));
            let Some(bytes) = end.and_then(|end| stream.get(pos..end)) else {
                return Err(ModelError {
                    at: pos as u64,
                    what: "the column lengths run past the end of the stream",
                });
            };
            *c = Column {
                bytes,
                pos: 0,
                start: pos as u64,
            };
            pos += bytes.len();
        }
        if pos != stream.len() {
            return Err(ModelError {
                at: pos as u64,
                what: "bytes after the last column",
            });
        }
        let start = out.len() as u64;
        let limit = start + raw_len;
        while !columns[BATCHES].done() {
            let form_at = columns[BATCHES].start + columns[BATCHES].pos as u64;
            let form = columns[BATCHES].varint("a batch form is truncated")?;
            match form {
                FORM_VERBATIM => {
                    let len = columns[BATCHES].varint("a verbatim length is truncated")?;
                    if len > limit - out.len() as u64 {
                        return Err(columns[BATCHES].error("a verbatim batch runs past raw_len"));
                    }
                    let bytes =
                        columns[VERBATIM].take(len, "a verbatim batch runs past its column")?;
                    out.extend_from_slice(bytes);
                }
                FORM_EVENTS => self.decode_events_batch(&mut columns, limit, out)?,
                _ => {
                    return Err(ModelError {
                        at: form_at,
                        what: "unknown batch form",
                    })
                }
            }
        }
        if let Some(c) = columns.iter().find(|c| !c.done()) {
            return Err(c.error("bytes left over in a column"));
        }
        if out.len() as u64 != limit {
            return Err(ModelError {
                at: stream.len() as u64,
                what: "the stream decodes to fewer bytes than raw_len",
            });
        }
        Ok(())
    }

    fn decode_events_batch(
        &mut self,
        columns: &mut [Column<'_>; COLUMNS],
        limit: u64,
        out: &mut Vec<u8>,
    ) -> Result<(), ModelError> {
        let [batches, _, kinds, times, ids, escapes, sizes, args, tags] = columns;
        let model = &mut self.model;
        let batch_start = out.len();
        out.extend_from_slice(&[BatchKind::CompactEvents as u8, 0, 0, 0, 0]);
        for _ in 0..3 {
            push_varint(out, batches.varint("a batch header is truncated")?);
        }
        let events = batches.varint("an event count is truncated")?;
        let mut previous_heap_id = 0u64;
        // Events are written straight into `out`, which is grown ahead in
        // zeroed steps (never past raw_len and one event) and cut back to
        // `pos` at the end: no event is staged and copied.
        let mut pos = out.len();
        // Each event takes a byte of the kinds column, so a count that
        // lies ends at that column's end.
        for _ in 0..events {
            if pos as u64 > limit {
                return Err(batches.error("an events batch runs past raw_len"));
            }
            if out.len() - pos < MAX_EVENT_LEN {
                let step = (limit - pos as u64).clamp(MAX_EVENT_LEN as u64, 1 << 16);
                out.resize(pos + step as usize, 0);
            }
            let kind_byte = kinds.byte("the kinds column ends before the event count")?;
            let Some(kind) = EventKind::from_u8(kind_byte & EVENT_KIND_MASK) else {
                return Err(kinds.error("unknown event kind"));
            };
            let flags = kind_byte & (LONG_FORM | ENTRY_TAG);
            let time_delta = times.varint("a time delta is truncated")?;
            // The arguments as the encoder split them among the columns;
            // those from `rest` on come from the args column.
            let mut fields = [0u64; 5];
            let rest = match kind as u8 {
                4..=6 | 11 if flags & LONG_FORM == 0 => {
                    let code = ids.varint("an ID code is truncated")?;
                    let (id, size) = if kind == EventKind::HeapObjectFree {
                        let id = if code == 0 {
                            previous_heap_id.wrapping_add(unzigzag(
                                escapes.varint("an escape is truncated")?,
                            ) as u64)
                        } else {
                            model
                                .decode_free(code)
                                .ok_or_else(|| ids.error("a free's code names no allocation"))?
                        };
                        model.freed_any(id);
                        (id, None)
                    } else {
                        let size = sizes.varint("a size is truncated")?;
                        let escape = if code == 0 {
                            escapes.varint("an escape is truncated")?
                        } else {
                            0
                        };
                        let id = model
                            .decode_alloc(code, escape, size)
                            .ok_or_else(|| ids.error("an allocation's code names no freed ID"))?;
                        (id, Some(size))
                    };
                    fields[0] = zigzag(id.wrapping_sub(previous_heap_id) as i64);
                    previous_heap_id = id;
                    match size {
                        Some(size) => {
                            fields[1] = size;
                            2
                        }
                        None => 1,
                    }
                }
                4 | 5 | 11 => {
                    fields[0] = args.varint("an argument is truncated")?;
                    fields[1] = sizes.varint("a size is truncated")?;
                    2
                }
                _ => 0,
            };
            for field in fields.get_mut(rest..kind.arg_count()).unwrap_or(&mut []) {
                *field = args.varint("an argument is truncated")?;
            }
            if flags & ENTRY_TAG != 0 {
                let last = &mut model.last_tag[usize::from(kind_byte & !ENTRY_TAG)];
                let tag = tags.varint("an entry tag is truncated")? ^ *last;
                *last = tag;
                fields[4] = tag;
            }
            // The format's encoder, straight into `out` (room for one
            // event is there).
            let Some(room) = out
                .get_mut(pos..pos + MAX_EVENT_LEN)
                .and_then(|r| <&mut [u8; MAX_EVENT_LEN]>::try_from(r).ok())
            else {
                return Err(batches.error("an events batch runs past raw_len"));
            };
            pos += encode_event(room, kind, flags, time_delta, fields);
        }
        out.truncate(pos);
        let payload_len = out.len() - batch_start - BATCH_PREFIX_LEN;
        if out.len() as u64 > limit || payload_len > MAX_BATCH_PAYLOAD as usize {
            return Err(batches.error("an events batch runs past raw_len or the payload limit"));
        }
        if let Some(len) = out.get_mut(batch_start + 1..batch_start + BATCH_PREFIX_LEN) {
            len.copy_from_slice(&(payload_len as u32).to_le_bytes());
        }
        Ok(())
    }
}
