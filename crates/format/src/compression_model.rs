//! The transform behind modeled compressed batches (batch kind 9,
//! docs/FORMAT.md section 2.2): whole batches are turned into a byte stream
//! that zstd compresses far better than the batches themselves, and the
//! inverse turns that stream back into exactly the original bytes.
//!
//! ## Design
//!
//! The stream is a set of columns, each holding one kind of field (event
//! kinds, time deltas, sizes, ...), so zstd sees homogeneous data. The
//! heap-object IDs, the least predictable field of a trace, are replaced
//! by predictions from a model of the heap that both sides keep:
//!
//! - a free names an object allocated earlier: a ring of the most recent
//!   allocations (and a hash table from ID to position in the ring) turns
//!   it into the number of allocations since, written as the difference
//!   from the previous free's (a program freeing in allocation order gives
//!   0 every time);
//! - an allocator hands out again a block of the same size it freed
//!   recently: per size class, a small stack of the IDs freed most
//!   recently turns an allocation's ID into its position there; failing
//!   that, a ring of the last 4096 frees of any size (allocators split and
//!   merge free blocks) turns it into the number of frees since.
//!
//! Whatever the model cannot predict is written as an escape with the raw
//! value. Batches that are not compact events batches, and any batch that
//! does not parse exactly (an unknown event kind, a varint not in its
//! shortest form, a body that does not end where its payload does), are
//! copied as they are, so the inverse gives back exactly the input for
//! every input.
//!
//! ## Invariants
//!
//! 1. The encoder and the decoder MUST update the model identically, from
//!    values both of them know at that point of the stream (the decoder
//!    reads an allocation's size before its ID so that it knows its size
//!    class). Otherwise the decoder's predictions differ from the
//!    encoder's and it restores wrong IDs without noticing.
//! 2. The model MUST be reset at the start of every stream. Otherwise a
//!    compressed batch could not be decoded on its own.
//! 3. The encoder MUST copy a batch verbatim unless it parsed completely,
//!    with every varint in its shortest form. Otherwise re-encoding the
//!    decoded values would not give back the input bytes.
//! 4. The decoder MUST bound its work and output by its input and
//!    `raw_len`: every loop consumes a column byte, and output past
//!    `raw_len` is an error. Otherwise a few bytes of a hostile stream
//!    could make it loop forever or allocate without limit.
//!
//! ## Memory
//!
//! The model is about 0.95 MiB in the encoder and 0.7 MiB in the decoder
//! (which needs no hash table), allocated once; the encoder's columns and the output vectors are reused across streams by
//! the caller, so a long trace allocates nothing per batch once they have
//! grown to their working size.

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;

use crate::batch::{BatchKind, BATCH_PREFIX_LEN, MAX_BATCH_PAYLOAD};
use crate::event::{
    decode_event, encode_event, EventKind, ENTRY_TAG, EVENT_KIND_MASK, LONG_FORM, MAX_EVENT_LEN,
};
use crate::varint::{get_uvarint, put_uvarint, unzigzag, zigzag, MAX_VARINT_LEN};

/// log2 of the number of allocations the ring remembers.
pub const RING_BITS: u32 = 16;
/// log2 of the number of slots of the hash table from ID to allocation.
pub const HASH_BITS: u32 = 17;
/// IDs remembered per size class, most recently freed first.
pub const FREED_PER_CLASS: usize = 8;
/// log2 of the number of frees the free ring remembers.
pub const FREE_RING_BITS: u32 = 12;
/// log2 of the number of slots of the encoder's hash table from ID to
/// free ring index.
pub const FREE_HASH_BITS: u32 = 14;
/// Size classes: 16-byte steps up to 1 KiB (0 to 64), then four per power
/// of two (65 to 280).
pub const SIZE_CLASSES: usize = 281;
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
const BATCHES: usize = 0;
const VERBATIM: usize = 1;

/// Batch forms in the BATCHES column.
const FORM_VERBATIM: u64 = 0;
const FORM_EVENTS: u64 = 1;

/// Largest modeled stream for `raw_len` raw bytes: what a reader accepts
/// before decoding (beyond it the writer writes the batches uncompressed).
/// Unpredictable IDs cost a code byte more than the raw batches, rare
/// odd values (an entry tag far from the last) several: twice the raw
/// length leaves room for any real trace.
pub const fn max_modeled_len(raw_len: u64) -> u64 {
    raw_len.saturating_mul(2).saturating_add(4096)
}

/// The size class of an allocation size.
#[inline]
pub const fn size_class(size: u64) -> usize {
    if size <= 1024 {
        return size.div_ceil(16) as usize;
    }
    let log = 63 - (size - 1).leading_zeros();
    let quarter = ((size - 1) >> (log - 2)) & 3;
    65 + (log as usize - 10) * 4 + quarter as usize
}

/// The heap model both sides keep (see Design). Reset at every stream.
struct Model {
    /// `ring_ids[a % RING]`, `ring_classes[a % RING]`: the ID and size
    /// class of allocation number `a` of the stream.
    ring_ids: Box<[u64]>,
    ring_classes: Box<[u16]>,
    /// Allocations seen in this stream.
    allocations: u64,
    /// Encoder only: `hash[slot(id)]`, the ring index of the latest
    /// allocation whose ID hashed there. Colliding IDs overwrite each
    /// other, and an entry may be stale (0 after a reset, or overwritten in
    /// the ring since): the ring confirms a hit. The decoder needs no hash:
    /// a free's code names a ring index.
    hash: Box<[u16]>,
    /// Per size class, the IDs freed most recently, newest first, and how
    /// many are valid.
    freed: Box<[[u64; FREED_PER_CLASS]]>,
    freed_len: Box<[u8]>,
    /// The age of the last free the ring confirmed.
    last_age: u64,
    /// The ID of the last escaped allocation.
    last_escaped_alloc: u64,
    /// The previous entry tag of each kind byte without its tag bit.
    last_tag: [u64; 256],
    /// `free_ring[f % FREE_RING]`: the ID of short-form free number `f`
    /// of the stream, whatever its size class (an allocator splits and
    /// merges free blocks: a block often comes back in another class).
    free_ring: Box<[u64]>,
    /// Short-form frees seen in this stream.
    frees: u64,
    /// Encoder only: `free_hash[free_slot(id)]`, the free ring index of
    /// the latest free whose ID hashed there (confirmed by the ring).
    free_hash: Box<[u16]>,
}

const FREE_RING: usize = 1 << FREE_RING_BITS;

const RING: usize = 1 << RING_BITS;

/// What a free's or an allocation's ID costs to tell the other side.
enum Prediction {
    /// The model knew it: this code (never 0) in the IDS column.
    Code(u64),
    /// The model did not: 0 in IDS and this value in ESCAPES.
    Escape(u64),
}

impl Model {
    /// Allocates the model, reset: about 0.7 MiB, and 0.28 MiB more for
    /// the encoder's hash tables.
    fn new(hash: bool) -> Model {
        let hash_len = if hash { 1 << HASH_BITS } else { 0 };
        Model {
            ring_ids: vec![0u64; RING].into_boxed_slice(),
            ring_classes: vec![0u16; RING].into_boxed_slice(),
            allocations: 0,
            hash: vec![0u16; hash_len].into_boxed_slice(),
            freed: vec![[0u64; FREED_PER_CLASS]; SIZE_CLASSES].into_boxed_slice(),
            freed_len: vec![0u8; SIZE_CLASSES].into_boxed_slice(),
            last_age: 0,
            last_escaped_alloc: 0,
            last_tag: [0; 256],
            free_ring: vec![0u64; FREE_RING].into_boxed_slice(),
            frees: 0,
            free_hash: vec![0u16; if hash { 1 << FREE_HASH_BITS } else { 0 }].into_boxed_slice(),
        }
    }

    /// Forgets everything: the start of a stream.
    pub fn reset(&mut self) {
        self.allocations = 0;
        self.hash.fill(0);
        self.freed_len.fill(0);
        self.last_age = 0;
        self.last_escaped_alloc = 0;
        self.last_tag = [0; 256];
        self.frees = 0;
        self.free_hash.fill(0);
    }

    #[inline]
    fn slot(id: u64) -> usize {
        (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - HASH_BITS)) as usize
    }

    #[inline]
    fn free_slot(id: u64) -> usize {
        (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - FREE_HASH_BITS)) as usize
    }

    /// Records a short-form free of `id` (predicted or escaped).
    #[inline]
    fn freed_any(&mut self, id: u64) {
        let i = (self.frees as usize) & (FREE_RING - 1);
        if let Some(slot) = self.free_ring.get_mut(i) {
            *slot = id;
        }
        if let Some(h) = self.free_hash.get_mut(Self::free_slot(id)) {
            *h = i as u16;
        }
        self.frees += 1;
    }

    /// Encoder: how many frees back (1 is the newest) `id` was freed, if
    /// the free ring holds it.
    #[inline]
    fn find_free(&self, id: u64) -> Option<u64> {
        let i = usize::from(*self.free_hash.get(Self::free_slot(id))?);
        let newest = self.frees.checked_sub(1)?;
        let age = 1 + (newest.wrapping_sub(i as u64) & (FREE_RING as u64 - 1));
        (age <= self.frees && self.free_ring.get(i) == Some(&id)).then_some(age)
    }

    /// The age of the latest allocation of `id` (allocations since it,
    /// counting it: 1 to RING) and its ring index, if the ring still holds
    /// it.
    #[inline]
    fn find_allocation(&self, id: u64) -> Option<(u64, usize)> {
        let i = usize::from(*self.hash.get(Self::slot(id))?);
        let newest = self.allocations.checked_sub(1)?;
        let age = 1 + (newest.wrapping_sub(i as u64) & (RING as u64 - 1));
        (age <= self.allocations && self.ring_ids.get(i) == Some(&id)).then_some((age, i))
    }

    /// Records an allocation (or exists event) of `id` and `size`.
    #[inline]
    fn allocated(&mut self, id: u64, size: u64) {
        let i = (self.allocations as usize) & (RING - 1);
        if let (Some(r), Some(c)) = (self.ring_ids.get_mut(i), self.ring_classes.get_mut(i)) {
            *r = id;
            *c = size_class(size) as u16;
        }
        if let Some(h) = self.hash.get_mut(Self::slot(id)) {
            *h = i as u16;
        }
        self.allocations += 1;
    }

    /// The ring index of the allocation `age` allocations back (1 is the
    /// newest), if the ring holds it.
    #[inline]
    fn ring_index(&self, age: u64) -> Option<usize> {
        (age >= 1 && age <= RING as u64 && age <= self.allocations)
            .then(|| ((self.allocations - age) as usize) & (RING - 1))
    }

    /// Encoder: the prediction for freeing `id`, updating the model. The
    /// free's age is first guessed to be the last one's, a read of the ring
    /// next to the last; the hash table is asked only when that fails.
    #[inline]
    fn encode_free(&mut self, id: u64) -> Prediction {
        let guess = self
            .ring_index(self.last_age)
            .filter(|&i| self.ring_ids.get(i) == Some(&id));
        let found = match guess {
            Some(i) => Some((self.last_age, i)),
            None => self.find_allocation(id),
        };
        match found {
            Some((age, i)) => {
                let code = zigzag(age.wrapping_sub(self.last_age) as i64) + 1;
                self.last_age = age;
                self.push_freed(id, i);
                Prediction::Code(code)
            }
            None => Prediction::Escape(0),
        }
    }

    /// Decoder: the ID a free's code names, updating the model; `None`
    /// for a code the model cannot resolve (malformed).
    #[inline]
    fn decode_free(&mut self, code: u64) -> Option<u64> {
        let age = self.last_age.wrapping_add(unzigzag(code - 1) as u64);
        let i = self.ring_index(age)?;
        let id = *self.ring_ids.get(i)?;
        self.last_age = age;
        self.push_freed(id, i);
        Some(id)
    }

    /// Remembers `id`, the allocation at ring index `i`, as freed.
    #[inline]
    fn push_freed(&mut self, id: u64, i: usize) {
        let class = usize::from(self.ring_classes.get(i).copied().unwrap_or(0));
        let (Some(ids), Some(len)) = (self.freed.get_mut(class), self.freed_len.get_mut(class))
        else {
            return;
        };
        ids.copy_within(0..FREED_PER_CLASS - 1, 1);
        ids[0] = id;
        *len = (*len + 1).min(FREED_PER_CLASS as u8);
    }

    /// Encoder: the prediction for allocating `id` of `size`, updating the
    /// model.
    #[inline]
    fn encode_alloc(&mut self, id: u64, size: u64) -> Prediction {
        let class = size_class(size);
        let found = match (self.freed.get(class), self.freed_len.get(class)) {
            (Some(ids), Some(&len)) => ids.iter().take(len as usize).position(|&f| f == id),
            _ => None,
        };
        let prediction = match found {
            Some(i) => {
                self.take_freed(class, i);
                Prediction::Code(i as u64 + 1)
            }
            None => match self.find_free(id) {
                Some(age) => Prediction::Code(FREED_PER_CLASS as u64 + age),
                None => {
                    let raw = zigzag(id.wrapping_sub(self.last_escaped_alloc) as i64);
                    self.last_escaped_alloc = id;
                    Prediction::Escape(raw)
                }
            },
        };
        self.allocated(id, size);
        prediction
    }

    /// Decoder: the ID of an allocation of `size` from its code, or from
    /// its escape value when the code is 0; updates the model.
    #[inline]
    fn decode_alloc(&mut self, code: u64, escape: u64, size: u64) -> Option<u64> {
        let id = if code == 0 {
            let id = self
                .last_escaped_alloc
                .wrapping_add(unzigzag(escape) as u64);
            self.last_escaped_alloc = id;
            id
        } else if code > FREED_PER_CLASS as u64 {
            let age = code - FREED_PER_CLASS as u64;
            if age > FREE_RING as u64 || age > self.frees {
                return None;
            }
            *self
                .free_ring
                .get(((self.frees - age) as usize) & (FREE_RING - 1))?
        } else {
            let class = size_class(size);
            let i = (code - 1) as usize;
            if i >= usize::from(*self.freed_len.get(class)?) {
                return None;
            }
            let id = *self.freed.get(class)?.get(i)?;
            self.take_freed(class, i);
            id
        };
        self.allocated(id, size);
        Some(id)
    }

    #[inline]
    fn take_freed(&mut self, class: usize, i: usize) {
        if let (Some(ids), Some(len)) = (self.freed.get_mut(class), self.freed_len.get_mut(class)) {
            if i < FREED_PER_CLASS {
                ids.copy_within(i + 1.., i);
            }
            *len = len.saturating_sub(1);
        }
    }
}

/// Reads a varint, with the one-byte case inline.
#[inline(always)]
fn read_varint(buf: &[u8], pos: &mut usize) -> Result<u64, crate::varint::VarintError> {
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
fn read_canonical_varint(buf: &[u8], pos: &mut usize) -> Result<u64, NotExact> {
    let start = *pos;
    let v = read_varint(buf, pos).map_err(|_| NotExact)?;
    if *pos - start > 1 && buf.get(*pos - 1) == Some(&0) {
        return Err(NotExact);
    }
    Ok(v)
}

#[inline]
fn push_varint(out: &mut Vec<u8>, v: u64) {
    let mut buf = [0u8; MAX_VARINT_LEN];
    let n = put_uvarint(&mut buf, 0, v);
    out.extend_from_slice(buf.get(..n).unwrap_or(&buf));
}

/// A batch the encoder must copy verbatim: it does not parse exactly.
#[derive(Debug)]
struct NotExact;

/// Most bytes any column gains from a modeled events batch of payload
/// length `len`, plus its batch header. Every event takes at least 3
/// bytes of payload; the widest growth is an entry tag (1 byte) whose
/// XOR takes 10, or an allocation (at least 5 bytes) whose escape takes
/// 10: under 3 bytes per payload byte.
const fn column_room(len: usize) -> usize {
    3 * len + 64
}

/// A column being written: a slice with room for the batch and a cursor
/// kept in a local, so byte stores need not reload it.
struct ColumnWriter<'a> {
    bytes: &'a mut [u8],
    pos: usize,
}

impl ColumnWriter<'_> {
    #[inline(always)]
    fn byte(&mut self, b: u8) {
        if let Some(slot) = self.bytes.get_mut(self.pos) {
            *slot = b;
        }
        self.pos += 1;
    }

    #[inline(always)]
    fn varint(&mut self, v: u64) {
        if v < 0x80 {
            self.byte(v as u8);
        } else {
            self.pos = put_uvarint(self.bytes, self.pos, v);
        }
    }
}

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

/// Where and why a modeled stream is malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelError {
    /// Offset in the modeled stream of the byte the decoder could not use.
    pub at: u64,
    /// What is wrong, for messages.
    pub what: &'static str,
}

/// One column of a stream being decoded.
struct Column<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Offset of the column in the stream, for errors.
    start: u64,
}

impl<'a> Column<'a> {
    #[inline]
    fn error(&self, what: &'static str) -> ModelError {
        ModelError {
            at: self.start + self.pos as u64,
            what,
        }
    }

    #[inline]
    fn varint(&mut self, what: &'static str) -> Result<u64, ModelError> {
        read_varint(self.bytes, &mut self.pos).map_err(|_| self.error(what))
    }

    #[inline]
    fn byte(&mut self, what: &'static str) -> Result<u8, ModelError> {
        let b = *self.bytes.get(self.pos).ok_or_else(|| self.error(what))?;
        self.pos += 1;
        Ok(b)
    }

    #[inline]
    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], ModelError> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n));
        let bytes = end
            .and_then(|end| self.bytes.get(self.pos..end))
            .ok_or_else(|| self.error(what))?;
        self.pos += bytes.len();
        Ok(bytes)
    }

    fn done(&self) -> bool {
        self.pos == self.bytes.len()
    }
}

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
