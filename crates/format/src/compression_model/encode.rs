//! The encoder: raw batches to a modeled stream.

use alloc::vec;
use alloc::vec::Vec;

use super::columns::{
    column_room, push_varint, read_canonical_varint, ColumnWriter, NotExact, BATCHES, COLUMNS,
    FORM_EVENTS, FORM_VERBATIM, VERBATIM,
};
use super::heap::{Model, Prediction};
use crate::batch::{BatchKind, BATCH_PREFIX_LEN, MAX_BATCH_PAYLOAD};
use crate::event::{decode_event, ENTRY_TAG};
use crate::varint::{unzigzag, MAX_VARINT_LEN};

/// Batches an encoder was told to copy verbatim although they are compact
/// events batches, by offset in the raw input; past this many it copies
/// every batch.
const MAX_NOT_EXACT: usize = 8;

/// Turns raw batches into a modeled stream; keeps its columns and model
/// from one stream to the next.
pub struct Encoder {
    model: Model,
    /// Each column's storage: zeroed room, written from the start; grown
    /// (never shrunk) when a batch might not fit.
    columns: [Vec<u8>; COLUMNS],
    /// Bytes of each column written in this stream.
    used: [usize; COLUMNS],
}

impl Encoder {
    /// An encoder with room for streams of up to about `raw_len` raw bytes
    /// in batches of up to 64 KiB without allocating: larger ones grow its
    /// columns, once. (The room is zeroed memory: pages never written are
    /// never touched.)
    pub fn with_capacity(raw_len: usize) -> Encoder {
        let room = raw_len + column_room(64 << 10);
        Encoder {
            model: Model::new(true),
            columns: core::array::from_fn(|_| vec![0u8; room]),
            used: [0; COLUMNS],
        }
    }

    fn make_room(&mut self, column: usize, need: usize) {
        if let (Some(c), Some(&used)) = (self.columns.get_mut(column), self.used.get(column)) {
            if c.len() - used.min(c.len()) < need {
                c.resize(used + need.max(c.len()), 0);
            }
        }
    }

    /// Replaces `out` with the modeled stream of `raw`: whole compact
    /// events batches are modeled, anything else copied. Returns false,
    /// with `out` unusable, only if a column outgrew the room reserved for
    /// it (never expected: see `column_room`).
    pub fn encode(&mut self, raw: &[u8], out: &mut Vec<u8>) -> bool {
        // One pass models and checks each batch. A batch found not exact
        // midway has already changed the model, so the stream starts over
        // with that batch copied (invariant 3); the writer never makes one.
        let mut not_exact = [usize::MAX; MAX_NOT_EXACT];
        let mut not_exact_len = 0;
        let fits = loop {
            match self.encode_once(raw, &not_exact[..not_exact_len]) {
                Ok(fits) => break fits,
                Err(offset) => {
                    let Some(slot) = not_exact.get_mut(not_exact_len) else {
                        break self.encode_all_verbatim(raw);
                    };
                    *slot = offset;
                    not_exact_len += 1;
                }
            }
        };
        if !fits {
            return false;
        }
        out.clear();
        for &used in &self.used {
            push_varint(out, used as u64);
        }
        for (c, &used) in self.columns.iter().zip(&self.used) {
            out.extend_from_slice(c.get(..used).unwrap_or(c));
        }
        true
    }

    /// One try at the whole stream, copying the batches at the offsets in
    /// `verbatim`; `Err` with the offset of a compact events batch that
    /// does not parse exactly.
    fn encode_once(&mut self, raw: &[u8], verbatim: &[usize]) -> Result<bool, usize> {
        self.model.reset();
        self.used = [0; COLUMNS];
        let mut offset = 0;
        while let Some(rest) = raw.get(offset..).filter(|rest| !rest.is_empty()) {
            let batch_len = match rest.get(..BATCH_PREFIX_LEN) {
                Some(&[_, a, b, c, d]) => {
                    let len = u32::from_le_bytes([a, b, c, d]);
                    let total = BATCH_PREFIX_LEN + len as usize;
                    if len <= MAX_BATCH_PAYLOAD && total <= rest.len() {
                        total
                    } else {
                        rest.len()
                    }
                }
                _ => rest.len(),
            };
            let batch = rest.get(..batch_len).unwrap_or(rest);
            let payload = batch.get(BATCH_PREFIX_LEN..).unwrap_or(&[]);
            let modeled = batch.first() == Some(&(BatchKind::CompactEvents as u8))
                && !payload.is_empty()
                && !verbatim.contains(&offset);
            let fits = if modeled {
                self.encode_events_batch(payload)
                    .map_err(|NotExact| offset)?
            } else {
                self.encode_verbatim(batch)
            };
            if !fits {
                return Ok(false);
            }
            offset += batch_len;
        }
        Ok(true)
    }

    fn encode_all_verbatim(&mut self, raw: &[u8]) -> bool {
        self.model.reset();
        self.used = [0; COLUMNS];
        self.encode_verbatim(raw)
    }

    fn encode_verbatim(&mut self, batch: &[u8]) -> bool {
        self.make_room(BATCHES, 2 * MAX_VARINT_LEN);
        self.make_room(VERBATIM, batch.len());
        let [batches, verbatim, ..] = &mut self.columns;
        let mut w = ColumnWriter {
            bytes: batches,
            pos: self.used[BATCHES],
        };
        w.varint(FORM_VERBATIM);
        w.varint(batch.len() as u64);
        self.used[BATCHES] = w.pos;
        let at = self.used[VERBATIM];
        match verbatim.get_mut(at..at + batch.len()) {
            Some(room) => room.copy_from_slice(batch),
            None => return false,
        }
        self.used[VERBATIM] += batch.len();
        w.pos <= batches.len()
    }

    /// Writes a compact events batch's payload to the columns, checking as
    /// it goes that it parses exactly (else `Err`, and the columns' used
    /// lengths are unchanged but the model is not).
    fn encode_events_batch(&mut self, payload: &[u8]) -> Result<bool, NotExact> {
        for column in 0..COLUMNS {
            self.make_room(column, column_room(payload.len()));
        }
        let model = &mut self.model;
        let used = &mut self.used;
        let [batches, _, kinds, times, ids, escapes, sizes, args, tags] = &mut self.columns;
        fn writer(bytes: &mut [u8], pos: usize) -> ColumnWriter<'_> {
            ColumnWriter { bytes, pos }
        }
        let mut batches = writer(batches, used[BATCHES]);
        let mut kinds = writer(kinds, used[2]);
        let mut times = writer(times, used[3]);
        let mut ids = writer(ids, used[4]);
        let mut escapes = writer(escapes, used[5]);
        let mut sizes = writer(sizes, used[6]);
        let mut args = writer(args, used[7]);
        let mut tags = writer(tags, used[8]);
        let mut pos = 0;
        let mut header = [0u64; 3];
        for field in header.iter_mut() {
            *field = read_canonical_varint(payload, &mut pos)?;
        }
        let mut events = 0u64;
        let mut previous_heap_id = 0u64;
        while pos < payload.len() {
            // The format's decoder; exact means every varint in its
            // shortest form (invariant 3).
            let start = pos;
            let event = decode_event(payload, &mut pos).map_err(|_| NotExact)?;
            if event.encoded_len() != pos - start {
                return Err(NotExact);
            }
            events += 1;
            let kind = event.kind as u8;
            let kind_byte = kind | event.flags;
            kinds.byte(kind_byte);
            times.varint(event.time_delta);
            // Kind 11 (a heap alloc with a stack) is modeled as kind 5; its
            // stack ID, the last argument, goes to the args column. The
            // arguments from `rest` on go to the args column too.
            let rest = match kind {
                4..=6 | 11 if !event.long_form() => {
                    let first = event.args[0];
                    let id = previous_heap_id.wrapping_add(unzigzag(first) as u64);
                    previous_heap_id = id;
                    let prediction = if kind == 6 {
                        let prediction = match model.encode_free(id) {
                            Prediction::Escape(_) => Prediction::Escape(first),
                            code => code,
                        };
                        model.freed_any(id);
                        prediction
                    } else {
                        let size = event.args[1];
                        sizes.varint(size);
                        model.encode_alloc(id, size)
                    };
                    match prediction {
                        Prediction::Code(code) => ids.varint(code),
                        Prediction::Escape(raw) => {
                            ids.byte(0);
                            escapes.varint(raw);
                        }
                    }
                    if kind == 6 {
                        1
                    } else {
                        2
                    }
                }
                4 | 5 | 11 => {
                    args.varint(event.args[0]);
                    sizes.varint(event.args[1]);
                    2
                }
                _ => 0,
            };
            for &arg in event.args.get(rest..event.kind.arg_count()).unwrap_or(&[]) {
                args.varint(arg);
            }
            if event.tagged() {
                let tag = event.entry();
                let last = &mut model.last_tag[usize::from(kind_byte & !ENTRY_TAG)];
                tags.varint(tag ^ *last);
                *last = tag;
            }
        }
        batches.varint(FORM_EVENTS);
        for field in header {
            batches.varint(field);
        }
        batches.varint(events);
        let mut fits = true;
        for (i, w) in [
            (BATCHES, batches),
            (2, kinds),
            (3, times),
            (4, ids),
            (5, escapes),
            (6, sizes),
            (7, args),
            (8, tags),
        ] {
            fits &= w.pos <= w.bytes.len();
            used[i] = w.pos;
        }
        Ok(fits)
    }
}
