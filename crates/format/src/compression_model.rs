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

//!
//! ## Files
//!
//! `heap` holds the model, `columns` the stream's columns, `encode` and
//! `decode` the two directions.

mod columns;
mod decode;
mod encode;
mod heap;

pub use columns::{ModelError, COLUMNS};
pub use decode::Decoder;
pub use encode::Encoder;
pub use heap::{
    size_class, FREED_PER_CLASS, FREE_HASH_BITS, FREE_RING_BITS, HASH_BITS, RING_BITS, SIZE_CLASSES,
};

/// Largest modeled stream for `raw_len` raw bytes: what a reader accepts
/// before decoding (beyond it the writer writes the batches uncompressed).
/// Unpredictable IDs cost a code byte more than the raw batches, rare
/// odd values (an entry tag far from the last) several: twice the raw
/// length leaves room for any real trace.
pub const fn max_modeled_len(raw_len: u64) -> u64 {
    raw_len.saturating_mul(2).saturating_add(4096)
}
