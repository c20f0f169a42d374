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
//!   template when handed out: 15,432 bytes a thread, where a box each
//!   took the 16 KiB class of the shim's private heap and its
//!   construction on the stack faulted in most of its size on every
//!   thread's stack. Taking one may allocate (a chunk), which a capture must
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
//! - **The walk before, again** (a loop allocating from two or three
//!   places in turn): `intern_walk` tags the memo's walk with its key and
//!   stack ID (`WalkMemo::set_tag`); the memo keeps the tag with that
//!   walk's inner frames when a later walk displaces them (a branch). A
//!   walk that takes them back (`WalkMemo::took_alt`) is, frame for frame,
//!   the tagged walk: under the same key, its stack is the tag's ID,
//!   returned without interning. The previous stack's nodes are this
//!   walk's only for the frames the two share: `LastStack` keeps the ID,
//!   the key and those nodes.
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

use core::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};

use alloctrace_unwind::{Modules, MEMO_DEPTH};
use crossbeam_queue::ArrayQueue;

/// Where a walk starts (alloctrace-unwind's): the program's registers as a
/// naked entry point saw them.
pub use alloctrace_unwind::StartRegs;

mod check;
mod state;
mod unwinder;
mod walk;
pub use check::{check_stacks_report, set_check_stacks};
pub use state::prepare_thread;
pub(crate) use state::refill_pool;
pub(crate) use unwinder::{lock_refresh, refresh_if_stale};

use state::{CaptureState, POOL, POOL_CAPACITY, POOL_TARGET};
pub use unwinder::{modules_changed, unloading_begin, unloading_end};
use unwinder::{
    swap_unwinder, Unwinding, AFTER_REFRESH, LAST_REFRESH, PERMANENT, REFRESH, TABLES_WANTED,
    UNWINDER,
};
use walk::{capture_from_in_section, capture_in_section, walk_in_section, OWN_END, OWN_START};

use crate::clock;
use crate::lost::LOST_STACKS;
use crate::shared::SHARED;
use crate::stacks::module_table;
use crate::thread;
use crate::tls::{self, Word};

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

/// Walks the calling thread's native stack as [`capture_stack_or_lost`]
/// does (the same walk, `skip` and dropping of the tracer's own frames)
/// and writes its return addresses, innermost first, into `out` instead
/// of interning them (`trace_stack_walk`: a runtime that merges frames of
/// its own in). At most `out.len()` and the session's depth limit; how
/// many, 0 when tracing is off or no stack could be taken (not counted:
/// the caller registers what it makes of the frames).
///
/// Must not allocate, lock or make a system call in the common case
/// (invariant 1); never panics.
#[inline(never)]
pub fn walk_stack(skip: usize, out: &mut [u64]) -> usize {
    if SHARED.generation.load(Ordering::Relaxed) == 0 {
        return 0;
    }
    let Some(slot) = thread::current_or_claim() else {
        return 0;
    };
    if !slot.capture_seq.try_begin() {
        // A signal handler inside this thread's capture (invariant 3).
        return 0;
    }
    let n = walk_in_section(slot, skip + 1, out);
    slot.capture_seq.end();
    n
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

#[cfg(test)]
mod tests {
    use super::state::*;
    use super::walk::*;
    use super::*;
    use crate::stacks::call_stack_table;
    use alloctrace_format::stacks::FrameWord;
    use alloctrace_unwind::WalkMemo;

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
