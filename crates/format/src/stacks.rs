//! The entries of the three call-stack batches of version 3 (FORMAT.md
//! section "Call stacks, frames and modules"): modules (batch kind 10),
//! registered frames (11) and call-stack nodes (12), and the frame word
//! that names a frame in a node.
//!
//! Pure functions over byte slices, as the rest of this crate: the encoders
//! write into the caller's slice and say how much they wrote (or that it
//! did not fit); the parsers borrow names from the input and never
//! allocate, so a lying length can cost nothing but an error. Every parse
//! error carries the offset, in the slice parsed, of the field that is
//! wrong.
//!
//! The parsers check each entry on its own (IDs not 0, a parent below its
//! node, a module range not empty, lengths within the body); what needs
//! the rest of the generation (IDs increasing across entries, a parent or
//! a registered frame defined, a stack ID an event uses defined) is the
//! reader's.

use crate::varint::{get_uvarint, put_uvarint, uvarint_len, VarintError};

/// Most bytes of a module's GNU build ID.
pub const MAX_BUILD_ID_LEN: usize = 64;

/// The longest function or file name of a registered frame, in bytes: the
/// writer cuts longer names (`trace_frame_register`), a reader refuses
/// them (a hostile trace cannot make a report print megabytes per frame).
pub const MAX_FRAME_NAME_LEN: usize = 1024;

/// The deepest call stack, in frames (nodes from a stack's innermost node
/// to the root, the truncation marker included): the writer keeps the
/// innermost `MAX_STACK_DEPTH - 1` frames of a deeper stack under the
/// truncation marker (`trace_stack_register`), its own walks stop sooner;
/// a reader refuses a deeper node. So a report's work per stack is
/// bounded, whatever the file: a chain of nodes a few bytes each cannot
/// make every stack as deep as the file is long.
pub const MAX_STACK_DEPTH: usize = 1024;

/// The longest module path, in bytes (Linux's PATH_MAX).
pub const MAX_MODULE_PATH_LEN: usize = 4096;

/// In the in-memory API (`trace_frame_register`'s result, which
/// `trace_stack_register` takes mixed with native return addresses): the
/// bit that marks a registered frame's value `REGISTERED_FRAME_BIT | id`.
/// Never set in a user-space address.
pub const REGISTERED_FRAME_BIT: u64 = 1 << 63;

/// What a call-stack node's frame is, decoded from its frame word.
///
/// The word: an even `w` is the native return address `w >> 1`; an odd `w`
/// the registered frame `w >> 1` of the generation's frames batch, where
/// registered frame 0 (word 1) is the [truncation marker](FrameWord::TRUNCATED).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameWord {
    /// A native return address (a symbolizer looks up `address - 1`).
    /// Addresses travel as `address << 1`: the top bit of the address is
    /// lost (user-space addresses never have it).
    Native(u64),
    /// A registered frame's ID; 0 is the truncation marker.
    Registered(u64),
}

impl FrameWord {
    /// "The walk stopped here" (depth limit, a bad frame pointer, no unwind
    /// info): only ever an outermost node.
    pub const TRUNCATED: FrameWord = FrameWord::Registered(0);

    /// The word written in a call-stack node.
    pub const fn word(self) -> u64 {
        match self {
            FrameWord::Native(addr) => addr << 1,
            FrameWord::Registered(id) => (id << 1) | 1,
        }
    }

    /// The frame a word names.
    pub const fn from_word(w: u64) -> FrameWord {
        if w & 1 == 0 {
            FrameWord::Native(w >> 1)
        } else {
            FrameWord::Registered(w >> 1)
        }
    }

    /// The frame of an in-memory API value: a value with
    /// [`REGISTERED_FRAME_BIT`] names the registered frame of its low bits,
    /// any other a native return address.
    pub const fn from_api_value(v: u64) -> FrameWord {
        if v & REGISTERED_FRAME_BIT != 0 {
            FrameWord::Registered(v & !REGISTERED_FRAME_BIT)
        } else {
            FrameWord::Native(v)
        }
    }

    /// Whether this is the truncation marker.
    pub const fn is_truncation(self) -> bool {
        matches!(self, FrameWord::Registered(0))
    }
}

/// Why an entry could not be parsed, and where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryError {
    /// Offset in the parsed slice of the bad field (for a rule between
    /// fields, of the entry's first byte).
    pub at: usize,
    /// What is wrong, for messages.
    pub what: &'static str,
}

/// Reads a varint field, naming it on error.
fn field(buf: &[u8], pos: &mut usize, what: &'static str) -> Result<u64, EntryError> {
    let at = *pos;
    get_uvarint(buf, pos).map_err(|e| EntryError {
        at,
        what: match e {
            VarintError::Truncated => what,
            VarintError::Overflow => "a varint overflows 64 bits",
        },
    })
}

/// Reads a varint length and that many bytes, without allocating.
fn bytes<'a>(
    buf: &'a [u8],
    pos: &mut usize,
    max: usize,
    truncated: &'static str,
    too_long: &'static str,
) -> Result<&'a [u8], EntryError> {
    let at = *pos;
    let len = field(buf, pos, truncated)?;
    if len > max as u64 {
        return Err(EntryError { at, what: too_long });
    }
    let end = pos.saturating_add(len as usize);
    let s = buf.get(*pos..end).ok_or(EntryError {
        at,
        what: "a length runs past the end of the payload",
    })?;
    *pos = end;
    Ok(s)
}

/// Writes `values` as varints then the `(len, bytes)` parts at `out[pos..]`;
/// `None` (nothing promised about `out`) when they do not fit.
fn put_all(out: &mut [u8], mut pos: usize, values: &[u64], parts: &[&[u8]]) -> Option<usize> {
    let need: usize = values.iter().map(|&v| uvarint_len(v)).sum::<usize>()
        + parts
            .iter()
            .map(|p| uvarint_len(p.len() as u64) + p.len())
            .sum::<usize>();
    if out.len().checked_sub(pos)? < need {
        return None;
    }
    for &v in values {
        pos = put_uvarint(out, pos, v);
    }
    for p in parts {
        pos = put_uvarint(out, pos, p.len() as u64);
        out.get_mut(pos..pos + p.len())?.copy_from_slice(p);
        pos += p.len();
    }
    Some(pos)
}

/// One node of a call-stacks batch (kind 12): stack ID `id` is the stack
/// from `frame` (innermost) through `parent`'s stack; `parent` 0 for an
/// outermost frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CallStackNode {
    /// At least 1; strictly increasing within the generation.
    pub id: u64,
    /// Below `id`; 0 for none.
    pub parent: u64,
    /// The [`FrameWord`] as written.
    pub frame: u64,
}

impl CallStackNode {
    /// Bytes the entry takes.
    pub const fn encoded_len(&self) -> usize {
        uvarint_len(self.id) + uvarint_len(self.parent) + uvarint_len(self.frame)
    }

    /// Writes the entry at `out[pos..]`; the position after it, or `None`
    /// when it does not fit.
    pub fn encode(&self, out: &mut [u8], pos: usize) -> Option<usize> {
        put_all(out, pos, &[self.id, self.parent, self.frame], &[])
    }

    /// Parses the entry at `buf[*pos..]`, moving `*pos` past it; checks
    /// `id >= 1` and `parent < id`.
    pub fn parse(buf: &[u8], pos: &mut usize) -> Result<CallStackNode, EntryError> {
        let start = *pos;
        let id = field(
            buf,
            pos,
            "a call-stack node runs past the end of the payload",
        )?;
        if id == 0 {
            return Err(EntryError {
                at: start,
                what: "call-stack node ID 0 (IDs start at 1; 0 means no stack)",
            });
        }
        let parent = field(
            buf,
            pos,
            "a call-stack node runs past the end of the payload",
        )?;
        if parent >= id {
            return Err(EntryError {
                at: start,
                what: "a call-stack node's parent is not below its ID",
            });
        }
        let frame = field(
            buf,
            pos,
            "a call-stack node runs past the end of the payload",
        )?;
        Ok(CallStackNode { id, parent, frame })
    }

    /// The frame the node's word names.
    pub const fn frame_word(&self) -> FrameWord {
        FrameWord::from_word(self.frame)
    }
}

/// One registered frame of a frames batch (kind 11): a function of a
/// runtime's own code (a Lua or Python function, a JIT stub).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameEntry<'a> {
    /// At least 1.
    pub id: u64,
    /// 0 = unknown.
    pub line: u64,
    /// Bytes, UTF-8 by convention.
    pub func: &'a [u8],
    pub file: &'a [u8],
}

impl<'a> FrameEntry<'a> {
    /// Bytes the entry takes.
    pub const fn encoded_len(&self) -> usize {
        uvarint_len(self.id)
            + uvarint_len(self.line)
            + uvarint_len(self.func.len() as u64)
            + self.func.len()
            + uvarint_len(self.file.len() as u64)
            + self.file.len()
    }

    /// Writes the entry at `out[pos..]`; the position after it, or `None`
    /// when it does not fit.
    pub fn encode(&self, out: &mut [u8], pos: usize) -> Option<usize> {
        put_all(out, pos, &[self.id, self.line], &[self.func, self.file])
    }

    /// Parses the entry at `buf[*pos..]`, moving `*pos` past it; checks
    /// `id >= 1` and that the names lie within `buf`.
    pub fn parse(buf: &'a [u8], pos: &mut usize) -> Result<FrameEntry<'a>, EntryError> {
        let start = *pos;
        let truncated = "a frame entry runs past the end of the payload";
        let id = field(buf, pos, truncated)?;
        if id == 0 {
            return Err(EntryError {
                at: start,
                what: "registered frame ID 0 (IDs start at 1; frame 0 is the truncation marker)",
            });
        }
        let line = field(buf, pos, truncated)?;
        let too_long = "a registered frame's function or file name is longer than 1024 bytes";
        let func = bytes(buf, pos, MAX_FRAME_NAME_LEN, truncated, too_long)?;
        let file = bytes(buf, pos, MAX_FRAME_NAME_LEN, truncated, too_long)?;
        Ok(FrameEntry {
            id,
            line,
            func,
            file,
        })
    }
}

/// One native code object of a modules batch (kind 10): an executable, a
/// shared library or the vDSO, mapped during some part of the generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModuleEntry<'a> {
    /// At least 1, stable for the session.
    pub id: u64,
    /// The mapped range `[start, end)`, `start < end`.
    pub start: u64,
    pub end: u64,
    /// Load bias: an ELF virtual address is `runtime address - bias`.
    pub bias: u64,
    /// Runtime address of the PT_GNU_EH_FRAME segment, or 0.
    pub eh_frame_hdr: u64,
    /// 0: loaded before the generation started; else the dlopen's tick.
    pub load_ticks: u64,
    /// 0: still loaded at the generation's end; else the dlclose's tick.
    pub unload_ticks: u64,
    /// The GNU build ID, at most [`MAX_BUILD_ID_LEN`] bytes.
    pub build_id: &'a [u8],
    /// The path as the loader names it.
    pub path: &'a [u8],
}

impl<'a> ModuleEntry<'a> {
    fn values(&self) -> [u64; 7] {
        [
            self.id,
            self.start,
            self.end,
            self.bias,
            self.eh_frame_hdr,
            self.load_ticks,
            self.unload_ticks,
        ]
    }

    /// Bytes the entry takes.
    pub fn encoded_len(&self) -> usize {
        self.values().iter().map(|&v| uvarint_len(v)).sum::<usize>()
            + uvarint_len(self.build_id.len() as u64)
            + self.build_id.len()
            + uvarint_len(self.path.len() as u64)
            + self.path.len()
    }

    /// Writes the entry at `out[pos..]`; the position after it, or `None`
    /// when it does not fit or the build ID is longer than
    /// [`MAX_BUILD_ID_LEN`].
    pub fn encode(&self, out: &mut [u8], pos: usize) -> Option<usize> {
        if self.build_id.len() > MAX_BUILD_ID_LEN {
            return None;
        }
        put_all(out, pos, &self.values(), &[self.build_id, self.path])
    }

    /// Parses the entry at `buf[*pos..]`, moving `*pos` past it; checks
    /// `id >= 1`, `start < end`, the build ID's length and that the bytes
    /// lie within `buf`.
    pub fn parse(buf: &'a [u8], pos: &mut usize) -> Result<ModuleEntry<'a>, EntryError> {
        let start_pos = *pos;
        let truncated = "a module entry runs past the end of the payload";
        let mut v = [0u64; 7];
        for x in v.iter_mut() {
            *x = field(buf, pos, truncated)?;
        }
        let [id, start, end, bias, eh_frame_hdr, load_ticks, unload_ticks] = v;
        if id == 0 {
            return Err(EntryError {
                at: start_pos,
                what: "module ID 0 (IDs start at 1)",
            });
        }
        if start >= end {
            return Err(EntryError {
                at: start_pos,
                what: "a module's range is empty (start >= end)",
            });
        }
        let build_id = bytes(
            buf,
            pos,
            MAX_BUILD_ID_LEN,
            truncated,
            "a module's build ID is longer than 64 bytes",
        )?;
        let path = bytes(
            buf,
            pos,
            MAX_MODULE_PATH_LEN,
            truncated,
            "a module's path is longer than 4096 bytes",
        )?;
        Ok(ModuleEntry {
            id,
            start,
            end,
            bias,
            eh_frame_hdr,
            load_ticks,
            unload_ticks,
            build_id,
            path,
        })
    }

    /// Whether the module contains `addr`.
    pub const fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_words() {
        assert_eq!(FrameWord::Native(0x401234).word(), 0x802468);
        assert_eq!(FrameWord::from_word(0x802468), FrameWord::Native(0x401234));
        assert_eq!(FrameWord::Registered(5).word(), 11);
        assert_eq!(FrameWord::from_word(11), FrameWord::Registered(5));
        assert_eq!(FrameWord::TRUNCATED.word(), 1);
        assert!(FrameWord::from_word(1).is_truncation());
        assert!(!FrameWord::from_word(3).is_truncation());
        assert!(!FrameWord::from_word(0).is_truncation());
        assert_eq!(
            FrameWord::from_api_value(REGISTERED_FRAME_BIT | 7),
            FrameWord::Registered(7)
        );
        assert_eq!(
            FrameWord::from_api_value(0x7fff_1234),
            FrameWord::Native(0x7fff_1234)
        );
    }

    #[test]
    fn nodes_round_trip_and_refuse_bad_ones() {
        let nodes = [
            CallStackNode {
                id: 1,
                parent: 0,
                frame: FrameWord::TRUNCATED.word(),
            },
            CallStackNode {
                id: 300,
                parent: 1,
                frame: FrameWord::Native(0x7f00_0000_1234).word(),
            },
            CallStackNode {
                id: u64::MAX,
                parent: u64::MAX - 1,
                frame: u64::MAX,
            },
        ];
        let mut buf = [0u8; 64];
        let mut pos = 0;
        for n in &nodes {
            let end = n.encode(&mut buf, pos).unwrap();
            assert_eq!(end - pos, n.encoded_len());
            pos = end;
        }
        // The design's bytes: id 1, parent 0, frame word 1.
        assert_eq!(&buf[..3], &[1, 0, 1]);
        let mut at = 0;
        for n in &nodes {
            assert_eq!(CallStackNode::parse(&buf[..pos], &mut at), Ok(*n));
        }
        assert_eq!(at, pos);
        assert!(nodes[2].encode(&mut buf[..10], 0).is_none());
        let bad = |bytes: &[u8]| CallStackNode::parse(bytes, &mut 0).unwrap_err();
        assert_eq!(bad(&[0, 0, 2]).at, 0);
        assert!(bad(&[0, 0, 2]).what.contains("ID 0"));
        assert!(bad(&[2, 2, 2]).what.contains("parent"));
        assert!(bad(&[2, 3, 2]).what.contains("parent"));
        let cut = bad(&[2, 1]);
        assert_eq!((cut.at, cut.what.contains("past the end")), (2, true));
        // Parsing from inside a buffer names offsets in that buffer.
        let mut at = 3;
        assert_eq!(
            CallStackNode::parse(&[1, 0, 1, 5, 7], &mut at)
                .unwrap_err()
                .at,
            3
        );
    }

    /// FORMAT.md section 10's worked example, byte for byte.
    #[test]
    fn the_documented_example() {
        let nodes = [
            (1, 0, FrameWord::Native(0x401136)),
            (2, 1, FrameWord::Native(0x401189)),
            (3, 2, FrameWord::Registered(1)),
            (4, 0, FrameWord::TRUNCATED),
        ];
        // Batch prefix, then the header: generation 1, thread 0, base 0.
        let mut batch = [0u8; 64];
        batch[..8].copy_from_slice(&[12, 0, 0, 0, 0, 1, 0, 0]);
        let mut pos = 8;
        for (id, parent, frame) in nodes {
            let n = CallStackNode {
                id,
                parent,
                frame: frame.word(),
            };
            pos = n.encode(&mut batch, pos).unwrap();
        }
        batch[1] = (pos - 5) as u8;
        assert_eq!(
            &batch[..pos],
            &[
                0x0C, 0x15, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x01, 0x00, 0xEC, 0xC4, 0x80, 0x04,
                0x02, 0x01, 0x92, 0xC6, 0x80, 0x04, 0x03, 0x02, 0x03, 0x04, 0x00, 0x01
            ]
        );
        assert_eq!(
            crate::checksum::batch_checksum(&[&batch[..pos]]),
            0x8930_ca28
        );
        let frame = FrameEntry {
            id: 1,
            line: 7,
            func: b"f",
            file: b"a.lua",
        };
        let mut frames = [0u8; 32];
        frames[..8].copy_from_slice(&[11, 13, 0, 0, 0, 1, 0, 0]);
        let end = frame.encode(&mut frames, 8).unwrap();
        assert_eq!(
            &frames[..end],
            &[
                0x0B, 0x0D, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x01, 0x07, 0x01, 0x66, 0x05, 0x61,
                0x2E, 0x6C, 0x75, 0x61
            ]
        );
        assert_eq!(
            crate::checksum::batch_checksum(&[&frames[..end]]),
            0x681a_b3c9
        );
        // The allocation with stack 3.
        let mut out = [0u8; crate::event::MAX_EVENT_LEN];
        let n = crate::event::encode_event(
            &mut out,
            crate::event::EventKind::HeapObjectAllocStack,
            0,
            5,
            [crate::varint::zigzag(1), 48, 0, 3, 0],
        );
        assert_eq!(&out[..n], &[0x0B, 0x05, 0x02, 0x30, 0x00, 0x03]);
    }

    #[test]
    fn frames_round_trip_and_refuse_bad_ones() {
        let f = FrameEntry {
            id: 2,
            line: 40,
            func: b"lua_fn",
            file: b"a.lua",
        };
        let mut buf = [0u8; 32];
        let n = f.encode(&mut buf, 0).unwrap();
        assert_eq!(n, f.encoded_len());
        assert_eq!(&buf[..n], b"\x02\x28\x06lua_fn\x05a.lua");
        assert_eq!(FrameEntry::parse(&buf[..n], &mut 0), Ok(f));
        assert!(f.encode(&mut buf[..n - 1], 0).is_none());
        // A name length past the end: the length's offset, no allocation.
        let lying = [2, 0, 0x10, b'x'];
        let err = FrameEntry::parse(&lying, &mut 0).unwrap_err();
        assert_eq!(err.at, 2);
        assert!(err.what.contains("past the end"));
        // A huge name: refused at its length, whether or not its bytes are there.
        let huge = [2, 0, 0xff, 0xff, 0xff, 0xff, 0x0f, b'x'];
        let err = FrameEntry::parse(&huge, &mut 0).unwrap_err();
        assert_eq!(err.at, 2);
        assert!(err.what.contains("longer than 1024"), "{}", err.what);
        let mut long = alloc::vec![2u8, 0, 0x81, 0x08];
        long.extend_from_slice(&[b'f'; 1025]);
        long.push(0);
        assert!(FrameEntry::parse(&long, &mut 0)
            .unwrap_err()
            .what
            .contains("longer than 1024"));
        let mut max = alloc::vec![2u8, 0, 0x80, 0x08];
        max.extend_from_slice(&[b'f'; 1024]);
        max.push(0);
        assert_eq!(FrameEntry::parse(&max, &mut 0).unwrap().func.len(), 1024);
        assert!(FrameEntry::parse(&[0, 0, 0, 0], &mut 0)
            .unwrap_err()
            .what
            .contains("ID 0"));
        let cut = FrameEntry::parse(&buf[..n - 1], &mut 0).unwrap_err();
        assert_eq!(cut.at, 9, "the file name's length");
    }

    #[test]
    fn modules_round_trip_and_refuse_bad_ones() {
        let m = ModuleEntry {
            id: 1,
            start: 0x5555_0000,
            end: 0x5556_0000,
            bias: 0x5555_0000,
            eh_frame_hdr: 0x5555_8000,
            load_ticks: 0,
            unload_ticks: 77,
            build_id: &[0xab; 20],
            path: b"/usr/bin/app",
        };
        let mut buf = [0u8; 128];
        let n = m.encode(&mut buf, 1).unwrap();
        assert_eq!(n - 1, m.encoded_len());
        let mut at = 1;
        assert_eq!(ModuleEntry::parse(&buf[..n], &mut at), Ok(m));
        assert_eq!(at, n);
        let long = ModuleEntry {
            build_id: &[0; 65],
            ..m
        };
        assert!(long.encode(&mut buf, 0).is_none());
        let empty = ModuleEntry { end: m.start, ..m };
        let n = put_all(&mut buf, 0, &empty.values(), &[b"", b""]).unwrap();
        let err = ModuleEntry::parse(&buf[..n], &mut 0).unwrap_err();
        assert_eq!((err.at, err.what.contains("empty")), (0, true));
        // A build ID length of 65: refused at the length.
        let n = put_all(&mut buf, 0, &m.values(), &[&[0; 65], b""]).unwrap();
        let err = ModuleEntry::parse(&buf[..n], &mut 0).unwrap_err();
        assert!(err.what.contains("build ID"), "{err:?}");
        let fields: usize = m.values().iter().map(|&v| uvarint_len(v)).sum();
        assert_eq!(err.at, fields, "the length's offset");
        let zero = ModuleEntry { id: 0, ..m };
        let n = put_all(&mut buf, 0, &zero.values(), &[b"", b""]).unwrap();
        assert!(ModuleEntry::parse(&buf[..n], &mut 0)
            .unwrap_err()
            .what
            .contains("ID 0"));
        assert!(m.contains(0x5555_0000) && !m.contains(0x5556_0000));
    }
}
