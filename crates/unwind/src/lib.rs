//! In-process native stack capture for alloctrace: the unwinder the
//! LD_PRELOAD shim and `trace_stack_capture` run from inside malloc.
//!
//! The design (compact unwind tables, the one step every walk takes, the
//! flat re-validation memo, memory per thread) is in `docs/STACKS.md`. In
//! short:
//!
//! - [`capture_from`] walks from the traced program's own frame, as a naked
//!   malloc entry hands it over ([`StartRegs`]); [`capture_here`] from its
//!   caller, after `skip` frames. Both write return addresses innermost
//!   first into the caller's `out` (its length is the depth limit) and
//!   return a [`MemoWalk`] `{ len, truncated, shared }`.
//! - Each frame is unwound by its module's compact table (rows built from
//!   `.eh_frame` by [`DwarfUnwinder::from_modules`], looked up through the
//!   thread's [`DwarfCache`]), by framehop where no compact row applies, and
//!   through the kernel's `ucontext_t` at a signal frame.
//! - A per-thread [`WalkMemo`] keeps the previous walk outermost first; a
//!   walk that reaches one of its frames re-reads, branch-free, the words
//!   that walk's steps read and takes its frames while they hold.
//! - [`capture_from_compact`] and [`capture_from_framehop`] are the same
//!   walk without the memo, and framehop alone: the references the memoized
//!   walk must equal frame for frame.
//! - Stack bounds ([`StackBounds`]) are found once per thread; the module
//!   snapshot ([`Modules`]) at start and after each `dlopen`/`dlclose`.
//!
//! ## Invariants
//!
//! 1. A capture MUST NOT allocate, not even through Rust's global
//!    allocator: it uses only the caller's `out`, the stack, the shared
//!    unwinder and the caller's cache and memo, built at set-up. Otherwise it
//!    re-enters the malloc it runs in (recursion, or a deadlock on the
//!    allocator's lock). tests/no_alloc.rs counts 0 allocations (Rust's
//!    and the C library's) in 10,000 captures of each kind (`capture_from`,
//!    `capture_here`, the reference walks and the older entry points), and
//!    in `StackBounds::from_maps`.
//! 2. A capture MUST NOT take a lock, wait or make a system call: no
//!    `dl_iterate_phdr` (the loader's lock: libunwind's and DataDog's
//!    deadlocks), no `/proc` reads (only [`StackBounds::from_maps`], once
//!    per thread, before its first capture), no `pthread_*` calls; memory is
//!    validated by bounds, not by probing with a system call per read. The
//!    framehop fallback claims one of the unwinder's framehop caches with a
//!    single compare-exchange and never waits: with none free the step
//!    fails (the walk ends truncated). Otherwise it can deadlock against the
//!    thread that holds the lock, and it would cost microseconds per frame.
//! 3. Every stack read MUST be 8-byte aligned and inside
//!    `[max(lo, sp), hi)` of the calling thread. Steps read through the
//!    fence, which checks it; the compact step (`step::compact_step`) runs
//!    only from an aligned stack pointer inside the fence and bounds each
//!    read by `hi` (its reads are at or above that stack pointer). The memo's re-reads are not checked one by
//!    one: each address was read through a fence with the same `hi` by a
//!    compact step of the previous walk, and compact steps read only at or
//!    above their own frame's stack pointer, which is at or above the
//!    current walk's (docs/STACKS.md, section 6). Otherwise a garbage frame
//!    pointer (any -O2 code may leave one in rbp) faults inside the host's
//!    malloc.
//! 4. Reads of unwind tables and code (framehop's view of `.eh_frame`, the
//!    signal trampoline check) MUST stay inside objects of the snapshot that
//!    are still loaded; that is the contract of the `unsafe`
//!    [`DwarfUnwinder::from_modules`]. (The compact rows are copies, owned by
//!    the unwinder.) Otherwise a capture after `dlclose` reads unmapped
//!    memory.
//! 5. Every step MUST move up the stack: frame records strictly increase,
//!    and a step that yields a frame must raise the stack pointer. Otherwise
//!    a corrupt or cyclic chain loops until the depth limit, emitting
//!    garbage.
//! 6. A memoized capture MUST give exactly the full walk's `out[..len]` and
//!    `truncated` (`capture_from_compact`'s, itself framehop's), and MUST
//!    take a previous frame only after re-reading every stack word the
//!    previous walk's steps read from the matched frame on (and the word
//!    that decided how it ended, when that end is reused). A match needs the
//!    same return address, stack pointer and frame kind, and the same rbp
//!    when a re-checked step further out uses rbp as an address. Matching a
//!    frame's return address and its slot is not enough: with `main`
//!    calling `Y()` then `Z()`, both calling `X()` with equal frame sizes,
//!    `X`'s frames match while the word above them holds a return address
//!    into `Y` before and into `Z` now (tests/differential.rs and
//!    tests/memo.rs check this trap). A step the memo cannot re-check
//!    (framehop's, a signal frame's, a failed ending) is never taken: it is
//!    walked again. Otherwise the trace reports call stacks the program
//!    never had.
//! 7. A capture MUST NOT panic: no unwrap, no failing index, checked or
//!    wrapping arithmetic on addresses; framehop and gimli report malformed
//!    tables as errors (their readers are bounds-checked), which end the
//!    walk. Otherwise a panic would unwind into the traced program's malloc.

#![warn(unsafe_op_in_unsafe_fn)]

mod bounds;
mod dwarf;
mod fp;
mod memo;
mod modules;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod step;
mod table;
mod walker;

pub use bounds::StackBounds;
pub use dwarf::{DwarfCache, DwarfUnwinder, MappedBytes, FALLBACK_CACHES};
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub use fp::capture_fp_raw;
pub use fp::{capture_fp, walk_fp_chain, TRUNCATED_BIT};
pub use memo::{MemoWalk, WalkMemo, MEMO_DEPTH};
pub use modules::{LoadSegment, ModuleInfo, Modules};
pub use step::set_walk_end;
/// [`capture_dwarf`], memoized: the same `out[..len]` and `truncated` as
/// `capture_dwarf(skip, ...)` called at this point, plus `shared` (see
/// [`MemoWalk`]). It is [`capture_here`], under the name that pairs it
/// with `capture_dwarf`.
pub use walker::capture_here as capture_dwarf_memo;
pub use walker::{
    capture_dwarf, capture_from, capture_from_compact, capture_from_framehop, capture_from_lazy,
    capture_here, StartRegs,
};

/// The default depth limit (frames per capture), as heaptrack's.
pub const DEFAULT_DEPTH: usize = 64;

/// The result of a capture: `len` addresses were written to the front of
/// the output slice; `truncated` says the walk stopped before the end of
/// the stack (depth limit, a bad frame pointer, an unreadable or
/// out-of-bounds address, a frame no rule could unwind).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Walk {
    /// Addresses written, innermost first.
    pub len: usize,
    /// The stack goes on beyond the last address (or could not be followed).
    pub truncated: bool,
}
