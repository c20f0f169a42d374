//! Native call stacks captured by the tracer itself: the stack mode of a
//! session, each thread's capture state, the shared DWARF unwinder and its
//! replacement when libraries come and go. The LD_PRELOAD shim captures
//! the stack of every allocation through [`capture_stack_or_lost`]; the C
//! API offers [`capture_stack`] as `trace_stack_capture` and, with
//! `trace_config.stacks`, in the plain alloc calls.
//!
//! ## Design
//!
//! - **Modes** ([`StackMode`]): `None` captures nothing; `Fast` unwinds the
//!   tracer's own frames by CFI and the program's by frame pointers
//!   (alloctrace-unwind's `capture_mixed`: cheap, but it skips or stops at
//!   code built without frame pointers); `Full` unwinds every frame by its
//!   module's `.eh_frame` rules, with frame pointers only where a module has
//!   none (`capture_dwarf`: right on distributions built without frame
//!   pointers). The depth limit (default [`DEFAULT_DEPTH`], at most
//!   [`MAX_DEPTH`]) counts native frames; a deeper stack keeps its
//!   innermost frames under the truncation marker.
//! - **Per-thread state** (`CaptureState`: the stack bounds, framehop's
//!   rule cache, the walk's memo, the frame array and the previous stack;
//!   about 40 KiB) hangs off the thread's slot
//!   (thread.rs), so the capture finds it with the slot, without TLS of its
//!   own. Building one allocates (framehop boxes its cache), which a capture
//!   must never do: states come from a pool that session start fills and
//!   the writer thread tops up (`refill_pool`). A slot keeps its state
//!   when its thread exits; the next thread to claim the slot resets the
//!   bounds (the state remembers the thread pointer it was set up for).
//! - **Stack bounds**: what the host says (the shim knows each thread's
//!   stack from `pthread_getattr_np` at thread start and sets them with
//!   [`set_thread_stack`]), else found once per thread, at its first
//!   capture, from `/proc/self/maps` read with raw system calls (no
//!   malloc: `StackBounds::from_maps`).
//! - **Walking less**: the full mode keeps, per thread, what its previous
//!   walk read (alloctrace-unwind's `WalkMemo`) and stops at the first
//!   frame that provably sits where it sat then with the same callers,
//!   taking the rest from the memo; interning then reuses the previous
//!   stack's nodes for the frames the two share (`LastStack`). A loop that
//!   allocates from one place costs a few reads per frame, not a CFI step
//!   per frame.
//! - **The tracer's own frames** (the capture, the event call, the shim's
//!   malloc wrapper) are dropped by count (`skip`: every function between
//!   the capture and the caller's frame is `#[inline(never)]` or
//!   `#[inline(always)]`, never left to the optimiser, and never a tail
//!   call), then, as a safety net, any frame whose return address lies in
//!   the tracer's own module when that is a library of its own
//!   (liballoctrace.so, the shim; not when linked into the program).
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
//!
//! ## Invariants
//!
//! 1. A capture never allocates, locks or makes a system call once its
//!    thread has a state and bounds: the state's first use on a thread may
//!    find the bounds with system calls (no allocation, no lock). When the
//!    pool is empty the allocation goes without its stack (counted in
//!    `lost_stacks`) until the writer thread, going round, refills it.
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
    capture_dwarf, capture_dwarf_memo, capture_mixed, DwarfCache, DwarfUnwinder, Modules,
    StackBounds, WalkMemo, MEMO_DEPTH,
};
use crossbeam_queue::ArrayQueue;

use crate::session::LOST_STACKS;
use crate::shared::SHARED;
use crate::thread::{self, ThreadSlot};
use crate::tls::{self, Word};
use crate::{call_stack_table, clock, handshake, module_table};

/// Which native stacks a session captures by itself (docs/CLI.md,
/// `record --stacks`).
#[repr(u8)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StackMode {
    /// No native stacks.
    #[default]
    None = 0,
    /// The tracer's own frames by CFI, the program's by frame pointers.
    Fast = 1,
    /// Every frame by DWARF CFI (`.eh_frame`), frame pointers where a
    /// module has no unwind table.
    Full = 2,
}

impl StackMode {
    fn from_u8(v: u8) -> StackMode {
        match v {
            1 => StackMode::Fast,
            2 => StackMode::Full,
            _ => StackMode::None,
        }
    }
}

/// The default depth limit (native frames per stack), as heaptrack's.
pub const DEFAULT_DEPTH: usize = alloctrace_unwind::DEFAULT_DEPTH;
/// The largest depth limit a session accepts.
pub const MAX_DEPTH: usize = 256;

// A walk's buffer (the limit, 4 spare addresses and up to 8 own frames)
// fits the memo, so the full mode uses it at every depth limit.
const _: () = assert!(MAX_DEPTH + 12 <= MEMO_DEPTH);

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
    fn new(modules: &Modules) -> Box<Unwinding> {
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
            unwinder: unsafe { DwarfUnwinder::from_modules(modules) },
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
/// Spare capture states (pointers from `Box::into_raw`).
static POOL: OnceLock<ArrayQueue<usize>> = OnceLock::new();
/// Serialises set-up and refreshes (never taken by a capture).
static REFRESH: Mutex<()> = Mutex::new(());

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
    /// What the full mode's previous walk read, so that the next one stops
    /// at the first frame the two share (alloctrace-unwind's memo).
    memo: WalkMemo,
    /// The walk's return addresses (the depth limit and a few own frames).
    frames: [u64; MAX_DEPTH + 12],
    last: LastStack,
}

/// The thread's previous stack as interned: consecutive allocations share
/// most of their callers, so a new stack interns only the frames it does
/// not share with the previous one (the common outermost frames keep their
/// nodes).
struct LastStack {
    /// Its frames, outermost first (so that the frames two stacks share,
    /// their outermost ones, keep their positions whatever the depths).
    frames: [u64; MAX_DEPTH],
    /// `nodes[i]`: the node (stack ID) of the stack from `frames[i]` out.
    nodes: [u32; MAX_DEPTH],
    len: usize,
    truncated: bool,
}

impl CaptureState {
    fn new() -> Box<CaptureState> {
        Box::new(CaptureState {
            owner: 0,
            lo: 0,
            hi: 0,
            cache: DwarfCache::new(),
            memo: WalkMemo::new(),
            frames: [0; MAX_DEPTH + 12],
            last: LastStack {
                frames: [0; MAX_DEPTH],
                nodes: [0; MAX_DEPTH],
                len: 0,
                truncated: false,
            },
        })
    }
}

impl LastStack {
    /// Interns `kept` (innermost first; `truncated`: under the truncation
    /// marker), reusing the nodes of the outermost frames it shares with
    /// the previous stack, and remembers it. Returns its stack ID; 0 when
    /// the table is full (and forgets the previous stack).
    #[inline(always)]
    fn intern(&mut self, kept: &[u64], truncated: bool) -> u32 {
        let (n, pn) = (kept.len().min(MAX_DEPTH), self.len);
        let kept = &kept[..n];
        // The outermost frames both stacks share keep their nodes.
        let mut common = 0;
        if truncated == self.truncated {
            while common < n.min(pn) && kept[n - 1 - common] == self.frames[common] {
                common += 1;
            }
        }
        let mut parent = if common > 0 {
            self.nodes[common - 1]
        } else if truncated {
            call_stack_table::intern_child(0, FrameWord::TRUNCATED.word())
        } else {
            0
        };
        if common == 0 && truncated && parent == 0 {
            self.len = 0;
            return 0;
        }
        for i in common..n {
            let ra = kept[n - 1 - i];
            parent = call_stack_table::intern_child(parent, FrameWord::Native(ra).word());
            if parent == 0 {
                self.len = 0;
                return 0;
            }
            self.nodes[i] = parent;
            self.frames[i] = ra;
        }
        self.len = n;
        self.truncated = truncated;
        // n == 0: only the truncation marker.
        parent
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
pub(crate) fn set_up(mode: StackMode, depth: usize) {
    let _guard = REFRESH.lock().unwrap_or_else(|p| p.into_inner());
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
    swap_unwinder(Unwinding::new(&modules));
    LAST_REFRESH.store(clock::ticks(), Ordering::Relaxed);
    let pool = POOL.get_or_init(|| ArrayQueue::new(POOL_CAPACITY));
    while pool.len() < POOL_TARGET {
        if pool
            .push(Box::into_raw(CaptureState::new()) as usize)
            .is_err()
        {
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
    let _guard = REFRESH.lock().unwrap_or_else(|p| p.into_inner());
    let mut modules = Modules::snapshot();
    let now = clock::ticks();
    LAST_REFRESH.store(now, Ordering::Relaxed);
    let changed = module_table::refresh(modules.modules(), now);
    if !changed && !force {
        return;
    }
    if UNLOADING.load(Ordering::SeqCst) > 0 {
        let permanent = PERMANENT.get().map_or(&[][..], Vec::as_slice);
        modules.retain(|m| permanent.contains(&m.start));
    }
    swap_unwinder(Unwinding::new(&modules));
}

/// Refreshes the module table if a capture found code outside every known
/// module and the last refresh is at least [`STALE_REFRESH_MS`] old. The
/// writer thread calls this as it goes round (it may allocate and take the
/// loader's lock; no producer waits for it while it does).
pub(crate) fn refresh_if_stale() {
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
        if pool
            .push(Box::into_raw(CaptureState::new()) as usize)
            .is_err()
        {
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
/// event the caller records next ([`crate::events::heap_object_alloc_stack`]
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
    if state.lo >= state.hi {
        return 0;
    }
    // SAFETY: the bounds are this thread's stack (the host's word for it,
    // or the mapping holding its stack pointer), readable while it runs.
    let bounds = unsafe { StackBounds::from_raw(state.lo, state.hi) };
    let depth = DEPTH.load(Ordering::Relaxed).clamp(1, MAX_DEPTH);
    // The full mode walks the tracer's own frames too (up to 8 of the
    // `skip`) and drops them here: its memo then matches from the first
    // frame on, so a repeated stack costs no CFI step at all. A few more
    // addresses than the limit, to see own frames dropped by address and
    // still keep `depth` of the program's.
    let mode = mode();
    let walked_skip = match mode {
        StackMode::Fast => 0,
        StackMode::Full | StackMode::None => skip.min(8),
    };
    let out = &mut state.frames[..depth + 4 + walked_skip];
    let walk = match mode {
        // The memo would cost the frame-pointer walk more than it saves.
        StackMode::Fast => capture_mixed(skip, &bounds, unwinder, &mut state.cache, out),
        StackMode::Full | StackMode::None if out.len() <= MEMO_DEPTH => {
            let w = capture_dwarf_memo(
                skip - walked_skip,
                &bounds,
                unwinder,
                &mut state.cache,
                &mut state.memo,
                out,
            );
            alloctrace_unwind::Walk {
                len: w.len,
                truncated: w.truncated,
            }
        }
        StackMode::Full | StackMode::None => {
            capture_dwarf(skip - walked_skip, &bounds, unwinder, &mut state.cache, out)
        }
    };
    let walk = alloctrace_unwind::Walk {
        len: walk.len.saturating_sub(walked_skip),
        truncated: walk.truncated,
    };
    let first = walked_skip.min(out.len());
    let out = &out[first..];
    let captured = &out[..walk.len.min(out.len())];
    if walk.truncated && walk.len < out.len() {
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
    let kept = &program[..program.len().min(depth)];
    let truncated = walk.truncated || kept.len() < program.len();
    if kept.is_empty() && !truncated {
        return 0;
    }
    state.last.intern(kept, truncated)
}

/// The calling thread's capture state, taken from the pool on the slot's
/// first capture and reset for a new owner; `None` when the pool is empty
/// (the writer thread refills it as it goes round).
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
    let me = thread::thread_pointer();
    if state.owner != me {
        state.owner = me;
        state.last.len = 0;
        state.memo.clear();
        let (lo, hi) = thread_stack();
        state.lo = lo;
        state.hi = hi;
    }
    Some(state)
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
    fn reusing_the_previous_stacks_nodes_interns_every_stack_as_a_whole_walk_would() {
        // Stacks over a small alphabet, so that consecutive ones share
        // outer frames, inner frames, both or neither, with and without the
        // truncation marker.
        let mut last = Box::new(LastStack {
            frames: [0; MAX_DEPTH],
            nodes: [0; MAX_DEPTH],
            len: 0,
            truncated: false,
        });
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut reused = 0;
        for round in 0..20_000 {
            let len = (next() % 12) as usize;
            let mut kept: Vec<u64> = (0..len).map(|_| 0x40_0000 + 16 * (next() % 3)).collect();
            // Often the same outer frames as a fixed "main".
            if round % 3 != 0 {
                kept.extend_from_slice(&[0x50_0000, 0x50_0010, 0x50_0020]);
            }
            let truncated = next() % 5 == 0;
            if kept.is_empty() && !truncated {
                continue;
            }
            let before = last.len;
            let got = last.intern(&kept, truncated);
            assert_eq!(
                got,
                plain(&kept, truncated),
                "round {round}: {kept:x?} {truncated}"
            );
            assert_ne!(got, 0);
            if before > 0 {
                reused += 1;
            }
        }
        assert!(reused > 10_000);
    }
}
