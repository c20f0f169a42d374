//! The call-stack table: interns call stacks as nodes of a prefix tree, so
//! an allocation event carries one small stack ID (docs/FORMAT.md, "Call
//! stacks, frames and modules").
//!
//! ## Design
//!
//! A node is `(parent, frame)`: `frame` is a frame word (a native return
//! address shifted left by one, or a registered frame's ID shifted left by
//! one with the low bit set), `parent` the node of the caller's frames, 0
//! at the outermost frame. A stack ID is the ID of its innermost node, so
//! stacks that share callers share nodes, and every node is a stack.
//!
//! Like Go's traceStackTable the table is lock-free and append-only, in
//! memory of its own (reserved.rs): an open-addressing hash index from
//! `(parent, frame)` to node ID over an array of nodes, IDs from a
//! counter. Interning never calls malloc, never locks and makes no syscall
//! once the regions are mapped (the first call maps them). A capture
//! interns the frames its walk did not share with the previous stack in
//! one call ([`intern_path`]), onto the node of the shared ones.
//!
//! Unlike Go's, IDs are stable for the process: a runtime registers a
//! stack once and keeps its ID (`trace_stack_register`). Each generation
//! still lists every node its events use, ancestors included, so it reads
//! alone; and it lists them *before* the events that use them, so a trace
//! cut anywhere (a process killed by SIGKILL) keeps the stacks of every
//! event it holds. An event that uses a stack marks its node and the
//! node's ancestors with the generation ([`mark_used`]); the writer thread,
//! before it writes any batch of the generation, lists the marked nodes it
//! has not listed in that generation yet ([`Lister::list`], tables.rs).
//! So the writer finds new marks without scanning the table, a marker
//! announces each mark in a per-chunk counter ([`DIRTY`]).
//!
//! ## Invariants
//!
//! 1. A node's parent and frame are written before its ID is published
//!    (the Release store of its `ready`, then the Release CAS of its hash
//!    slot); readers load either with Acquire before the fields (a lookup
//!    the slot it found the ID in, a reader handed an ID its `ready`).
//!    Otherwise a lookup could match a half-written node.
//! 2. A node's parent ID is smaller than its own: the parent is interned
//!    (its ID taken from the counter) before the child asks for an ID. So
//!    a walk to the root ends, and listing ancestors first puts every
//!    parent before its children, as the format requires.
//! 3. `mark_used(id, g)` MUST run inside the event's seqlock section of
//!    generation `g`, before the event is written. A node's mark goes
//!    through three steps: `used = 2g` (marked), then its chunk's
//!    [`DIRTY`] counter is incremented (Release), then `used = 2g + 1`
//!    (announced). A marker that finds `2g + 1` relies on the announcement
//!    of whoever stored it (which happened before, by the Release/Acquire
//!    of the mark); one that finds `2g` (a marker between the two steps)
//!    increments the counter itself. So when the writer thread takes a
//!    batch whose events use node `n`, an increment made after `n` was
//!    marked happened before it: the writer, which reads the counter
//!    (Acquire) before it scans the chunk and scans again whenever the
//!    counter moved, finds `n` marked before it writes the batch.
//! 4. Marks are kept per generation parity: generations `g` and `g + 1`
//!    may be open at once (an advance), and the events of `g + 1` must not
//!    overwrite the marks of `g` the writer has yet to list. A third
//!    generation opens only after the writer has written `g`'s end
//!    (lifecycle.rs, `advance_session`).
//! 5. The writer lists a node's unlisted ancestors before the node (it
//!    walks the parents itself), so a node marked by a marker that has not
//!    yet marked its ancestors is listed whole.
//! 6. The header's inline event path (include/alloctrace_inline.h,
//!    `alloctrace_record_`) writes an event with stack `id` only after it
//!    finds `used[g % 2] == 2g + 1`, as [`used_by`] does, inside the
//!    seqlock section of `g`; otherwise it calls the library, which marks.
//!    It reads the node array through `SHARED.call_stack_nodes` (stored
//!    once the array is mapped, never unmapped) at the offsets
//!    `shared::CALL_STACK_NODE_SIZE` and `CALL_STACK_NODE_USED_OFFSET`
//!    give, which the header takes from alloctrace_format.h: a node's
//!    layout is `repr(C)` and asserted against them, and changes together
//!    with them.

use core::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::reserved::Region;
use crate::shared::{
    CALL_STACK_MAX_NODES, CALL_STACK_NODE_SIZE, CALL_STACK_NODE_USED_OFFSET, SHARED,
};

/// Most nodes the table holds (frames of all distinct stacks, shared
/// prefixes counted once): 48 MiB of address space (and 8 MiB of index), used as touched.
pub(crate) const MAX_NODES: usize = CALL_STACK_MAX_NODES;
/// Hash slots: twice the nodes, so the index is at most half full.
const SLOT_BITS: u32 = 21;
const SLOTS: usize = 1 << SLOT_BITS;
/// Longest probe run before interning gives up (never reached below half
/// load in practice; bounds the work of a pathological hash).
const MAX_PROBES: usize = 1024;

/// `repr(C)`: the header's inline event path reads `used` (invariant 6),
/// at the offsets `shared::CALL_STACK_NODE_SIZE` and
/// `CALL_STACK_NODE_USED_OFFSET` give it.
#[repr(C)]
struct Node {
    parent: AtomicU32,
    /// Set (Release) once `parent`, `frame` and `depth` are written
    /// (invariant 1).
    ready: AtomicBool,
    /// Frames from this node to the root (1 at the outermost frame),
    /// saturated at `u16::MAX`: [`intern_onto`] refuses to grow a stack
    /// past the format's depth limit with it.
    depth: AtomicU16,
    frame: AtomicU64,
    /// `2g` or `2g + 1` for the last generation `g` of each parity whose
    /// events used this node (invariants 3 and 4).
    used: [AtomicU64; 2],
    /// The writer thread's own: the last listing key (tables.rs) of each
    /// parity that listed the node.
    listed: [AtomicU64; 2],
}

// The layout the header reads (invariant 6).
static_assertions::const_assert_eq!(core::mem::size_of::<Node>(), CALL_STACK_NODE_SIZE);
static_assertions::const_assert_eq!(
    core::mem::offset_of!(Node, used),
    CALL_STACK_NODE_USED_OFFSET
);

/// Nodes per chunk of [`DIRTY`].
const CHUNK_BITS: u32 = 10;
/// Chunks of the node array.
pub(crate) const CHUNKS: usize = MAX_NODES >> CHUNK_BITS;

/// Per generation parity and chunk of 1024 nodes: incremented after a node
/// of the chunk is marked (invariant 3), so the writer scans only chunks
/// with new marks.
#[allow(clippy::declare_interior_mutable_const)]
static DIRTY: [[AtomicU64; CHUNKS]; 2] = {
    const ZERO: AtomicU64 = AtomicU64::new(0);
    const ROW: [AtomicU64; CHUNKS] = [ZERO; CHUNKS];
    [ROW, ROW]
};

const NODES_LEN: usize = MAX_NODES * core::mem::size_of::<Node>();
const SLOTS_LEN: usize = SLOTS * core::mem::size_of::<AtomicU32>();

static NODES: Region<NODES_LEN> = Region::new();
static INDEX: Region<SLOTS_LEN> = Region::new();
/// The next node ID; 0 is "no stack". May run past MAX_NODES when full.
static NEXT: AtomicUsize = AtomicUsize::new(1);

/// The node with ID `id` (`0 < id < MAX_NODES`) in the mapped array.
fn node(nodes: *mut u8, id: usize) -> &'static Node {
    debug_assert!(id > 0 && id < MAX_NODES);
    // SAFETY: id < MAX_NODES is inside the region, which is mapped for
    // good (reserved.rs invariant 1) and zeroed: all-zero bytes are a valid
    // Node (atomics), so any node may be referenced, written or not.
    unsafe { &*nodes.cast::<Node>().add(id) }
}

fn slot(index: *mut u8, i: usize) -> &'static AtomicU32 {
    // SAFETY: i < SLOTS is inside the mapped, zeroed region, as above.
    unsafe { &*index.cast::<AtomicU32>().add(i & (SLOTS - 1)) }
}

fn hash(parent: u32, frame: u64) -> usize {
    let h =
        (frame ^ (u64::from(parent) << 40) ^ u64::from(parent)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> (64 - SLOT_BITS)) as usize
}

/// The ID of node `(parent, frame)`, interned if new; 0 when the table is
/// full or cannot be mapped. No malloc, no lock; a syscall only on the
/// process's first call.
pub(crate) fn intern_child(parent: u32, frame: u64) -> u32 {
    let Some((nodes, index)) = regions() else {
        return 0;
    };
    find_or_insert(nodes, index, parent, frame)
}

/// Interns a path of frames in one call: `words`, outermost first, each
/// the child of the one before and the first a child of `parent` (0: the
/// outermost frame of a stack). Writes each frame's node ID to `ids` in
/// order and returns the innermost one's (`parent` for no words); 0 when
/// the table is full or cannot be mapped, or `ids` is shorter than
/// `words` (then `ids` is left partly written). A capture interns the
/// frames its walk did not prove shared with the previous one this way:
/// the regions' bases are loaded once, and a node the table has costs a
/// hash and a compare, inlined. No malloc, no lock; a syscall only on the
/// process's first call.
#[inline(always)]
pub(crate) fn intern_path(
    parent: u32,
    words: impl ExactSizeIterator<Item = u64>,
    ids: &mut [u32],
) -> u32 {
    if words.len() > ids.len() {
        return 0;
    }
    let Some((nodes, index)) = regions() else {
        return 0;
    };
    let mut parent = parent;
    for (frame, id) in words.zip(ids.iter_mut()) {
        parent = find_or_insert(nodes, index, parent, frame);
        if parent == 0 {
            return 0;
        }
        *id = parent;
    }
    parent
}

/// The bases of the node array and the index, mapping them on the
/// process's first call (out of line); `None` if the kernel refused.
#[inline(always)]
fn regions() -> Option<(*mut u8, *mut u8)> {
    match (NODES.base_if_mapped(), INDEX.base_if_mapped()) {
        (Some(nodes), Some(index)) => Some((nodes, index)),
        _ => map_regions(),
    }
}

#[cold]
#[inline(never)]
fn map_regions() -> Option<(*mut u8, *mut u8)> {
    let regions = (NODES.base()?, INDEX.base()?);
    // Published for the header's inline path once both are mapped: the
    // node array is mapped for good (reserved.rs), so the pointer stays
    // valid (invariant 6).
    SHARED.call_stack_nodes.store(regions.0, Ordering::Release);
    Some(regions)
}

/// [`intern_child`] in the mapped regions. Inlined: the common case, a
/// node the table has in the first slot its hash names; the probe goes on
/// out of line ([`probe`]), which adds the node if new.
#[inline(always)]
fn find_or_insert(nodes: *mut u8, index: *mut u8, parent: u32, frame: u64) -> u32 {
    let start = hash(parent, frame);
    let id = slot(index, start).load(Ordering::Acquire);
    if id != 0 && is_node(nodes, id, parent, frame) {
        return id;
    }
    probe(nodes, index, parent, frame, start)
}

/// Whether node `id`, loaded (Acquire) from a slot of the index or from
/// a failed compare-exchange of one, is `(parent, frame)`. Its fields were
/// written before the ID was published there (invariant 1): that Acquire
/// load suffices, its `ready` needs no second look.
#[inline(always)]
fn is_node(nodes: *mut u8, id: u32, parent: u32, frame: u64) -> bool {
    let n = node(nodes, id as usize);
    n.parent.load(Ordering::Relaxed) == parent && n.frame.load(Ordering::Relaxed) == frame
}

/// The probe for `(parent, frame)` from slot `start` (its hash), out of
/// line: the ID of the node in the first slot that holds it, or of the
/// probe's own node published in the first empty slot; 0 when the table
/// is full. Cold: most lookups find their node in the first slot.
#[cold]
#[inline(never)]
fn probe(nodes: *mut u8, index: *mut u8, parent: u32, frame: u64, start: usize) -> u32 {
    let mut mine = 0usize;
    for i in start..start + MAX_PROBES {
        let s = slot(index, i);
        let mut id = s.load(Ordering::Acquire);
        if id == 0 {
            if mine == 0 {
                mine = NEXT.fetch_add(1, Ordering::Relaxed);
                if mine >= MAX_NODES {
                    return 0;
                }
                let n = node(nodes, mine);
                // The parent's node is interned (its ID was handed out
                // after its `ready`), so its depth is written.
                let depth = if parent == 0 {
                    1
                } else {
                    node(nodes, parent as usize)
                        .depth
                        .load(Ordering::Relaxed)
                        .saturating_add(1)
                };
                n.parent.store(parent, Ordering::Relaxed);
                n.frame.store(frame, Ordering::Relaxed);
                n.depth.store(depth, Ordering::Relaxed);
                n.ready.store(true, Ordering::Release);
            }
            match s.compare_exchange(0, mine as u32, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return mine as u32,
                Err(other) => id = other,
            }
        }
        if is_node(nodes, id, parent, frame) {
            return id;
        }
    }
    0
}

/// The ID of the stack `parent` (a stack ID; 0: none) with `frame` (a frame
/// word) as its innermost frame, interned if new: one hash lookup, however
/// deep the stack. 0 when `parent` names no node, when the stack would be
/// deeper than `max_depth` frames, or when the table is full. No malloc,
/// no lock; a syscall only on the process's first call.
#[inline]
pub(crate) fn intern_onto(parent: u64, frame: u64, max_depth: usize) -> u32 {
    let Some((nodes, index)) = regions() else {
        return 0;
    };
    if parent != 0 {
        if parent >= MAX_NODES as u64 || parent as usize >= NEXT.load(Ordering::Relaxed) {
            return 0;
        }
        let p = node(nodes, parent as usize);
        // Acquire: the node's depth is read after its `ready` (invariant 1).
        if !p.ready.load(Ordering::Acquire)
            || usize::from(p.depth.load(Ordering::Relaxed)) >= max_depth
        {
            return 0;
        }
    } else if max_depth == 0 {
        return 0;
    }
    find_or_insert(nodes, index, parent as u32, frame)
}

/// Interns a stack given as frame words from the outermost in; returns its
/// ID (the innermost node's), or 0 for an empty stack, a `None` word (a
/// frame the caller could not turn into a word) or a full table.
pub(crate) fn intern_outermost_first(words: impl Iterator<Item = Option<u64>>) -> u32 {
    let mut parent = 0;
    for word in words {
        let Some(word) = word else {
            return 0;
        };
        parent = intern_child(parent, word);
        if parent == 0 {
            return 0;
        }
    }
    parent
}

/// Interns a whole stack of frame words, innermost first (a native walk's
/// order).
#[cfg(test)]
pub(crate) fn intern(frames: &[u64]) -> u32 {
    intern_outermost_first(frames.iter().rev().map(|&w| Some(w)))
}

/// Whether any stack was ever interned.
pub(crate) fn any() -> bool {
    NEXT.load(Ordering::Relaxed) > 1
}

/// Whether `id` names a node (for IDs a caller hands in).
pub(crate) fn is_defined(id: u64) -> bool {
    let Some(nodes) = NODES.base_if_mapped() else {
        return false;
    };
    id > 0
        && id < MAX_NODES as u64
        && (id as usize) < NEXT.load(Ordering::Relaxed)
        && node(nodes, id as usize).ready.load(Ordering::Acquire)
}

/// Node `id`'s parent and frame word, once it is interned (invariant 1);
/// `None` for an ID that names no node. For the writer thread's snapshot
/// (writer/snapshot.rs), which lists the nodes of the live objects'
/// stacks without marking them.
pub(crate) fn node_fields(id: u32) -> Option<(u32, u64)> {
    let nodes = NODES.base_if_mapped()?;
    let i = id as usize;
    if i == 0 || i >= MAX_NODES || i >= NEXT.load(Ordering::Relaxed) {
        return None;
    }
    let n = node(nodes, i);
    n.ready.load(Ordering::Acquire).then(|| {
        (
            n.parent.load(Ordering::Relaxed),
            n.frame.load(Ordering::Relaxed),
        )
    })
}

/// Whether node `id` is already marked used by `generation` (so are its
/// ancestors: invariant 3), for an event that carries it without marking.
/// False for an ID that names no node.
#[inline(always)]
pub(crate) fn used_by(id: u64, generation: u64) -> bool {
    let Some(nodes) = NODES.base_if_mapped() else {
        return false;
    };
    id > 0
        && id < MAX_NODES as u64
        && (id as usize) < NEXT.load(Ordering::Relaxed)
        && node(nodes, id as usize).used[(generation & 1) as usize].load(Ordering::Acquire)
            == announced(generation)
}

/// A node's `used` once its mark of `generation` is announced (invariant 3).
#[inline(always)]
fn announced(generation: u64) -> u64 {
    generation.wrapping_mul(2) | 1
}

/// Marks node `id` and its ancestors as used by `generation`, each
/// announced in its chunk's counter (invariant 3). Runs inside the event's
/// seqlock section, before the event is written. `id` is one [`intern`]
/// returned or [`is_defined`] accepted.
pub(crate) fn mark_used(id: u32, generation: u64) {
    let Some(nodes) = NODES.base_if_mapped() else {
        return;
    };
    let parity = (generation & 1) as usize;
    let marked = generation.wrapping_mul(2);
    let mut id = id as usize;
    // At most one step per node: parents have smaller IDs (invariant 2).
    while id > 0 && id < MAX_NODES {
        let n = node(nodes, id);
        let mark = &n.used[parity];
        let now = mark.load(Ordering::Acquire);
        if now == marked | 1 {
            return;
        }
        if now != marked {
            mark.store(marked, Ordering::Release);
        }
        DIRTY[parity][id >> CHUNK_BITS].fetch_add(1, Ordering::Release);
        mark.store(marked | 1, Ordering::Release);
        let parent = n.parent.load(Ordering::Relaxed) as usize;
        if parent >= id {
            return;
        }
        id = parent;
    }
}

/// The writer thread's state for listing one parity's nodes (tables.rs):
/// what it read of each chunk's counter when it last scanned the chunk.
pub(crate) struct Lister {
    seen: Vec<u64>,
    /// Ancestors waiting to be listed, innermost first.
    path: Vec<u32>,
}

impl Lister {
    pub(crate) fn new() -> Lister {
        Lister {
            seen: vec![0; CHUNKS],
            path: Vec::with_capacity(256),
        }
    }

    /// Calls `f(id, parent, frame)` for every node `generation` used that
    /// no listing of `key` has listed yet, ancestors before their nodes
    /// (invariant 5), and notes them listed under `key`. With `full`
    /// (the first listing of a generation), scans every chunk; else only
    /// chunks whose counter moved since this lister last scanned them.
    pub(crate) fn list(
        &mut self,
        generation: u64,
        key: u64,
        full: bool,
        mut f: impl FnMut(u32, u32, u64),
    ) {
        let Some(nodes) = NODES.base_if_mapped() else {
            return;
        };
        let parity = (generation & 1) as usize;
        let marked = generation.wrapping_mul(2);
        let end = NEXT.load(Ordering::Acquire).min(MAX_NODES);
        let chunks = end.div_ceil(1 << CHUNK_BITS);
        for (chunk, dirty) in DIRTY[parity].iter().enumerate().take(chunks) {
            let count = dirty.load(Ordering::Acquire);
            if !full && count == self.seen[chunk] {
                continue;
            }
            self.seen[chunk] = count;
            // The node count read after the chunk's counter: a node whose
            // mark that count includes was interned before it was marked,
            // so it is below this `end` (read before the counter, a node
            // interned and marked in between would be counted as seen
            // without being scanned, and never listed).
            let end = NEXT.load(Ordering::Acquire).min(MAX_NODES);
            let first = (chunk << CHUNK_BITS).max(1);
            let last = ((chunk + 1) << CHUNK_BITS).min(end);
            for id in first..last {
                let n = node(nodes, id);
                if n.used[parity].load(Ordering::Acquire) | 1 != marked | 1
                    || n.listed[parity].load(Ordering::Relaxed) == key
                {
                    continue;
                }
                // The node and its unlisted ancestors, listed outermost
                // first.
                let mut at = id;
                while at > 0 && at < MAX_NODES {
                    let a = node(nodes, at);
                    if !a.ready.load(Ordering::Acquire)
                        || a.listed[parity].load(Ordering::Relaxed) == key
                    {
                        break;
                    }
                    a.listed[parity].store(key, Ordering::Relaxed);
                    self.path.push(at as u32);
                    let parent = a.parent.load(Ordering::Relaxed) as usize;
                    if parent >= at {
                        break;
                    }
                    at = parent;
                }
                while let Some(at) = self.path.pop() {
                    let a = node(nodes, at as usize);
                    f(
                        at,
                        a.parent.load(Ordering::Relaxed),
                        a.frame.load(Ordering::Relaxed),
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table is process-wide: each test uses frame words of its own
    /// (`tag` in the high bits) and generations of its own.
    fn frames(tag: u64, words: &[u64]) -> Vec<u64> {
        words.iter().map(|w| (tag << 40 | w) << 1).collect()
    }

    /// What a fresh writer lists for `generation` (a key of its own).
    fn listing(generation: u64) -> Vec<(u32, u32, u64)> {
        static KEY: AtomicU64 = AtomicU64::new(1 << 62);
        let key = KEY.fetch_add(1, Ordering::Relaxed);
        let mut out = Vec::new();
        Lister::new().list(generation, key, true, |id, parent, frame| {
            out.push((id, parent, frame))
        });
        out
    }

    #[test]
    fn stacks_share_their_callers_nodes_and_intern_to_the_same_id() {
        // main <- work <- alloc_a   and   main <- work <- alloc_b
        let a = intern(&frames(1, &[30, 20, 10]));
        let b = intern(&frames(1, &[31, 20, 10]));
        assert!(a != 0 && b != 0 && a != b);
        assert_eq!(intern(&frames(1, &[30, 20, 10])), a, "same stack, same ID");
        // The shared prefix: a's and b's parents are one node.
        let work = intern(&frames(1, &[20, 10]));
        assert!(work < a && work < b, "parents come first");
        // One function called from two places: two stacks.
        let from_a = intern(&frames(1, &[40, 41]));
        let from_b = intern(&frames(1, &[40, 42]));
        assert!(from_a != 0 && from_b != 0 && from_a != from_b);
        assert_eq!(intern(&[]), 0, "the empty stack is 0");
        assert!(is_defined(a as u64) && is_defined(work as u64));
        assert!(!is_defined(0) && !is_defined(u64::MAX) && !is_defined(MAX_NODES as u64 - 1));
    }

    /// Keys that hash to one slot: probing must compare the whole key.
    #[test]
    fn keys_that_collide_in_the_index_stay_distinct_nodes() {
        let frame = (4u64 << 40 | 1) << 1;
        let parent = 7u32;
        let other_parent = (parent + 1..)
            .find(|&p| hash(p, frame) == hash(parent, frame))
            .unwrap();
        let other_frame = (1u64..)
            .map(|w| (5u64 << 40 | w) << 1)
            .find(|&f| hash(parent, f) == hash(parent, frame))
            .unwrap();
        let a = intern_child(parent, frame);
        let b = intern_child(other_parent, frame);
        let c = intern_child(parent, other_frame);
        assert!(a != 0 && b != 0 && c != 0);
        assert!(a != b && a != c && b != c, "{a} {b} {c}");
        assert_eq!(intern_child(other_parent, frame), b);
        assert_eq!(intern_child(parent, other_frame), c);
    }

    #[test]
    fn a_path_interned_in_one_call_is_the_chain_of_its_children() {
        let words = frames(8, &[1, 2, 3, 4]);
        let mut ids = [0u32; 5];
        let id = intern_path(0, words.iter().copied(), &mut ids);
        let mut parent = 0;
        for (i, &w) in words.iter().enumerate() {
            parent = intern_child(parent, w);
            assert_eq!(ids[i], parent, "frame {i}");
        }
        assert_eq!(id, parent);
        assert_eq!(ids[4], 0, "no more IDs than words");
        // Onto a shared prefix: the same nodes as the whole path.
        let mut tail = [0u32; 2];
        assert_eq!(
            intern_path(ids[1], words[2..].iter().copied(), &mut tail),
            id
        );
        assert_eq!(tail, [ids[2], ids[3]]);
        // Another inner path off the same prefix: new nodes, parents first.
        let other = frames(8, &[5, 6]);
        let mut branch = [0u32; 2];
        let b = intern_path(ids[1], other.iter().copied(), &mut branch);
        assert!(b != 0 && b != id && branch[0] > ids[1] && branch[1] == b);
        assert_eq!(intern(&frames(8, &[6, 5, 2, 1])), b);
        // No words: the parent; too few IDs: nothing interned.
        assert_eq!(intern_path(ids[2], core::iter::empty(), &mut []), ids[2]);
        let fresh = frames(8, &[7, 8, 9]);
        assert_eq!(intern_path(0, fresh.iter().copied(), &mut [0; 2]), 0);
    }

    #[test]
    fn a_frame_pushed_onto_a_stack_is_the_stack_interned_whole() {
        let words = frames(9, &[1, 2, 3]);
        let mut parent = 0u64;
        for &w in &words {
            parent = u64::from(intern_onto(parent, w, 1024));
            assert_ne!(parent, 0);
        }
        let whole = intern(&frames(9, &[3, 2, 1]));
        assert_eq!(parent, u64::from(whole));
        assert_eq!(
            intern_onto(parent, words[0], 1024),
            intern_onto(parent, words[0], 1024)
        );
        // A parent that names no node: nothing.
        assert_eq!(intern_onto(MAX_NODES as u64 - 1, words[0], 1024), 0);
        assert_eq!(intern_onto(u64::MAX, words[0], 1024), 0);
        // The depth limit: a 3-frame stack takes no fourth frame under 3.
        assert_eq!(intern_onto(parent, words[1], 3), 0);
        assert_ne!(intern_onto(parent, words[1], 4), 0);
        assert_eq!(intern_onto(0, words[1], 0), 0);
    }

    /// Every node knows its depth, however it was interned: a chain that
    /// reaches the limit is refused one frame more.
    #[test]
    fn a_node_made_by_any_path_carries_its_depth() {
        let words = frames(10, &(1..=1024).collect::<Vec<u64>>());
        let mut ids = vec![0u32; 1024];
        let deepest = intern_path(0, words.iter().copied(), &mut ids);
        assert_ne!(deepest, 0);
        let nodes = NODES.base_if_mapped().unwrap();
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(
                usize::from(node(nodes, id as usize).depth.load(Ordering::Relaxed)),
                i + 1
            );
        }
        assert_eq!(intern_onto(u64::from(deepest), words[0], 1024), 0);
        assert_eq!(
            intern_onto(u64::from(ids[1022]), words[1023], 1024),
            deepest
        );
    }

    #[test]
    fn a_generation_lists_the_nodes_its_events_used_with_their_ancestors() {
        let (g1, g2) = (1_000_001, 1_000_002);
        let a = intern(&frames(2, &[3, 2, 1]));
        let b = intern(&frames(2, &[4, 2, 1]));
        let c = intern(&frames(2, &[5]));
        mark_used(a, g1);
        mark_used(a, g1);
        assert!(used_by(a as u64, g1) && !used_by(a as u64, g2));
        mark_used(c, g2);
        mark_used(b, g2);
        let one = listing(g1);
        assert_eq!(one.len(), 3);
        assert_eq!(one.last().unwrap().0, a);
        // Ancestors before children, every parent listed.
        for (i, &(id, parent, _)) in one.iter().enumerate() {
            assert!(parent < id);
            assert!(parent == 0 || one[..i].iter().any(|n| n.0 == parent));
        }
        // g2 (the other parity, open at once) lists its own: c, and b with
        // the prefix it shares with a, listed again.
        let two: Vec<u32> = listing(g2).iter().map(|n| n.0).collect();
        assert_eq!(two.len(), 4);
        assert!(two.contains(&b) && two.contains(&c) && !two.contains(&a));
        // g3 reuses g1's parity: g1's marks do not leak into it.
        assert!(listing(g1 + 2).is_empty());
    }

    /// The writer lists each node once per generation, as its marks come:
    /// a later listing of the same generation holds only the new ones, a
    /// node marked before its ancestors comes with them, parents first.
    #[test]
    fn a_writer_lists_each_new_mark_once_with_its_unlisted_ancestors() {
        let g = 1_000_011;
        let key = 77;
        let mut lister = Lister::new();
        let a = intern(&frames(6, &[3, 2, 1]));
        mark_used(a, g);
        let mut first = Vec::new();
        lister.list(g, key, true, |id, parent, _| first.push((id, parent)));
        assert_eq!(first.len(), 3);
        assert_eq!(first.last().unwrap().0, a);
        let mut again = Vec::new();
        lister.list(g, key, false, |id, _, _| again.push(id));
        assert!(again.is_empty(), "nothing new: {again:?}");
        // A new stack sharing a's callers: only its own node is new.
        let b = intern(&frames(6, &[4, 2, 1]));
        mark_used(b, g);
        let mut second = Vec::new();
        lister.list(g, key, false, |id, _, _| second.push(id));
        assert_eq!(second, vec![b]);
        // A node marked alone (its marker not yet at its ancestors): the
        // writer lists the ancestors first.
        let c = intern(&frames(6, &[9, 8, 7]));
        let n = node(NODES.base_if_mapped().unwrap(), c as usize);
        n.used[(g & 1) as usize].store(announced(g), Ordering::Release);
        DIRTY[(g & 1) as usize][c as usize >> CHUNK_BITS].fetch_add(1, Ordering::Release);
        let mut third = Vec::new();
        lister.list(g, key, false, |id, parent, _| third.push((id, parent)));
        assert_eq!(third.len(), 3);
        assert_eq!(third[0].1, 0);
        assert_eq!(third[1].1, third[0].0);
        assert_eq!(third[2], (c, third[1].0));
    }

    #[test]
    fn threads_interning_the_same_stacks_agree_on_every_id() {
        let ids: Vec<Vec<u32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        (0..500u64)
                            .map(|i| intern(&frames(3, &[i % 50 + 100, i % 7 + 10, 1])))
                            .collect::<Vec<u32>>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(ids.iter().all(|v| *v == ids[0]));
        assert!(ids[0].iter().all(|&id| id != 0));
        // 350 distinct stacks: 50 x 7 leaves... at most 7 * 50 + 7 + 1 nodes.
        let distinct: std::collections::BTreeSet<_> = ids[0].iter().collect();
        assert_eq!(distinct.len(), 350);
    }
}
