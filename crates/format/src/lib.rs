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
#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;

pub mod compression_model;
pub mod stacks;

/// The first eight bytes of every trace file.
pub const MAGIC: [u8; 8] = *b"ALCTRACE";

/// The format version this crate writes: 5, version 4 with the stack
/// tables listed as the generation goes (FORMAT.md sections 9 and 10):
/// call-stack nodes in any ID order, a module listed again with its
/// unload tick. A change that earlier readers would call malformed (a new
/// batch kind, a rule relaxed) bumps the version, so they refuse the file
/// by its version ("unsupported format version"), not as a damaged file.
pub const VERSION: u16 = 5;

/// The version with the process batch and stack tables listed as a
/// generation ends: still read.
pub const VERSION_4: u16 = 4;

/// The first version, without trailers: still read.
pub const VERSION_1: u16 = 1;

/// The version with checksum trailers and without call stacks: still read.
pub const VERSION_2: u16 = 2;

/// The version with call stacks and without the process batch: still read.
pub const VERSION_3: u16 = 3;

/// The versions readers accept, oldest first.
pub const READABLE_VERSIONS: [u16; 5] = [VERSION_1, VERSION_2, VERSION_3, VERSION_4, VERSION];

/// Size of the file header in bytes: magic, version u16 LE, flags u16 LE,
/// then a u32: zero in version 1, the header's CRC32C from version 2 on.
pub const FILE_HEADER_LEN: usize = 16;

/// Size of the checksum trailer after every batch of a version-2 or 3 file
/// (FORMAT.md section 2): the batch's CRC32C, u32 LE. Batches inside a
/// compressed batch have none.
pub const TRAILER_LEN: usize = 4;

/// Whether the batches of a file of `version` carry trailers.
pub const fn has_trailers(version: u16) -> bool {
    version >= 2
}

/// The CRC32C (Castagnoli) of `parts`, one after the other: a batch's
/// checksum is that of its kind byte, payload length and payload
/// (FORMAT.md section 2), a version-2 header's that of its first 12 bytes.
/// Hardware-accelerated where the CPU has it (SSE 4.2, ARMv8 CRC).
pub fn batch_checksum(parts: &[&[u8]]) -> u32 {
    parts
        .iter()
        .fold(0, |crc, part| crc32c::crc32c_append(crc, part))
}

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

/// Most bytes a LEB128 varint of a u64 takes.
pub const MAX_VARINT_LEN: usize = 10;

/// Most bytes one event takes: kind, timestamp delta, four arguments (a
/// stack event's stack ID is the fourth) and an entry-point tag: 61.
pub const MAX_EVENT_LEN: usize = 1 + 6 * MAX_VARINT_LEN;

/// Most bytes a batch header takes: prefix plus generation, thread and base
/// timestamp varints.
pub const MAX_BATCH_HEADER_LEN: usize = BATCH_PREFIX_LEN + 3 * MAX_VARINT_LEN;

/// Largest stack-size order (log2 of the size) a short-form stack event may
/// carry.
pub const MAX_STACK_ORDER: u64 = 63;

/// Kinds of batch. The kind is the first byte of every batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum BatchKind {
    /// Events [event...] written by one thread in one generation.
    Events = 1,
    /// Info [min_heap_addr, page_size, min_heap_align, min_stack_align,
    /// start_ticks, start_mono_ns, start_wall_ns, ticks_per_sec, pid] for
    /// interpreting one generation.
    Info = 2,
    /// Types [{id, size, ptr_bytes, name_len, name bytes}...].
    Types = 3,
    /// GenerationEnd [end_ticks, end_mono_ns, lost_events, lost_stacks]:
    /// the generation is complete; no batch of it follows. (`lost_stacks`
    /// is new in version 3; a body without it reads as 0.)
    GenerationEnd = 4,
    /// TraceEnd []: the trace was stopped cleanly; nothing follows.
    TraceEnd = 5,
    /// Pages [8-byte page words...] from the page tracer.
    Pages = 6,
    /// CompactEvents [event...]: events whose short-form first argument is
    /// a zigzag delta from the previous ID of the same address class in the
    /// batch (see [`IdDeltas`]). What the writer emits.
    CompactEvents = 7,
    /// Compressed [varint raw_len, zstd frame]: whole batches, compressed
    /// together. No batch header. Written by earlier versions; still read.
    Compressed = 8,
    /// CompressedModeled [varint raw_len, zstd frame of a modeled stream]:
    /// whole batches, transformed by [`compression_model`] and compressed together by
    /// the writer thread. No batch header.
    CompressedModeled = 9,
    /// Modules [{id, start, end, bias, eh_frame_hdr, load_ticks,
    /// unload_ticks, build_id_len, build ID, path_len, path}...]: the native
    /// code objects mapped during the generation ([`stacks::ModuleEntry`]).
    Modules = 10,
    /// Frames [{id, line, func_len, func, file_len, file}...]: the
    /// registered (runtime) frames the generation's call stacks use
    /// ([`stacks::FrameEntry`]).
    Frames = 11,
    /// CallStacks [{id, parent, frame}...]: the generation's call stacks as
    /// a prefix tree ([`stacks::CallStackNode`]).
    CallStacks = 12,
    /// Process [flags, argc, {len, bytes}...]: the traced program's command
    /// line, at most one per generation (version 4; [`MAX_COMMAND_LINE`],
    /// [`PROCESS_TRUNCATED`]).
    Process = 13,
}

/// Most bytes of arguments, and most arguments, a process batch carries
/// (FORMAT.md, "Process"): the writer keeps the first 64 KiB of the
/// command line and sets [`PROCESS_TRUNCATED`] when there was more; readers
/// refuse a body above either limit, so a hostile batch cannot make them
/// allocate more.
pub const MAX_COMMAND_LINE: u64 = 64 << 10;

/// In a process batch's `flags`: the command line was longer than
/// [`MAX_COMMAND_LINE`] bytes and was cut (its last argument may be cut
/// too).
pub const PROCESS_TRUNCATED: u64 = 1;

/// The arguments of a command line as Linux keeps it (`/proc/PID/cmdline`):
/// each argument followed by a NUL byte. A last argument without its NUL
/// (a command line cut at [`MAX_COMMAND_LINE`]) counts as an argument; an
/// empty `raw` has none.
pub fn command_line_args(raw: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = (!raw.is_empty()).then(|| raw.strip_suffix(&[0]).unwrap_or(raw));
    core::iter::from_fn(move || {
        let r = rest?;
        match r.iter().position(|&b| b == 0) {
            Some(i) => {
                rest = Some(&r[i + 1..]);
                Some(&r[..i])
            }
            None => {
                rest = None;
                Some(r)
            }
        }
    })
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

/// Set in an event's kind byte when the event is in long form: its first
/// argument is the absolute address instead of a compressed ID, and a stack
/// event's size argument is the size in bytes instead of its log2. The writer
/// uses long form for any argument the short form cannot carry exactly (an
/// address below `min_heap_addr` or off its alignment, a stack size that is
/// not a power of two).
pub const LONG_FORM: u8 = 0x80;

/// Set in an event's kind byte when one more varint follows the arguments:
/// the [`EntryPoint`] (the interposed function) that made the event. The
/// LD_PRELOAD shim tags exactly one event per call, so counting tags counts
/// calls.
pub const ENTRY_TAG: u8 = 0x40;

/// Mask of the event kind proper in an event's kind byte.
pub const EVENT_KIND_MASK: u8 = 0x3f;

/// Kinds of event in an events batch, with their arguments after the kind
/// byte and the timestamp delta.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EventKind {
    /// SpanExists [span id, npages, kind_class]
    SpanExists = 1,
    /// SpanAlloc [span id, npages, kind_class]
    SpanAlloc = 2,
    /// SpanFree [span id]
    SpanFree = 3,
    /// HeapObjectExists [object id, size, type id]
    HeapObjectExists = 4,
    /// HeapObjectAlloc [object id, size, type id]
    HeapObjectAlloc = 5,
    /// HeapObjectFree [object id]
    HeapObjectFree = 6,
    /// StackExists [stack id, order]
    StackExists = 7,
    /// StackAlloc [stack id, order]
    StackAlloc = 8,
    /// StackFree [stack id]
    StackFree = 9,
    /// Call [0]: a call that changed no memory (`free(NULL)`, a failed
    /// allocation); always entry-tagged. The argument is reserved, 0.
    Call = 10,
    /// HeapObjectAllocStack [object id, size, type id, stack id]: a heap
    /// object alloc with the call stack that made it (version 3). The stack
    /// ID is at least 1 and names a node of the generation's call-stacks
    /// batch.
    HeapObjectAllocStack = 11,
    /// SpanAllocStack [span id, npages, kind_class, stack id]: a span alloc
    /// with its call stack (version 3).
    SpanAllocStack = 12,
}

/// All event kinds, in kind-byte order.
pub const EVENT_KINDS: [EventKind; 12] = [
    EventKind::SpanExists,
    EventKind::SpanAlloc,
    EventKind::SpanFree,
    EventKind::HeapObjectExists,
    EventKind::HeapObjectAlloc,
    EventKind::HeapObjectFree,
    EventKind::StackExists,
    EventKind::StackAlloc,
    EventKind::StackFree,
    EventKind::Call,
    EventKind::HeapObjectAllocStack,
    EventKind::SpanAllocStack,
];

/// What an event's first argument identifies, and so which alignment its ID
/// is compressed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AddressClass {
    /// IDs are `(base - min_heap_addr) / page_size`.
    Span,
    /// IDs are `(addr - min_heap_addr) / min_heap_align`.
    HeapObject,
    /// IDs are `(base - min_heap_addr) / min_stack_align`.
    Stack,
    /// Not an address.
    Raw,
}

impl AddressClass {
    /// The class's index in a batch's previous IDs ([`IdDeltas`]: span 0,
    /// heap object 1, stack 2), or `None` for [`AddressClass::Raw`], whose
    /// arguments are not deltas.
    pub const fn delta_index(self) -> Option<usize> {
        match self {
            AddressClass::Span => Some(0),
            AddressClass::HeapObject => Some(1),
            AddressClass::Stack => Some(2),
            AddressClass::Raw => None,
        }
    }
}

impl EventKind {
    /// The event kind for the low bits of a kind byte, or `None`.
    pub const fn from_u8(b: u8) -> Option<EventKind> {
        if b == 0 || b as usize > EVENT_KINDS.len() {
            return None;
        }
        Some(EVENT_KINDS[b as usize - 1])
    }

    /// Number of varint arguments after the timestamp delta.
    pub const fn arg_count(self) -> usize {
        match self {
            EventKind::SpanFree
            | EventKind::HeapObjectFree
            | EventKind::StackFree
            | EventKind::Call => 1,
            EventKind::StackExists | EventKind::StackAlloc => 2,
            EventKind::HeapObjectAllocStack | EventKind::SpanAllocStack => 4,
            _ => 3,
        }
    }

    /// Whether the event's last argument is a stack ID (kinds 11 and 12).
    pub const fn has_stack(self) -> bool {
        matches!(
            self,
            EventKind::HeapObjectAllocStack | EventKind::SpanAllocStack
        )
    }

    /// The kind without a stack that this kind adds a stack ID to (kind 5
    /// for 11, 2 for 12); the kind itself for every other.
    pub const fn without_stack(self) -> EventKind {
        match self {
            EventKind::HeapObjectAllocStack => EventKind::HeapObjectAlloc,
            EventKind::SpanAllocStack => EventKind::SpanAlloc,
            other => other,
        }
    }

    /// Whether the event's second argument is a stack size, written in
    /// short form as its log2 (stack alloc and exists).
    pub const fn size_as_log2(self) -> bool {
        matches!(self, EventKind::StackExists | EventKind::StackAlloc)
    }

    /// Which alignment the event's first argument is compressed with.
    pub const fn address_class(self) -> AddressClass {
        match self {
            EventKind::SpanExists
            | EventKind::SpanAlloc
            | EventKind::SpanFree
            | EventKind::SpanAllocStack => AddressClass::Span,
            EventKind::HeapObjectExists
            | EventKind::HeapObjectAlloc
            | EventKind::HeapObjectFree
            | EventKind::HeapObjectAllocStack => AddressClass::HeapObject,
            EventKind::StackExists | EventKind::StackAlloc | EventKind::StackFree => {
                AddressClass::Stack
            }
            EventKind::Call => AddressClass::Raw,
        }
    }

    /// The snake_case name used by the CLI and its JSON output.
    pub const fn name(self) -> &'static str {
        match self {
            EventKind::SpanExists => "span_exists",
            EventKind::SpanAlloc => "span_alloc",
            EventKind::SpanFree => "span_free",
            EventKind::HeapObjectExists => "heap_object_exists",
            EventKind::HeapObjectAlloc => "heap_object_alloc",
            EventKind::HeapObjectFree => "heap_object_free",
            EventKind::StackExists => "stack_exists",
            EventKind::StackAlloc => "stack_alloc",
            EventKind::StackFree => "stack_free",
            EventKind::Call => "call",
            EventKind::HeapObjectAllocStack => "heap_object_alloc_stack",
            EventKind::SpanAllocStack => "span_alloc_stack",
        }
    }
}

/// The interposed functions of the LD_PRELOAD shim, as entry-point tags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum EntryPoint {
    Malloc = 1,
    Calloc = 2,
    Realloc = 3,
    Free = 4,
    PosixMemalign = 5,
    AlignedAlloc = 6,
    Memalign = 7,
    Valloc = 8,
    Pvalloc = 9,
    Reallocarray = 10,
    Mmap = 11,
    Munmap = 12,
    Mremap = 13,
}

/// All entry points, in tag order.
pub const ENTRY_POINTS: [EntryPoint; 13] = [
    EntryPoint::Malloc,
    EntryPoint::Calloc,
    EntryPoint::Realloc,
    EntryPoint::Free,
    EntryPoint::PosixMemalign,
    EntryPoint::AlignedAlloc,
    EntryPoint::Memalign,
    EntryPoint::Valloc,
    EntryPoint::Pvalloc,
    EntryPoint::Reallocarray,
    EntryPoint::Mmap,
    EntryPoint::Munmap,
    EntryPoint::Mremap,
];

impl EntryPoint {
    /// The entry point for a tag, or `None`.
    pub fn from_tag(tag: u64) -> Option<EntryPoint> {
        ENTRY_POINTS.get((tag as usize).wrapping_sub(1)).copied()
    }

    /// The function's name, as used in `stats --json` `entry_points`.
    pub const fn name(self) -> &'static str {
        match self {
            EntryPoint::Malloc => "malloc",
            EntryPoint::Calloc => "calloc",
            EntryPoint::Realloc => "realloc",
            EntryPoint::Free => "free",
            EntryPoint::PosixMemalign => "posix_memalign",
            EntryPoint::AlignedAlloc => "aligned_alloc",
            EntryPoint::Memalign => "memalign",
            EntryPoint::Valloc => "valloc",
            EntryPoint::Pvalloc => "pvalloc",
            EntryPoint::Reallocarray => "reallocarray",
            EntryPoint::Mmap => "mmap",
            EntryPoint::Munmap => "munmap",
            EntryPoint::Mremap => "mremap",
        }
    }
}

/// The fields of the file header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileHeader {
    /// Format version.
    pub version: u16,
    /// Flags; none are defined, so writers write 0 and readers ignore them.
    pub flags: u16,
}

impl FileHeader {
    /// The header bytes for this version: in version 2 its last four bytes
    /// are the CRC32C of the first twelve, in version 1 zero.
    pub fn encode(self) -> [u8; FILE_HEADER_LEN] {
        let v = self.version.to_le_bytes();
        let f = self.flags.to_le_bytes();
        let m = MAGIC;
        let mut h = [
            m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], v[0], v[1], f[0], f[1], 0, 0, 0, 0,
        ];
        if has_trailers(self.version) {
            let crc = batch_checksum(&[&h[..12]]);
            h[12..].copy_from_slice(&crc.to_le_bytes());
        }
        h
    }

    /// Parses a header, saying what is wrong with a bad one.
    pub fn decode(bytes: &[u8; FILE_HEADER_LEN]) -> Result<FileHeader, HeaderError> {
        if bytes[..8] != MAGIC {
            return Err(HeaderError::BadMagic);
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if !READABLE_VERSIONS.contains(&version) {
            return Err(HeaderError::UnsupportedVersion(version));
        }
        let stored = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
        // Version 1 writers left the last four bytes zero: refusing
        // anything else catches the one bit flip that turns version 3
        // into 1 (and so would skip every checksum).
        let expected = if has_trailers(version) {
            batch_checksum(&[&bytes[..12]])
        } else {
            0
        };
        if stored != expected {
            return Err(HeaderError::BadChecksum);
        }
        let flags = u16::from_le_bytes([bytes[10], bytes[11]]);
        Ok(FileHeader { version, flags })
    }
}

/// What is wrong with a file header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderError {
    /// The file does not start with [`MAGIC`]: not an alloctrace trace.
    BadMagic,
    /// A version this reader does not know.
    UnsupportedVersion(u16),
    /// A version-2 or 3 header whose checksum does not match its first 12
    /// bytes, or a version-1 header whose reserved last four bytes are not
    /// zero.
    BadChecksum,
}

/// Writes `v` as a LEB128 varint at `buf[pos..]` and returns the position
/// after it.
///
/// The caller guarantees `buf.len() - pos >= MAX_VARINT_LEN`; the writer
/// reserves room for a whole event before encoding it. Out-of-room writes
/// are cut short rather than panicking.
#[inline(always)]
pub fn put_uvarint(buf: &mut [u8], mut pos: usize, mut v: u64) -> usize {
    while v >= 0x80 {
        if let Some(b) = buf.get_mut(pos) {
            *b = (v as u8) | 0x80;
        }
        v >>= 7;
        pos += 1;
    }
    if let Some(b) = buf.get_mut(pos) {
        *b = v as u8;
    }
    pos + 1
}

/// Number of bytes `v` takes as a varint.
#[inline]
pub const fn uvarint_len(v: u64) -> usize {
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Why a varint could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VarintError {
    /// The input ended inside the varint.
    Truncated,
    /// More than ten bytes, or a tenth byte above 1: not a u64.
    Overflow,
}

/// Reads a LEB128 varint from `buf[*pos..]`, advancing `*pos` past it.
#[inline]
pub fn get_uvarint(buf: &[u8], pos: &mut usize) -> Result<u64, VarintError> {
    let mut v: u64 = 0;
    let mut shift = 0u32;
    let mut i = *pos;
    loop {
        let Some(&b) = buf.get(i) else {
            return Err(VarintError::Truncated);
        };
        i += 1;
        if shift == 63 && b > 1 {
            return Err(VarintError::Overflow);
        }
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            *pos = i;
            return Ok(v);
        }
        shift += 7;
        if shift > 63 {
            return Err(VarintError::Overflow);
        }
    }
}

/// Zigzag-encodes a signed delta so small magnitudes of either sign give
/// small varints.
#[inline(always)]
pub const fn zigzag(delta: i64) -> u64 {
    ((delta << 1) ^ (delta >> 63)) as u64
}

/// Inverse of [`zigzag`].
#[inline(always)]
pub const fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// The previous short-form ID of each address class within one compact
/// events batch: the base its next ID is a delta from. Starts at 0 in every
/// batch; long-form events neither use nor change it.
/// One `[u64; 3]` in memory, indexed span, heap object, stack (the C
/// header's inline event path writes it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct IdDeltas {
    prev: [u64; 3],
}

impl IdDeltas {
    #[inline(always)]
    const fn index(class: AddressClass) -> Option<usize> {
        class.delta_index()
    }

    /// Writer: the argument to write for `id`, remembering it.
    #[inline(always)]
    pub fn encode(&mut self, class: AddressClass, id: u64) -> u64 {
        match Self::index(class) {
            Some(i) => {
                let delta = id.wrapping_sub(self.prev[i]) as i64;
                self.prev[i] = id;
                zigzag(delta)
            }
            None => id,
        }
    }

    /// Reader: the ID for a written argument, remembering it.
    #[inline(always)]
    pub fn decode(&mut self, class: AddressClass, arg: u64) -> u64 {
        match Self::index(class) {
            Some(i) => {
                let id = self.prev[i].wrapping_add(unzigzag(arg) as u64);
                self.prev[i] = id;
                id
            }
            None => arg,
        }
    }
}

/// log2 of a power of two; `None` for anything else.
#[inline]
pub const fn exact_log2(v: u64) -> Option<u32> {
    if v != 0 && v & (v - 1) == 0 {
        Some(v.trailing_zeros())
    } else {
        None
    }
}

/// Compresses an address into an ID: `(addr - min) / align`, or `None` when
/// that would not be exact (address below `min`, or off the alignment). The
/// caller then writes the event in [`LONG_FORM`]. `align_shift` is log2 of
/// the alignment.
#[inline(always)]
pub const fn compress_address(addr: u64, min: u64, align_shift: u32) -> Option<u64> {
    if addr < min {
        return None;
    }
    let off = addr - min;
    if off & ((1u64 << align_shift) - 1) != 0 {
        return None;
    }
    Some(off >> align_shift)
}

/// Restores an address from an ID. Wraps instead of overflowing, so a
/// corrupt ID gives a wrong address, never a panic.
#[inline]
pub const fn restore_address(id: u64, min: u64, align_shift: u32) -> u64 {
    min.wrapping_add(id.wrapping_shl(align_shift))
}

/// The short form of an event's first two arguments: the first argument
/// compressed into an ID (`addr` itself for [`AddressClass::Raw`]) and the
/// second one as written (a stack size as its log2). `None` when the short
/// form cannot carry them exactly: the event is then written in
/// [`LONG_FORM`], with `addr` and `arg1` as they are. `align_shift` is the
/// log2 alignment of the kind's address class.
///
/// The writer's one decision between the two forms (its fast and slow
/// paths both call this; the C header's inline path makes the same one,
/// and a test compares their bytes).
#[inline(always)]
pub const fn short_form(
    kind: EventKind,
    addr: u64,
    arg1: u64,
    min: u64,
    align_shift: u32,
) -> Option<(u64, u64)> {
    let id = match kind.address_class() {
        AddressClass::Raw => addr,
        _ => match compress_address(addr, min, align_shift) {
            Some(id) => id,
            None => return None,
        },
    };
    if !kind.size_as_log2() {
        return Some((id, arg1));
    }
    match exact_log2(arg1) {
        Some(order) => Some((id, order as u64)),
        None => None,
    }
}

/// Writes `v` as a LEB128 varint at `out[pos..]`, where `pos + 10 <=
/// MAX_EVENT_LEN`, and returns the position after it. Bounded loop and
/// indices, so the compiler proves every access in range.
#[inline(always)]
fn put_event_varint(out: &mut [u8; MAX_EVENT_LEN], pos: usize, mut v: u64) -> usize {
    let Some(dst) = out.get_mut(pos..pos + MAX_VARINT_LEN) else {
        return pos;
    };
    // One byte, the common case, first: no loop state to set up.
    if v < 0x80 {
        dst[0] = v as u8;
        return pos + 1;
    }
    let mut i = 0;
    while i < MAX_VARINT_LEN - 1 && v >= 0x80 {
        dst[i] = (v as u8) | 0x80;
        v >>= 7;
        i += 1;
    }
    dst[i] = v as u8;
    pos + i + 1
}

/// Encodes one event of a compact events batch (FORMAT.md section 3) into
/// `out` and returns its length: the kind byte (`kind` with `flags`, which
/// are [`LONG_FORM`] and [`ENTRY_TAG`] or neither), the time delta, the
/// first argument, as many more as `kind` has, and the entry tag when
/// `flags` has [`ENTRY_TAG`].
///
/// `args` is `[first, second, third, fourth, entry]` as written: the first
/// is the zigzag ID delta ([`IdDeltas::encode`]) in short form and the
/// address in long form; the second a stack size's log2 in short form
/// ([`short_form`]); the fourth the stack ID of kinds 11 and 12 (ignored,
/// pass 0, for the other kinds).
/// The only event encoder of the writer (the writer crate's emit.rs, fast and slow path);
/// the C header's inline path writes the same bytes. Pure: no allocation,
/// no panic.
#[inline(always)]
pub fn encode_event(
    out: &mut [u8; MAX_EVENT_LEN],
    kind: EventKind,
    flags: u8,
    time_delta: u64,
    args: [u64; 5],
) -> usize {
    let [first, second, third, fourth, entry] = args;
    let flags = flags & (LONG_FORM | ENTRY_TAG);
    out[0] = kind as u8 | flags;
    let mut pos = put_event_varint(out, 1, time_delta);
    pos = put_event_varint(out, pos, first);
    if kind.arg_count() >= 2 {
        pos = put_event_varint(out, pos, second);
    }
    if kind.arg_count() >= 3 {
        pos = put_event_varint(out, pos, third);
    }
    if kind.arg_count() >= 4 {
        pos = put_event_varint(out, pos, fourth);
    }
    if flags & ENTRY_TAG != 0 {
        pos = put_event_varint(out, pos, entry);
    }
    pos
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_event_writes_the_format() {
        let mut out = [0u8; MAX_EVENT_LEN];
        // Heap alloc, short form: kind, delta 300, zigzag id delta, size, type.
        let n = encode_event(
            &mut out,
            EventKind::HeapObjectAlloc,
            0,
            300,
            [zigzag(-2), 48, 7, 0, 0],
        );
        assert_eq!(&out[..n], &[5, 0xac, 0x02, 3, 48, 7]);
        // The same with a stack: kind 11, the stack ID after the type.
        let n = encode_event(
            &mut out,
            EventKind::HeapObjectAllocStack,
            ENTRY_TAG,
            300,
            [zigzag(-2), 48, 7, 200, 1],
        );
        assert_eq!(
            &out[..n],
            &[11 | ENTRY_TAG, 0xac, 0x02, 3, 48, 7, 0xc8, 0x01, 1]
        );
        // A free carries one argument; the entry tag adds a varint.
        let n = encode_event(
            &mut out,
            EventKind::HeapObjectFree,
            ENTRY_TAG,
            0,
            [9, 1, 2, 3, 4],
        );
        assert_eq!(&out[..n], &[6 | ENTRY_TAG, 0, 9, 4]);
        // Long form stack alloc: the size in bytes.
        let n = encode_event(
            &mut out,
            EventKind::StackAlloc,
            LONG_FORM,
            1,
            [0x5000, 3000, 0, 0, 0],
        );
        assert_eq!(&out[..n], &[8 | LONG_FORM, 1, 0x80, 0xa0, 0x01, 0xb8, 0x17]);
        // The longest event fits and decodes back.
        let n = encode_event(
            &mut out,
            EventKind::SpanAllocStack,
            LONG_FORM | ENTRY_TAG,
            u64::MAX,
            [u64::MAX; 5],
        );
        assert_eq!(n, MAX_EVENT_LEN);
        assert_eq!(MAX_EVENT_LEN, 61);
        let mut pos = 1;
        for _ in 0..6 {
            assert_eq!(get_uvarint(&out, &mut pos), Ok(u64::MAX));
        }
        // Every kind: the argument count of the format.
        for kind in EVENT_KINDS {
            let n = encode_event(&mut out, kind, 0, 1, [1, 1, 1, 1, 1]);
            assert_eq!(n, 2 + kind.arg_count(), "{kind:?}");
        }
    }

    #[test]
    fn short_form_is_exact_or_none() {
        let min = 0x10000;
        assert_eq!(
            short_form(EventKind::HeapObjectAlloc, 0x10040, 48, min, 4),
            Some((4, 48))
        );
        assert_eq!(
            short_form(EventKind::HeapObjectAlloc, 0x10041, 48, min, 4),
            None
        );
        assert_eq!(
            short_form(EventKind::HeapObjectFree, 0x100, 0, min, 4),
            None
        );
        assert_eq!(
            short_form(EventKind::StackAlloc, 0x12000, 8192, min, 12),
            Some((2, 13))
        );
        assert_eq!(
            short_form(EventKind::StackAlloc, 0x12000, 3000, min, 12),
            None
        );
        assert_eq!(
            short_form(EventKind::StackExists, 0x12000, 0, min, 12),
            None
        );
        assert_eq!(
            short_form(EventKind::StackFree, 0x12000, 3000, min, 12),
            Some((2, 3000))
        );
        assert_eq!(short_form(EventKind::Call, 0, 0, min, 0), Some((0, 0)));
    }

    #[test]
    fn varint_round_trip_at_boundaries() {
        let values = [
            0u64,
            1,
            127,
            128,
            255,
            16383,
            16384,
            u32::MAX as u64,
            u64::MAX - 1,
            u64::MAX,
        ];
        for &v in &values {
            let mut buf = [0u8; MAX_VARINT_LEN];
            let end = put_uvarint(&mut buf, 0, v);
            assert_eq!(end, uvarint_len(v), "length of {v}");
            let mut pos = 0;
            assert_eq!(get_uvarint(&buf[..end], &mut pos), Ok(v));
            assert_eq!(pos, end);
        }
    }

    #[test]
    fn varint_rejects_truncation_and_overflow() {
        let mut pos = 0;
        assert_eq!(
            get_uvarint(&[0x80, 0x80], &mut pos),
            Err(VarintError::Truncated)
        );
        let eleven = [0xffu8; 11];
        let mut pos = 0;
        assert_eq!(get_uvarint(&eleven, &mut pos), Err(VarintError::Overflow));
        let tenth_too_big = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        let mut pos = 0;
        assert_eq!(
            get_uvarint(&tenth_too_big, &mut pos),
            Err(VarintError::Overflow)
        );
        assert_eq!(pos, 0, "position must not move on error");
    }

    #[test]
    fn short_buffer_write_does_not_panic() {
        let mut buf = [0u8; 2];
        assert_eq!(put_uvarint(&mut buf, 1, u64::MAX), 11);
    }

    #[test]
    fn header_round_trip_and_errors() {
        let h = FileHeader {
            version: VERSION,
            flags: 0,
        };
        let bytes = h.encode();
        assert_eq!(FileHeader::decode(&bytes), Ok(h));
        let mut bad = bytes;
        bad[0] = b'X';
        assert_eq!(FileHeader::decode(&bad), Err(HeaderError::BadMagic));
        let mut v6 = bytes;
        v6[8] = 6;
        assert_eq!(
            FileHeader::decode(&v6),
            Err(HeaderError::UnsupportedVersion(6))
        );
        let v4 = FileHeader {
            version: VERSION_4,
            flags: 0,
        };
        assert_eq!(FileHeader::decode(&v4.encode()), Ok(v4));
        let v3 = FileHeader {
            version: VERSION_3,
            flags: 0,
        };
        assert_eq!(FileHeader::decode(&v3.encode()), Ok(v3));
        let v2 = FileHeader {
            version: VERSION_2,
            flags: 0,
        };
        assert_eq!(FileHeader::decode(&v2.encode()), Ok(v2));
        let v1 = FileHeader {
            version: VERSION_1,
            flags: 0,
        };
        assert_eq!(
            &v1.encode()[12..],
            &[0; 4],
            "version 1 keeps its reserved bytes zero"
        );
        assert_eq!(FileHeader::decode(&v1.encode()), Ok(v1));
        for bit in 0..FILE_HEADER_LEN * 8 {
            let mut flipped = bytes;
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(
                FileHeader::decode(&flipped).is_err(),
                "bit {bit} of a version-4 header"
            );
        }
    }

    #[test]
    fn checksum_is_crc32c() {
        // The check value of CRC-32C (RFC 3720, B.4): "123456789".
        assert_eq!(batch_checksum(&[b"123456789"]), 0xe306_9283);
        assert_eq!(batch_checksum(&[b"1234", b"", b"56789"]), 0xe306_9283);
        assert_eq!(batch_checksum(&[]), 0);
        // FORMAT.md's examples.
        let header = FileHeader {
            version: 2,
            flags: 0,
        }
        .encode();
        assert_eq!(&header[8..], &[2, 0, 0, 0, 0xcb, 0xe9, 0x46, 0x9c]);
        let header = FileHeader {
            version: 3,
            flags: 0,
        }
        .encode();
        assert_eq!(&header[8..], &[3, 0, 0, 0, 0x73, 0x43, 0x03, 0x41]);
        let header = FileHeader {
            version: 4,
            flags: 0,
        }
        .encode();
        assert_eq!(&header[8..], &[4, 0, 0, 0, 0xb9, 0xfb, 0x03, 0x58]);
        assert_eq!(batch_checksum(&[&[5, 3, 0, 0, 0, 1, 0, 0]]), 0xf94d_aae6);
        // The process batch of section 11: `ls -l`.
        let process = [13, 11, 0, 0, 0, 1, 0, 0, 0, 2, 2, b'l', b's', 2, b'-', b'l'];
        assert_eq!(batch_checksum(&[&process]), 0xdbf5_a04c);
    }

    #[test]
    fn zigzag_and_id_deltas_round_trip() {
        for d in [0i64, 1, -1, 63, -64, i64::MAX, i64::MIN] {
            assert_eq!(unzigzag(zigzag(d)), d);
        }
        assert_eq!(zigzag(-1), 1);
        assert_eq!(zigzag(1), 2);
        let ids = [
            (AddressClass::HeapObject, 1000u64),
            (AddressClass::Span, 5),
            (AddressClass::HeapObject, 998),
            (AddressClass::HeapObject, u64::MAX),
            (AddressClass::Raw, 77),
            (AddressClass::HeapObject, 0),
        ];
        let (mut w, mut r) = (IdDeltas::default(), IdDeltas::default());
        for (class, id) in ids {
            let arg = w.encode(class, id);
            assert_eq!(r.decode(class, arg), id);
        }
        let mut w = IdDeltas::default();
        w.encode(AddressClass::HeapObject, 1000);
        assert_eq!(
            w.encode(AddressClass::HeapObject, 998),
            3,
            "-2 zigzags to 3"
        );
    }

    #[test]
    fn address_compression() {
        assert_eq!(compress_address(0x1010, 0x1000, 4), Some(1));
        assert_eq!(compress_address(0x1008, 0x1000, 4), None, "off alignment");
        assert_eq!(compress_address(0x0ff0, 0x1000, 4), None, "below min");
        assert_eq!(restore_address(1, 0x1000, 4), 0x1010);
        assert_eq!(exact_log2(4096), Some(12));
        assert_eq!(exact_log2(3), None);
        assert_eq!(exact_log2(0), None);
    }

    #[test]
    fn command_line_args_split_at_nul() {
        let args = |raw: &'static [u8]| command_line_args(raw).collect::<alloc::vec::Vec<_>>();
        assert_eq!(args(b"ls\0-l\0"), [&b"ls"[..], b"-l"]);
        assert_eq!(args(b"ls\0\0x\0"), [&b"ls"[..], b"", b"x"]);
        // Cut: the last argument has no NUL.
        assert_eq!(args(b"ls\0-lon"), [&b"ls"[..], b"-lon"]);
        assert_eq!(args(b"\0"), [&b""[..]]);
        assert!(args(b"").is_empty());
    }

    #[test]
    fn event_kinds_round_trip() {
        for (i, k) in EVENT_KINDS.iter().enumerate() {
            assert_eq!(EventKind::from_u8(i as u8 + 1), Some(*k));
        }
        assert_eq!(EventKind::from_u8(0), None);
        assert_eq!(EventKind::from_u8(10), Some(EventKind::Call));
        assert_eq!(
            EventKind::from_u8(11),
            Some(EventKind::HeapObjectAllocStack)
        );
        assert_eq!(EventKind::from_u8(12), Some(EventKind::SpanAllocStack));
        assert_eq!(EventKind::from_u8(13), None);
        for k in EVENT_KINDS {
            let base = k.without_stack();
            assert_eq!(k.has_stack(), base != k, "{k:?}");
            assert_eq!(base.address_class(), k.address_class(), "{k:?}");
            let extra = usize::from(k.has_stack());
            assert_eq!(k.arg_count(), base.arg_count() + extra, "{k:?}");
        }
        assert_eq!(BatchKind::from_u8(12), Some(BatchKind::CallStacks));
        assert_eq!(BatchKind::from_u8(13), Some(BatchKind::Process));
        assert_eq!(BatchKind::from_u8(14), None);
        for (i, e) in ENTRY_POINTS.iter().enumerate() {
            assert_eq!(EntryPoint::from_tag(i as u64 + 1), Some(*e));
        }
        assert_eq!(EntryPoint::from_tag(0), None);
        assert_eq!(EntryPoint::from_tag(14), None);
        for b in 0..=255u8 {
            if let Some(k) = BatchKind::from_u8(b) {
                assert_eq!(k as u8, b);
            }
        }
    }
}

/// The page tracer's packed 8-byte words (batch kind [`BatchKind::Pages`]),
/// after the Go runtime's page tracer, with the bit split derived from the
/// page shift instead of fixed for 8 KiB pages. docs/FORMAT.md section 7.
///
/// An event word, for page shift `s`:
/// `[16 time delta][48 - s base >> s][s - 3 npages][1 large][2 kind]`.
/// The low `s` bits of a page-aligned base are zero, which is what makes
/// room for kind, large and npages. A sync word (kind 0) is
/// `[60 payload][2 subtype][2 kind = 0]`.
pub mod pages {
    /// Word kinds (the low two bits).
    pub const KIND_SYNC: u64 = 0;
    /// Pages allocated.
    pub const KIND_ALLOC: u64 = 1;
    /// Pages freed.
    pub const KIND_FREE: u64 = 2;
    /// Pages scavenged (returned to the OS).
    pub const KIND_SCAV: u64 = 3;

    /// Sync subtype: payload is the new time base in units (ticks >> lost bits).
    pub const SYNC_TIME: u64 = 0;
    /// Sync subtype: payload is the trace thread ID of the writer.
    pub const SYNC_THREAD: u64 = 1;
    /// Sync subtype: payload is the layout: `page_shift | lost_bits << 6`.
    pub const SYNC_LAYOUT: u64 = 2;
    /// Sync subtype: a long-form event: payload is `kind | delta << 2`, and
    /// two more words follow: the full base address and the full npages.
    pub const SYNC_LONG_EVENT: u64 = 3;

    /// Bits of address space a short event word covers (user space on
    /// x86-64 and arm64); bases at or above 2^48 take the long form.
    pub const ADDRESS_BITS: u32 = 48;
    /// Bits of the time delta in an event word.
    pub const DELTA_BITS: u32 = 16;
    /// Low tick bits dropped from page-event times, as in the Go tracer.
    pub const TIME_LOST_BITS: u32 = 7;
    /// Smallest page shift with room for kind, large and one npages bit.
    pub const MIN_PAGE_SHIFT: u32 = 4;
    /// Largest page shift accepted.
    pub const MAX_PAGE_SHIFT: u32 = 40;

    /// How a pages batch packs its words; written in its first word.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Layout {
        /// log2 of the page size.
        pub page_shift: u32,
        /// Low tick bits dropped from times.
        pub lost_bits: u32,
    }

    impl Layout {
        /// Bits of the npages field.
        pub const fn npages_bits(self) -> u32 {
            self.page_shift - 3
        }

        /// Whether an event fits a short word: base page-aligned and below
        /// 2^48. npages that do not fit go in a second word ("large").
        pub const fn fits(self, base: u64) -> bool {
            base & ((1u64 << self.page_shift) - 1) == 0 && base >> ADDRESS_BITS == 0
        }

        /// Whether npages needs the large form.
        pub const fn is_large(self, npages: u64) -> bool {
            npages >> self.npages_bits() != 0
        }

        /// The layout sync word.
        pub const fn word(self) -> u64 {
            sync_word(
                SYNC_LAYOUT,
                self.page_shift as u64 | (self.lost_bits as u64) << 6,
            )
        }

        /// Parses a layout payload, or `None` if out of range.
        pub const fn from_payload(payload: u64) -> Option<Layout> {
            let page_shift = (payload & 0x3f) as u32;
            let lost_bits = ((payload >> 6) & 0x3f) as u32;
            if payload >> 12 != 0
                || page_shift < MIN_PAGE_SHIFT
                || page_shift > MAX_PAGE_SHIFT
                || lost_bits > 32
            {
                return None;
            }
            Some(Layout {
                page_shift,
                lost_bits,
            })
        }

        /// A short event word. The caller checked [`Layout::fits`] and that
        /// `delta < 2^DELTA_BITS`; for a large event it writes npages in the
        /// next word and this word's npages field is 0.
        pub const fn event_word(self, kind: u64, base: u64, npages: u64, delta: u64) -> u64 {
            let (large, np) = if self.is_large(npages) {
                (1, 0)
            } else {
                (0, npages)
            };
            base | kind | large << 2 | np << 3 | delta << (64 - DELTA_BITS)
        }
    }

    /// A sync word.
    pub const fn sync_word(subtype: u64, payload: u64) -> u64 {
        payload << 4 | subtype << 2 | KIND_SYNC
    }

    /// One decoded word.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Word {
        /// A sync word: subtype and 60-bit payload.
        Sync { subtype: u64, payload: u64 },
        /// A short event word. With `large`, npages is in the next word.
        Event {
            kind: u64,
            base: u64,
            npages: u64,
            large: bool,
            delta: u64,
        },
    }

    /// Decodes a word under `layout`.
    pub const fn decode(layout: Layout, w: u64) -> Word {
        let kind = w & 3;
        if kind == KIND_SYNC {
            return Word::Sync {
                subtype: (w >> 2) & 3,
                payload: w >> 4,
            };
        }
        let address_mask = ((1u64 << ADDRESS_BITS) - 1) & !((1u64 << layout.page_shift) - 1);
        Word::Event {
            kind,
            base: w & address_mask,
            npages: (w >> 3) & ((1u64 << layout.npages_bits()) - 1),
            large: (w >> 2) & 1 == 1,
            delta: w >> (64 - DELTA_BITS),
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn seed_split_for_8k_pages() {
            // Go's layout: 35 address bits, 10 npages bits for 8 KiB pages.
            let l = Layout {
                page_shift: 13,
                lost_bits: TIME_LOST_BITS,
            };
            assert_eq!(l.npages_bits(), 10);
            assert_eq!(ADDRESS_BITS - l.page_shift, 35);
            let w = l.event_word(KIND_ALLOC, 0x7f00_1234_e000, 1023, 0xffff);
            assert_eq!(
                decode(l, w),
                Word::Event {
                    kind: KIND_ALLOC,
                    base: 0x7f00_1234_e000,
                    npages: 1023,
                    large: false,
                    delta: 0xffff
                }
            );
            assert!(l.is_large(1024));
        }

        #[test]
        fn layout_word_round_trip_and_limits() {
            let l = Layout {
                page_shift: 12,
                lost_bits: 7,
            };
            match decode(l, l.word()) {
                Word::Sync {
                    subtype: SYNC_LAYOUT,
                    payload,
                } => assert_eq!(Layout::from_payload(payload), Some(l)),
                other => panic!("{other:?}"),
            }
            assert_eq!(Layout::from_payload(3), None);
            assert_eq!(Layout::from_payload(41), None);
            assert!(!l.fits(0x1001));
            assert!(!l.fits(1 << 48));
            assert!(l.fits((1 << 48) - 4096));
        }
    }
}
