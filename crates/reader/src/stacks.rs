//! A generation's call stacks, registered frames and modules (FORMAT.md
//! section 10, batch kinds 10, 11 and 12): parsed and checked as their
//! batches arrive, then offered to the reader's users through
//! [`TraceReader::stacks`](crate::TraceReader::stacks).
//!
//! Since version 5 the writer lists a generation's entries as it goes,
//! before the events that use them, in as many batches as it likes: a
//! node's ID need not be above the previous one's (a node first used late
//! in a generation may be an old one), and a module is listed again when
//! its unload becomes known.
//!
//! ## Invariants
//! 1. `ids` is sorted, so a lookup is a binary search; a node listed
//!    after a larger one (version 5) goes to `late`, a map by ID, so that
//!    it costs a map insertion rather than a shift of every larger node (a
//!    batch of nodes in decreasing order would otherwise take time
//!    quadratic in the batch). An ID is listed once, in one of the two.
//! 2. Every node's parent is 0 or an earlier node, so a walk from any node
//!    to the root ends (the parent's ID is always smaller) and never meets
//!    an undefined node.
//! 3. Every registered frame a node names (other than the truncation
//!    marker, frame 0) is in `registered`: the frames batch comes before
//!    the call-stacks batch (FORMAT.md's order), and a frame word naming a
//!    frame not yet listed is malformed.
//! 4. No stack is deeper than [`MAX_STACK_DEPTH`] frames: a node's depth
//!    is its parent's plus one, and a deeper node is malformed. So a walk
//!    from a node takes at most that many steps, whatever the file: a
//!    chain of nodes a few bytes each cannot make a reader's users expand
//!    stacks as deep as the file is long.

use std::collections::BTreeMap;

use alloctrace_format::stacks::{
    CallStackNode, FrameEntry, FrameWord, ModuleEntry, MAX_STACK_DEPTH,
};

use crate::decode::Cursor;
use crate::ReadError;

/// A native code object mapped during the generation (modules batch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    /// At least 1, stable for the session.
    pub id: u64,
    /// Mapped range `[start, end)`.
    pub start: u64,
    pub end: u64,
    /// Load bias: an address's ELF virtual address is `address - bias`.
    pub bias: u64,
    /// Runtime address of the PT_GNU_EH_FRAME segment, or 0.
    pub eh_frame_hdr: u64,
    /// 0: loaded before the generation started; else the dlopen's tick.
    pub load_ticks: u64,
    /// 0: still loaded at the generation's end; else the dlclose's tick.
    pub unload_ticks: u64,
    /// The GNU build ID (empty when the object has none).
    pub build_id: Vec<u8>,
    /// The path as the loader names it; invalid UTF-8 is replaced by U+FFFD.
    pub path: String,
}

impl Module {
    /// Whether `addr` lies in the module's range.
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }

    /// Whether the module was mapped at `ticks`.
    pub fn alive_at(&self, ticks: u64) -> bool {
        (self.load_ticks == 0 || self.load_ticks <= ticks)
            && (self.unload_ticks == 0 || ticks < self.unload_ticks)
    }

    /// The ELF virtual address of runtime address `addr`: what `nm` and
    /// `addr2line -e PATH` take.
    pub fn offset(&self, addr: u64) -> u64 {
        addr.wrapping_sub(self.bias)
    }

    /// The file name: the path after its last `/`.
    pub fn file_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }
}

/// A frame of a runtime's own code (frames batch), registered with
/// `trace_frame_register`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisteredFrame {
    /// At least 1, stable for the session.
    pub id: u64,
    /// 0 = unknown.
    pub line: u64,
    /// Invalid UTF-8 is replaced by U+FFFD.
    pub function: String,
    pub file: String,
}

/// One frame of a call stack, resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A native return address, and the module that holds it, if the
    /// modules batch lists one (a symbolizer looks up
    /// `module.offset(addr) - 1`).
    Native {
        addr: u64,
        module: Option<&'a Module>,
    },
    /// A registered frame.
    Registered(&'a RegisteredFrame),
    /// The truncation marker: the walk stopped here (depth limit, a bad
    /// frame pointer, no unwind info).
    Truncated,
}

/// A generation's call stacks, registered frames and modules: empty for a
/// trace without stacks (versions 1 and 2, or a recording without them).
#[derive(Clone, Debug, Default)]
pub struct Stacks {
    /// Node IDs, sorted (invariant 1); `parents`, `words` and `depths`
    /// run alongside.
    ids: Vec<u64>,
    parents: Vec<u64>,
    words: Vec<u64>,
    /// Frames from the node to the root, 1 to [`MAX_STACK_DEPTH`]
    /// (invariant 4).
    depths: Vec<u16>,
    /// The nodes listed after a larger one (invariant 1).
    late: BTreeMap<u64, Node>,
    registered: BTreeMap<u64, RegisteredFrame>,
    /// In file order.
    modules: Vec<Module>,
    /// The generation was cut off before its generation-end batch (a
    /// truncated trace): its events' stack IDs are kept but not checked
    /// (a writer before version 5 listed the stacks only as the
    /// generation ended; since, every event cut short of its stack is one
    /// a damaged or hostile file names wrongly).
    cut: bool,
}

/// A node's parent, frame word and depth: what a lookup gives, and an
/// entry of `late`.
#[derive(Clone, Copy, Debug)]
struct Node {
    parent: u64,
    word: u64,
    depth: u16,
}

/// Rough memory of one entry besides its names (charged to the reader's
/// per-generation budget); a late node takes [`LATE_NODE_MEMORY`].
const NODE_MEMORY: u64 = 26;
const LATE_NODE_MEMORY: u64 = 64;
// A depth fits `depths`.
const _: () = assert!(MAX_STACK_DEPTH <= u16::MAX as usize);
const ENTRY_OVERHEAD: u64 = 96;

impl Stacks {
    /// Number of call-stack nodes (each a stack ID).
    pub fn len(&self) -> usize {
        self.ids.len() + self.late.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty() && self.late.is_empty()
    }

    /// The stack IDs defined in the generation, in increasing order.
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        let (mut a, mut b) = (
            self.ids.iter().copied().peekable(),
            self.late.keys().copied().peekable(),
        );
        // The two sorted lists merged (an ID is in one only).
        std::iter::from_fn(move || match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if y < x => b.next(),
            (Some(_), _) => a.next(),
            (None, _) => b.next(),
        })
    }

    /// Whether `id` is a node of the generation (0 never is).
    #[inline]
    pub fn contains(&self, id: u64) -> bool {
        self.ids.binary_search(&id).is_ok()
            || (!self.late.is_empty() && self.late.contains_key(&id))
    }

    /// Whether the generation was cut off before its generation-end batch
    /// (a truncated trace): with a writer before version 5 its stack
    /// batches are missing, so stack IDs of its events may name no stack
    /// here.
    pub fn is_cut(&self) -> bool {
        self.cut
    }

    /// Marks the generation as cut off ([`Stacks::is_cut`]).
    pub(crate) fn set_cut(&mut self) {
        self.cut = true;
    }

    /// Whether an event may name stack `id`: one defined here, or any in a
    /// generation cut off.
    #[inline(always)]
    pub(crate) fn accepts(&self, id: u64) -> bool {
        self.cut || self.contains(id)
    }

    /// The node `id`, as written.
    pub fn node(&self, id: u64) -> Option<CallStackNode> {
        let n = self.find(id)?;
        Some(CallStackNode {
            id,
            parent: n.parent,
            frame: n.word,
        })
    }

    /// Node `id`: in `ids` or in `late` (invariant 1).
    #[inline]
    fn find(&self, id: u64) -> Option<Node> {
        match self.ids.binary_search(&id) {
            Ok(i) => Some(Node {
                parent: self.parents[i],
                word: self.words[i],
                depth: self.depths[i],
            }),
            Err(_) if self.late.is_empty() => None,
            Err(_) => self.late.get(&id).copied(),
        }
    }

    /// The number of frames of stack `id`, at most [`MAX_STACK_DEPTH`]
    /// (`None` for an ID not defined).
    pub fn depth(&self, id: u64) -> Option<usize> {
        Some(usize::from(self.find(id)?.depth))
    }

    /// The frame words of stack `id`, innermost first (`None` for an ID not
    /// defined): at most [`MAX_STACK_DEPTH`] (invariant 4). Ends: each
    /// parent's ID is below its node's.
    pub fn words(&self, id: u64) -> Option<impl Iterator<Item = FrameWord> + '_> {
        let first = self.find(id)?;
        let mut next = Some(first);
        Some(std::iter::from_fn(move || {
            let n = next?;
            next = match n.parent {
                0 => None,
                parent => self.find(parent),
            };
            Some(FrameWord::from_word(n.word))
        }))
    }

    /// The frames of stack `id`, innermost first, resolved: native
    /// addresses to the module holding them (whichever lists the address
    /// first, when modules loaded at different times reused a range; see
    /// [`Stacks::frames_at`]).
    pub fn frames(&self, id: u64) -> Option<impl Iterator<Item = Frame<'_>> + '_> {
        Some(self.words(id)?.map(|w| self.resolve(w, None)))
    }

    /// [`Stacks::frames`] for an event at `ticks`: native addresses resolve
    /// to the module mapped at that time.
    pub fn frames_at(&self, id: u64, ticks: u64) -> Option<impl Iterator<Item = Frame<'_>> + '_> {
        Some(self.words(id)?.map(move |w| self.resolve(w, Some(ticks))))
    }

    /// Resolves one frame word; with `ticks`, to a module mapped then.
    pub fn resolve(&self, word: FrameWord, ticks: Option<u64>) -> Frame<'_> {
        match word {
            FrameWord::Native(addr) => Frame::Native {
                addr,
                module: self.module_of(addr, ticks),
            },
            FrameWord::Registered(0) => Frame::Truncated,
            FrameWord::Registered(id) => match self.registered.get(&id) {
                Some(f) => Frame::Registered(f),
                // Not reached: every frame word was checked (invariant 3).
                None => Frame::Truncated,
            },
        }
    }

    /// The module holding `addr` (mapped at `ticks`, when given).
    pub fn module_of(&self, addr: u64, ticks: Option<u64>) -> Option<&Module> {
        self.modules
            .iter()
            .find(|m| m.contains(addr) && ticks.is_none_or(|t| m.alive_at(t)))
    }

    /// The registered frame `id`.
    pub fn registered_frame(&self, id: u64) -> Option<&RegisteredFrame> {
        self.registered.get(&id)
    }

    /// The registered frames, by ID.
    pub fn registered_frames(&self) -> impl Iterator<Item = &RegisteredFrame> + '_ {
        self.registered.values()
    }

    /// The modules, in file order.
    pub fn modules(&self) -> &[Module] {
        &self.modules
    }

    /// Reads a modules body to its end; returns the memory it takes.
    pub(crate) fn read_modules(&mut self, c: &mut Cursor<'_>) -> Result<u64, ReadError> {
        let mut memory = 0;
        while c.remaining() > 0 {
            let at = c.pos();
            let m = c.entry(ModuleEntry::parse)?;
            let module = Module {
                id: m.id,
                start: m.start,
                end: m.end,
                bias: m.bias,
                eh_frame_hdr: m.eh_frame_hdr,
                load_ticks: m.load_ticks,
                unload_ticks: m.unload_ticks,
                build_id: m.build_id.to_vec(),
                path: String::from_utf8_lossy(m.path).into_owned(),
            };
            if let Some(old) = self.modules.iter_mut().find(|old| old.id == m.id) {
                // Listed again: the same object, its unload now known.
                let same = Module {
                    unload_ticks: old.unload_ticks,
                    ..module.clone()
                };
                if same != *old || (old.unload_ticks != 0 && old.unload_ticks != m.unload_ticks) {
                    return Err(c.error_at(
                        at,
                        format_args!(
                            "module ID {} listed twice, not as the same object with its unload",
                            m.id
                        ),
                    ));
                }
                old.unload_ticks = m.unload_ticks;
                continue;
            }
            memory += ENTRY_OVERHEAD + m.path.len() as u64 + m.build_id.len() as u64;
            self.modules.push(module);
        }
        Ok(memory)
    }

    /// Reads a frames body to its end; returns the memory it takes.
    pub(crate) fn read_frames(&mut self, c: &mut Cursor<'_>) -> Result<u64, ReadError> {
        let mut memory = 0;
        while c.remaining() > 0 {
            let at = c.pos();
            let f = c.entry(FrameEntry::parse)?;
            if self.registered.contains_key(&f.id) {
                return Err(c.error_at(
                    at,
                    format_args!("registered frame ID {} listed twice", f.id),
                ));
            }
            memory += ENTRY_OVERHEAD + f.func.len() as u64 + f.file.len() as u64;
            self.registered.insert(
                f.id,
                RegisteredFrame {
                    id: f.id,
                    line: f.line,
                    function: String::from_utf8_lossy(f.func).into_owned(),
                    file: String::from_utf8_lossy(f.file).into_owned(),
                },
            );
        }
        Ok(memory)
    }

    /// Reads a call-stacks body to its end (FORMAT.md section 10's rules);
    /// returns the memory it takes.
    pub(crate) fn read_call_stacks(&mut self, c: &mut Cursor<'_>) -> Result<u64, ReadError> {
        let mut memory = 0;
        while c.remaining() > 0 {
            let at = c.pos();
            let n = c.entry(CallStackNode::parse)?;
            // Where the node goes in `ids`: at the end, but for a node
            // listed after a larger one (version 5).
            // Whether the node goes to `late`: listed after a larger one
            // (version 5).
            let late = self.ids.last().is_some_and(|&last| n.id <= last);
            if late && self.find(n.id).is_some() {
                return Err(
                    c.error_at(at, format_args!("call-stack node ID {} listed twice", n.id))
                );
            }
            let depth = match n.parent {
                0 => 1,
                parent => match self.find(parent) {
                    Some(p) => usize::from(p.depth) + 1,
                    None => {
                        return Err(c.error_at(
                            at,
                            format_args!(
                                "call-stack node {} names parent {}, which is not an earlier node",
                                n.id, n.parent
                            ),
                        ))
                    }
                },
            };
            if depth > MAX_STACK_DEPTH {
                return Err(c.error_at(
                    at,
                    format_args!(
                        "call-stack node {} makes a stack of {depth} frames (at most {MAX_STACK_DEPTH})",
                        n.id
                    ),
                ));
            }
            if let FrameWord::Registered(f) = n.frame_word() {
                if f != 0 && !self.registered.contains_key(&f) {
                    return Err(c.error_at(
                        at,
                        format_args!(
                            "call-stack node {} names registered frame {f}, which the generation's frames batch does not list",
                            n.id
                        ),
                    ));
                }
            }
            // Fits: at most MAX_STACK_DEPTH, checked above.
            let depth = depth as u16;
            if late {
                let node = Node {
                    parent: n.parent,
                    word: n.frame,
                    depth,
                };
                self.late.insert(n.id, node);
                memory += LATE_NODE_MEMORY;
            } else {
                self.ids.push(n.id);
                self.parents.push(n.parent);
                self.words.push(n.frame);
                self.depths.push(depth);
                memory += NODE_MEMORY;
            }
        }
        Ok(memory)
    }
}
