//! The alloctrace wire format, shared by the writer (the `alloctrace` library)
//! and the reader (`alloctrace-reader`) so that the two cannot drift apart.
//!
//! docs/FORMAT.md is the byte-level specification; this crate is its code.
//! Everything here is plain data and pure functions: no allocation, no I/O,
//! no panics on any input, so the writer may call it from inside malloc.
//! The one exception is [`compression_model`], the transform of modeled compressed
//! batches, which only the writer thread and the reader use: it allocates
//! its fixed-size state once and grows vectors its caller reuses.
//!
//! # Layout in one paragraph
//! A trace is a 16-byte [file header](FileHeader) followed by batches. A batch
//! is `[kind u8][payload length u32 LE][payload]`, followed in a version-2
//! or 3 file by a 4-byte [trailer](batch_checksum), the CRC32C of those bytes;
//! every payload (but a compressed batch's) opens with
//! `varint generation, varint thread, varint base timestamp`. Event batches
//! then hold events `[kind u8][varint timestamp delta][varint args...]`.
//! Addresses travel as compressed IDs, `(addr - min_heap_addr) / align`, with
//! the alignments written once per generation in an info batch. Version 3
//! adds call stacks: allocations carrying a stack ID (event kinds 11 and
//! 12) and, per generation, batches of modules, registered frames and
//! call-stack nodes ([`stacks`]). Version 4 adds the process batch: the
//! traced program's command line, once per generation.
//!
//! # Modules, lowest first
//! Each names (`crate::`) only modules before it in this list, so the
//! module graph has no cycle: [`varint`], [`checksum`], [`header`],
//! [`batch`], [`command_line`], [`address`], [`entry`], [`event`],
//! [`pages`], [`stacks`], [`compression_model`], and [`control`] (the
//! control socket's words, no part of the trace). Everything public is also
//! re-exported here, at the paths the other crates use.
#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;

pub mod address;
pub mod batch;
pub mod checksum;
pub mod command_line;
pub mod compression_model;
pub mod control;
pub mod entry;
pub mod event;
pub mod header;
pub mod pages;
pub mod stacks;
pub mod varint;

pub use address::{compress_address, exact_log2, restore_address, AddressClass, IdDeltas};
pub use batch::{
    encode_batch_header, BatchKind, BATCH_PREFIX_LEN, MAX_BATCH_HEADER_LEN, MAX_BATCH_PAYLOAD,
    MAX_DECOMPRESSED_LEN, MAX_WINDOW_LOG,
};
pub use checksum::{batch_checksum, has_trailers, TRAILER_LEN};
pub use command_line::{command_line_args, MAX_COMMAND_LINE, PROCESS_TRUNCATED};
pub use entry::{EntryPoint, ENTRY_POINTS};
pub use event::{
    decode_event, encode_event, short_form, EventError, EventFields, EventKind, EventSpec,
    ENTRY_TAG, EVENT_KINDS, EVENT_KIND_MASK, EVENT_SPECS, LONG_FORM, MAX_EVENT_LEN,
    MAX_STACK_ORDER,
};
pub use header::{
    FileHeader, HeaderError, FILE_HEADER_LEN, FLAG_FLIGHT_WINDOW, MAGIC, READABLE_VERSIONS,
    VERSION, VERSION_1, VERSION_2, VERSION_3, VERSION_4, VERSION_5,
};
pub use varint::{
    get_uvarint, push_uvarint, put_uvarint, unzigzag, uvarint_len, zigzag, VarintError,
    MAX_VARINT_LEN,
};
