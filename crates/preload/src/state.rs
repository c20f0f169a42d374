//! The process-wide state the wrappers and the lifecycle share: where the
//! session is in its lifecycle, which families it records, and the few
//! facts of the running session the wrappers need.
//!
//! This module is the leaf of the crate's graph: it uses nothing else of
//! the crate. session.rs writes nearly all of it (lib.rs's constructor
//! the page size, signals.rs's fatal-signal handler one transition);
//! early.rs, heap.rs, maps.rs, stacks.rs and signals.rs read it. So the
//! recording modules do not depend on session.rs, and session.rs (which
//! calls down into early.rs, maps.rs and stacks.rs for a new session's
//! snapshot) is not reached back from them.
//!
//! | item | means | written by | stores | loads |
//! |---|---|---|---|---|
//! | [`LIFECYCLE`] | the lifecycle state (session.rs's state machine) | session.rs (as the shim's own code); signals.rs's fatal-signal handler (RUNNING to STOPPED once the core ended the session) | Release; transitions out of RUNNING by compare-exchange (AcqRel) | Acquire; Relaxed in early.rs's and late.rs's checks (`early::active`, `late::note`) |
//! | [`HEAP`], [`MMAP`], [`STACKS`] | the families the run records (ALLOCTRACE_FAMILIES) | session.rs's constructor work, once, before the first session starts | Relaxed | Relaxed, after `alloctrace_writer::enabled()` |
//! | [`FILTER`] | frees are filtered through the live set (liveset.rs) | session.rs, before each session starts | Release | Relaxed (heap.rs's hot path) |
//! | [`EPOCH`] | the number of sessions started | session.rs, as each session starts | fetch_add (AcqRel) | Acquire (stacks.rs) |
//! | [`SESSION_PID`] | the process that runs the session | session.rs, as each session starts | Release | Acquire (session.rs, signals.rs) |
//! | [`PAGE_SIZE`] | the system page size (4096 until the constructor) | lib.rs's constructor, once | Relaxed | Relaxed |
//!
//! ## Orderings
//!
//! - LIFECYCLE's Release stores pair with its Acquire loads: a thread that
//!   reads RUNNING sees the settings, FILTER, EPOCH and SESSION_PID the
//!   session was started with (all written before RUNNING is stored).
//! - HEAP, MMAP and STACKS are written once, before the first session turns
//!   events on; the event path loads them Relaxed after the core's
//!   `enabled()` (itself Relaxed). They never change afterwards, and the
//!   constructor runs before the program's main (normally with one
//!   thread), so no reader can see them change.
//! - FILTER is stored (Release) before the core's start turns events on
//!   (the core's SeqCst store of the generation); heap.rs loads it Relaxed,
//!   so the hot path pays no fence. A session that starts with other
//!   threads running (after a failed exec) could, on a weakly ordered CPU,
//!   show another thread events on and FILTER's previous value for a
//!   moment: a free of an inherited object would then be recorded as a
//!   free (an unknown free), never a lost event. A forked child starts
//!   its session with one thread, the constructor normally too.
//! - EPOCH's fetch_add is ordered before the session's stack snapshot;
//!   stacks.rs compares a thread's recorded epoch with an Acquire load, so
//!   a stack recorded in an earlier session is never freed in a later one.
//! - PAGE_SIZE is written by the constructor before it starts anything;
//!   until then the default (4096) is the value x86-64 and most AArch64
//!   systems have.
//!
//! Every item is an atomic: a signal handler or another thread may read it
//! at any time, and reading one never allocates, locks or calls the system.

use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// Before the constructor has decided (ld.so, other libraries'
/// constructors): heap calls are logged (early.rs).
pub const UNINIT: u8 = 0;
/// A session is recording.
pub const RUNNING: u8 = 1;
/// The session ended (exit, exec, a fatal signal); a failed exec or a fork
/// starts a new one.
pub const STOPPED: u8 = 2;
/// This process image is not traced (ALLOCTRACE_DISABLE, a bad setting,
/// ALLOCTRACE_ONLY, ALLOCTRACE_FOLLOW=0).
pub const DISABLED: u8 = 3;
/// A session could not start (the trace file, the live set).
pub const FAILED: u8 = 4;
/// The session ended as the process exits (exit, `_exit`, quick_exit):
/// calls made after it are counted as lost events of the trace (late.rs).
pub const EXITED: u8 = 5;

/// Where the shim is in its lifecycle (session.rs's state machine: one of
/// [`UNINIT`], [`RUNNING`], [`STOPPED`], [`DISABLED`], [`FAILED`],
/// [`EXITED`]).
/// Written only as the shim's own code (session.rs) and by the
/// fatal-signal handler (signals.rs); read by the wrappers (early logging,
/// exec, pthread_create, the fatal-signal handler).
pub static LIFECYCLE: AtomicU8 = AtomicU8::new(UNINIT);

/// Whether the run records the malloc family. Written once by the
/// constructor, before the first session starts.
pub static HEAP: AtomicBool = AtomicBool::new(false);
/// Whether the run records mmap, munmap and mremap (as [`HEAP`]).
pub static MMAP: AtomicBool = AtomicBool::new(false);
/// Whether the run records thread stacks (as [`HEAP`]).
pub static STACKS: AtomicBool = AtomicBool::new(false);

/// Whether frees are filtered through the live set (liveset.rs): set for
/// sessions that start with an inherited heap (a forked child, after a
/// failed exec). Written before each session starts.
pub static FILTER: AtomicBool = AtomicBool::new(false);

/// Counts the sessions this process (and its ancestors before fork) has
/// started: a thread's stack is freed in the trace only if the stack was
/// recorded in the same session.
pub static EPOCH: AtomicU64 = AtomicU64::new(0);

/// The process that runs the session. A vfork child (or a clone child that
/// ran no fork handlers) shares or copies the parent's memory but has
/// another pid: the exec wrappers and the fatal-signal handler leave the
/// parent's session alone there.
pub static SESSION_PID: AtomicI32 = AtomicI32::new(0);

/// The system page size, read by the constructor (4096 until then).
pub static PAGE_SIZE: AtomicUsize = AtomicUsize::new(4096);

/// The system page size.
#[inline(always)]
pub fn page_size() -> usize {
    PAGE_SIZE.load(Ordering::Relaxed)
}

/// Whether pthread_create should wrap new threads (to record their stacks):
/// not in an image that is not traced; before the constructor (the
/// families are not known yet), yes.
#[inline]
pub fn wrap_threads() -> bool {
    match LIFECYCLE.load(Ordering::Acquire) {
        DISABLED | FAILED => false,
        UNINIT => true,
        // Thread stacks are recorded, or native call stacks need each
        // thread's bounds (stacks.rs, note_bounds).
        _ => {
            STACKS.load(Ordering::Relaxed)
                || alloctrace_writer::capture::mode() != alloctrace_writer::capture::StackMode::None
        }
    }
}

/// The snapshot signal (signals.rs), 0 for none: set by the session's
/// start from `ALLOCTRACE_SNAPSHOT_SIGNAL` (config.rs).
pub static SNAPSHOT_SIGNAL: core::sync::atomic::AtomicI32 = core::sync::atomic::AtomicI32::new(0);
