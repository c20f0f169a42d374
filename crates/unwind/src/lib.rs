//! In-process native stack capture for alloctrace: the unwinder the
//! LD_PRELOAD shim and `trace_stack_capture` run from inside malloc.
//!
//! ## Design
//!
//! - **Three captures, one convention.** Each writes return addresses,
//!   innermost first, into a caller-owned `out: &mut [u64]` and returns a
//!   [`Walk`] `{ len, truncated }`. `out[0]` is the return address into the
//!   direct caller of the capture function; `skip` drops that many
//!   innermost addresses first (the tracer's own frames); `out.len()` is
//!   the depth limit, which the caller picks ([`DEFAULT_DEPTH`] = 64, as
//!   heaptrack; a deeper stack gives exactly `out.len()` addresses,
//!   truncated). Addresses are return addresses (the instruction after the
//!   call): a symbolizer looks up `address - 1`. The one exception is the
//!   frame a signal interrupted, whose exact pc the DWARF walk reports.
//!   - [`capture_fp`]: the frame-pointer walk. A naked entry point pushes a
//!     frame record of its own and follows the saved-rbp chain from it
//!     (about 1.8 ns per frame). It sees only frames that keep frame
//!     pointers; a frame without one is skipped (its caller's record is
//!     next) or, if the frame left garbage in rbp, ends the walk.
//!     Optimised Rust uses rbp as an ordinary register, so `capture_fp`
//!     called from a release-built Rust malloc wrapper stops after one
//!     frame unless that code is built with `-C force-frame-pointers=yes`.
//!   - [`capture_mixed`]: the fast mode for such callers. It unwinds its own
//!     frame and the `skip` frames above it by CFI (the tracer's frames:
//!     cache hits), which recovers the rbp the traced program's frame had,
//!     then walks frame pointers from there.
//!   - [`capture_dwarf`]: the full mode. framehop unwinds every frame by its
//!     module's `.eh_frame` rule, with a per-thread rule cache
//!     ([`DwarfCache`], 509 slots keyed by address) and fixed-size DWARF
//!     evaluation storage (`MustNotAllocateDuringUnwind`); where no rule
//!     exists (no module, no FDE: JIT code, hand-written stubs) framehop
//!     falls back to the frame pointer. Signal frames are crossed by reading
//!     the interrupted registers from the kernel's `ucontext_t` (framehop
//!     cannot apply `__restore_rt`'s CFI expression). About 7-10 ns per
//!     frame with a warm cache.
//! - **Stack bounds** ([`StackBounds::current`]) are found once per thread
//!   at thread set-up, with `pthread_getattr_np`: for a `pthread_create`
//!   thread its allocated stack; for the main thread glibc reads
//!   `/proc/self/maps` and reports the `[stack]` mapping's top as `hi` and
//!   `hi - RLIMIT_STACK` as `lo`. We use glibc's answer rather than parsing
//!   the maps ourselves: it is the same computation, and it also covers
//!   threads with user-provided stacks. A walk then reads only
//!   `[max(lo, sp), hi)`: every frame of the capture's callers lies above
//!   its own stack pointer, so the unmapped part of the main thread's
//!   rlimit range is never touched. `StackBounds` is `!Send`: bounds stay
//!   on the thread that found them.
//!   [`StackBounds::from_maps`] is the same without malloc, locks or
//!   stdio, for the C API's first capture on a thread the host did not
//!   describe, which may run inside the host's malloc (where
//!   `pthread_getattr_np`, which mallocs and `fopen`s, must not run): raw
//!   `open`/`read`/`close` of `/proc/self/maps` through a 4 KiB stack
//!   buffer, the readable mapping holding the stack pointer parsed by hand
//!   (for the main thread's `[stack]`, `lo` extended to where it may grow,
//!   as glibc does). System calls, but once per thread.
//! - **Memoized captures** ([`capture_dwarf_memo`], [`capture_mixed_memo`],
//!   with a per-thread [`WalkMemo`]): consecutive allocations on a thread
//!   usually share most outer frames (a Python interpreter: 30-60 native
//!   frames per malloc, ~10 ns each by CFI). The memo keeps, per kept frame
//!   of the previous walk, its return address, the unwinding state after
//!   it (rsp, rbp, and whether the walk goes on by CFI from a return
//!   address, from an interrupted pc, or by frame record) and the stack
//!   words its step read (the return address at `rsp - 8`; the saved rbp
//!   and where it was; for a signal frame the ucontext's rip, rsp and rbp
//!   at the previous frame's rsp); how the walk ended (and the words that
//!   decided it) or the frame beyond the depth limit; the unwinder and the
//!   capture kind. A new walk goes from the innermost frame as the plain
//!   one; after each kept frame it looks (cursor over increasing stack
//!   pointers) for a previous frame in the same state, rbp aside. From
//!   there the previous walk is a deterministic function of the words it
//!   read and of that frame's rbp, so it re-reads each of them through the
//!   fence: while they hold, its frames are taken (copied) instead of
//!   unwound; the first that does not hold resumes the walk from the last
//!   frame that did. Where the rbp differs (optimised code keeps anything
//!   in rbp, e.g. a caller's loop counter, and the frames that do not save
//!   it pass it through unchanged), a frame is taken only while each step
//!   from the match on is known to pass rbp through (the new walk's rbp
//!   goes into the taken frame) until one is known to replace it by a
//!   stack word it read; a step not known so (it may use rbp: a CFA
//!   `rbp + 16`, a frame record) is walked, and so is the end of the walk
//!   while rbp still differs. What a step does with rbp is learnt when two
//!   walks take it from the same pc and rsp with different rbp values
//!   (same return address, rsp and addresses read: rbp passed through both
//!   times, or read from the same address) and kept with the frame in the
//!   memo: from the third capture on, a call site under a varying rbp
//!   matches at its first frames. A DWARF walk that skips nothing (the
//!   writer's: it keeps the tracer's own frames and drops them itself)
//!   also matches its starting state (the capture function's rip, rsp and
//!   rbp, as an interrupted pc) before any step, so a repeated capture
//!   re-reads even the capture function's own step instead of unwinding it:
//!   no CFI step at all when nothing changed. The result
//!   (`out[..len]`, `truncated`) is exactly the plain capture's; `shared`
//!   counts the outermost frames taken from the previous walk up to its
//!   end, so a caller that interned the previous stack outermost-first
//!   reuses those nodes. The new frames are written over the previous
//!   walk's dead ones (below the current stack pointer), so frames that
//!   keep their indices are not moved; a memo is two banks of
//!   [`MEMO_DEPTH`] + 1 frames (about 17 KiB), no heap. In the benchmark
//!   (60-frame chain, 69 frames captured) a DWARF capture goes from
//!   ~690 ns to ~210 ns from the same call site and ~290 ns alternating
//!   between two (66 frames shared). With rbp a counter passed through the
//!   10 innermost frames of a 49-frame stack (the benchmark's rbp rows),
//!   ~420 ns before (13 frames walked, plain ~520 ns) and ~220 ns with
//!   rbp matched as above (1 walked); same-site captures ~10-15 ns less
//!   (no step from the capture's own frame). Under the shim, bench/workload
//!   in full mode: ~135-150 ns per operation before, ~115 ns after (55 ns
//!   without stacks). The mixed
//!   walk reads frame records at ~2 ns per frame, less than checking and
//!   copying them (~300 ns against ~145 ns for 64 frames): there the gain
//!   is `shared` alone (fewer frames to intern).
//! - **Modules.** [`Modules::snapshot`] reads `dl_iterate_phdr` once at
//!   start and again after each `dlopen`/`dlclose` (the shim's own wrappers
//!   say when), never per capture. Per loaded object it records the path,
//!   the GNU build ID (from the in-memory `PT_NOTE`), the load bias, the
//!   `PT_LOAD` segments and their span, and the `.eh_frame_hdr` (from
//!   `PT_GNU_EH_FRAME`) and `.eh_frame` addresses: what the writer's module
//!   table needs ([`ModuleInfo`]). [`DwarfUnwinder::from_modules`] hands the
//!   in-memory `.eh_frame_hdr`/`.eh_frame` of each object to framehop (no
//!   file I/O). After a change the owner builds a new unwinder and swaps
//!   it in; each thread keeps its [`DwarfCache`] (framehop tags cached rules
//!   with a modules generation, so rules of the old set are not reused).
//!
//! ## Invariants
//!
//! 1. A capture MUST NOT allocate, not even through Rust's global
//!    allocator: it uses only the caller's `out`, the stack, the shared
//!    unwinder and the caller's cache and memo, built at set-up. Otherwise it
//!    re-enters the malloc it runs in (recursion, or a deadlock on the
//!    allocator's lock). tests/no_alloc.rs counts 0 allocations (Rust's
//!    and the C library's) in 10,000 captures of each kind, memoized ones
//!    included, and in `StackBounds::from_maps`.
//! 2. A capture MUST NOT take a lock or make a system call: no
//!    `dl_iterate_phdr` (the loader's lock: libunwind's and DataDog's
//!    deadlocks), no `/proc` reads (only [`StackBounds::from_maps`], once
//!    per thread, before its first capture), no `pthread_*` calls; memory is validated
//!    by bounds, not by probing with a system call per read (pprof-rs's
//!    `write()` trick). Otherwise it can deadlock against the thread that
//!    holds the lock, and it would cost microseconds per frame.
//! 3. Every stack read MUST be 8-byte aligned and inside
//!    `[max(lo, sp), hi)` of the calling thread. Otherwise a garbage frame
//!    pointer (any -O2 code may leave one in rbp) faults inside the host's
//!    malloc.
//! 4. Reads of unwind tables and code (the signal trampoline check) MUST
//!    stay inside objects of the snapshot that are still loaded; that is
//!    the contract of the `unsafe` [`DwarfUnwinder::from_modules`].
//!    Otherwise a capture after `dlclose` reads unmapped memory.
//! 5. Every step MUST move up the stack: frame records strictly increase,
//!    and a CFI step must raise the stack pointer. Otherwise a corrupt or
//!    cyclic chain loops until the depth limit, emitting garbage.
//! 6. A memoized capture MUST give exactly the plain capture's `out[..len]`
//!    and `truncated`, and MUST take a previous frame only after re-reading,
//!    through the fence, every stack word the previous walk's steps read
//!    from the matched frame on (and the words that decided how it ended,
//!    when that end is reused). Matching a frame's return address and
//!    return-address slot is not enough: with `main` calling `Y()` then
//!    `Z()`, both calling `X()` with equal frame sizes, `X`'s frames match
//!    while the word above them holds a return address into `Y` before and
//!    into `Z` now (tests/memo.rs checks this trap, and fails without the
//!    re-read). A step the memo cannot re-check (a DWARF expression rule,
//!    more than two reads, a failed read framehop ignored) is never taken,
//!    nor is a step from a frame whose rbp differs from the previous
//!    walk's unless two walks showed that the step passes rbp through or
//!    replaces it by a word read at an address independent of it
//!    (tests/memo.rs `an_rbp_that_a_later_step_uses_is_compared` fails
//!    when the frames after such a match are taken regardless).
//!    Otherwise the trace reports call stacks the program never had.
//! 7. A capture MUST NOT panic: no unwrap, no failing index, wrapping
//!    arithmetic on addresses; framehop and gimli report malformed tables
//!    as errors (their readers are bounds-checked), which end the walk.
//!    Otherwise a panic would unwind into the traced program's malloc.
//!
//! ## Corner cases
//!
//! - **Truncated** means the walk stopped before the end of the stack: the
//!   depth limit was reached with frames left, or a frame pointer was out
//!   of bounds, misaligned or not increasing, or a read failed, or no rule
//!   could unwind a frame. It is not set when the walk reached the
//!   outermost frame (a saved rbp or return address of 0, set by `_start`
//!   and by `clone` for every thread; or a CFI end-of-stack rule).
//!   A frame-pointer walk that skips a frame without a frame pointer does
//!   not know it did: its stack is short but not marked truncated.
//! - **Signal handlers** on the thread's stack: the DWARF walk continues
//!   into the interrupted code; the frame-pointer walks follow the
//!   handler's records into the interrupted code's (missing the
//!   interrupted frame itself). On `sigaltstack` or a `makecontext`
//!   stack the stack pointer is outside the thread's bounds: the capture
//!   reads nothing and returns `{ len: 0, truncated: true }` (a caller that
//!   knows the alternate stack may pass [`StackBounds::from_raw`]).
//! - **dlopen/dlclose**: a capture never sees a module loaded after its
//!   unwinder was built (its frames fall back to frame pointers); the owner
//!   rebuilds after the real call returns. For `dlclose`, no capture may
//!   use the old unwinder once the object is unmapped and another can be
//!   mapped at its address (invariant 4).
//! - **fork**: the child has the parent's mappings, so the forking
//!   thread's bounds, snapshot and cache stay valid in it.
//! - **Thread exit**: bounds and cache are per-thread values the owner
//!   frees with its thread state; nothing here is global.
//! - **JIT code, code without CFI**: framehop's frame-pointer fallback.
//! - **The vDSO** is a module (it has `.eh_frame_hdr`) named
//!   `linux-vdso.so.1`, with no file behind it.
//! - **Memo soundness**: the walk from a frame is a function of its
//!   unwinding state (pc, rsp, rbp, frame kind), the unwind rules (the
//!   memo records which unwinder made it: a rebuilt one after
//!   dlopen/dlclose is not trusted) and the stack words it reads, all of
//!   which are compared, so a taken frame is what the plain walk would
//!   give. What the comparison cannot see is a rule it does not model: the
//!   rbp a frame-pointer rule (`CFA = rbp + 16`: `alloca`, VLAs, stack
//!   realignment, `-O0` code) starts from is part of the compared state,
//!   (or, when it differs, must not be used by any step taken, below) and
//!   the words it reads are re-read, so a frame whose layout changed
//!   (a larger `alloca` this time) is not taken even if its old slots
//!   still hold the old return addresses; that case, which the plain
//!   (ra, slot) check of the outer return addresses would get wrong, is
//!   covered. So is a frame record whose saved-rbp word changed while its
//!   return-address word did not: checking only the return-address words
//!   (and matching frames without their rbp, unconditionally) reuses a
//!   stale chain there, and tests/memo.rs
//!   (`how_the_previous_walk_ended_is_checked_again`) fails with that
//!   weaker check. Rules that read registers other than rsp/rbp/rip do not
//!   exist in framehop's x86_64 model; a rule that reads through a DWARF
//!   expression is opaque (never taken). What a step does with rbp is
//!   learnt, not read from the rule (framehop does not expose it), by
//!   comparing two walks through it with different rbp values: framehop's
//!   x86_64 rules use rbp not at all, pass it through, or as the base of
//!   an address (CFA = rbp + c, the frame-pointer fallback, a frame
//!   record), which moves the new rsp or an address read, so two values
//!   tell them apart; a DWARF value expression of rbp that gives rbp back
//!   at two values and something else at a third would not be told apart
//!   (compilers emit none: rbp's rules are same-value, a CFA offset, or a
//!   frame base). `shared` is conservative: it is
//!   0 when the match is not followed to the previous walk's end (or the
//!   truncation differs), even if the stacks are the same. An rbp that
//!   differs between two calls at an inner frame (optimised code using
//!   rbp as a general register) delays the match, the first time, to the
//!   next frame that restores rbp (the steps in between are walked, and
//!   learnt); the frames in between, at the same stack addresses with the
//!   same return addresses as the previous walk's, still count in
//!   `shared` once that match is followed to the end. A memo used on another thread, or after its thread's stack was
//!   reused, matches nothing it cannot verify.
//! - **Depth limits**: a previous walk that stopped at its limit recorded
//!   the frame beyond it; a new walk with the same or a smaller limit that
//!   reaches it takes it as its own frame beyond the limit (truncated), a
//!   walk with more room takes it as a kept frame and unwinds on from it.
//!   `out.len()` above [`MEMO_DEPTH`] walks without the memo.
//! - **Other targets** than x86_64 Linux: captures return
//!   `{ len: 0, truncated: true }`; the module snapshot works on any glibc.

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
pub use dwarf::{
    capture_dwarf, capture_mixed, DwarfCache, DwarfUnwinder, MappedBytes, FALLBACK_CACHES,
};
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub use fp::capture_fp_raw;
pub use fp::{capture_fp, walk_fp_chain, TRUNCATED_BIT};
pub use memo::{capture_dwarf_memo, capture_mixed_memo, MemoWalk, WalkMemo, MEMO_DEPTH};
pub use modules::{LoadSegment, ModuleInfo, Modules};
pub use walker::{
    capture_from, capture_from_compact, capture_from_framehop, capture_here, StartRegs,
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
