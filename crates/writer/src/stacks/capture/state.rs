//! Each thread's capture state (the module docs' "Per-thread state"):
//! carved from chunks, handed out at thread start or from the pool the
//! writer thread tops up, reset for a slot's new owner with its thread
//! stack's bounds; and the previous stack it keeps, whose nodes a new
//! stack reuses (`LastStack`, "Walking less").

use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::OnceLock;

use alloctrace_format::stacks::FrameWord;
use alloctrace_unwind::{DwarfCache, StackBounds, WalkMemo};
use crossbeam_queue::ArrayQueue;

use super::{mode, StackMode, MAX_DEPTH, MODE};
use crate::stacks::call_stack_table;
use crate::thread::{self, ThreadSlot};
use crate::tls::{self, Word};
/// Spare capture states (pointers from [`CaptureState::carve`]).
pub(super) static POOL: OnceLock<ArrayQueue<usize>> = OnceLock::new();
/// States the pool holds after a refill.
pub(super) const POOL_TARGET: usize = 8;
/// Most states the pool holds (one per thread slot is the most ever used).
pub(super) const POOL_CAPACITY: usize = 64;

/// One thread's capture state (see the module docs).
pub(crate) struct CaptureState {
    /// The thread pointer of the thread the state was set up for; 0 none.
    pub(super) owner: usize,
    /// That thread's stack, `[lo, hi)`; `lo == hi` when unknown.
    pub(super) lo: u64,
    pub(super) hi: u64,
    pub(super) cache: DwarfCache,
    /// What the previous walk read, so that the next one stops at the
    /// first frame the two share (alloctrace-unwind's memo).
    pub(super) memo: WalkMemo,
    /// The walk's return addresses: the depth limit, the frames beyond it
    /// to the thread-start trampoline (3), and up to 8 own frames of the
    /// C API's walk.
    pub(super) frames: [u64; MAX_DEPTH + 12],
    pub(super) last: LastStack,
}

/// The thread's previous stack as interned: consecutive allocations share
/// most of their callers, so a new stack interns only the frames the walk
/// did not prove shared with the previous one (`MemoWalk::shared`): the
/// common outermost frames keep their nodes, with no comparison.
pub(super) struct LastStack {
    /// `nodes[i]`: the node (stack ID) of the stack from its `i`-th frame
    /// counted from the outermost one (so that the frames two stacks share,
    /// their outermost ones, keep their positions whatever the depths).
    pub(super) nodes: [u32; MAX_DEPTH],
    pub(super) len: usize,
    pub(super) truncated: bool,
    /// How the kept frames sit in the walk they came from: [`TAIL_NONE`]
    /// (nodes not reusable), [`TAIL_CAPI`] (the C API's walk: its outermost
    /// frame is the walk's), or the number of walked frames beyond the kept
    /// ones at the outer end (0 for a stack that ends where its walk does;
    /// 1: the return into the thread-start trampoline; more: the frames
    /// beyond the depth limit). A walk's `shared` frames are counted from
    /// its outer end, so the nodes are reusable only under the same tail.
    pub(super) tail: usize,
    /// The shim's walk the stack came from ([`LastStack::walk_key`]: its
    /// length, `truncated` and the depth limit), [`WALK_NONE`] when it came
    /// from elsewhere (the C API's walk, no walk, a failed intern): a walk
    /// with the same key whose frames are all shared (`MemoWalk::shared`)
    /// is the same walk, whose stack is `id`.
    pub(super) walk: u64,
    /// The stack's ID, when `walk` is not [`WALK_NONE`].
    pub(super) id: u32,
}

/// [`LastStack::walk`]: no walk to compare with.
pub(super) const WALK_NONE: u64 = u64::MAX;

/// [`LastStack::tail`]: nothing to reuse.
pub(super) const TAIL_NONE: usize = usize::MAX;
/// [`LastStack::tail`]: kept by the C API's capture.
pub(super) const TAIL_CAPI: usize = usize::MAX - 1;

impl CaptureState {
    /// A new state, never freed (a slot keeps it from owner to owner): the
    /// next one of the current [`Chunk`], in place. Allocates (a chunk now
    /// and then): never on the event path.
    pub(super) fn carve() -> *mut CaptureState {
        loop {
            let c = CHUNK.load(Ordering::Acquire);
            // SAFETY: chunks are never freed once published.
            if let Some(chunk) = unsafe { c.as_ref() } {
                let i = chunk.next.fetch_add(1, Ordering::Relaxed);
                if let Some(cell) = chunk.states.get(i) {
                    let p = cell.get().cast::<CaptureState>();
                    // SAFETY: `fetch_add` gave index `i` to this caller
                    // alone; the cell is uninitialised memory of the chunk.
                    unsafe { CaptureState::init(p) };
                    return p;
                }
            }
            // None yet, or used up: publish a new one (a racing caller's
            // wins, and ours, untouched, is freed).
            let new = Chunk::new();
            if CHUNK
                .compare_exchange(c, new, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                // SAFETY: `new` came from Box::into_raw and was never
                // published.
                drop(unsafe { Box::from_raw(new) });
            }
        }
    }

    /// Writes an empty state to `p`: a copy of [`EMPTY_STATE`], so that
    /// none of it is built on the stack first (`Box::new` of a new state
    /// had a frame larger than the state, which faulted in most of it on
    /// every thread's stack at its start, more than its state in the private heap added;
    /// written field by field, `WalkMemo::new()` and `DwarfCache::new()`
    /// still went through the stack).
    ///
    /// # Safety
    /// `p` is valid for writes of a `CaptureState`, and aligned.
    #[inline(never)]
    pub(super) unsafe fn init(p: *mut CaptureState) {
        // SAFETY: the caller's; the template is a static, which `p`, fresh
        // memory of a chunk, does not overlap.
        unsafe { core::ptr::copy_nonoverlapping(&EMPTY_STATE, p, 1) };
    }
}

/// An empty state, for [`CaptureState::init`] to copy.
pub(super) static EMPTY_STATE: CaptureState = CaptureState {
    owner: 0,
    lo: 0,
    hi: 0,
    cache: DwarfCache::new(),
    memo: WalkMemo::new(),
    frames: [0; MAX_DEPTH + 12],
    last: LastStack::new(),
};

/// States per [`Chunk`]: 64 of 15,432 bytes, 0.9 MiB.
pub(super) const CHUNK_STATES: usize = 64;

/// Capture states side by side, initialised one by one as they are handed
/// out ([`CaptureState::carve`]). One allocation per state would round each
/// up to an allocator's size class (the shim's private heap: 16 KiB for
/// 15.1 KiB); a chunk's pages are touched only as its states are taken.
pub(super) struct Chunk {
    /// The next state to hand out (past the end: used up).
    pub(super) next: AtomicUsize,
    pub(super) states: [core::cell::UnsafeCell<core::mem::MaybeUninit<CaptureState>>; CHUNK_STATES],
}

// SAFETY: each state is handed to one caller (`next`), and only its owner
// thread uses it afterwards (the slot's capture section).
unsafe impl Sync for Chunk {}

impl Chunk {
    /// A new chunk, its states uninitialised (never written, so their
    /// pages stay untouched until taken).
    pub(super) fn new() -> *mut Chunk {
        let mut b = Box::<Chunk>::new_uninit();
        let p = b.as_mut_ptr();
        // SAFETY: `p` points to the box's memory; `states` may stay
        // uninitialised (MaybeUninit), so after this write it is a Chunk.
        unsafe {
            (&raw mut (*p).next).write(AtomicUsize::new(0));
            Box::into_raw(b.assume_init())
        }
    }
}

/// The chunk states are taken from; null until the first. Chunks are
/// never freed.
pub(super) static CHUNK: AtomicPtr<Chunk> = AtomicPtr::new(core::ptr::null_mut());

impl LastStack {
    pub(super) const fn new() -> LastStack {
        LastStack {
            nodes: [0; MAX_DEPTH],
            len: 0,
            truncated: false,
            tail: TAIL_NONE,
            walk: WALK_NONE,
            id: 0,
        }
    }

    /// What identifies a walk of the shim's for [`LastStack::walk`]: its
    /// length (at most `depth + 4`), whether it was truncated, and the
    /// depth limit it was cut under (a session may change it).
    #[inline(always)]
    pub(super) fn walk_key(len: usize, truncated: bool, depth: usize) -> u64 {
        (len as u64) | (u64::from(truncated) << 16) | ((depth as u64) << 17)
    }

    /// The depth limit and `truncated` of a [`LastStack::walk_key`].
    #[inline(always)]
    pub(super) fn walk_parts(key: u64) -> (usize, bool) {
        ((key >> 17) as usize, key & (1 << 16) != 0)
    }

    /// How many outermost frames of a new stack (kept under `tail`,
    /// `truncated`) keep their nodes, given that the walk proved `shared`
    /// outermost walked frames to be the previous walk's. The previous
    /// stack must have come from this memo's previous walk (every capture
    /// of the state updates or forgets it).
    #[inline(always)]
    pub(super) fn reusable(&self, shared: usize, tail: usize, truncated: bool) -> usize {
        if tail != self.tail || truncated != self.truncated || tail == TAIL_NONE {
            return 0;
        }
        let walked_tail = if tail == TAIL_CAPI { 0 } else { tail };
        shared.saturating_sub(walked_tail).min(self.len)
    }

    /// Interns `kept` (innermost first; `truncated`: under the truncation
    /// marker), taking the nodes of its `reuse` outermost frames from the
    /// previous stack ([`LastStack::reusable`]) and interning only the
    /// others, and remembers it under `tail` (`TAIL_NONE`: forgets it).
    /// Returns its stack ID; 0 when the table is full (and forgets).
    #[inline(always)]
    pub(super) fn intern(
        &mut self,
        kept: &[u64],
        truncated: bool,
        reuse: usize,
        tail: usize,
    ) -> u32 {
        let n = kept.len();
        // None: more frames than any depth limit (not kept by a capture).
        let id = match self.nodes.get_mut(..n) {
            Some(nodes) => {
                let (shared, new) = nodes.split_at_mut(reuse.min(n));
                let parent = match shared.last() {
                    Some(&node) => node,
                    None if truncated => truncation_marker(),
                    None => 0,
                };
                // The new frames, outermost first, onto the shared frames'
                // node, their nodes kept at their positions.
                match kept.get(..new.len()) {
                    Some(kept) if parent != 0 || !truncated => call_stack_table::intern_path(
                        parent,
                        kept.iter().rev().map(|&ra| FrameWord::Native(ra).word()),
                        new,
                    ),
                    _ => 0,
                }
            }
            None => 0,
        };
        if id == 0 {
            self.tail = TAIL_NONE;
            return 0;
        }
        self.len = n;
        self.truncated = truncated;
        self.tail = tail;
        // n == reuse: the shared frames' node (n == 0: only the
        // truncation marker).
        id
    }
}

/// Tops the pool of capture states up (the writer thread, which may
/// allocate, calls this as it goes round).
pub(crate) fn refill_pool() {
    let Some(pool) = POOL.get() else {
        return;
    };
    if MODE.load(Ordering::Relaxed) == StackMode::None as u8 || pool.len() >= POOL_TARGET / 2 {
        return;
    }
    while pool.len() < POOL_TARGET {
        if pool.push(CaptureState::carve() as usize).is_err() {
            break;
        }
    }
}

/// The truncation marker's node (the root of every truncated stack); 0
/// when the table is full.
#[cold]
#[inline(never)]
pub(super) fn truncation_marker() -> u32 {
    call_stack_table::intern_child(0, FrameWord::TRUNCATED.word())
}

/// The calling thread's capture state, set up at thread start
/// ([`prepare_thread`]) or else taken from the pool on the slot's first
/// capture, and reset for a new owner; `None` when the pool is empty (the
/// writer thread refills it as it goes round).
#[inline(always)]
pub(super) fn state_of(slot: &ThreadSlot) -> Option<&'static mut CaptureState> {
    let mut p = slot.capture.load(Ordering::Relaxed).cast::<CaptureState>();
    if p.is_null() {
        p = take_state()?;
        slot.capture.store(p.cast(), Ordering::Relaxed);
    }
    // SAFETY: the state belongs to this slot, which only its owner (this
    // thread, inside its capture section) uses; states are never freed.
    let state = unsafe { &mut *p };
    if state.owner != thread::thread_pointer() {
        reset_for(state);
    }
    Some(state)
}

/// Makes `state` the calling thread's: its previous owner's stack and
/// walk are forgotten, its bounds found.
#[cold]
#[inline(never)]
pub(super) fn reset_for(state: &mut CaptureState) {
    state.owner = thread::thread_pointer();
    state.last.tail = TAIL_NONE;
    state.last.walk = WALK_NONE;
    state.memo.clear();
    let (lo, hi) = thread_stack();
    state.lo = lo;
    state.hi = hi;
}

/// Gives the calling thread its capture state now, at thread start (the
/// shim's pthread trampoline, before the thread's routine runs), so that
/// its first allocation does not depend on the pool: claims the thread's
/// slot, takes a state from the pool or builds one (this may allocate: the
/// caller runs outside malloc, as the tracer's own code) and sets it up
/// for this thread (call [`set_thread_stack`](super::set_thread_stack) first). The state stays with
/// the slot when the thread exits, for the next thread to claim the slot.
/// Does nothing when the session captures no stacks.
pub fn prepare_thread() {
    if mode() == StackMode::None {
        return;
    }
    let Some(slot) = thread::current_or_claim() else {
        return;
    };
    if slot.capture.load(Ordering::Relaxed).is_null() {
        let p = take_state().unwrap_or_else(CaptureState::carve);
        slot.capture.store(p.cast(), Ordering::Relaxed);
    }
    if !slot.capture_seq.try_begin() {
        return;
    }
    let _ = state_of(slot);
    slot.capture_seq.end();
}

#[cold]
#[inline(never)]
pub(super) fn take_state() -> Option<*mut CaptureState> {
    let pool = POOL.get()?;
    // Empty: the writer thread refills the pool within its idle period.
    pool.pop().map(|p| p as *mut CaptureState)
}

/// The calling thread's stack `[lo, hi)`: the host's word for it when it
/// holds the stack pointer, else found by the unwinder; `(0, 0)` unknown.
#[cold]
#[inline(never)]
pub(super) fn thread_stack() -> (u64, u64) {
    let (lo, hi) = (
        tls::get(Word::StackLo) as u64,
        tls::get(Word::StackHi) as u64,
    );
    let sp = stack_pointer();
    if lo < hi && sp >= lo && sp < hi {
        return (lo, hi);
    }
    stack_from_maps()
}

/// The calling thread's stack as `/proc/self/maps` says, `(0, 0)` unknown.
/// Out of line: its 4 KiB buffer would otherwise be in the frame of
/// [`thread_stack`], which every thread the shim starts runs through.
#[cold]
#[inline(never)]
pub(super) fn stack_from_maps() -> (u64, u64) {
    match StackBounds::from_maps() {
        Some(b) => (b.lo(), b.hi()),
        None => (0, 0),
    }
}

#[inline(always)]
pub(super) fn stack_pointer() -> u64 {
    let probe = 0u8;
    core::ptr::addr_of!(probe) as u64
}
