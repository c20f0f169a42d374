//! Native call stacks captured by the tracer itself: the stack mode of a
//! session, each thread's capture state, the shared DWARF unwinder and its
//! replacement when libraries come and go. The LD_PRELOAD shim captures
//! the stack of every allocation through [`capture_stack_from`], handed
//! the program's registers by its naked malloc entries; the C API offers
//! [`capture_stack`] as `trace_stack_capture` and, with
//! `trace_config.stacks`, in the plain alloc calls
//! ([`capture_stack_or_lost`]).
//!
//! ## Design
//!
//! - **Modes** ([`StackMode`]): `None` captures nothing; `Full` unwinds
//!   every frame by its module's `.eh_frame` rules, with frame pointers
//!   only where a module has none (right on distributions built without
//!   frame pointers). (A `fast` frame-pointer mode existed; it saw about
//!   one frame per allocation on Debian's binaries and cost nearly as
//!   much, and was removed: the C API's `TRACE_STACKS_FAST` means `Full`.)
//!   The depth limit (default [`DEFAULT_DEPTH`], at most [`MAX_DEPTH`])
//!   counts native frames; a deeper stack keeps its innermost frames under
//!   the truncation marker.
//! - **No tracer frames in the shim's walk**: the shim's malloc entries
//!   are naked; they pass the program's return address, stack pointer
//!   and rbp at the call ([`StartRegs`]) to [`capture_stack_from`], whose
//!   walk (alloctrace-unwind's `capture_from`) starts in the program's
//!   frame: nothing to skip, no filter by module.
//! - **Threads end at their start routine**: the shim's pthread trampoline
//!   calls every thread's routine from one call site and says where
//!   ([`set_thread_start`]); the walk itself ends at the return address
//!   there (an end-of-stack rule: alloctrace-unwind's `set_walk_end`),
//!   complete (not truncated), so that `start_thread` and `clone3` are
//!   not walked. That address is the walk's outermost one, and the only
//!   one looked at: dropped, it leaves the trampoline out of the stack.
//! - **Per-thread state** (`CaptureState`: the stack bounds, framehop's
//!   rule cache, the walk's memo, the frame array and the previous
//!   stack's nodes) hangs off the thread's slot (thread.rs), so the
//!   capture finds it with the slot, without TLS of its own. States are
//!   carved side by side from chunks of 64 (`Chunk`), each copied from a
//!   template when handed out: 14,720 bytes a thread, where a box each
//!   took the 16 KiB class of the shim's private heap and its
//!   construction on the stack faulted in about 14 KiB of every thread's
//!   stack. Taking one may allocate (a chunk), which a capture must
//!   never do: the shim takes it at thread start ([`prepare_thread`],
//!   from its trampoline, outside malloc); threads the shim did not start
//!   take one from a pool that session start fills and the writer
//!   thread tops up (`refill_pool`). A slot keeps its state when its
//!   thread exits; the next thread to claim the slot reuses it and
//!   resets the bounds (the state remembers the thread pointer it was
//!   set up for).
//! - **Stack bounds**: what the host says (the shim knows each thread's
//!   stack from `pthread_getattr_np` at thread start and sets them with
//!   [`set_thread_stack`]), else found once per thread, at its first
//!   capture, from `/proc/self/maps` read with raw system calls (no
//!   malloc: `StackBounds::from_maps`).
//! - **Walking less**: the walk keeps, per thread, what its previous walk
//!   read (alloctrace-unwind's `WalkMemo`) and stops at the first frame
//!   that provably sits where it sat then with the same callers, taking
//!   the rest from the memo (`MemoWalk::shared` of them, outermost); the
//!   previous stack's nodes are kept outermost first (`LastStack`), so
//!   interning starts from the node of the outermost shared frame and
//!   interns only the new frames, in one call to the table
//!   (`intern_path`), with no comparison of frames. Stacks cut by the
//!   depth limit share nodes too, between walks cut at the same length.
//! - **The same walk again** (a loop allocating from one place): when the
//!   memo proves every frame of a walk the previous one's and the walk has
//!   the previous one's length, `truncated` and depth limit
//!   (`LastStack::walk`), its stack is the previous one, and so is its ID:
//!   the capture returns it right after the walk, without looking at the
//!   frames; only another walk goes on to the trampoline check and the
//!   interning (`intern_walk`, out of line so that the common case keeps
//!   few registers across the walk). A walk of the C API's and a reset
//!   state forget the previous walk.
//! - **The C API's frames** ([`capture_stack_or_lost`], called inside the
//!   library) are dropped by count (`skip`: every function between the
//!   capture and the caller's frame is `#[inline(never)]` or
//!   `#[inline(always)]`, never left to the optimiser, and never a tail
//!   call), then, as a safety net, any frame whose return address lies in
//!   the tracer's own module when that is a library of its own
//!   (liballoctrace.so; not when linked into the program).
//! - **The unwinder** is built from a module snapshot at session start and
//!   rebuilt by [`modules_changed`]: the shim calls it after each `dlopen`,
//!   the generation's end before it lists the modules, and the
//!   writer thread when a capture stopped in code no known module holds (a
//!   library loaded since: `refresh_if_stale`, at most every 100 ms).
//!   Around each `dlclose` the shim calls [`unloading_begin`] and
//!   [`unloading_end`]: in between, every unwinder built knows only the
//!   objects loaded with the program (the first set-up's snapshot in this
//!   process image), which ld.so never unloads.
//!   Captures reach it through one pointer; the old one is freed after a
//!   grace period: every thread's capture section (a seqlock in its slot,
//!   as the event path's) has been left since the swap.
//! - **Check mode** (a testing aid, `check`: the shim's
//!   `ALLOCTRACE_CHECK_STACKS=1`): each walk of the shim's is made again
//!   without the memo and by framehop alone, and compared frame for frame;
//!   off, it costs a capture one relaxed load and a branch.
//!
//! ## Invariants
//!
//! 1. A capture never allocates, locks or makes a system call once its
//!    thread has a state and bounds: the state's first use on a thread may
//!    find the bounds with system calls (no allocation, no lock). A thread
//!    the shim did not start that finds the pool empty goes without its
//!    stacks (counted in `lost_stacks`) until the writer thread, going
//!    round, refills it.
//! 2. A capture runs inside its slot's capture section (`capture_seq` odd).
//!    The unwinder pointer is loaded inside it; an unwinder is freed only
//!    after `swap_unwinder` has seen every other slot's section even or
//!    moved on after its store (the Dekker pattern of handshake.rs).
//!    Otherwise a capture could read a freed unwinder.
//! 3. A signal handler that allocates while its thread is capturing finds
//!    the section odd and records its allocation without a stack
//!    (counted): the thread's state is in use.
//!
//! ## Corner cases
//!
//! - `dlclose`: the object is unmapped inside the real call. Before it,
//!   [`unloading_begin`] swaps in an unwinder without any object a dlclose
//!   could unmap (the handle's, its dependencies, objects it bound at run
//!   time: every object loaded after the program started) and waits until
//!   no capture uses the old one; until [`unloading_end`], refreshes build
//!   such unwinders too. So a capture racing with the dlclose on another
//!   thread never reads an unmapped object's unwind tables, even for a
//!   stale or garbage return address inside it; its frames in other
//!   dlopened objects end the walk (truncated) for that window only.
//!   Objects dlopened by constructors that ran before the first set-up
//!   count as loaded with the program.
//! - fork: the child's forking thread keeps its slot and state; every
//!   other slot's capture section is reset with the event seqlock.
//! - Stacks on `sigaltstack`: the stack pointer is outside the thread's
//!   bounds; the allocation gets the truncation marker only.

use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use alloctrace_format::stacks::FrameWord;
use alloctrace_unwind::{
    capture_dwarf, capture_dwarf_memo, DwarfCache, DwarfUnwinder, Modules, StackBounds, WalkMemo,
    MEMO_DEPTH,
};
use crossbeam_queue::ArrayQueue;

/// Where a walk starts (alloctrace-unwind's): the program's registers as a
/// naked entry point saw them.
pub use alloctrace_unwind::StartRegs;

mod check;
pub use check::{check_stacks_report, set_check_stacks};

use crate::lost::LOST_STACKS;
use crate::shared::SHARED;
use crate::stacks::{call_stack_table, module_table};
use crate::thread::{self, ThreadSlot};
use crate::tls::{self, Word};
use crate::{clock, handshake};

/// Which native stacks a session captures by itself (docs/CLI.md,
/// `record --stacks`).
#[repr(u8)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StackMode {
    /// No native stacks.
    #[default]
    None = 0,
    /// Every frame by DWARF CFI (`.eh_frame`), frame pointers where a
    /// module has no unwind table.
    Full = 2,
}

impl StackMode {
    fn from_u8(v: u8) -> StackMode {
        match v {
            2 => StackMode::Full,
            _ => StackMode::None,
        }
    }
}

/// The default depth limit (native frames per stack), as heaptrack's.
pub const DEFAULT_DEPTH: usize = alloctrace_unwind::DEFAULT_DEPTH;
/// The largest depth limit a session accepts.
pub const MAX_DEPTH: usize = 256;
// A walk's stack, its truncation marker included, stays within the
// format's limit, which readers enforce.
const _: () = assert!(MAX_DEPTH < alloctrace_format::stacks::MAX_STACK_DEPTH);

// A walk's buffer at the default limit (the limit and 4 spare addresses)
// fits the memo; a larger limit walks without it once its buffer is
// longer than MEMO_DEPTH (alloctrace-unwind's capture_from).
const _: () = assert!(DEFAULT_DEPTH + 4 <= MEMO_DEPTH);

/// The running session's mode (a [`StackMode`]); `None` when stopped.
static MODE: AtomicU8 = AtomicU8::new(0);
/// The running session's depth limit.
static DEPTH: AtomicUsize = AtomicUsize::new(DEFAULT_DEPTH);
/// What captures unwind with: the unwinder and the address ranges of the
/// modules it was built from (sorted), to notice code it does not know.
struct Unwinding {
    unwinder: DwarfUnwinder,
    ranges: Vec<(u64, u64)>,
}

impl Unwinding {
    /// The unwinder of `modules`: with compact tables when `tables` (those
    /// of `prev` reused for the modules it had), else framehop alone.
    fn new(modules: &Modules, tables: bool, prev: Option<&Unwinding>) -> Box<Unwinding> {
        let mut ranges: Vec<(u64, u64)> = modules
            .modules()
            .iter()
            .flat_map(|m| m.segments.iter().map(|s| (s.start, s.end)))
            .collect();
        ranges.sort_unstable();
        Box::new(Unwinding {
            // SAFETY: the objects of the snapshot are loaded now; before a
            // dlclose can unmap one, unloading_begin replaces this unwinder
            // with one without it and waits for the captures using it.
            unwinder: unsafe {
                if tables {
                    DwarfUnwinder::from_modules_reusing(modules, prev.map(|p| &p.unwinder))
                } else {
                    DwarfUnwinder::from_modules_without_tables(modules)
                }
            },
            ranges,
        })
    }

    /// Whether `addr` lies in a segment of a known module.
    fn knows(&self, addr: u64) -> bool {
        let i = self.ranges.partition_point(|&(start, _)| start <= addr);
        i.checked_sub(1)
            .and_then(|i| self.ranges.get(i))
            .is_some_and(|&(_, end)| addr < end)
    }
}

/// Set when the unwinder in use has no compact tables and a capture wants
/// them: the writer thread then builds them ([`refresh_if_stale`]).
static TABLES_WANTED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Set while the writer thread refreshes: only it builds the compact
    /// tables of a session's start (a dlopen's refresh keeps what it has).
    static ON_WRITER: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

/// Whether this refresh may build the compact tables (the writer thread's).
fn force_tables() -> bool {
    ON_WRITER.with(|w| w.get())
}

/// The unwinding captures use (invariant 2); null until a session sets up.
static UNWINDER: AtomicPtr<Unwinding> = AtomicPtr::new(core::ptr::null_mut());
/// Set by a capture that stopped in code no known module holds (a library
/// loaded since the last refresh); the writer thread then refreshes.
static STALE: AtomicBool = AtomicBool::new(false);
/// When the last refresh ran (ticks), to refresh at most every
/// [`STALE_REFRESH_MS`] (JIT code is in no module, and stays unknown).
static LAST_REFRESH: AtomicU64 = AtomicU64::new(0);
const STALE_REFRESH_MS: u64 = 100;
/// The tracer's own module, `[start, end)`: frames in it are dropped.
static OWN_START: AtomicU64 = AtomicU64::new(0);
static OWN_END: AtomicU64 = AtomicU64::new(0);
/// Spare capture states (pointers from [`CaptureState::carve`]).
static POOL: OnceLock<ArrayQueue<usize>> = OnceLock::new();
/// Serialises set-up and refreshes (never taken by a capture).
static REFRESH: Mutex<()> = Mutex::new(());
/// What a refresh calls after it (set_up's `after_refresh`).
static AFTER_REFRESH: OnceLock<fn()> = OnceLock::new();

/// Takes the refresh lock (fork.rs holds it across a fork, so that a child
/// never inherits it locked by the writer thread).
pub(crate) fn lock_refresh() -> std::sync::MutexGuard<'static, ()> {
    REFRESH.lock().unwrap_or_else(|p| p.into_inner())
}

/// How many `dlclose` calls are between [`unloading_begin`] and
/// [`unloading_end`]; read under `REFRESH`.
static UNLOADING: AtomicUsize = AtomicUsize::new(0);

/// The start addresses of the objects loaded with the program (the first
/// set-up's snapshot in this process image; a forked child inherits it):
/// the only ones an unwinder built during a `dlclose` knows.
static PERMANENT: OnceLock<Vec<u64>> = OnceLock::new();

/// States the pool holds after a refill.
const POOL_TARGET: usize = 8;
/// Most states the pool holds (one per thread slot is the most ever used).
const POOL_CAPACITY: usize = 64;

/// One thread's capture state (see the module docs).
pub(crate) struct CaptureState {
    /// The thread pointer of the thread the state was set up for; 0 none.
    owner: usize,
    /// That thread's stack, `[lo, hi)`; `lo == hi` when unknown.
    lo: u64,
    hi: u64,
    cache: DwarfCache,
    /// What the previous walk read, so that the next one stops at the
    /// first frame the two share (alloctrace-unwind's memo).
    memo: WalkMemo,
    /// The walk's return addresses: the depth limit, the frames beyond it
    /// to the thread-start trampoline (3), and up to 8 own frames of the
    /// C API's walk.
    frames: [u64; MAX_DEPTH + 12],
    last: LastStack,
}

/// The thread's previous stack as interned: consecutive allocations share
/// most of their callers, so a new stack interns only the frames the walk
/// did not prove shared with the previous one (`MemoWalk::shared`): the
/// common outermost frames keep their nodes, with no comparison.
struct LastStack {
    /// `nodes[i]`: the node (stack ID) of the stack from its `i`-th frame
    /// counted from the outermost one (so that the frames two stacks share,
    /// their outermost ones, keep their positions whatever the depths).
    nodes: [u32; MAX_DEPTH],
    len: usize,
    truncated: bool,
    /// How the kept frames sit in the walk they came from: [`TAIL_NONE`]
    /// (nodes not reusable), [`TAIL_CAPI`] (the C API's walk: its outermost
    /// frame is the walk's), or the number of walked frames beyond the kept
    /// ones at the outer end (0 for a stack that ends where its walk does;
    /// 1: the return into the thread-start trampoline; more: the frames
    /// beyond the depth limit). A walk's `shared` frames are counted from
    /// its outer end, so the nodes are reusable only under the same tail.
    tail: usize,
    /// The shim's walk the stack came from ([`LastStack::walk_key`]: its
    /// length, `truncated` and the depth limit), [`WALK_NONE`] when it came
    /// from elsewhere (the C API's walk, no walk, a failed intern): a walk
    /// with the same key whose frames are all shared (`MemoWalk::shared`)
    /// is the same walk, whose stack is `id`.
    walk: u64,
    /// The stack's ID, when `walk` is not [`WALK_NONE`].
    id: u32,
}

/// [`LastStack::walk`]: no walk to compare with.
const WALK_NONE: u64 = u64::MAX;

/// [`LastStack::tail`]: nothing to reuse.
const TAIL_NONE: usize = usize::MAX;
/// [`LastStack::tail`]: kept by the C API's capture.
const TAIL_CAPI: usize = usize::MAX - 1;

impl CaptureState {
    /// A new state, never freed (a slot keeps it from owner to owner): the
    /// next one of the current [`Chunk`], in place. Allocates (a chunk now
    /// and then): never on the event path.
    fn carve() -> *mut CaptureState {
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
    /// had a 19 KiB frame, which faulted in about 14 KiB of every thread's
    /// stack at its start, more than its state in the private heap added;
    /// written field by field, `WalkMemo::new()` and `DwarfCache::new()`
    /// still went through the stack).
    ///
    /// # Safety
    /// `p` is valid for writes of a `CaptureState`, and aligned.
    #[inline(never)]
    unsafe fn init(p: *mut CaptureState) {
        // SAFETY: the caller's; the template is a static, which `p`, fresh
        // memory of a chunk, does not overlap.
        unsafe { core::ptr::copy_nonoverlapping(&EMPTY_STATE, p, 1) };
    }
}

/// An empty state, for [`CaptureState::init`] to copy.
static EMPTY_STATE: CaptureState = CaptureState {
    owner: 0,
    lo: 0,
    hi: 0,
    cache: DwarfCache::new(),
    memo: WalkMemo::new(),
    frames: [0; MAX_DEPTH + 12],
    last: LastStack::new(),
};

/// States per [`Chunk`]: 64 of 14,720 bytes, 0.9 MiB.
const CHUNK_STATES: usize = 64;

/// Capture states side by side, initialised one by one as they are handed
/// out ([`CaptureState::carve`]). One allocation per state would round each
/// up to an allocator's size class (the shim's private heap: 16 KiB for
/// 14.4 KiB); a chunk's pages are touched only as its states are taken.
struct Chunk {
    /// The next state to hand out (past the end: used up).
    next: AtomicUsize,
    states: [core::cell::UnsafeCell<core::mem::MaybeUninit<CaptureState>>; CHUNK_STATES],
}

// SAFETY: each state is handed to one caller (`next`), and only its owner
// thread uses it afterwards (the slot's capture section).
unsafe impl Sync for Chunk {}

impl Chunk {
    /// A new chunk, its states uninitialised (never written, so their
    /// pages stay untouched until taken).
    fn new() -> *mut Chunk {
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
static CHUNK: AtomicPtr<Chunk> = AtomicPtr::new(core::ptr::null_mut());

impl LastStack {
    const fn new() -> LastStack {
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
    fn walk_key(len: usize, truncated: bool, depth: usize) -> u64 {
        (len as u64) | (u64::from(truncated) << 16) | ((depth as u64) << 17)
    }

    /// The depth limit and `truncated` of a [`LastStack::walk_key`].
    #[inline(always)]
    fn walk_parts(key: u64) -> (usize, bool) {
        ((key >> 17) as usize, key & (1 << 16) != 0)
    }

    /// How many outermost frames of a new stack (kept under `tail`,
    /// `truncated`) keep their nodes, given that the walk proved `shared`
    /// outermost walked frames to be the previous walk's. The previous
    /// stack must have come from this memo's previous walk (every capture
    /// of the state updates or forgets it).
    #[inline(always)]
    fn reusable(&self, shared: usize, tail: usize, truncated: bool) -> usize {
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
    fn intern(&mut self, kept: &[u64], truncated: bool, reuse: usize, tail: usize) -> u32 {
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

/// The session's mode.
#[inline(always)]
pub fn mode() -> StackMode {
    StackMode::from_u8(MODE.load(Ordering::Relaxed))
}

/// Records the calling thread's stack, `[lo, hi)`, for its captures: the
/// host knows it (the shim reads it at thread start). Without it, the
/// thread's first capture finds it itself.
pub fn set_thread_stack(lo: u64, hi: u64) {
    tls::set(Word::StackLo, lo as usize);
    tls::set(Word::StackHi, hi as usize);
}

/// Sets up native stacks for a session starting with `mode` and `depth`:
/// reads the module table, builds the unwinder, fills the pool. Runs in
/// start (under the tracer's control lock), before the first event; the
/// module table and unwinder are set up whatever the mode, since
/// `trace_stack_capture` and registered native addresses need them too.
///
/// `after_refresh` is called after each later refresh of the module table,
/// outside its lock: the session's reaction to a module gone
/// (lifecycle.rs `after_modules_refresh`), passed down so that this layer
/// never imports the session's.
pub(crate) fn set_up(mode: StackMode, depth: usize, after_refresh: fn()) {
    let _guard = REFRESH.lock().unwrap_or_else(|p| p.into_inner());
    AFTER_REFRESH.get_or_init(|| after_refresh);
    let modules = Modules::snapshot();
    PERMANENT.get_or_init(|| modules.modules().iter().map(|m| m.start).collect());
    module_table::reset(modules.modules(), clock::ticks());
    // The tracer's own module, when it is a library of its own
    // (liballoctrace.so, the shim); linked into the program (the static
    // library, Rust), its range is the program's: then nothing is dropped
    // by address, only the `skip` frames.
    let own = capture_stack as fn(usize) -> u64 as usize as u64;
    let exe = std::fs::read_link("/proc/self/exe")
        .map(|p| p.into_os_string().into_encoded_bytes())
        .unwrap_or_default();
    let (start, end) = match modules.find(own) {
        Some(m) if m.path != exe => (m.start, m.end),
        _ => (0, 0),
    };
    OWN_START.store(start, Ordering::Relaxed);
    OWN_END.store(end, Ordering::Relaxed);
    // framehop alone at first: parsing every module's `.eh_frame` into
    // compact tables (some 10 ms for python and libc) is left to the
    // writer thread (refresh_if_stale), off the program's start. With
    // ALLOCTRACE_TABLES_AT_START set (for `make bench`'s instruction
    // counts, which must not depend on when the writer thread runs), they
    // are built here.
    let current = UNWINDER.load(Ordering::Acquire);
    // SAFETY: unwinders are freed only by swap_unwinder, under REFRESH,
    // which this thread holds.
    let current = unsafe { current.as_ref() };
    let had_tables = current.is_some_and(|u| u.unwinder.has_tables())
        || (mode != StackMode::None && std::env::var_os("ALLOCTRACE_TABLES_AT_START").is_some());
    swap_unwinder(Unwinding::new(&modules, had_tables, current));
    if !had_tables && mode != StackMode::None {
        TABLES_WANTED.store(true, Ordering::Relaxed);
    }
    LAST_REFRESH.store(clock::ticks(), Ordering::Relaxed);
    let pool = POOL.get_or_init(|| ArrayQueue::new(POOL_CAPACITY));
    while pool.len() < POOL_TARGET {
        if pool.push(CaptureState::carve() as usize).is_err() {
            break;
        }
    }
    DEPTH.store(depth.clamp(1, MAX_DEPTH), Ordering::Relaxed);
    MODE.store(mode as u8, Ordering::Relaxed);
}

/// The session's first generation has started (its info batch is
/// written): a library found from now on was loaded inside it.
pub(crate) fn first_generation_started() {
    module_table::current_at(clock::ticks());
}

/// Turns automatic capture off (stop).
pub(crate) fn tear_down() {
    MODE.store(StackMode::None as u8, Ordering::Relaxed);
}

/// The loaded objects may have changed (after a `dlopen` or `dlclose`
/// returned): refreshes the module table and, if it changed, replaces the
/// unwinder. Not for the event path: it allocates, takes the loader's lock
/// and waits for captures in progress. Does nothing before a session has
/// set up stacks.
pub fn modules_changed() {
    refresh(false);
}

/// A `dlclose` is about to run (the shim calls this before the real call,
/// as its own code): refreshes the module table (an object loaded since the
/// last look is listed while it is still loaded) and swaps in an unwinder
/// that knows only the objects loaded with the program, waiting until no
/// capture uses the old one. Until the matching [`unloading_end`], every
/// refresh builds such an unwinder. Not for the event path (as
/// [`modules_changed`]).
pub fn unloading_begin() {
    UNLOADING.fetch_add(1, Ordering::SeqCst);
    refresh(true);
}

/// The `dlclose` that [`unloading_begin`] announced has returned:
/// refreshes the module table (noting the unload) and, once no other
/// dlclose is running, swaps in an unwinder of every loaded object again.
pub fn unloading_end() {
    UNLOADING.fetch_sub(1, Ordering::SeqCst);
    refresh(true);
}

/// Re-reads the loaded objects; replaces the unwinder when they changed
/// or when `force`d (a dlclose starts or ends).
fn refresh(force: bool) {
    if UNWINDER.load(Ordering::Acquire).is_null() {
        return;
    }
    {
        let _guard = REFRESH.lock().unwrap_or_else(|p| p.into_inner());
        let current = UNWINDER.load(Ordering::Acquire);
        // SAFETY: unwinders are freed only by swap_unwinder, under
        // REFRESH, which this thread holds.
        let current = unsafe { current.as_ref() };
        // The compact tables once the writer thread built them (reused for
        // the modules that stay); until then framehop alone.
        let tables = current.is_some_and(|u| u.unwinder.has_tables())
            || (force_tables() && TABLES_WANTED.swap(false, Ordering::Relaxed));
        let force = force || current.is_some_and(|u| tables && !u.unwinder.has_tables());
        let mut modules = Modules::snapshot();
        let now = clock::ticks();
        LAST_REFRESH.store(now, Ordering::Relaxed);
        let changed = module_table::refresh(modules.modules(), now);
        if changed || force {
            if UNLOADING.load(Ordering::SeqCst) > 0 {
                let permanent = PERMANENT.get().map_or(&[][..], Vec::as_slice);
                modules.retain(|m| permanent.contains(&m.start));
            }
            swap_unwinder(Unwinding::new(&modules, tables, current));
        }
    }
    // A module gone: a new generation (lifecycle.rs).
    if let Some(after) = AFTER_REFRESH.get() {
        after();
    }
}

/// Refreshes the module table if a capture found code outside every known
/// module and the last refresh is at least [`STALE_REFRESH_MS`] old. The
/// writer thread calls this as it goes round (it may allocate and take the
/// loader's lock; no producer waits for it while it does).
pub(crate) fn refresh_if_stale() {
    if TABLES_WANTED.load(Ordering::Relaxed) {
        // The session's first unwinder has no compact tables: build them
        // here, on the writer thread.
        ON_WRITER.with(|w| w.set(true));
        refresh(false);
        ON_WRITER.with(|w| w.set(false));
    }
    if !STALE.load(Ordering::Relaxed) {
        return;
    }
    let since = clock::ticks().saturating_sub(LAST_REFRESH.load(Ordering::Relaxed));
    if since < clock::ticks_per_sec() / 1000 * STALE_REFRESH_MS {
        return;
    }
    STALE.store(false, Ordering::Relaxed);
    modules_changed();
}

/// Publishes `new` and frees the unwinder it replaces once no capture can
/// be using it (invariant 2).
fn swap_unwinder(new: Box<Unwinding>) {
    let old = UNWINDER.swap(Box::into_raw(new), Ordering::AcqRel);
    if old.is_null() {
        return;
    }
    handshake::heavy_barrier();
    let mine = thread::current().map_or(core::ptr::null(), |s| s as *const ThreadSlot);
    for slot in thread::used_slots() {
        if core::ptr::eq(slot, mine) {
            if slot.capture_seq.is_odd() {
                // Called from a signal handler inside this thread's own
                // capture, which still uses `old`: leave it.
                return;
            }
            continue;
        }
        slot.capture_seq.wait_quiescent();
    }
    // SAFETY: `old` came from Box::into_raw in an earlier swap, and no
    // capture section that could have loaded it is still open.
    drop(unsafe { Box::from_raw(old) });
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

/// What [`capture_stack_or_lost`] returns when no stack could be taken:
/// an ID no stack has, which the event path records as "lost" (the
/// allocation without its stack, counted in its generation's
/// `lost_stacks`, inside the event's seqlock section).
pub const LOST_STACK: u64 = u64::MAX;

/// Counts one allocation recorded without the stack it should have had
/// (for a caller that gets 0 instead of [`LOST_STACK`]).
#[cold]
fn count_lost_stack() {
    let generation = SHARED.generation.load(Ordering::Relaxed);
    LOST_STACKS[(generation & 1) as usize].fetch_add(1, Ordering::Relaxed);
}

/// Captures the calling thread's native stack in the session's mode
/// (`Full` when the session's mode is `None`: an explicit request), drops
/// the `skip` innermost frames and then every frame of the tracer's own
/// module, interns the rest and returns its stack ID, for an allocation
/// event the caller records next ([`crate::event::calls::heap_object_alloc_stack`]
/// and friends); [`LOST_STACK`] when no stack could be taken, 0 when
/// tracing is off. `skip` is how many frames of the caller's to drop, the
/// caller's own first: 0 keeps the caller's frame (unless it is in the
/// tracer's module), 1 starts at the caller's caller.
///
/// Must not allocate, lock or make a system call in the common case
/// (invariant 1); never panics.
#[inline(never)]
pub fn capture_stack_or_lost(skip: usize) -> u64 {
    if SHARED.generation.load(Ordering::Relaxed) == 0 {
        return 0;
    }
    let Some(slot) = thread::current_or_claim() else {
        return LOST_STACK;
    };
    if !slot.capture_seq.try_begin() {
        // A signal handler inside this thread's capture (invariant 3).
        return LOST_STACK;
    }
    let id = capture_in_section(slot, skip + 1);
    slot.capture_seq.end();
    match id {
        0 => LOST_STACK,
        id => u64::from(id),
    }
}

/// [`capture_stack_or_lost`] for a caller that hands the ID out
/// (`trace_stack_capture`): 0 when no stack could be taken, counted in
/// the current generation's `lost_stacks` (the allocation its caller then
/// records with stack 0 carries none).
#[inline(never)]
pub fn capture_stack(skip: usize) -> u64 {
    match capture_stack_or_lost(skip + 1) {
        LOST_STACK => {
            count_lost_stack();
            0
        }
        id => id,
    }
}

/// Captures the stack of an allocation whose entry point (the shim's
/// naked malloc entries) handed over the program's registers at the call,
/// `start`: the walk starts in the program's frame, so it has no frame of
/// the tracer's to skip or filter. Interns it and returns its stack ID, for
/// an allocation event the caller records next; [`LOST_STACK`] when no
/// stack could be taken, 0 when tracing is off. A thread the shim started
/// ends its stack at the frame that returns into the thread-start
/// trampoline ([`set_thread_start`]): the stack is complete there, not
/// truncated, and the trampoline, `start_thread` and `clone3` are left
/// out.
///
/// Must not allocate, lock or make a system call in the common case
/// (invariant 1); never panics.
#[inline(never)]
pub fn capture_stack_from(start: StartRegs) -> u64 {
    let Some(slot) = thread::current_or_claim() else {
        return LOST_STACK;
    };
    if !slot.capture_seq.try_begin() {
        // A signal handler inside this thread's capture (invariant 3).
        return LOST_STACK;
    }
    let id = capture_from_in_section(slot, start);
    slot.capture_seq.end();
    id
}

/// Where the thread-start trampoline's return addresses lie, `[start,
/// start + len)`: a walk ends at the frame returning there, its outermost
/// address, which the stack leaves out.
static THREAD_START: AtomicU64 = AtomicU64::new(0);
static THREAD_START_LEN: AtomicU64 = AtomicU64::new(0);

/// The code `[start, end)` that calls every thread's start routine (the
/// shim's pthread trampoline): captures end at the frame returning into
/// it, untruncated. Set once, before threads start.
pub fn set_thread_start(start: u64, end: u64) {
    THREAD_START.store(start, Ordering::Relaxed);
    THREAD_START_LEN.store(end.saturating_sub(start), Ordering::Relaxed);
    // The walk itself ends there (an end-of-stack rule): the memo then
    // re-checks no frame of the trampoline or of the thread's start.
    alloctrace_unwind::set_walk_end(start, end);
}

/// [`capture_stack_from`] inside the capture section: the stack ID, or
/// [`LOST_STACK`].
#[inline(always)]
fn capture_from_in_section(slot: &ThreadSlot, start: StartRegs) -> u64 {
    let Some(state) = state_of(slot) else {
        return LOST_STACK;
    };
    // SAFETY: loaded inside the capture section: not freed before it ends
    // (invariant 2).
    let Some(unwinding) = (unsafe { UNWINDER.load(Ordering::Acquire).as_ref() }) else {
        return LOST_STACK;
    };
    // SAFETY: the bounds are this thread's stack (the host's word for it,
    // or the mapping holding its stack pointer), readable while it runs;
    // empty (lo == hi) when unknown, where the walk reads nothing.
    let bounds = unsafe { StackBounds::from_raw(state.lo, state.hi) };
    let depth = DEPTH.load(Ordering::Relaxed);
    // Room for the trampoline's frame and its two callers beyond the
    // limit: a stack of exactly `depth` frames is seen to end there.
    let out = &mut state.frames[..depth + 4];
    let walk = if check::ENABLED.load(Ordering::Relaxed) {
        // ALLOCTRACE_CHECK_STACKS (a testing aid): the same walk, compared
        // with the reference walks.
        check::walk_and_compare(
            start,
            &bounds,
            &unwinding.unwinder,
            &mut state.cache,
            &mut state.memo,
            out,
        )
    } else {
        // The addresses it takes from the memo are written only when the
        // interning needs them (`stack_of_walk`).
        alloctrace_unwind::capture_from_lazy(
            start,
            &bounds,
            &unwinding.unwinder,
            &mut state.cache,
            &mut state.memo,
            out,
        )
    };
    let n = walk.len.min(out.len());
    // The walk proved every frame the previous one's (the memo's common
    // case: a loop allocating from one place): the same stack, and the
    // same ID, with nothing to look at (`LastStack::walk`).
    let walk_key = LastStack::walk_key(n, walk.truncated, depth);
    // `shared` > 0: the memo is valid, for this unwinder and so this
    // session (a new session, in a forked child too, has a new unwinder
    // and may have a new call-stack table: an empty walk proves nothing).
    if walk.shared >= n.max(1) && walk_key == state.last.walk {
        // Not 0: `walk` is set only with a stack.
        return u64::from(state.last.id);
    }
    intern_walk(state, n, walk.shared, walk_key)
}

/// The stack of the shim's walk in `state.frames[..n]` (innermost first;
/// `shared` outermost frames proven the previous walk's; `walk_key` its
/// [`LastStack::walk_key`]) under the depth limit: leaves out the return
/// into the thread-start trampoline, interns it, remembers it in
/// `state.last`; its stack ID, [`LOST_STACK`] none. Out of line, so that
/// the walk's caller keeps few registers across the walk for the common
/// case, a walk the same as the previous one.
#[inline(never)]
fn intern_walk(state: &mut CaptureState, n: usize, shared: usize, walk_key: u64) -> u64 {
    let last = &mut state.last;
    let (depth, walk_truncated) = LastStack::walk_parts(walk_key);
    let out = state.frames.get_mut(..n).unwrap_or_default();
    let id = stack_of_walk(last, out, &mut state.memo, shared, walk_truncated, depth);
    last.walk = if id != 0 { walk_key } else { WALK_NONE };
    last.id = id;
    match id {
        0 => LOST_STACK,
        id => u64::from(id),
    }
}

/// [`intern_walk`]'s stack, from the walk's addresses `out` (of which
/// the lazy walk may have left the outermost `memo.unfilled()` unwritten:
/// they are filled in here when the interning reads them).
#[inline(always)]
fn stack_of_walk(
    last: &mut LastStack,
    out: &mut [u64],
    memo: &mut WalkMemo,
    shared: usize,
    walk_truncated: bool,
    depth: usize,
) -> u32 {
    let n = out.len();
    let unfilled = memo.unfilled().min(n);
    // The walk ends at the return into the thread-start trampoline (an
    // end-of-stack rule: `set_thread_start`), which it keeps as its
    // outermost address: the program's frames are the ones before it.
    let (tramp, tramp_len) = (
        THREAD_START.load(Ordering::Relaxed),
        THREAD_START_LEN.load(Ordering::Relaxed),
    );
    let outermost = match unfilled {
        0 => out.last().copied(),
        _ => memo.outermost(),
    };
    let at_start = outermost.is_some_and(|ra| ra.wrapping_sub(tramp) < tramp_len);
    // (A walk that ended there is complete.)
    let truncated = walk_truncated && !at_start;
    let tail = usize::from(at_start);
    let end = n - tail;
    // The common case: a complete stack within the limit.
    if !truncated && end <= depth && end > 0 {
        let reuse = last.reusable(shared, tail, false);
        // Interning reads the frames before the reused ones, out[..end -
        // reuse]; the unwritten ones are out[n - unfilled..].
        if end - reuse.min(end) > n - unfilled {
            memo.fill(out, n);
        }
        let kept = out.get(..end).unwrap_or_default();
        return last.intern(kept, false, reuse, tail);
    }
    memo.fill(out, n);
    stack_of_odd_walk(last, out, shared, truncated, depth, end)
}

/// [`stack_of_walk`] for a walk that was `truncated`, is cut by the depth
/// limit, or is empty (`end`: its frames before the trampoline's). Out of
/// line: the common case keeps fewer registers.
#[inline(never)]
fn stack_of_odd_walk(
    last: &mut LastStack,
    out: &[u64],
    shared: usize,
    truncated: bool,
    depth: usize,
    end: usize,
) -> u32 {
    let n = out.len();
    if truncated && n < depth + 4 {
        // Neither cut by the limit nor ended: maybe in code no known
        // module holds.
        note_unknown(out);
    }
    let kept = out.get(..end.min(depth)).unwrap_or_default();
    let truncated = truncated || end > depth;
    if kept.is_empty() && !truncated {
        last.tail = TAIL_NONE;
        return 0;
    }
    // A stack cut by the limit keeps its innermost frames: the walked ones
    // beyond them are its tail, so that the next walk cut at the same
    // length reuses the nodes of the frames the two share.
    let tail = n - kept.len();
    let reuse = last.reusable(shared, tail, truncated);
    last.intern(kept, truncated, reuse, tail)
}

/// The truncation marker's node (the root of every truncated stack); 0
/// when the table is full.
#[cold]
#[inline(never)]
fn truncation_marker() -> u32 {
    call_stack_table::intern_child(0, FrameWord::TRUNCATED.word())
}

/// A walk `out` stopped before its limit: when no known module holds its
/// last address (a library loaded since the last refresh), asks the
/// writer thread for a refresh (`refresh_if_stale`).
#[cold]
#[inline(never)]
fn note_unknown(out: &[u64]) {
    let Some(&ra) = out.last() else {
        return;
    };
    // SAFETY: called inside the capture section (invariant 2).
    if let Some(unwinding) = unsafe { UNWINDER.load(Ordering::Acquire).as_ref() } {
        if !unwinding.knows(ra) {
            STALE.store(true, Ordering::Relaxed);
        }
    }
}

#[inline(always)]
fn capture_in_section(slot: &ThreadSlot, skip: usize) -> u32 {
    let Some(state) = state_of(slot) else {
        return 0;
    };
    // SAFETY: loaded inside the capture section: not freed before it ends
    // (invariant 2).
    let Some(unwinding) = (unsafe { UNWINDER.load(Ordering::Acquire).as_ref() }) else {
        return 0;
    };
    let unwinder = &unwinding.unwinder;
    if !unwinder.has_tables() {
        TABLES_WANTED.store(true, Ordering::Relaxed);
    }
    // This walk updates the memo: the shim's next walk has no previous
    // walk of its own to be the same as.
    state.last.walk = WALK_NONE;
    if state.lo >= state.hi {
        return 0;
    }
    // SAFETY: the bounds are this thread's stack (the host's word for it,
    // or the mapping holding its stack pointer), readable while it runs.
    let bounds = unsafe { StackBounds::from_raw(state.lo, state.hi) };
    let depth = DEPTH.load(Ordering::Relaxed).clamp(1, MAX_DEPTH);
    // The walk takes the tracer's own frames too (up to 8 of the `skip`)
    // and drops them here: its memo then matches from the first frame on,
    // so a repeated stack costs no CFI step at all. A few more addresses
    // than the limit, to see own frames dropped by address and still keep
    // `depth` of the program's.
    let walked_skip = skip.min(8);
    let out = &mut state.frames[..depth + 4 + walked_skip];
    let (len, walk_truncated, shared) = if out.len() <= MEMO_DEPTH {
        let w = capture_dwarf_memo(
            skip - walked_skip,
            &bounds,
            unwinder,
            &mut state.cache,
            &mut state.memo,
            out,
        );
        (w.len, w.truncated, w.shared)
    } else {
        let w = capture_dwarf(skip - walked_skip, &bounds, unwinder, &mut state.cache, out);
        (w.len, w.truncated, 0)
    };
    let len = len.min(out.len());
    let shared = shared.min(len);
    let first = walked_skip.min(len);
    let captured = &out[first..len];
    if walk_truncated && len < out.len() {
        if let Some(&last) = captured.last() {
            if !unwinding.knows(last) {
                STALE.store(true, Ordering::Relaxed);
            }
        }
    }
    let (own_start, own_end) = (
        OWN_START.load(Ordering::Relaxed),
        OWN_END.load(Ordering::Relaxed),
    );
    let own = captured
        .iter()
        .take_while(|&&ra| ra >= own_start && ra < own_end)
        .count();
    let program = &captured[own..];
    let fits = program.len() <= depth;
    let kept = &program[..program.len().min(depth)];
    let truncated = walk_truncated || !fits;
    let last = &mut state.last;
    if kept.is_empty() && !truncated {
        last.tail = TAIL_NONE;
        return 0;
    }
    let tail = if fits { TAIL_CAPI } else { TAIL_NONE };
    let reuse = last.reusable(shared, tail, truncated);
    last.intern(kept, truncated, reuse, tail)
}

/// The calling thread's capture state, set up at thread start
/// ([`prepare_thread`]) or else taken from the pool on the slot's first
/// capture, and reset for a new owner; `None` when the pool is empty (the
/// writer thread refills it as it goes round).
#[inline(always)]
fn state_of(slot: &ThreadSlot) -> Option<&'static mut CaptureState> {
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
fn reset_for(state: &mut CaptureState) {
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
/// for this thread (call [`set_thread_stack`] first). The state stays with
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
fn take_state() -> Option<*mut CaptureState> {
    let pool = POOL.get()?;
    // Empty: the writer thread refills the pool within its idle period.
    pool.pop().map(|p| p as *mut CaptureState)
}

/// The calling thread's stack `[lo, hi)`: the host's word for it when it
/// holds the stack pointer, else found by the unwinder; `(0, 0)` unknown.
#[cold]
#[inline(never)]
fn thread_stack() -> (u64, u64) {
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
fn stack_from_maps() -> (u64, u64) {
    match StackBounds::from_maps() {
        Some(b) => (b.lo(), b.hi()),
        None => (0, 0),
    }
}

#[inline(always)]
fn stack_pointer() -> u64 {
    let probe = 0u8;
    core::ptr::addr_of!(probe) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A xorshift64 sequence from `seed` (not 0): the tests' random walks.
    fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        }
    }

    fn plain(kept: &[u64], truncated: bool) -> u32 {
        let marker = truncated.then_some(Some(FrameWord::TRUNCATED.word()));
        let words = marker.into_iter().chain(
            kept.iter()
                .rev()
                .map(|&ra| Some(FrameWord::Native(ra).word())),
        );
        call_stack_table::intern_outermost_first(words)
    }

    #[test]
    fn interning_only_the_new_frames_gives_every_stack_as_a_whole_walk_would() {
        // Stacks over a small alphabet, so that consecutive ones share
        // outer frames, inner frames, both or neither, with and without the
        // truncation marker; `shared` as a memo reports it: any count up to
        // the outermost frames the two walks have in common (the memo may
        // prove fewer), under a tail (walked frames beyond the kept ones)
        // that changes now and then.
        let mut last = Box::new(LastStack::new());
        let mut next = xorshift(0x2545_f491_4f6c_dd1du64);
        let mut prev: Option<(Vec<u64>, usize, bool)> = None;
        let (mut reused, mut tails) = (0, 0);
        for round in 0..20_000 {
            let len = (next() % 12) as usize;
            let mut kept: Vec<u64> = (0..len).map(|_| 0x40_0000 + 16 * (next() % 3)).collect();
            // Often the same outer frames as a fixed "main".
            if round % 3 != 0 {
                kept.extend_from_slice(&[0x50_0000, 0x50_0010, 0x50_0020]);
            }
            let truncated = next().is_multiple_of(5);
            if kept.is_empty() && !truncated {
                continue;
            }
            // The walk: the kept frames, then (for 50 rounds in turn) the
            // return into the thread-start trampoline, which is not kept,
            // or 4 frames beyond the depth limit.
            let tail = [0, 1, 4][(round / 50) % 3];
            let mut walk = kept.clone();
            walk.extend((0..tail as u64).map(|i| 0x60_0000 + 16 * i));
            let shared = match &prev {
                Some((p, ptail, ptrunc)) if *ptrunc == truncated => {
                    let mut pw = p.clone();
                    pw.extend((0..*ptail as u64).map(|i| 0x60_0000 + 16 * i));
                    let common = walk
                        .iter()
                        .rev()
                        .zip(pw.iter().rev())
                        .take_while(|(a, b)| a == b)
                        .count();
                    match next() % 2 {
                        0 => common,
                        _ => (next() % (common as u64 + 1)) as usize,
                    }
                }
                _ => 0,
            };
            let reuse = last.reusable(shared, tail, truncated);
            if reuse > 0 {
                reused += 1;
                tails += usize::from(tail > 0);
            }
            // Interning reads only the frames before the reused ones (the
            // lazy walk leaves the others unwritten: `stack_of_walk`).
            let mut seen = kept.clone();
            let from = seen.len() - reuse.min(seen.len());
            for w in &mut seen[from..] {
                *w = 0xbad;
            }
            let got = last.intern(&seen, truncated, reuse, tail);
            assert_eq!(
                got,
                plain(&kept, truncated),
                "round {round}: {kept:x?} {truncated} shared {shared}"
            );
            assert_ne!(got, 0);
            prev = Some((kept, tail, truncated));
        }
        assert!(
            reused > 2_000 && tails > 1_000 && reused - tails > 1_000,
            "{reused} {tails}"
        );
        // Another tail, or none, reuses nothing.
        let other = if last.tail == 1 { 4 } else { 1 };
        assert_eq!(last.reusable(5, other, last.truncated), 0);
        assert_eq!(last.reusable(5, TAIL_CAPI, last.truncated), 0);
        last.tail = TAIL_NONE;
        assert_eq!(last.reusable(5, TAIL_NONE, last.truncated), 0);
    }

    /// The shim's walks as `stack_of_walk` gets them, against the stack a
    /// whole intern of the expected frames gives: threads' walks ending
    /// at the return into the trampoline (dropped), complete ones, failed
    /// ones (truncated), and deep ones cut by the depth limit, whose
    /// buffer ends 4 frames beyond it; `shared` as the memo reports it.
    #[test]
    fn a_walk_s_stack_leaves_the_trampoline_out_and_reuses_across_cuts() {
        // A trampoline no real return address hits (the statics are only
        // read by stack_of_walk; the unwinder's walk end is left alone).
        let tramp = 0x7fff_0000_0000u64;
        THREAD_START.store(tramp, Ordering::Relaxed);
        THREAD_START_LEN.store(1, Ordering::Relaxed);
        let depth = 16;
        let mut last = Box::new(LastStack::new());
        // A memo that left nothing unwritten: every walk here is whole.
        let mut memo = Box::new(WalkMemo::new());
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15u64);
        // (the whole walk outermost-aligned, its kind: 0 complete, 1 a
        // thread's, 2 failed)
        let mut prev: Option<(Vec<u64>, u8)> = None;
        let (mut reused, mut cut_reused) = (0, 0);
        for round in 0..20_000 {
            let kind = [0u8, 1, 2][(round / 40) % 3];
            // Stacks over a small alphabet under a fixed outer part, and
            // deep ones now and then (cut by the limit), a few frames over
            // a fixed deep part.
            let deep = next().is_multiple_of(4);
            let len = if deep { 2 + next() % 2 } else { next() % 10 };
            let mut full: Vec<u64> = (0..len).map(|_| 0x40_0000 + 16 * (next() % 3)).collect();
            if deep {
                full.extend((0..18u64).map(|i| 0x48_0000 + 16 * i));
            }
            full.extend((0..6u64).map(|i| 0x50_0000 + 16 * i));
            if kind == 1 {
                full.push(tramp);
            }
            let d = depth + 4;
            let cut = full.len() > d;
            let out = &full[..full.len().min(d)];
            let walk_truncated = cut || kind == 2;
            // What the memo may prove: outermost frames of the same frames
            // (for walks cut by the buffer, those at the cut, whose
            // callers are then the same: the whole walks end alike). A cut
            // walk and an ended or failed one share nothing.
            let shared = match &prev {
                Some((p, pkind))
                    if p.len() > d && cut
                        || p.len() <= d && !cut && (*pkind == 2) == (kind == 2) =>
                {
                    let common = full
                        .iter()
                        .rev()
                        .zip(p.iter().rev())
                        .take_while(|(a, b)| a == b)
                        .count();
                    let provable = if !cut {
                        common.min(out.len())
                    } else if p.len() == full.len() {
                        common.saturating_sub(full.len() - d)
                    } else {
                        0
                    };
                    match next() % 2 {
                        0 => provable,
                        _ => (next() % (provable as u64 + 1)) as usize,
                    }
                }
                _ => 0,
            };
            // The expected stack: the program's frames, the innermost
            // `depth` under the marker when deeper.
            let program = &full[..full.len() - usize::from(kind == 1)];
            let kept = &program[..program.len().min(depth)];
            let truncated = kind == 2 || program.len() > depth;
            let expected = plain(kept, truncated);
            // How many nodes it may take from the previous stack.
            let tail = out.len() - kept.len();
            let reuse = last.reusable(shared, tail, truncated);
            let mut walked = out.to_vec();
            let got = stack_of_walk(
                &mut last,
                &mut walked,
                &mut memo,
                shared,
                walk_truncated,
                depth,
            );
            assert_eq!(
                got,
                expected,
                "round {round}: kind {kind} len {} shared {shared}",
                full.len()
            );
            if reuse > 0 {
                reused += 1;
                cut_reused += usize::from(cut);
            }
            prev = Some((full, kind));
        }
        assert!(reused > 1_000 && cut_reused > 100, "{reused} {cut_reused}");
    }

    #[test]
    fn states_sit_side_by_side_in_chunks_however_many_threads_take_them() {
        // Threads take states at once, more than a chunk holds: every
        // state is a fresh one (never one handed out before), none
        // overlaps another, and each lies one state's size after the
        // previous one of its chunk, not in a size class of its own. (Other
        // tests may take states meanwhile: they only leave gaps.)
        const THREADS: usize = 4;
        const EACH: usize = 100;
        let taken: Vec<usize> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        (0..EACH)
                            .map(|_| CaptureState::carve() as usize)
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        let size = core::mem::size_of::<CaptureState>();
        for &p in &taken {
            assert_eq!(p % core::mem::align_of::<CaptureState>(), 0);
            // SAFETY: a state from CaptureState::carve, never freed, used by
            // no one else.
            let state = unsafe { &*(p as *const CaptureState) };
            assert_eq!((state.owner, state.lo, state.hi), (0, 0, 0));
            assert_eq!((state.last.tail, state.last.walk), (TAIL_NONE, WALK_NONE));
        }
        let mut sorted = taken.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), THREADS * EACH, "a state handed out twice");
        let mut packed = 0;
        for w in sorted.windows(2) {
            let gap = w[1] - w[0];
            assert!(gap >= size, "states overlap: {:#x} {:#x}", w[0], w[1]);
            packed += usize::from(gap == size);
        }
        // 400 states in at least 7 chunks: all but the first of each chunk
        // follow another, but for the few taken by other tests.
        assert!(
            packed >= THREADS * EACH * 9 / 10,
            "{packed} of {}",
            THREADS * EACH
        );
    }

    #[test]
    fn a_walk_key_tells_length_truncation_and_depth_apart() {
        let mut seen = std::collections::HashSet::new();
        for depth in [1, 2, 3, 100, MAX_DEPTH - 1, MAX_DEPTH] {
            for len in 0..=depth + 4 {
                for truncated in [false, true] {
                    let key = LastStack::walk_key(len, truncated, depth);
                    assert_ne!(key, WALK_NONE);
                    assert_eq!(LastStack::walk_parts(key), (depth, truncated));
                    assert!(seen.insert(key), "{len} {truncated} {depth}");
                }
            }
        }
    }
}
