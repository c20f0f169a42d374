//! Call stacks interned across generations and files.
//!
//! A trace interns its stacks per generation (FORMAT.md section 10): the
//! same call path has a different ID in every generation, and its native
//! frames are runtime addresses, which differ between processes (ASLR).
//! [`StackTable`] gives each distinct call path one [`StackId`] for the
//! whole analysis: a native frame is keyed by its module (path and build
//! ID) and its module-relative address, a registered frame by its
//! function, file and line. Frames in the LD_PRELOAD shim itself are left
//! out: traces written before the shim's walks ended at a thread's start
//! routine have its thread-start trampoline under every thread's stack
//! (newer traces have no frame of the shim's, so this only keeps old ones
//! readable as before).
//!
//! ## Invariants
//! 1. Node 0 is the empty stack; every other node's parent is a smaller
//!    index, so a walk to the root ends.
//! 2. `(parent, frame)` pairs are unique: two stacks with the same frames
//!    have the same ID.

use alloctrace_reader::{Frame as ReaderFrame, Stacks};
use alloctrace_symbolize::ModuleKey;
use rustc_hash::FxHashMap;

/// The LD_PRELOAD shim's file: its frames are left out of stacks.
pub const SHIM_FILE_NAME: &str = "liballoctrace_preload.so";

/// A call stack of the analysis; 0 is "no stack".
pub type StackId = u32;

/// A frame, independent of generation and process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Frame {
    /// A return address in module `module` (an index into
    /// [`StackTable::modules`]), `offset` its module-relative address (the
    /// ELF virtual address, what `nm` and `addr2line` take).
    Native { module: u32, offset: u64 },
    /// A return address no listed module holds.
    Unknown { addr: u64 },
    /// A frame registered with `trace_frame_register` (an index into
    /// [`StackTable::registered`]).
    Registered(u32),
    /// The walk stopped here (depth limit, a bad frame pointer, no unwind
    /// info).
    Truncated,
}

/// A registered frame's text.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RegisteredFrame {
    pub function: String,
    pub file: String,
    pub line: u64,
}

/// Every distinct call stack seen, as a prefix tree (innermost frame at the
/// leaf).
pub struct StackTable {
    /// Per node: its parent (the caller's stack) and its innermost frame.
    /// Node 0 is the empty stack (its entries are unused).
    parents: Vec<StackId>,
    frames: Vec<Frame>,
    nodes: FxHashMap<(StackId, Frame), StackId>,
    modules: Vec<ModuleKey>,
    module_index: FxHashMap<ModuleKey, u32>,
    registered: Vec<RegisteredFrame>,
    registered_index: FxHashMap<RegisteredFrame, u32>,
}

impl Default for StackTable {
    fn default() -> Self {
        StackTable::new()
    }
}

impl StackTable {
    pub fn new() -> StackTable {
        StackTable {
            parents: vec![0],
            frames: vec![Frame::Truncated],
            nodes: FxHashMap::default(),
            modules: Vec::new(),
            module_index: FxHashMap::default(),
            registered: Vec::new(),
            registered_index: FxHashMap::default(),
        }
    }

    /// Number of stacks, the empty one included.
    pub fn len(&self) -> usize {
        self.parents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.parents.len() == 1
    }

    /// The modules native frames name, by index.
    pub fn modules(&self) -> &[ModuleKey] {
        &self.modules
    }

    /// The registered frames, by index.
    pub fn registered(&self) -> &[RegisteredFrame] {
        &self.registered
    }

    /// The caller's stack of `stack` (0 for a one-frame stack or 0).
    pub fn parent(&self, stack: StackId) -> StackId {
        self.parents[stack as usize]
    }

    /// The innermost frame of `stack` (`None` for 0).
    pub fn frame(&self, stack: StackId) -> Option<Frame> {
        (stack != 0).then(|| self.frames[stack as usize])
    }

    /// The frames of `stack`, innermost first.
    pub fn frames(&self, stack: StackId) -> impl Iterator<Item = Frame> + '_ {
        let mut next = stack;
        std::iter::from_fn(move || {
            if next == 0 {
                return None;
            }
            let frame = self.frames[next as usize];
            next = self.parents[next as usize];
            Some(frame)
        })
    }

    /// The stack whose innermost frame is `frame`, called from `parent`.
    pub fn intern(&mut self, parent: StackId, frame: Frame) -> StackId {
        let next = self.parents.len() as StackId;
        *self.nodes.entry((parent, frame)).or_insert_with(|| {
            self.parents.push(parent);
            self.frames.push(frame);
            next
        })
    }

    /// The stack of `frames`, given innermost first.
    #[cfg(test)]
    fn intern_frames(&mut self, frames: &[Frame]) -> StackId {
        frames
            .iter()
            .rev()
            .fold(0, |parent, &frame| self.intern(parent, frame))
    }

    /// The index of a module, added if new.
    pub fn module(&mut self, key: &ModuleKey) -> u32 {
        if let Some(&i) = self.module_index.get(key) {
            return i;
        }
        let i = self.modules.len() as u32;
        self.modules.push(key.clone());
        self.module_index.insert(key.clone(), i);
        i
    }

    fn registered_frame(&mut self, frame: RegisteredFrame) -> u32 {
        if let Some(&i) = self.registered_index.get(&frame) {
            return i;
        }
        let i = self.registered.len() as u32;
        self.registered.push(frame.clone());
        self.registered_index.insert(frame, i);
        i
    }

    /// Interns every stack of a generation; the returned map turns the
    /// generation's stack IDs into the table's.
    pub fn add_generation(&mut self, stacks: &Stacks) -> GenerationStacks {
        let mut map = GenerationStacks::with_capacity(stacks.len());
        // The table's index of each of the generation's modules, by
        // module ID, looked up once per module rather than once per frame.
        let mut modules: FxHashMap<u64, u32> = FxHashMap::default();
        // Node IDs increase and every parent precedes its node (the
        // reader checks both), so a parent is always mapped first.
        for id in stacks.ids() {
            let Some(node) = stacks.node(id) else {
                continue;
            };
            let parent = map.get(node.parent);
            let word = alloctrace_format::stacks::FrameWord::from_word(node.frame);
            let frame = match stacks.resolve(word, None) {
                // The shim's own frames (its thread-start trampoline, under
                // every thread's stack): the tracer, not the program.
                ReaderFrame::Native {
                    module: Some(m), ..
                } if m.file_name() == SHIM_FILE_NAME => {
                    map.insert(id, parent);
                    continue;
                }
                ReaderFrame::Native {
                    addr,
                    module: Some(m),
                } => {
                    let module = match modules.get(&m.id) {
                        Some(&i) => i,
                        None => {
                            let i = self.module(&ModuleKey {
                                path: m.path.clone(),
                                build_id: m.build_id.clone(),
                            });
                            modules.insert(m.id, i);
                            i
                        }
                    };
                    Frame::Native {
                        module,
                        offset: m.offset(addr),
                    }
                }
                ReaderFrame::Native { addr, module: None } => Frame::Unknown { addr },
                ReaderFrame::Registered(r) => {
                    Frame::Registered(self.registered_frame(RegisteredFrame {
                        function: r.function.clone(),
                        file: r.file.clone(),
                        line: r.line,
                    }))
                }
                ReaderFrame::Truncated => Frame::Truncated,
            };
            let stack = self.intern(parent, frame);
            map.insert(id, stack);
        }
        map
    }
}

/// A generation's stack IDs mapped to [`StackId`]s.
#[derive(Default)]
pub struct GenerationStacks {
    /// Dense when the IDs are (the writer counts them from 1): IDs below
    /// `dense_limit`.
    dense: Vec<StackId>,
    sparse: FxHashMap<u64, StackId>,
    /// A few times the generation's node count, so that a hostile trace's
    /// large IDs cannot make the dense map big.
    dense_limit: u64,
}

impl GenerationStacks {
    fn with_capacity(n: usize) -> GenerationStacks {
        GenerationStacks {
            dense: Vec::with_capacity(n + 1),
            sparse: FxHashMap::default(),
            dense_limit: 2 * n as u64 + 1024,
        }
    }

    fn insert(&mut self, id: u64, stack: StackId) {
        if id < self.dense_limit {
            let i = id as usize;
            if self.dense.len() <= i {
                self.dense.resize(i + 1, 0);
            }
            self.dense[i] = stack;
        } else {
            self.sparse.insert(id, stack);
        }
    }

    /// The stack of generation stack ID `id`; 0 for 0 or an ID the
    /// generation does not define (a generation cut off before its stacks).
    #[inline]
    pub fn get(&self, id: u64) -> StackId {
        if id < self.dense_limit {
            self.dense.get(id as usize).copied().unwrap_or(0)
        } else {
            self.sparse.get(&id).copied().unwrap_or(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_frames_give_equal_ids_and_frames_come_back_innermost_first() {
        let mut t = StackTable::new();
        let m = t.module(&ModuleKey {
            path: "/bin/x".into(),
            build_id: vec![1],
        });
        let a = Frame::Native {
            module: m,
            offset: 10,
        };
        let b = Frame::Native {
            module: m,
            offset: 20,
        };
        let c = Frame::Unknown { addr: 5 };
        let s1 = t.intern_frames(&[a, b, c]);
        let s2 = t.intern_frames(&[a, b, c]);
        let s3 = t.intern_frames(&[b, b, c]);
        assert_eq!(s1, s2);
        assert_ne!(s1, s3);
        assert_eq!(t.frames(s1).collect::<Vec<_>>(), vec![a, b, c]);
        assert_eq!(t.parent(t.parent(s1)), t.parent(t.parent(s3)));
        assert_eq!(t.frames(0).count(), 0);
        // Nodes: c, b<-c, a<-b<-c, b<-b<-c.
        assert_eq!(t.len(), 5);
    }
}
