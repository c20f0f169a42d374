//! Parsing of batch payloads (FORMAT.md sections 2 and 3). Pure functions
//! over byte slices; every error carries the file offset of the bad item.

use std::collections::BTreeMap;
use std::fmt;

use alloctrace_format::pages::{self, Layout, Word};
use alloctrace_format::stacks::EntryError;
use alloctrace_format::{
    decode_event, exact_log2, get_uvarint, BatchKind, EventError, EventKind, VarintError,
    ENTRY_TAG, EVENT_KIND_MASK, LONG_FORM, MAX_COMMAND_LINE, MAX_STACK_ORDER, PROCESS_TRUNCATED,
};

use crate::event::{GenerationEnd, GenerationInfo, ProcessInfo, Totals, TypeInfo};
use crate::ReadError;

/// Names the batch an error was found in: "events batch starting at offset 1200".
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchContext {
    pub kind: BatchKind,
    /// File offset of the batch's kind byte.
    pub offset: u64,
}

impl fmt::Display for BatchContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} batch starting at offset {}",
            self.kind.name(),
            self.offset
        )
    }
}

/// A position in a slice of one batch's payload that knows where the slice
/// sits in the file, so errors can name absolute offsets.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// File offset of `buf[0]`.
    file_offset: u64,
    ctx: BatchContext,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8], file_offset: u64, ctx: BatchContext) -> Cursor<'a> {
        Cursor {
            buf,
            pos: 0,
            file_offset,
            ctx,
        }
    }

    /// Moves `n` bytes on (at most to the end).
    pub fn skip(&mut self, n: usize) {
        self.pos = self.pos.saturating_add(n).min(self.buf.len());
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// File offset of position `pos` of the slice.
    pub fn offset_of(&self, pos: usize) -> u64 {
        self.file_offset.saturating_add(pos as u64)
    }

    /// A malformed-trace error for the item starting at slice position `pos`.
    pub fn error_at(&self, pos: usize, what: impl fmt::Display) -> ReadError {
        ReadError::malformed(self.offset_of(pos), format!("{what} in {}", self.ctx))
    }

    /// Reads a varint; `field` names it in the error message.
    pub fn varint(&mut self, field: &str) -> Result<u64, ReadError> {
        let start = self.pos;
        get_uvarint(self.buf, &mut self.pos).map_err(|e| match e {
            VarintError::Truncated => self.error_at(
                start,
                format_args!("{field} runs past the end of the payload (truncated varint)"),
            ),
            VarintError::Overflow => self.error_at(
                start,
                format_args!("{field} is a varint that overflows 64 bits"),
            ),
        })
    }

    /// Parses one entry of a call-stack batch with the format crate's
    /// parser, moving past it; its error names the bad field's offset.
    pub fn entry<T>(
        &mut self,
        parse: impl FnOnce(&'a [u8], &mut usize) -> Result<T, EntryError>,
    ) -> Result<T, ReadError> {
        let mut pos = self.pos;
        match parse(self.buf, &mut pos) {
            Ok(v) => {
                self.pos = pos;
                Ok(v)
            }
            Err(e) => Err(self.error_at(e.at, e.what)),
        }
    }

    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
}

/// The three varints every payload opens with.
pub(crate) struct BatchHeader {
    pub generation: u64,
    pub thread: u64,
    pub base_ticks: u64,
}

pub(crate) fn batch_header(c: &mut Cursor<'_>) -> Result<BatchHeader, ReadError> {
    let gen_pos = c.pos();
    let generation = c.varint("the generation")?;
    if generation == 0 {
        return Err(c.error_at(gen_pos, "generation 0 (generations are numbered from 1)"));
    }
    let thread = c.varint("the thread ID")?;
    let base_ticks = c.varint("the base timestamp")?;
    Ok(BatchHeader {
        generation,
        thread,
        base_ticks,
    })
}

/// One event as written: kind, timestamp delta, arguments still compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RawEvent {
    pub kind: EventKind,
    pub long_form: bool,
    pub delta: u64,
    /// The first `kind.arg_count()` are meaningful; the rest are 0. So
    /// `args[3]` is the stack ID of kinds 11 and 12 (at least 1), and 0 for
    /// every other kind.
    pub args: [u64; 4],
    /// The entry-point tag (FORMAT.md section 3), 0 when untagged.
    pub entry: u64,
}

/// Reads one event at the cursor with the format crate's decoder
/// ([`decode_event`]); its error names the bad item's file offset (the
/// event's, or an overflowing varint's).
pub(crate) fn event(c: &mut Cursor<'_>) -> Result<RawEvent, ReadError> {
    let start = c.pos();
    let mut pos = start;
    match decode_event(c.buf, &mut pos) {
        Ok(e) => {
            c.pos = pos;
            let [a0, a1, a2, a3, entry] = e.args;
            Ok(RawEvent {
                kind: e.kind,
                long_form: e.long_form(),
                delta: e.time_delta,
                args: [a0, a1, a2, a3],
                entry,
            })
        }
        Err(e) => {
            let at = match e {
                EventError::Overflow { at, .. } => at,
                _ => start,
            };
            Err(c.error_at(at, e))
        }
    }
}

/// A varint as `get_uvarint` reads it, with the one-byte case inline.
#[inline(always)]
fn fast_varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let b = *buf.get(*pos)?;
    if b < 0x80 {
        *pos += 1;
        return Some(u64::from(b));
    }
    let (v, next) = multi_byte_varint(buf, *pos);
    // `next` is past the varint's first byte unless it was refused.
    if next == 0 {
        return None;
    }
    *pos = next;
    Some(v)
}

/// A varint of two bytes or more, and the position after it; the position
/// 0 if it is refused (a pair, not an `Option`: it comes back in two
/// registers). Without a loop or a branch per byte when it ends within
/// the 8 bytes at `pos` (then it holds at most 56 bits, and never
/// overflows); else as `get_uvarint` reads it. Takes the position by
/// value: a `&mut` to the caller's position would keep it in memory
/// through the caller's whole loop.
#[inline(always)]
fn multi_byte_varint(buf: &[u8], pos: usize) -> (u64, usize) {
    let word = buf
        .get(pos..pos.wrapping_add(8))
        .and_then(|w| <[u8; 8]>::try_from(w).ok())
        .map(u64::from_le_bytes);
    let Some(word) = word else {
        return long_varint(buf, pos);
    };
    match varint_in_word(word) {
        Some((v, len)) => (v, pos + len),
        None => long_varint(buf, pos),
    }
}

/// A varint as `get_uvarint` reads it, out of line (one of 9 or 10 bytes,
/// or one near the end of the buffer); the position 0 if it is refused.
#[cold]
#[inline(never)]
fn long_varint(buf: &[u8], mut pos: usize) -> (u64, usize) {
    match get_uvarint(buf, &mut pos) {
        Ok(v) => (v, pos),
        Err(_) => (0, 0),
    }
}

/// What a kind byte says about its event, for the fast decoder.
#[derive(Clone, Copy)]
struct KindByte {
    kind: EventKind,
    long_form: bool,
    tagged: bool,
    /// `kind.arg_count()`.
    args: u8,
    /// The fourth argument is a stack ID, at least 1 (kinds 11 and 12).
    stack: bool,
    /// The second argument is a stack order (short-form stack exists or
    /// alloc), at most `MAX_STACK_ORDER`.
    stack_order: bool,
}

/// Per kind byte: what it says, or `None` for a kind byte [`event`]
/// refuses (unknown kind; a call event untagged or in long form).
const KIND_BYTES: [Option<KindByte>; 256] = {
    let mut table = [None; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        if let Some(kind) = EventKind::from_u8(byte & EVENT_KIND_MASK) {
            let long_form = byte & LONG_FORM != 0;
            let tagged = byte & ENTRY_TAG != 0;
            let call = matches!(kind, EventKind::Call);
            if !(call && (long_form || !tagged)) {
                table[b] = Some(KindByte {
                    kind,
                    long_form,
                    tagged,
                    args: kind.arg_count() as u8,
                    stack: kind.has_stack(),
                    stack_order: kind.size_as_log2() && !long_form,
                });
            }
        }
        b += 1;
    }
    table
};

/// Decodes the event at `buf[*pos..]` exactly as [`event`] does, but
/// without building error messages: `None` for every event [`event`]
/// refuses (then `*pos` is left anywhere; the caller runs [`event`] for the
/// error and its offset). The hot path of both validation and the merge.
#[inline(always)]
pub(crate) fn event_fast(buf: &[u8], pos: &mut usize) -> Option<RawEvent> {
    let kb = KIND_BYTES[usize::from(*buf.get(*pos)?)]?;
    *pos += 1;
    let delta = fast_varint(buf, pos)?;
    let mut args = [0u64; 4];
    args[0] = fast_varint(buf, pos)?;
    if kb.args > 1 {
        args[1] = fast_varint(buf, pos)?;
        if kb.args > 2 {
            args[2] = fast_varint(buf, pos)?;
            if kb.stack {
                args[3] = fast_varint(buf, pos)?;
                if args[3] == 0 {
                    return None;
                }
            }
        }
    }
    let mut entry = 0;
    if kb.tagged {
        entry = fast_varint(buf, pos)?;
        alloctrace_format::EntryPoint::from_tag(entry)?;
    }
    if kb.stack_order && args[1] > MAX_STACK_ORDER {
        return None;
    }
    Some(RawEvent {
        kind: kb.kind,
        long_form: kb.long_form,
        delta,
        args,
        entry,
    })
}

/// Bytes of the window [`event_at`] decodes from: an event takes at most
/// 61 (a kind byte, then at most six varints of at most 10 bytes), and a
/// varint that starts before byte 64 can be read as one 8-byte word.
const WINDOW: usize = 72;

/// [`event_fast`] for the event at `buf[pos..]`, reading from a fixed
/// window when at least [`WINDOW`] bytes are left: every byte's index is
/// then known to be in bounds, with no check per field. Returns the event
/// and where it ends; `None` exactly when [`event_fast`] refuses it.
#[inline(always)]
pub(crate) fn event_at(buf: &[u8], pos: usize) -> Option<(RawEvent, usize)> {
    let window = buf
        .get(pos..pos.wrapping_add(WINDOW))
        .and_then(|w| <&[u8; WINDOW]>::try_from(w).ok());
    if let Some(w) = window {
        if let Some((ev, len)) = event_in_window(w) {
            return Some((ev, pos + len));
        }
    }
    // Near the end of the buffer, or a varint of 9 or 10 bytes, or an
    // event refused (then refused again here).
    let mut end = pos;
    let ev = event_fast(buf, &mut end)?;
    Some((ev, end))
}

/// The event at the start of `w`, and its length; `None` if it is refused
/// or holds a varint of more than 8 bytes (the caller decodes it again).
#[inline(always)]
fn event_in_window(w: &[u8; WINDOW]) -> Option<(RawEvent, usize)> {
    let kb = KIND_BYTES[usize::from(w[0])]?;
    let mut at = 1;
    let delta = window_varint(w, &mut at)?;
    let mut args = [0u64; 4];
    args[0] = window_varint(w, &mut at)?;
    if kb.args > 1 {
        args[1] = window_varint(w, &mut at)?;
        if kb.args > 2 {
            args[2] = window_varint(w, &mut at)?;
            if kb.stack {
                args[3] = window_varint(w, &mut at)?;
                if args[3] == 0 {
                    return None;
                }
            }
        }
    }
    let mut entry = 0;
    if kb.tagged {
        entry = window_varint(w, &mut at)?;
        alloctrace_format::EntryPoint::from_tag(entry)?;
    }
    if kb.stack_order && args[1] > MAX_STACK_ORDER {
        return None;
    }
    Some((
        RawEvent {
            kind: kb.kind,
            long_form: kb.long_form,
            delta,
            args,
            entry,
        },
        at,
    ))
}

/// The varint at `w[*at..]` (of at most 8 bytes) as `get_uvarint` reads
/// it; `None` for a longer one, or one that starts past byte 63.
#[inline(always)]
fn window_varint(w: &[u8; WINDOW], at: &mut usize) -> Option<u64> {
    let i = *at;
    if i >= 64 {
        return None;
    }
    let b = w[i];
    if b < 0x80 {
        *at = i + 1;
        return Some(u64::from(b));
    }
    let word = <[u8; 8]>::try_from(&w[i..i + 8])
        .ok()
        .map(u64::from_le_bytes)?;
    let (v, len) = varint_in_word(word)?;
    *at = i + len;
    Some(v)
}

/// The varint at the start of the little-endian `word`, and its length in
/// bytes, if it ends within the word (then it holds at most 56 bits and
/// never overflows).
#[inline(always)]
fn varint_in_word(word: u64) -> Option<(u64, usize)> {
    // The high bit of the last byte is clear.
    let ends = !word & 0x8080_8080_8080_8080;
    if ends == 0 {
        return None;
    }
    // The varint's bits: 8 per byte up to and including the last.
    let bits = ends.trailing_zeros() + 1;
    let x = word & (u64::MAX >> (64 - bits));
    let v = if bits <= 32 {
        // Up to 4 bytes (IDs of compact events, most sizes): each group
        // of 7 bits moved into place on its own, with small masks.
        let x = x as u32;
        u64::from((x & 0x7f) | (x >> 1 & 0x3f80) | (x >> 2 & 0x1f_c000) | (x >> 3 & 0xfe0_0000))
    } else {
        // Close the gaps between the 7-bit groups: pairs, then fours,
        // then all.
        let x = x & 0x7f7f_7f7f_7f7f_7f7f;
        let x = (x & 0x007f_007f_007f_007f) | (x & 0x7f00_7f00_7f00_7f00) >> 1;
        let x = (x & 0x0000_3fff_0000_3fff) | (x & 0x3fff_0000_3fff_0000) >> 2;
        (x & 0x0000_0000_0fff_ffff) | (x & 0x0fff_ffff_0000_0000) >> 4
    };
    Some((v, (bits / 8) as usize))
}

pub(crate) fn info(c: &mut Cursor<'_>, generation: u64) -> Result<GenerationInfo, ReadError> {
    let min_heap_addr = c.varint("min_heap_addr")?;
    let page_size = power_of_two(c, "page_size")?;
    let min_heap_align = power_of_two(c, "min_heap_align")?;
    let min_stack_align = power_of_two(c, "min_stack_align")?;
    let start_ticks = c.varint("start_ticks")?;
    let start_mono_ns = c.varint("start_mono_ns")?;
    let start_wall_ns = c.varint("start_wall_ns")?;
    let tps_pos = c.pos();
    let ticks_per_sec = c.varint("ticks_per_sec")?;
    if ticks_per_sec == 0 {
        return Err(c.error_at(tps_pos, "ticks_per_sec is 0"));
    }
    let pid = c.varint("pid")?;
    // Version 6 appends sample_bytes; a body without it records every
    // allocation.
    let sample_bytes = if c.remaining() > 0 {
        c.varint("sample_bytes")?
    } else {
        0
    };
    // Later versions may append fields: the rest of the body is ignored.
    Ok(GenerationInfo {
        generation,
        min_heap_addr,
        page_size,
        min_heap_align,
        min_stack_align,
        start_ticks,
        start_mono_ns,
        start_wall_ns,
        ticks_per_sec,
        pid,
        sample_bytes,
    })
}

fn power_of_two(c: &mut Cursor<'_>, field: &str) -> Result<u64, ReadError> {
    let pos = c.pos();
    let v = c.varint(field)?;
    if exact_log2(v).is_none() {
        return Err(c.error_at(pos, format_args!("{field} {v} is not a power of two")));
    }
    Ok(v)
}

/// Reads type-table entries to the end of the body into `table` (a later
/// entry with the same ID replaces the earlier one). Returns the bytes the
/// new entries take in memory, for the reader's memory budget.
pub(crate) fn types(
    c: &mut Cursor<'_>,
    table: &mut BTreeMap<u64, TypeInfo>,
) -> Result<u64, ReadError> {
    let mut memory = 0u64;
    while c.remaining() > 0 {
        let entry_pos = c.pos();
        let id = c.varint("a type ID")?;
        if id == 0 {
            return Err(c.error_at(entry_pos, "type ID 0 (reserved for \"no type\")"));
        }
        let size = c.varint("a type size")?;
        let ptr_bytes = c.varint("a type's ptr_bytes")?;
        let len_pos = c.pos();
        let name_len = c.varint("a type name length")?;
        let left = c.remaining();
        let name = usize::try_from(name_len).ok().and_then(|n| c.bytes(n)).ok_or_else(|| {
            c.error_at(len_pos, format_args!("type name length {name_len} runs past the end of the payload ({left} bytes left)"))
        })?;
        let name = String::from_utf8_lossy(name).into_owned();
        memory += name.len() as u64 + TYPE_ENTRY_OVERHEAD;
        table.insert(
            id,
            TypeInfo {
                id,
                size,
                ptr_bytes,
                name,
            },
        );
    }
    Ok(memory)
}

/// Reads a process body (FORMAT.md section 2): flags, the argument count,
/// then each argument's length and bytes. The count and the bytes are
/// checked against [`MAX_COMMAND_LINE`] before anything is kept. Returns
/// the process and the bytes it takes in memory, for the reader's budget.
pub(crate) fn process(c: &mut Cursor<'_>) -> Result<(ProcessInfo, u64), ReadError> {
    // Flags the reader does not know are ignored (later versions may
    // define them).
    let flags = c.varint("the process flags")?;
    let argc_pos = c.pos();
    let argc = c.varint("the argument count")?;
    if argc > MAX_COMMAND_LINE {
        return Err(c.error_at(
            argc_pos,
            format_args!("argument count {argc} is above the limit of {MAX_COMMAND_LINE}"),
        ));
    }
    let mut total = 0u64;
    let mut args = Vec::new();
    for i in 0..argc {
        let len_pos = c.pos();
        let len = c.varint("an argument's length")?;
        total = total.saturating_add(len);
        if total > MAX_COMMAND_LINE {
            return Err(c.error_at(
                len_pos,
                format_args!(
                    "argument {i} makes the command line longer than the limit of {MAX_COMMAND_LINE} bytes"
                ),
            ));
        }
        let left = c.remaining();
        let arg = usize::try_from(len).ok().and_then(|n| c.bytes(n)).ok_or_else(|| {
            c.error_at(
                len_pos,
                format_args!("argument {i}'s length {len} runs past the end of the payload ({left} bytes left)"),
            )
        })?;
        args.push(String::from_utf8_lossy(arg).into_owned());
    }
    // Later versions may append fields: the rest of the body is ignored.
    let memory = total + argc * 32 + TYPE_ENTRY_OVERHEAD;
    let process = ProcessInfo {
        command_line: args,
        truncated: flags & PROCESS_TRUNCATED != 0,
    };
    Ok((process, memory))
}

/// Rough memory of one type-table entry besides its name.
const TYPE_ENTRY_OVERHEAD: u64 = 96;

pub(crate) fn generation_end(
    c: &mut Cursor<'_>,
    generation: u64,
) -> Result<GenerationEnd, ReadError> {
    let end_ticks = c.varint("end_ticks")?;
    let end_mono_ns = c.varint("end_mono_ns")?;
    let lost_events = c.varint("lost_events")?;
    // Version 3 appends lost_stacks; a body without it (versions 1 and 2)
    // counts none.
    let lost_stacks = if c.remaining() > 0 {
        c.varint("lost_stacks")?
    } else {
        0
    };
    // Version 6 appends the sampling session's totals; a body without
    // them (and a session recording everything) counts 0.
    let mut totals = Totals::default();
    for (field, name) in [
        (&mut totals.allocs, "total_allocs"),
        (&mut totals.alloc_bytes, "total_alloc_bytes"),
        (&mut totals.frees, "total_frees"),
        (&mut totals.sample_overflow, "sample_overflow"),
    ] {
        if c.remaining() > 0 {
            *field = c.varint(name)?;
        }
    }
    // Later versions may append fields: the rest of the body is ignored.
    Ok(GenerationEnd {
        generation,
        end_ticks,
        end_mono_ns,
        lost_events,
        lost_stacks,
        totals,
    })
}

/// What the sync words of a pages body (FORMAT.md section 7) have set so
/// far, carried from one page event to the next.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PagesState {
    /// The batch header's thread: a thread word must name the same one.
    thread: u64,
    /// The batch header's base_ticks, the time base until a time-base word
    /// sets one (the writer always writes one first).
    base_ticks: u64,
    layout: Option<Layout>,
    /// The time base in units, once a time-base word has set it.
    time_base: Option<u64>,
    /// Ticks of the previous page event of the body: times never go back.
    last_ticks: u64,
}

impl PagesState {
    pub fn new(thread: u64, base_ticks: u64) -> PagesState {
        PagesState {
            thread,
            base_ticks,
            layout: None,
            time_base: None,
            last_ticks: 0,
        }
    }
}

/// One page event as decoded from its word(s).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PageEvent {
    /// `pages::KIND_ALLOC`, `KIND_FREE` or `KIND_SCAV`.
    pub kind: u64,
    pub base: u64,
    pub npages: u64,
    /// Written as a long event (sync word, base, npages).
    pub long_form: bool,
    /// `(time base + delta) << lost_bits`.
    pub ticks: u64,
}

/// Sync words do not depend on the layout, so any layout decodes them,
/// also before the layout word has come.
const ANY_LAYOUT: Layout = Layout {
    page_shift: pages::MIN_PAGE_SHIFT,
    lost_bits: 0,
};

/// Reads the words of a pages body up to and including its next page
/// event, applying the sync words on the way. `None` at the end of the body.
/// The caller has checked that the body is a whole number of words.
pub(crate) fn page_event(
    c: &mut Cursor<'_>,
    st: &mut PagesState,
) -> Result<Option<PageEvent>, ReadError> {
    while c.remaining() >= 8 {
        let pos = c.pos();
        let word = page_word(c).unwrap_or(0);
        let decoded = match st.layout {
            Some(layout) => pages::decode(layout, word),
            None if word & 3 == pages::KIND_SYNC => pages::decode(ANY_LAYOUT, word),
            None => return Err(c.error_at(pos, "page event word before the layout word")),
        };
        let (kind, base, npages, delta, long_form) = match decoded {
            Word::Sync {
                subtype: pages::SYNC_LAYOUT,
                payload,
            } => {
                st.layout = Some(Layout::from_payload(payload).ok_or_else(|| {
                    c.error_at(
                        pos,
                        format_args!("page layout payload {payload:#x} out of range"),
                    )
                })?);
                continue;
            }
            Word::Sync {
                subtype: pages::SYNC_THREAD,
                payload,
            } => {
                if payload != st.thread {
                    return Err(c.error_at(
                        pos,
                        format_args!(
                            "page thread word names thread {payload}, but the batch header names thread {}",
                            st.thread
                        ),
                    ));
                }
                continue;
            }
            Word::Sync {
                subtype: pages::SYNC_TIME,
                payload,
            } => {
                st.time_base = Some(payload);
                continue;
            }
            // SYNC_LONG_EVENT: the only subtype left of the two bits.
            Word::Sync { payload, .. } => {
                if st.layout.is_none() {
                    return Err(c.error_at(pos, "long page event before the layout word"));
                }
                let kind = payload & 3;
                if kind == pages::KIND_SYNC {
                    return Err(c.error_at(pos, "long page event of kind 0"));
                }
                let (Some(base), Some(npages)) = (page_word(c), page_word(c)) else {
                    return Err(c.error_at(pos, "page event runs past the end of the payload"));
                };
                (kind, base, npages, payload >> 2, true)
            }
            Word::Event {
                kind,
                base,
                npages,
                large,
                delta,
            } => {
                let npages = if large {
                    page_word(c).ok_or_else(|| {
                        c.error_at(pos, "page event runs past the end of the payload")
                    })?
                } else {
                    npages
                };
                (kind, base, npages, delta, false)
            }
        };
        // A layout is set: an event before it was refused above.
        let layout = st.layout.unwrap_or(ANY_LAYOUT);
        let time_base = st.time_base.unwrap_or(st.base_ticks >> layout.lost_bits);
        // lost_bits is at most 32 (Layout::from_payload), so the factor fits.
        let ticks = time_base
            .checked_add(delta)
            .and_then(|units| units.checked_mul(1u64 << layout.lost_bits))
            .ok_or_else(|| c.error_at(pos, "page event timestamp overflows 64 bits"))?;
        if ticks < st.last_ticks {
            return Err(c.error_at(
                pos,
                format_args!(
                    "page event time goes backwards (tick {ticks} after tick {})",
                    st.last_ticks
                ),
            ));
        }
        st.last_ticks = ticks;
        return Ok(Some(PageEvent {
            kind,
            base,
            npages,
            long_form,
            ticks,
        }));
    }
    Ok(None)
}

/// The next 8-byte little-endian word, if a whole one is left.
fn page_word(c: &mut Cursor<'_>) -> Option<u64> {
    let bytes: [u8; 8] = c.bytes(8)?.try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

/// Checks a whole pages body (FORMAT.md section 7): a whole number of
/// words, every word well formed, times never going back. Returns the
/// number of page events.
pub(crate) fn validate_pages(c: &mut Cursor<'_>, mut st: PagesState) -> Result<u64, ReadError> {
    let body_pos = c.pos();
    if c.remaining() & 7 != 0 {
        return Err(c.error_at(
            body_pos,
            format_args!(
                "pages body of {} bytes is not a multiple of 8",
                c.remaining()
            ),
        ));
    }
    let mut events = 0u64;
    while page_event(c, &mut st)?.is_some() {
        events += 1;
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `event_at` against `event_fast` at every position of byte strings
    /// near and far from well-formed events, near the end of the buffer
    /// and not: the same verdict, the same event, the same end.
    #[test]
    fn window_decoder_agrees_with_the_fast_one() {
        let mut next = crate::test_util::xorshift(0x6a09_e667_f3bc_c909);
        let pick = |r: u64| -> u8 {
            match r % 8 {
                0 => (r >> 8) as u8 & 0x0f | [0, 0x40, 0x80, 0xc0][(r >> 16) as usize % 4],
                1 | 2 => (r >> 8) as u8 & 0x7f,
                3 | 4 => 0x80 | (r >> 8) as u8,
                5 => [0, 1, 2, 13, 14, 63, 64, 0x7f][(r >> 8) as usize % 8],
                6 => 0xff,
                _ => (r >> 8) as u8,
            }
        };
        let (mut accepted, mut refused) = (0u32, 0u32);
        for _ in 0..crate::test_util::rounds(20_000) {
            let len = (next() % 160) as usize;
            let buf: Vec<u8> = (0..len).map(|_| pick(next())).collect();
            for pos in 0..=buf.len() {
                let mut end = pos;
                let fast = event_fast(&buf, &mut end);
                match (event_at(&buf, pos), fast) {
                    (Some((w, w_end)), Some(f)) => {
                        assert_eq!((w, w_end), (f, end), "{buf:02x?} at {pos}");
                        accepted += 1;
                    }
                    (None, None) => refused += 1,
                    (w, f) => panic!("{buf:02x?} at {pos}: window {w:?}, fast {f:?}"),
                }
            }
        }
        assert!(
            accepted as usize > crate::test_util::rounds(10_000)
                && refused as usize > crate::test_util::rounds(10_000),
            "{accepted} accepted, {refused} refused"
        );
    }

    /// Stack events (kinds 11 and 12), pinned: the three decoders read the
    /// stack ID as the fourth argument, before the entry tag, and refuse
    /// stack ID 0; the longest event (61 bytes) decodes.
    #[test]
    fn stack_events_decode_alike_in_every_decoder() {
        let ctx = BatchContext {
            kind: BatchKind::Events,
            offset: 0,
        };
        let mut longest = vec![12 | LONG_FORM | ENTRY_TAG];
        longest.extend([0xff; 9].iter().chain(&[1]).copied().cycle().take(50));
        // Entry tag 13 as a ten-byte varint (not the shortest form, but
        // a varint all the same).
        longest.push(0x8d);
        longest.extend([0x80; 8]);
        longest.push(0);
        let cases: [(&[u8], Option<[u64; 4]>); 5] = [
            (&[11, 5, 2, 48, 7, 200, 1], Some([2, 48, 7, 200])),
            (&[12 | ENTRY_TAG, 0, 9, 1, 3, 4, 11], Some([9, 1, 3, 4])),
            (&[11, 5, 2, 48, 7, 0], None),
            (&[12 | LONG_FORM, 0, 9, 1, 3, 0, 0, 0], None),
            (&[11, 5, 2, 48, 7], None),
        ];
        for (bytes, want) in cases
            .iter()
            .map(|&(b, w)| (b.to_vec(), w))
            .chain([(longest.clone(), Some([u64::MAX; 4]))])
        {
            // Padded, so the window decoder runs on it too.
            let mut padded = bytes.clone();
            padded.resize(bytes.len() + WINDOW, 0);
            let mut end = 0;
            let fast = event_fast(&bytes, &mut end);
            let window = event_at(&padded, 0);
            let mut c = Cursor::new(&bytes, 0, ctx);
            let checked = event(&mut c).ok();
            assert_eq!(fast.map(|e| e.args), want, "{bytes:02x?}");
            assert_eq!(window.map(|(e, _)| e), fast, "{bytes:02x?}");
            assert_eq!(checked, fast, "{bytes:02x?}");
            if want.is_some() {
                assert_eq!(end, bytes.len());
                assert_eq!(window.map(|(_, end)| end), Some(bytes.len()));
            }
        }
        assert_eq!(longest.len(), alloctrace_format::MAX_EVENT_LEN);
        let mut c = Cursor::new(&[11, 0, 1, 1, 1, 0], 0, ctx);
        let e = event(&mut c).unwrap_err();
        assert!(e.what().contains("stack ID 0"), "{e}");
    }

    /// `fast_varint` against `get_uvarint` on every length and position
    /// near the end of the buffer: the same value, the same end, the same
    /// refusals.
    #[test]
    fn fast_varint_agrees_with_get_uvarint() {
        let mut next = crate::test_util::xorshift(0x1234_5678_9abc_def1);
        for _ in 0..crate::test_util::rounds(200_000) {
            let len = (next() % 14) as usize;
            let mut buf: Vec<u8> = (0..len)
                .map(|_| {
                    let r = next();
                    match r % 4 {
                        0 | 1 => 0x80 | (r >> 8) as u8,
                        2 => (r >> 8) as u8 & 0x7f,
                        _ => (r >> 8) as u8,
                    }
                })
                .collect();
            // Sometimes a well-formed varint of a chosen length, then more.
            if next().is_multiple_of(2) {
                let v = next() >> (next() % 64);
                let mut enc = vec![0u8; 10];
                let end = alloctrace_format::put_uvarint(&mut enc, 0, v);
                enc.truncate(end);
                enc.extend_from_slice(&buf);
                buf = enc;
            }
            for start in 0..=buf.len() {
                let mut fast_pos = start;
                let mut slow_pos = start;
                let fast = fast_varint(&buf, &mut fast_pos);
                let slow = get_uvarint(&buf, &mut slow_pos).ok();
                assert_eq!(fast, slow, "{buf:02x?} at {start}");
                if slow.is_some() {
                    assert_eq!(fast_pos, slow_pos, "{buf:02x?} at {start}");
                }
            }
        }
    }

    /// `event_fast` against `event` on byte strings near and far from
    /// well-formed events: the same verdict, the same event, the same end.
    #[test]
    fn fast_decoder_agrees_with_the_checked_one() {
        let ctx = BatchContext {
            kind: BatchKind::Events,
            offset: 0,
        };
        let mut next = crate::test_util::xorshift(0x2545_f491_4f6c_dd1d);
        // Bytes that make events likely: kind bytes of every flag, varint
        // ends, continuation bytes, the tenth-byte limit, entry tags.
        let pick = |r: u64| -> u8 {
            match r % 8 {
                0 => (r >> 8) as u8 & 0x0f | [0, 0x40, 0x80, 0xc0][(r >> 16) as usize % 4],
                1 | 2 => (r >> 8) as u8 & 0x7f,
                3 => 0x80 | (r >> 8) as u8,
                4 => [0, 1, 2, 13, 14, 63, 64, 0x7f][(r >> 8) as usize % 8],
                5 => 0xff,
                _ => (r >> 8) as u8,
            }
        };
        let (mut accepted, mut refused) = (0u32, 0u32);
        for _ in 0..crate::test_util::rounds(300_000) {
            let len = (next() % 24) as usize;
            let buf: Vec<u8> = (0..len).map(|_| pick(next())).collect();
            let mut fast_pos = 0;
            let fast = event_fast(&buf, &mut fast_pos);
            let mut c = Cursor::new(&buf, 0, ctx);
            match (fast, event(&mut c)) {
                (Some(f), Ok(e)) => {
                    assert_eq!(f, e, "{buf:02x?}");
                    assert_eq!(fast_pos, c.pos(), "{buf:02x?}");
                    accepted += 1;
                }
                (None, Err(_)) => refused += 1,
                (f, e) => panic!("{buf:02x?}: fast {f:?}, checked {e:?}"),
            }
        }
        // Both verdicts were exercised.
        assert!(
            accepted as usize > crate::test_util::rounds(10_000)
                && refused as usize > crate::test_util::rounds(10_000),
            "{accepted} accepted, {refused} refused"
        );
    }

    /// `event_fast` and `event_at` against the general decoder (`event`,
    /// the format crate's `decode_event`) on every kind byte (every kind,
    /// with and without a call stack, in both forms, tagged or not, and
    /// the bytes that name no kind) with argument values at the varints'
    /// length boundaries and the checks' limits: the same verdict, the
    /// same event, the same end.
    #[test]
    fn fast_decoders_equal_the_general_one_on_every_kind() {
        let ctx = BatchContext {
            kind: BatchKind::Events,
            offset: 0,
        };
        let odd = [0u64, 1, 63, 64, 127, 128, 13, 14, 1 << 35, u64::MAX];
        let (mut accepted, mut refused) = (0u32, 0u32);
        for kind_byte in 0..=255u8 {
            for (j, &v) in odd.iter().enumerate() {
                let w = odd[(j + 3) % odd.len()];
                // Kind byte, time delta, four arguments and an entry tag
                // (a reader takes as many as the kind byte says).
                let mut bytes = vec![kind_byte];
                for x in [v, v, w, v ^ 1, w, odd[(j + 5) % odd.len()]] {
                    let mut b = [0u8; 10];
                    let n = alloctrace_format::put_uvarint(&mut b, 0, x);
                    bytes.extend_from_slice(&b[..n]);
                }
                for len in [bytes.len(), bytes.len() - 1, 3] {
                    let buf = &bytes[..len];
                    let mut c = Cursor::new(buf, 0, ctx);
                    let general = event(&mut c).ok().map(|e| (e, c.pos()));
                    let mut end = 0;
                    let fast = event_fast(buf, &mut end).map(|e| (e, end));
                    assert_eq!(fast, general, "{buf:02x?}");
                    let mut padded = buf.to_vec();
                    padded.resize(buf.len() + WINDOW, 0);
                    let mut c = Cursor::new(&padded, 0, ctx);
                    let general_padded = event(&mut c).ok().map(|e| (e, c.pos()));
                    assert_eq!(event_at(&padded, 0), general_padded, "{buf:02x?} padded");
                    if general.is_some() {
                        accepted += 1;
                    } else {
                        refused += 1;
                    }
                }
            }
        }
        assert!(accepted > 300 && refused > 1000, "{accepted} {refused}");
    }
}
