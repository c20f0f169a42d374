//! Events: their kinds and properties, the choice between short and long
//! form, and the one encoder of an event (FORMAT.md section 3).

use crate::address::{compress_address, exact_log2, AddressClass};
use crate::varint::{get_uvarint, uvarint_len, VarintError, MAX_VARINT_LEN};

/// Most bytes one event takes: kind, timestamp delta, four arguments (a
/// stack event's stack ID is the fourth) and an entry-point tag: 61.
pub const MAX_EVENT_LEN: usize = 1 + 6 * MAX_VARINT_LEN;

/// Largest stack-size order (log2 of the size) a short-form stack event may
/// carry.
pub const MAX_STACK_ORDER: u64 = 63;

/// Set in an event's kind byte when the event is in long form: its first
/// argument is the absolute address instead of a compressed ID, and a stack
/// event's size argument is the size in bytes instead of its log2. The writer
/// uses long form for any argument the short form cannot carry exactly (an
/// address below `min_heap_addr` or off its alignment, a stack size that is
/// not a power of two).
pub const LONG_FORM: u8 = 0x80;

/// Set in an event's kind byte when one more varint follows the arguments:
/// the [`EntryPoint`](crate::EntryPoint) (the interposed function) that made the event. The
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
    /// Call \[0\]: a call that changed no memory (`free(NULL)`, a failed
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

/// One row of the event spec: everything the format says about one event
/// kind. [`EVENT_SPECS`] holds a row per kind; [`EventKind`]'s property
/// methods read it, so adding a kind or an argument is one row here (plus
/// the writer's call and the reader's meaning of the new argument).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventSpec {
    /// The kind the row describes; row `i` is kind `i + 1`.
    pub kind: EventKind,
    /// The snake_case name used by the CLI and its JSON output.
    pub name: &'static str,
    /// The varint arguments after the timestamp delta, by name, in order.
    pub args: &'static [&'static str],
    /// What the first argument identifies, and so which alignment its ID
    /// is compressed with.
    pub class: AddressClass,
    /// The second argument is a thread-stack size, written in short form
    /// as its log2.
    pub size_as_log2: bool,
    /// The last argument is a call-stack ID (at least 1).
    pub stack: bool,
    /// The kind this one adds a call-stack ID to; the kind itself when it
    /// has none.
    pub without_stack: EventKind,
}

impl EventSpec {
    /// A row for a kind without a call stack.
    const fn plain(
        kind: EventKind,
        name: &'static str,
        args: &'static [&'static str],
        class: AddressClass,
    ) -> EventSpec {
        EventSpec {
            kind,
            name,
            args,
            class,
            size_as_log2: false,
            stack: false,
            without_stack: kind,
        }
    }

    /// The row of a kind whose second argument is a thread-stack size.
    const fn sized(self) -> EventSpec {
        EventSpec {
            size_as_log2: true,
            ..self
        }
    }

    /// The row of `kind`: `self`'s kind with a call-stack ID appended.
    const fn with_stack(
        self,
        kind: EventKind,
        name: &'static str,
        args: &'static [&'static str],
    ) -> EventSpec {
        EventSpec {
            kind,
            name,
            args,
            stack: true,
            without_stack: self.kind,
            ..self
        }
    }
}

const SPAN_ALLOC: EventSpec = EventSpec::plain(
    EventKind::SpanAlloc,
    "span_alloc",
    &["span id", "npages", "kind_class"],
    AddressClass::Span,
);
const HEAP_OBJECT_ALLOC: EventSpec = EventSpec::plain(
    EventKind::HeapObjectAlloc,
    "heap_object_alloc",
    &["object id", "size", "type id"],
    AddressClass::HeapObject,
);

/// The event spec, in kind-byte order: row `k - 1` describes kind `k`.
/// The per-kind properties ([`EventKind::arg_count`] and the others) are
/// const lookups into it, folded at compile time where the kind is known
/// (the writer's event path, whose kind is a const parameter).
pub const EVENT_SPECS: [EventSpec; 12] = {
    use AddressClass::{HeapObject, Raw, Span, Stack};
    use EventKind as K;
    let rows = [
        EventSpec::plain(K::SpanExists, "span_exists", SPAN_ALLOC.args, Span),
        SPAN_ALLOC,
        EventSpec::plain(K::SpanFree, "span_free", &["span id"], Span),
        EventSpec::plain(
            K::HeapObjectExists,
            "heap_object_exists",
            HEAP_OBJECT_ALLOC.args,
            HeapObject,
        ),
        HEAP_OBJECT_ALLOC,
        EventSpec::plain(
            K::HeapObjectFree,
            "heap_object_free",
            &["object id"],
            HeapObject,
        ),
        EventSpec::plain(
            K::StackExists,
            "stack_exists",
            &["stack id", "order"],
            Stack,
        )
        .sized(),
        EventSpec::plain(K::StackAlloc, "stack_alloc", &["stack id", "order"], Stack).sized(),
        EventSpec::plain(K::StackFree, "stack_free", &["stack id"], Stack),
        EventSpec::plain(K::Call, "call", &["reserved 0"], Raw),
        HEAP_OBJECT_ALLOC.with_stack(
            K::HeapObjectAllocStack,
            "heap_object_alloc_stack",
            &["object id", "size", "type id", "stack id"],
        ),
        SPAN_ALLOC.with_stack(
            K::SpanAllocStack,
            "span_alloc_stack",
            &["span id", "npages", "kind_class", "stack id"],
        ),
    ];
    // Checked at compile time: row i is kind i + 1; a kind with a call
    // stack has its base's arguments plus one; at most four arguments
    // (MAX_EVENT_LEN); a size is the second argument.
    let mut i = 0;
    while i < rows.len() {
        let row = rows[i];
        assert!(row.kind as usize == i + 1);
        assert!(!row.args.is_empty() && row.args.len() <= 4);
        assert!(!row.size_as_log2 || row.args.len() >= 2);
        let base = rows[row.without_stack as usize - 1];
        if row.stack {
            assert!(!base.stack && base.args.len() + 1 == row.args.len());
        } else {
            assert!(row.without_stack as u8 == row.kind as u8);
        }
        i += 1;
    }
    rows
};

/// All event kinds, in kind-byte order: the spec's kinds.
pub const EVENT_KINDS: [EventKind; 12] = {
    let mut kinds = [EventKind::Call; 12];
    let mut i = 0;
    while i < kinds.len() {
        kinds[i] = EVENT_SPECS[i].kind;
        i += 1;
    }
    kinds
};

impl EventKind {
    /// The event kind for the low bits of a kind byte, or `None`.
    pub const fn from_u8(b: u8) -> Option<EventKind> {
        if b == 0 || b as usize > EVENT_KINDS.len() {
            return None;
        }
        Some(EVENT_KINDS[b as usize - 1])
    }

    /// The kind's row of [`EVENT_SPECS`].
    #[inline(always)]
    pub const fn spec(self) -> EventSpec {
        EVENT_SPECS[self as usize - 1]
    }

    /// Number of varint arguments after the timestamp delta.
    #[inline(always)]
    pub const fn arg_count(self) -> usize {
        self.spec().args.len()
    }

    /// Whether the event's last argument is a call-stack ID (kinds 11 and
    /// 12).
    #[inline(always)]
    pub const fn has_stack(self) -> bool {
        self.spec().stack
    }

    /// The kind without a call stack that this kind adds a call-stack ID to
    /// (kind 5 for 11, 2 for 12); the kind itself for every other.
    #[inline(always)]
    pub const fn without_stack(self) -> EventKind {
        self.spec().without_stack
    }

    /// Whether the event's second argument is a thread-stack size, written
    /// in short form as its log2 (stack alloc and exists).
    #[inline(always)]
    pub const fn size_as_log2(self) -> bool {
        self.spec().size_as_log2
    }

    /// Which alignment the event's first argument is compressed with.
    #[inline(always)]
    pub const fn address_class(self) -> AddressClass {
        self.spec().class
    }

    /// The snake_case name used by the CLI and its JSON output.
    #[inline(always)]
    pub const fn name(self) -> &'static str {
        self.spec().name
    }
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
    // Two and three bytes (most time deltas, ID deltas and stack IDs)
    // straight, without the loop's two tests a byte.
    if v < 1 << 14 {
        dst[0] = v as u8 | 0x80;
        dst[1] = (v >> 7) as u8;
        return pos + 2;
    }
    if v < 1 << 21 {
        dst[0] = v as u8 | 0x80;
        dst[1] = (v >> 7) as u8 | 0x80;
        dst[2] = (v >> 14) as u8;
        return pos + 3;
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
/// is the zigzag ID delta ([`IdDeltas::encode`](crate::IdDeltas::encode)) in short form and the
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

/// One event as [`encode_event`] takes it and [`decode_event`] gives it
/// back: the fields of FORMAT.md section 3, arguments still as written
/// (IDs as deltas or addresses, a thread-stack size as its log2 in short
/// form).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventFields {
    /// The event kind.
    pub kind: EventKind,
    /// The kind byte's [`LONG_FORM`] and [`ENTRY_TAG`] bits.
    pub flags: u8,
    /// The timestamp delta.
    pub time_delta: u64,
    /// `[first, second, third, fourth, entry]`: the kind's arguments
    /// ([`EventKind::arg_count`] of them), then the entry tag when `flags`
    /// has [`ENTRY_TAG`]; every other slot is 0.
    pub args: [u64; 5],
}

impl EventFields {
    /// Whether the event is in [`LONG_FORM`].
    #[inline(always)]
    pub const fn long_form(&self) -> bool {
        self.flags & LONG_FORM != 0
    }

    /// Whether the event carries an entry tag ([`ENTRY_TAG`]).
    #[inline(always)]
    pub const fn tagged(&self) -> bool {
        self.flags & ENTRY_TAG != 0
    }

    /// The entry tag, 0 when untagged.
    #[inline(always)]
    pub const fn entry(&self) -> u64 {
        self.args[4]
    }

    /// Writes the event with [`encode_event`] and returns its length.
    #[inline(always)]
    pub fn encode(&self, out: &mut [u8; MAX_EVENT_LEN]) -> usize {
        encode_event(out, self.kind, self.flags, self.time_delta, self.args)
    }

    /// The length [`encode_event`] gives the event: every varint in its
    /// shortest form. An event [`decode_event`] read from more bytes held a
    /// varint that was not.
    pub const fn encoded_len(&self) -> usize {
        let mut len = 1 + uvarint_len(self.time_delta);
        let mut i = 0;
        while i < self.kind.arg_count() {
            len += uvarint_len(self.args[i]);
            i += 1;
        }
        if self.tagged() {
            len += uvarint_len(self.args[4]);
        }
        len
    }
}

/// Why [`decode_event`] refused an event. Positions are indices into the
/// buffer it was given; [`core::fmt::Display`] says what is wrong, naming
/// the kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventError {
    /// No byte at the position: the payload ended.
    End,
    /// The kind byte's low bits name no kind.
    UnknownKind { kind_byte: u8 },
    /// A call event (kind 10) untagged or in long form.
    CallForm { kind_byte: u8 },
    /// The event runs past the end of the buffer.
    Truncated { kind: EventKind },
    /// Varint `arg` (0 the timestamp delta, 1 the first argument, ...,
    /// `arg_count + 1` the entry tag), at position `at`, overflows 64 bits.
    Overflow {
        kind: EventKind,
        arg: usize,
        at: usize,
    },
    /// An entry tag that names no [`EntryPoint`](crate::EntryPoint).
    UnknownEntry { kind: EventKind, entry: u64 },
    /// A kind with a call stack whose stack ID is 0.
    StackIdZero { kind: EventKind },
    /// A short-form thread-stack event whose size order is above
    /// [`MAX_STACK_ORDER`].
    StackOrder { kind: EventKind, order: u64 },
}

impl core::fmt::Display for EventError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            EventError::End => write!(f, "event expected but the payload ended"),
            EventError::UnknownKind { kind_byte } => {
                write!(f, "unknown event kind {}", kind_byte & EVENT_KIND_MASK)
            }
            EventError::CallForm { kind_byte } => write!(
                f,
                "call event kind byte 0x{kind_byte:02x}: a call is always entry-tagged and never long form"
            ),
            EventError::Truncated { kind } => {
                write!(f, "{} event runs past the end of the payload", kind.name())
            }
            EventError::Overflow { kind, arg: 0, .. } => write!(
                f,
                "the timestamp delta of a {} event overflows 64 bits",
                kind.name()
            ),
            EventError::Overflow { kind, arg, .. } => write!(
                f,
                "argument {arg} of a {} event overflows 64 bits",
                kind.name()
            ),
            EventError::UnknownEntry { kind, entry } => {
                write!(f, "unknown entry point {entry} on a {} event", kind.name())
            }
            EventError::StackIdZero { kind } => write!(
                f,
                "{} event with stack ID 0 (an allocation without a stack is written as kind {})",
                kind.name(),
                kind.without_stack() as u8
            ),
            EventError::StackOrder { kind, order } => write!(
                f,
                "{} event with stack order {order} (at most {MAX_STACK_ORDER})",
                kind.name()
            ),
        }
    }
}

/// Decodes the event at `buf[*pos..]`, the inverse of [`encode_event`]:
/// moves `*pos` past it, or leaves `*pos` alone and says why the event is
/// refused (FORMAT.md section 3: an unknown kind or entry tag, a call event
/// untagged or in long form, a call-stack ID 0, a short-form thread-stack
/// order above [`MAX_STACK_ORDER`], a truncated or overflowing varint).
/// Accepts varints longer than their shortest form; compare
/// [`EventFields::encoded_len`] to refuse them.
///
/// The one decoder of event bodies: the reader's checked decoder and the
/// compression model call it; the reader's fast decoders are tested
/// against it. Pure: no allocation, no panic.
pub fn decode_event(buf: &[u8], pos: &mut usize) -> Result<EventFields, EventError> {
    let start = *pos;
    let Some(&kind_byte) = buf.get(start) else {
        return Err(EventError::End);
    };
    let Some(kind) = EventKind::from_u8(kind_byte & EVENT_KIND_MASK) else {
        return Err(EventError::UnknownKind { kind_byte });
    };
    let flags = kind_byte & (LONG_FORM | ENTRY_TAG);
    if matches!(kind, EventKind::Call) && flags != ENTRY_TAG {
        return Err(EventError::CallForm { kind_byte });
    }
    let mut at = start + 1;
    let mut next = |arg: usize| {
        let varint_at = at;
        get_uvarint(buf, &mut at).map_err(|e| match e {
            VarintError::Truncated => EventError::Truncated { kind },
            VarintError::Overflow => EventError::Overflow {
                kind,
                arg,
                at: varint_at,
            },
        })
    };
    let time_delta = next(0)?;
    let mut args = [0u64; 5];
    let count = kind.arg_count();
    let mut i = 0;
    while i < count {
        args[i] = next(i + 1)?;
        i += 1;
    }
    if flags & ENTRY_TAG != 0 {
        args[4] = next(count + 1)?;
        if crate::entry::EntryPoint::from_tag(args[4]).is_none() {
            return Err(EventError::UnknownEntry {
                kind,
                entry: args[4],
            });
        }
    }
    if kind.has_stack() && args[3] == 0 {
        return Err(EventError::StackIdZero { kind });
    }
    if kind.size_as_log2() && flags & LONG_FORM == 0 && args[1] > MAX_STACK_ORDER {
        return Err(EventError::StackOrder {
            kind,
            order: args[1],
        });
    }
    *pos = at;
    Ok(EventFields {
        kind,
        flags,
        time_delta,
        args,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::varint::zigzag;

    #[test]
    fn event_varints_are_leb128_at_every_length() {
        // Each length's edges, the straight two- and three-byte cases
        // among them, against the plain encoder.
        let mut values = alloc::vec![0, u64::MAX];
        for bits in (7..64).step_by(7) {
            values.extend([(1u64 << bits) - 1, 1u64 << bits, (1u64 << bits) + 1]);
        }
        values.extend([300, 0x3fff, 0x4000, 0x1f_ffff, 0x20_0000, 0x12_3456]);
        for v in values {
            for pos in [0, 1, MAX_EVENT_LEN - MAX_VARINT_LEN] {
                let mut out = [0xaau8; MAX_EVENT_LEN];
                let mut want = [0xaau8; MAX_EVENT_LEN];
                let end = put_event_varint(&mut out, pos, v);
                assert_eq!(end, crate::varint::put_uvarint(&mut want, pos, v), "{v:#x}");
                assert_eq!(out, want, "{v:#x} at {pos}");
            }
        }
    }

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
    }

    /// Each kind's properties as the per-kind `match` functions gave them
    /// before the spec table replaced them: (kind, name, argument count,
    /// address class, size as log2, stack, kind without its stack).
    #[test]
    fn every_kind_has_its_properties() {
        use AddressClass::{HeapObject, Raw, Span, Stack};
        use EventKind::*;
        #[rustfmt::skip]
        let expected = [
            (SpanExists, "span_exists", 3, Span, false, false, SpanExists),
            (SpanAlloc, "span_alloc", 3, Span, false, false, SpanAlloc),
            (SpanFree, "span_free", 1, Span, false, false, SpanFree),
            (HeapObjectExists, "heap_object_exists", 3, HeapObject, false, false, HeapObjectExists),
            (HeapObjectAlloc, "heap_object_alloc", 3, HeapObject, false, false, HeapObjectAlloc),
            (HeapObjectFree, "heap_object_free", 1, HeapObject, false, false, HeapObjectFree),
            (StackExists, "stack_exists", 2, Stack, true, false, StackExists),
            (StackAlloc, "stack_alloc", 2, Stack, true, false, StackAlloc),
            (StackFree, "stack_free", 1, Stack, false, false, StackFree),
            (Call, "call", 1, Raw, false, false, Call),
            (HeapObjectAllocStack, "heap_object_alloc_stack", 4, HeapObject, false, true, HeapObjectAlloc),
            (SpanAllocStack, "span_alloc_stack", 4, Span, false, true, SpanAlloc),
        ];
        assert_eq!(expected.len(), EVENT_KINDS.len());
        // A new variant fails to compile here until it has a row above
        // (and so in EVENT_SPECS, which the loop below compares).
        let _exhaustive = |k: EventKind| match k {
            SpanExists | SpanAlloc | SpanFree | HeapObjectExists | HeapObjectAlloc
            | HeapObjectFree | StackExists | StackAlloc | StackFree | Call
            | HeapObjectAllocStack | SpanAllocStack => (),
        };
        for (i, (kind, name, args, class, log2, stack, base)) in expected.into_iter().enumerate() {
            assert_eq!(EVENT_KINDS[i], kind);
            assert_eq!(kind as usize, i + 1, "{kind:?}");
            assert_eq!(kind.name(), name, "{kind:?}");
            assert_eq!(kind.arg_count(), args, "{kind:?}");
            assert_eq!(kind.address_class(), class, "{kind:?}");
            assert_eq!(kind.size_as_log2(), log2, "{kind:?}");
            assert_eq!(kind.has_stack(), stack, "{kind:?}");
            assert_eq!(kind.without_stack(), base, "{kind:?}");
            assert_eq!(EVENT_SPECS[i].kind, kind);
        }
    }

    /// Values at the varints' length boundaries and the checks' limits.
    const ODD: [u64; 9] = [0, 1, 63, 64, 127, 128, 13, 1 << 35, u64::MAX];

    /// `decode_event` inverts `encode_event` for every kind, both forms,
    /// tagged or not, and odd argument values; it refuses exactly what the
    /// format refuses, and reads nothing past the event.
    #[test]
    fn decode_event_inverts_encode_event() {
        let mut out = [0u8; MAX_EVENT_LEN];
        let (mut accepted, mut refused) = (0, 0);
        for kind in EVENT_KINDS {
            for flags in [0, LONG_FORM, ENTRY_TAG, LONG_FORM | ENTRY_TAG] {
                for (j, &v) in ODD.iter().enumerate() {
                    let w = ODD[(j + 3) % ODD.len()];
                    let entry = [1, 13, 14, 0][j % 4];
                    let mut args = [v, w, v ^ 1, w, 0];
                    for a in &mut args[kind.arg_count()..4] {
                        *a = 0;
                    }
                    if flags & ENTRY_TAG != 0 {
                        args[4] = entry;
                    }
                    let n = encode_event(&mut out, kind, flags, v, args);
                    let mut buf = out[..n].to_vec();
                    buf.push(0xff); // not read
                    let mut pos = 0;
                    let got = decode_event(&buf, &mut pos);
                    let refuse = (kind == EventKind::Call && flags != ENTRY_TAG)
                        || (flags & ENTRY_TAG != 0 && !(1..=13).contains(&entry))
                        || (kind.has_stack() && args[3] == 0)
                        || (kind.size_as_log2() && flags & LONG_FORM == 0 && w > MAX_STACK_ORDER);
                    if refuse {
                        assert!(got.is_err(), "{kind:?} {flags:#x} {args:?}");
                        assert_eq!(pos, 0);
                        refused += 1;
                        continue;
                    }
                    let want = EventFields {
                        kind,
                        flags,
                        time_delta: v,
                        args,
                    };
                    assert_eq!(got, Ok(want), "{kind:?} {flags:#x} {args:?}");
                    assert_eq!(pos, n);
                    assert_eq!(want.encoded_len(), n);
                    accepted += 1;
                    // Cut anywhere: truncated, never a panic.
                    for cut in 1..n {
                        let mut pos = 0;
                        assert_eq!(
                            decode_event(&buf[..cut], &mut pos),
                            Err(EventError::Truncated { kind })
                        );
                    }
                }
            }
        }
        assert!(accepted > 100 && refused > 50, "{accepted} {refused}");
        let mut pos = 0;
        assert_eq!(decode_event(&[], &mut pos), Err(EventError::End));
        assert_eq!(
            decode_event(&[13, 0, 0], &mut pos),
            Err(EventError::UnknownKind { kind_byte: 13 })
        );
        // A varint longer than its shortest form is read, and shows in
        // the length.
        let e = decode_event(&[6, 0x80, 0x00, 9], &mut pos).unwrap();
        assert_eq!((e.args[0], pos, e.encoded_len()), (9, 4, 3));
        let mut pos = 0;
        let overflow = [
            3, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2,
        ];
        assert_eq!(
            decode_event(&overflow, &mut pos),
            Err(EventError::Overflow {
                kind: EventKind::SpanFree,
                arg: 1,
                at: 2
            })
        );
    }
}
