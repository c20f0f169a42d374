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
//! once the regions are mapped (the first call maps them).
//!
//! Unlike Go's, IDs are stable for the process: a runtime registers a
//! stack once and keeps its ID (`trace_stack_register`). Each generation
//! still lists every node its events use, ancestors included, so it reads
//! alone: an event that uses a stack marks its node and the node's
//! ancestors with the generation ([`mark_used`]), and the generation's end
//! lists the marked nodes ([`for_each_used`]).
//!
//! ## Invariants
//!
//! 1. A node's parent and frame are written before its ID is published
//!    (the Release store of its `ready`, then the Release CAS of its hash
//!    slot); readers load either with Acquire before the fields. Otherwise
//!    a lookup could match a half-written node.
//! 2. A node's parent ID is smaller than its own: the parent is interned
//!    (its ID taken from the counter) before the child asks for an ID. So
//!    the listing in ID order has every parent before its children, as the
//!    format requires.
//! 3. `mark_used(id, g)` MUST run inside the event's seqlock section of
//!    generation `g` (as the event itself is written), and marks the node
//!    before its parent. The generation's end lists nodes only after the
//!    handshake has waited for every event of `g`, so every mark of `g` is
//!    complete by then, and a node found marked has its ancestors marked:
//!    a marker that stops at an already-marked node relies on this.
//! 4. Marks are kept per generation parity: generations `g` and `g + 1`
//!    may be open at once (an advance), and the events of `g + 1` must not
//!    overwrite the marks the end of `g` is about to list. A third
//!    generation opens only after `g` has ended (session.rs invariant 4).
//!
//! ## Corner cases
//!
//! - Two threads interning the same new node: both may take an ID, one
//!   wins the slot, the other's ID stays a hole (never returned, never
//!   marked, never listed). IDs in a listing may therefore skip values.
//! - Full (MAX_NODES nodes, or a probe run past MAX_PROBES): interning
//!   returns 0, "no stack"; the caller records the allocation without a
//!   stack and counts it in the generation's `lost_stacks`.
//! - The kernel refuses the mapping: as full.
//! - A caller-supplied ID (the C API) is checked with [`is_defined`] before
//!   use; an undefined one is counted like a full table.

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::reserved::Region;

/// Most nodes the table holds (frames of all distinct stacks, shared
/// prefixes counted once): 32 MiB of address space, used as touched.
pub(crate) const MAX_NODES: usize = 1 << 20;
/// Hash slots: twice the nodes, so the index is at most half full.
const SLOT_BITS: u32 = 21;
const SLOTS: usize = 1 << SLOT_BITS;
/// Longest probe run before interning gives up (never reached below half
/// load in practice; bounds the work of a pathological hash).
const MAX_PROBES: usize = 1024;

struct Node {
    parent: AtomicU32,
    /// Set (Release) once `parent` and `frame` are written (invariant 1).
    ready: AtomicBool,
    frame: AtomicU64,
    /// The last generation of each parity whose events used this node
    /// (invariant 4).
    used: [AtomicU64; 2],
}

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
    let (Some(nodes), Some(index)) = (NODES.base(), INDEX.base()) else {
        return 0;
    };
    let mut mine = 0usize;
    let start = hash(parent, frame);
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
                n.parent.store(parent, Ordering::Relaxed);
                n.frame.store(frame, Ordering::Relaxed);
                n.ready.store(true, Ordering::Release);
            }
            match s.compare_exchange(0, mine as u32, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return mine as u32,
                Err(other) => id = other,
            }
        }
        let n = node(nodes, id as usize);
        if n.ready.load(Ordering::Acquire)
            && n.parent.load(Ordering::Relaxed) == parent
            && n.frame.load(Ordering::Relaxed) == frame
        {
            return id;
        }
    }
    0
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
        && node(nodes, id as usize).used[(generation & 1) as usize].load(Ordering::Relaxed)
            == generation
}

/// Marks node `id` and its ancestors as used by `generation`, calling
/// `on_frame` with the frame word of every node it marks (to mark the
/// registered frames they name). Runs inside the event's seqlock section
/// (invariant 3). `id` is one [`intern`] returned or [`is_defined`]
/// accepted.
pub(crate) fn mark_used(id: u32, generation: u64, mut on_frame: impl FnMut(u64)) {
    let Some(nodes) = NODES.base_if_mapped() else {
        return;
    };
    let mut id = id as usize;
    // At most one step per node: parents have smaller IDs (invariant 2).
    while id > 0 && id < MAX_NODES {
        let n = node(nodes, id);
        let mark = &n.used[(generation & 1) as usize];
        if mark.load(Ordering::Relaxed) == generation {
            return;
        }
        mark.store(generation, Ordering::Release);
        on_frame(n.frame.load(Ordering::Relaxed));
        let parent = n.parent.load(Ordering::Relaxed) as usize;
        if parent >= id {
            return;
        }
        id = parent;
    }
}

/// Calls `f(id, parent, frame)` for every node `generation` used, in ID
/// order (so parents first). Runs at the generation's end, after the
/// handshake (invariant 3).
pub(crate) fn for_each_used(generation: u64, mut f: impl FnMut(u32, u32, u64)) {
    let Some(nodes) = NODES.base_if_mapped() else {
        return;
    };
    let end = NEXT.load(Ordering::Acquire).min(MAX_NODES);
    for id in 1..end {
        let n = node(nodes, id);
        if n.used[(generation & 1) as usize].load(Ordering::Acquire) == generation {
            f(
                id as u32,
                n.parent.load(Ordering::Relaxed),
                n.frame.load(Ordering::Relaxed),
            );
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

    fn listing(generation: u64) -> Vec<(u32, u32, u64)> {
        let mut out = Vec::new();
        for_each_used(generation, |id, parent, frame| {
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
    fn a_generation_lists_the_nodes_its_events_used_with_their_ancestors() {
        let (g1, g2) = (1_000_001, 1_000_002);
        let a = intern(&frames(2, &[3, 2, 1]));
        let b = intern(&frames(2, &[4, 2, 1]));
        let c = intern(&frames(2, &[5]));
        let mut seen = Vec::new();
        mark_used(a, g1, |f| seen.push(f));
        mark_used(a, g1, |f| seen.push(f));
        assert_eq!(
            seen,
            frames(2, &[3, 2, 1]),
            "each node once, innermost first"
        );
        mark_used(c, g2, |_| ());
        mark_used(b, g2, |_| ());
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
