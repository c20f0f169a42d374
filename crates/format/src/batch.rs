//! Batches: their kinds, the prefix every batch opens with and the limits
//! readers check before allocating (FORMAT.md section 2).

use crate::varint::{put_uvarint, MAX_VARINT_LEN};

/// Size of the fixed prefix of every batch: kind byte and payload length.
pub const BATCH_PREFIX_LEN: usize = 5;

/// Largest payload a batch may declare. Readers reject larger lengths before
/// allocating anything, so a corrupt length can never cause a huge allocation.
pub const MAX_BATCH_PAYLOAD: u32 = 16 << 20;

/// Largest decompressed size a compressed batch may declare; readers check
/// it before allocating.
pub const MAX_DECOMPRESSED_LEN: u64 = 64 << 20;

/// Largest zstd window (log2 of its bytes) a compressed batch's frame may
/// use: 8 MiB. A decoder allocates the window a frame declares before any
/// output, so readers refuse larger ones. The writer compresses about
/// 1 MiB at a time at level 1 (kind 9) or 3 (kind 8), which zstd gives a
/// window of at most 2 MiB.
pub const MAX_WINDOW_LOG: u32 = 23;

/// Most bytes a batch header takes: prefix plus generation, thread and base
/// timestamp varints.
pub const MAX_BATCH_HEADER_LEN: usize = BATCH_PREFIX_LEN + 3 * MAX_VARINT_LEN;

/// The header of a batch of `kind` whose body, after the header, is
/// `body_len` bytes: the prefix (kind byte and payload length) and the
/// generation, thread and base timestamp varints (FORMAT.md section 2).
/// Returns the header's bytes and how many of them it uses. The caller
/// keeps the payload within [`MAX_BATCH_PAYLOAD`].
pub fn encode_batch_header(
    kind: BatchKind,
    generation: u64,
    thread: u64,
    base_ticks: u64,
    body_len: usize,
) -> ([u8; MAX_BATCH_HEADER_LEN], usize) {
    let mut head = [0u8; MAX_BATCH_HEADER_LEN];
    head[0] = kind as u8;
    let mut n = BATCH_PREFIX_LEN;
    for v in [generation, thread, base_ticks] {
        n = put_uvarint(&mut head, n, v);
    }
    let payload = (n - BATCH_PREFIX_LEN + body_len) as u32;
    head[1..BATCH_PREFIX_LEN].copy_from_slice(&payload.to_le_bytes());
    (head, n)
}

/// Kinds of batch. The kind is the first byte of every batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum BatchKind {
    /// Events [event...] written by one thread in one generation.
    Events = 1,
    /// Info [min_heap_addr, page_size, min_heap_align, min_stack_align,
    /// start_ticks, start_mono_ns, start_wall_ns, ticks_per_sec, pid,
    /// sample_bytes] for interpreting one generation (`sample_bytes` is new
    /// in version 6; a body without it reads as 0, every allocation).
    Info = 2,
    /// Types [{id, size, ptr_bytes, name_len, name bytes}...].
    Types = 3,
    /// GenerationEnd [end_ticks, end_mono_ns, lost_events, lost_stacks,
    /// total_allocs, total_alloc_bytes, total_frees, sample_overflow]:
    /// the generation is complete; no batch of it follows. (`lost_stacks`
    /// is new in version 3, the last four in version 6: a body without
    /// them reads as 0.)
    GenerationEnd = 4,
    /// TraceEnd []: the trace was stopped cleanly; nothing follows.
    TraceEnd = 5,
    /// Pages [8-byte page words...] from the page tracer.
    Pages = 6,
    /// CompactEvents [event...]: events whose short-form first argument is
    /// a zigzag delta from the previous ID of the same address class in the
    /// batch (see [`IdDeltas`](crate::IdDeltas)). What the writer emits.
    CompactEvents = 7,
    /// Compressed [varint raw_len, zstd frame]: whole batches, compressed
    /// together. No batch header. Written by earlier versions; still read.
    Compressed = 8,
    /// CompressedModeled [varint raw_len, zstd frame of a modeled stream]:
    /// whole batches, transformed by [`compression_model`](crate::compression_model) and compressed together by
    /// the writer thread. No batch header.
    CompressedModeled = 9,
    /// Modules [{id, start, end, bias, eh_frame_hdr, load_ticks,
    /// unload_ticks, build_id_len, build ID, path_len, path}...]: the native
    /// code objects mapped during the generation ([`stacks::ModuleEntry`](crate::stacks::ModuleEntry)).
    Modules = 10,
    /// Frames [{id, line, func_len, func, file_len, file}...]: the
    /// registered (runtime) frames the generation's call stacks use
    /// ([`stacks::FrameEntry`](crate::stacks::FrameEntry)).
    Frames = 11,
    /// CallStacks [{id, parent, frame}...]: the generation's call stacks as
    /// a prefix tree ([`stacks::CallStackNode`](crate::stacks::CallStackNode)).
    CallStacks = 12,
    /// Process [flags, argc, {len, bytes}...]: the traced program's command
    /// line, at most one per generation (version 4; [`MAX_COMMAND_LINE`](crate::MAX_COMMAND_LINE),
    /// [`PROCESS_TRUNCATED`](crate::PROCESS_TRUNCATED)).
    Process = 13,
}

impl BatchKind {
    /// The batch kind for a byte, or `None` for an unknown kind.
    pub const fn from_u8(b: u8) -> Option<BatchKind> {
        Some(match b {
            1 => BatchKind::Events,
            2 => BatchKind::Info,
            3 => BatchKind::Types,
            4 => BatchKind::GenerationEnd,
            5 => BatchKind::TraceEnd,
            6 => BatchKind::Pages,
            7 => BatchKind::CompactEvents,
            8 => BatchKind::Compressed,
            9 => BatchKind::CompressedModeled,
            10 => BatchKind::Modules,
            11 => BatchKind::Frames,
            12 => BatchKind::CallStacks,
            13 => BatchKind::Process,
            _ => return None,
        })
    }

    /// A short lowercase name, for messages.
    pub const fn name(self) -> &'static str {
        match self {
            BatchKind::Events => "events",
            BatchKind::Info => "info",
            BatchKind::Types => "types",
            BatchKind::GenerationEnd => "generation-end",
            BatchKind::TraceEnd => "trace-end",
            BatchKind::Pages => "pages",
            BatchKind::CompactEvents => "compact-events",
            BatchKind::Compressed => "compressed",
            BatchKind::CompressedModeled => "compressed-modeled",
            BatchKind::Modules => "modules",
            BatchKind::Frames => "frames",
            BatchKind::CallStacks => "call-stacks",
            BatchKind::Process => "process",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_kinds_round_trip() {
        assert_eq!(BatchKind::from_u8(12), Some(BatchKind::CallStacks));
        assert_eq!(BatchKind::from_u8(13), Some(BatchKind::Process));
        assert_eq!(BatchKind::from_u8(14), None);
        for b in 0..=255u8 {
            if let Some(k) = BatchKind::from_u8(b) {
                assert_eq!(k as u8, b);
            }
        }
    }
}
