//! The event calls, as Rust functions. The C API (capi.rs) forwards to
//! these; Rust runtimes can call them directly.
//!
//! Every function here must not allocate, lock or panic: they run inside
//! the host's malloc. Before start and after stop they cost one relaxed
//! load and a branch.

use alloctrace_format::stacks::FrameWord;
use alloctrace_format::EventKind;

use crate::event::emit::{emit, emit_tagged, emit_with_stack};
use crate::event::sample;
pub use crate::event::sample::Unsampled;

pub use alloctrace_format::EntryPoint;

/// A span of `npages` pages at `base` existed when tracing started.
#[inline]
pub fn span_exists(base: usize, npages: usize, kind_class: u64) {
    emit::<{ EventKind::SpanExists as u8 }>(base as u64, npages as u64, kind_class);
}

/// A span of `npages` pages was allocated at `base`.
#[inline]
pub fn span_alloc(base: usize, npages: usize, kind_class: u64) {
    emit::<{ EventKind::SpanAlloc as u8 }>(base as u64, npages as u64, kind_class);
}

/// A span of `npages` pages was allocated at `base` by the call stack
/// `stack_id` ([`stack_register`]). Stack 0 records it without a stack; an
/// ID that names no stack too, counted in the generation's `lost_stacks`.
#[inline]
pub fn span_alloc_stack(base: usize, npages: usize, kind_class: u64, stack_id: u64) {
    emit_with_stack::<{ EventKind::SpanAllocStack as u8 }, false>(
        base as u64,
        npages as u64,
        kind_class,
        stack_id,
        0,
    );
}

/// The span at `base` is about to be freed.
#[inline]
pub fn span_free(base: usize) {
    emit::<{ EventKind::SpanFree as u8 }>(base as u64, 0, 0);
}

/// A heap object of `size` bytes existed at `addr` when tracing started.
/// In sampling mode, recorded when sampled (as an allocation, not counted
/// in the totals).
#[inline]
pub fn heap_object_exists(addr: usize, size: u64, type_id: u64) {
    if sample::sample_exists(addr as u64, size) {
        emit::<{ EventKind::HeapObjectExists as u8 }>(addr as u64, size, type_id);
    }
}

/// A heap object of `size` bytes was allocated at `addr`. In sampling
/// mode, counted, and recorded when sampled ([`sample_alloc`]).
#[inline]
pub fn heap_object_alloc(addr: usize, size: u64, type_id: u64) {
    if sample::sample_alloc(addr as u64, size) {
        sampled::heap_object_alloc(addr, size, type_id);
    }
}

/// A heap object of `size` bytes was allocated at `addr` by the call stack
/// `stack_id` ([`stack_register`]). Stack 0 records it without a stack; an
/// ID that names no stack too, counted in the generation's `lost_stacks`.
/// In sampling mode, as [`heap_object_alloc`].
#[inline]
pub fn heap_object_alloc_stack(addr: usize, size: u64, type_id: u64, stack_id: u64) {
    // Sampling mode out of line: otherwise this is a load, a branch and the
    // event, with no registers saved (a runtime's every allocation).
    if crate::sampling::SAMPLE_BYTES.load(core::sync::atomic::Ordering::Relaxed) != 0 {
        return heap_object_alloc_stack_sampling(addr, size, type_id, stack_id);
    }
    sampled::heap_object_alloc_stack(addr, size, type_id, stack_id);
}

/// [`heap_object_alloc_stack`] in sampling mode.
#[cold]
#[inline(never)]
fn heap_object_alloc_stack_sampling(addr: usize, size: u64, type_id: u64, stack_id: u64) {
    if sample::sample_alloc(addr as u64, size) {
        sampled::heap_object_alloc_stack(addr, size, type_id, stack_id);
    }
}

/// The heap object at `addr` is about to be freed. In sampling mode,
/// counted, and recorded when its allocation was ([`sample_free`]).
#[inline]
pub fn heap_object_free(addr: usize) {
    if sample::sample_free(addr as u64) {
        sampled::heap_object_free(addr);
    }
}

/// Sampling mode (`Config::sample_bytes`): whether the heap-object
/// allocation of `size` bytes at `addr` is to be recorded. Always true
/// outside sampling mode (one load and a branch). In sampling mode the
/// allocation is counted in the exact totals and drawn by the thread's
/// countdown; when sampled, `addr` enters the set of sampled addresses
/// (which [`sample_free`] consults), and the caller records it with its
/// call stack through [`sampled`] or [`tagged`]. For a caller that must
/// decide before it captures a stack (the LD_PRELOAD shim, the C API's
/// capturing calls); [`heap_object_alloc`] calls it itself. Never
/// allocates nor locks.
#[inline]
pub fn sample_alloc(addr: usize, size: u64) -> bool {
    sample::sample_alloc(addr as u64, size)
}

/// The running session's mean bytes between sampled allocations, 0 when
/// it records every allocation: the switch, loaded once, for a caller that
/// goes on to [`sample_alloc_at`].
#[inline]
pub fn sample_bytes() -> u64 {
    crate::sampling::SAMPLE_BYTES.load(core::sync::atomic::Ordering::Relaxed)
}

/// [`sample_alloc`] in a sampling session whose mean `mean` (not 0) the
/// caller loaded with [`sample_bytes`]: the switch is not loaded again.
#[inline]
pub fn sample_alloc_at(mean: u64, addr: usize, size: u64) -> bool {
    sample::sample_alloc_at(mean, addr as u64, size)
}

/// Sampling mode: whether the free of the heap object at `addr` is to be
/// recorded, that is whether its allocation was (it then leaves the set of
/// sampled addresses, so call it once per free, before the memory goes
/// back to the allocator). Always true outside sampling mode. Counts the
/// free in the exact totals. Never allocates nor locks.
#[inline]
pub fn sample_free(addr: usize) -> bool {
    sample::sample_free(addr as u64)
}

/// Sampling mode's fast path for an interposer (see [`Unsampled`]), once
/// [`sampling`] said the session samples: the calling thread's countdown
/// and counts when the session records,
/// the thread has its slot and the client's TLS word
/// ([`crate::tls::Word::Client`], the shim's reentrancy state) is below
/// `client_below`, else `None`. With it the interposer
/// decides before anything else ([`Unsampled::skips`],
/// [`Unsampled::free_skips`]) and only counts what is not sampled; the
/// rest goes through [`sample_alloc`] and [`sample_free`]. Never
/// allocates, locks or panics; no system call.
#[inline(always)]
pub fn unsampled(client_below: usize) -> Option<Unsampled> {
    sample::unsampled(client_below)
}

/// Whether the running session samples (`Config::sample_bytes` > 0).
#[inline]
pub fn sampling() -> bool {
    crate::sampling::SAMPLE_BYTES.load(core::sync::atomic::Ordering::Relaxed) != 0
}

/// The heap-object events without the sampling decision, for a caller
/// that made it with [`sample_alloc`] and [`sample_free`].
pub mod sampled {
    use super::*;

    /// [`super::heap_object_alloc`], recorded.
    #[inline]
    pub fn heap_object_alloc(addr: usize, size: u64, type_id: u64) {
        emit::<{ EventKind::HeapObjectAlloc as u8 }>(addr as u64, size, type_id);
    }

    /// [`super::heap_object_alloc_stack`], recorded.
    #[inline]
    pub fn heap_object_alloc_stack(addr: usize, size: u64, type_id: u64, stack_id: u64) {
        emit_with_stack::<{ EventKind::HeapObjectAllocStack as u8 }, false>(
            addr as u64,
            size,
            type_id,
            stack_id,
            0,
        );
    }

    /// [`super::heap_object_free`], recorded.
    #[inline]
    pub fn heap_object_free(addr: usize) {
        emit::<{ EventKind::HeapObjectFree as u8 }>(addr as u64, 0, 0);
    }
}

/// A stack of `size` bytes at `base` existed when tracing started.
#[inline]
pub fn stack_exists(base: usize, size: usize) {
    emit::<{ EventKind::StackExists as u8 }>(base as u64, size as u64, 0);
}

/// A stack of `size` bytes was allocated at `base`.
#[inline]
pub fn stack_alloc(base: usize, size: usize) {
    emit::<{ EventKind::StackAlloc as u8 }>(base as u64, size as u64, 0);
}

/// The stack at `base` is about to be freed.
#[inline]
pub fn stack_free(base: usize) {
    emit::<{ EventKind::StackFree as u8 }>(base as u64, 0, 0);
}

/// Registers a type for heap object events and returns its ID (at least
/// 1), or 0 when the table is full. Names longer than 1024 bytes are cut.
/// Works before tracing starts; every call makes a new ID.
pub fn type_register(name: &[u8], size: u64, ptr_bytes: u64) -> u64 {
    crate::type_table::register(name, size, ptr_bytes)
}

/// The most frames a registered stack keeps: deeper stacks keep their
/// innermost `MAX_STACK_DEPTH - 1` frames under the truncation marker. The
/// format's limit (docs/FORMAT.md section 10), which readers enforce.
pub const MAX_STACK_DEPTH: usize = alloctrace_format::stacks::MAX_STACK_DEPTH;

/// The bit of a registered frame's value: no user-space address has it.
pub const REGISTERED_FRAME: u64 = alloctrace_format::stacks::REGISTERED_FRAME_BIT;

/// Registers a frame of a runtime's own code (a Lua or Python function, a
/// JIT stub) and returns its frame value, `REGISTERED_FRAME | id`: never a
/// native address. 0 when the frame table is full. Names longer than 1024
/// bytes are cut. Works before tracing starts; every call makes a new frame.
/// Never allocates nor locks (a runtime may call it inside malloc).
pub fn frame_register(function: &[u8], file: &[u8], line: u32) -> u64 {
    match crate::stacks::frame_table::register(function, file, line) {
        0 => 0,
        id => REGISTERED_FRAME | id,
    }
}

/// The frame word (docs/FORMAT.md) of a frame value: a native return
/// address or a value from [`frame_register`]; `None` for 0 and for a
/// registered value that names no frame. Inlined: `stack_push` runs at
/// every allocation of a runtime that keeps its callers' stack IDs.
#[inline(always)]
fn frame_word(value: u64) -> Option<u64> {
    let frame = FrameWord::from_api_value(value);
    let known = match frame {
        FrameWord::Native(addr) => addr != 0,
        FrameWord::Registered(id) => crate::stacks::frame_table::is_defined(id),
    };
    known.then(|| frame.word())
}

/// Interns a call stack given innermost frame first, native return
/// addresses and [`frame_register`] values freely mixed, and returns its
/// stack ID (stable for the process); 0 ("no stack") for an empty stack, a
/// frame value that is 0 or names no registered frame, or a full table.
/// A stack deeper than [`MAX_STACK_DEPTH`] keeps its innermost frames
/// under the truncation marker. Never allocates nor locks.
pub fn stack_register(frames: &[u64]) -> u64 {
    let kept = if frames.len() > MAX_STACK_DEPTH {
        &frames[..MAX_STACK_DEPTH - 1]
    } else {
        frames
    };
    let marker = (kept.len() < frames.len()).then_some(Some(FrameWord::TRUNCATED.word()));
    let outermost_first = marker
        .into_iter()
        .chain(kept.iter().rev().map(|&value| frame_word(value)));
    u64::from(crate::stacks::call_stack_table::intern_outermost_first(
        outermost_first,
    ))
}

/// The stack ID of `parent` (a stack ID from [`stack_register`] or this
/// function; 0: none, `frame` is then the outermost frame) with `frame`
/// (a native return address or a [`frame_register`] value) as its
/// innermost frame, interned if new: O(1), however deep the stack. 0 for
/// a `parent` that names no stack, a `frame` that is 0 or names no
/// registered frame, a full table, or a stack that would be deeper than
/// [`MAX_STACK_DEPTH`] frames (the caller registers the whole stack with
/// [`stack_register`] instead, which keeps its innermost frames under the
/// truncation marker). Never allocates nor locks.
#[inline]
pub fn stack_push(parent: u64, frame: u64) -> u64 {
    let Some(word) = frame_word(frame) else {
        return 0;
    };
    u64::from(crate::stacks::call_stack_table::intern_onto(
        parent,
        word,
        MAX_STACK_DEPTH,
    ))
}

/// The calling thread's trace thread ID (as in the trace's batch headers),
/// claiming a slot if needed; 0 when tracing is off or no slot is free.
pub fn thread_id() -> u64 {
    if !crate::event::emit::enabled() {
        return 0;
    }
    match crate::thread::current_or_claim() {
        Some(slot) => slot.id.load(core::sync::atomic::Ordering::Relaxed),
        None => 0,
    }
}

/// The calling thread's writer state, claiming it if needed: the handle
/// that the C header's inline event path (`trace_writer_get`) writes
/// through. Null on the tracer's own threads and when every slot is taken.
/// The handle is the calling thread's until it exits or calls
/// [`thread_destroy`]; its owner check makes a stale or foreign handle fall
/// back to the out-of-line path.
pub fn writer() -> *mut core::ffi::c_void {
    // The exit key makes the thread's exit give the slot back even when no
    // session has started yet.
    crate::thread::ensure_exit_key();
    match crate::thread::current_or_claim() {
        Some(slot) => (slot as *const crate::thread::ThreadSlot).cast_mut().cast(),
        None => core::ptr::null_mut(),
    }
}

/// Flushes the calling thread's buffers now and frees its slot. Its next
/// event starts a new slot with a new thread ID. (Thread exit flushes too,
/// but keeps the slot and ID until the thread is gone: thread.rs.)
pub fn thread_destroy() {
    crate::thread::release_current();
}

/// One event the caller could not record, counted in its generation's
/// `lost_events` (the shim counts so the calls of a thread whose tracing
/// a panic turned off). Never counted on the tracer's own threads.
#[cold]
pub fn lost() {
    crate::event::emit::count_lost_without_slot();
}

/// `npages` pages at `base` were allocated (page tracer).
#[inline]
pub fn page_alloc(base: usize, npages: usize) {
    crate::event::emit::emit_page(
        alloctrace_format::pages::KIND_ALLOC,
        base as u64,
        npages as u64,
    );
}

/// `npages` pages at `base` were freed (page tracer).
#[inline]
pub fn page_free(base: usize, npages: usize) {
    crate::event::emit::emit_page(
        alloctrace_format::pages::KIND_FREE,
        base as u64,
        npages as u64,
    );
}

/// `npages` pages at `base` were scavenged: returned to the OS (page tracer).
#[inline]
pub fn page_scav(base: usize, npages: usize) {
    crate::event::emit::emit_page(
        alloctrace_format::pages::KIND_SCAV,
        base as u64,
        npages as u64,
    );
}

/// The same events, tagged with the interposed function that made them, for
/// an interposer such as the LD_PRELOAD shim. Tag exactly one event per
/// call (FORMAT.md section 3), so that counting tags counts calls: for a
/// realloc that moves, the free of the old block is untagged and the alloc
/// of the new one is tagged. They record whatever the sampling mode: in
/// sampling mode the interposer decides first ([`sample_alloc`],
/// [`sample_free`]) and records only what is sampled.
pub mod tagged {
    use super::*;

    /// A heap object allocated by `entry`.
    #[inline]
    pub fn heap_object_alloc(entry: EntryPoint, addr: usize, size: u64) {
        emit_tagged::<{ EventKind::HeapObjectAlloc as u8 }, true>(
            addr as u64,
            size,
            0,
            entry as u64,
        );
    }

    /// A heap object allocated by `entry` with its call stack `stack_id`
    /// (from [`crate::stacks::capture::capture_stack_or_lost`]: an ID that names
    /// no stack records it without one, counted in `lost_stacks`).
    #[inline]
    pub fn heap_object_alloc_stack(entry: EntryPoint, addr: usize, size: u64, stack_id: u64) {
        emit_with_stack::<{ EventKind::HeapObjectAllocStack as u8 }, true>(
            addr as u64,
            size,
            0,
            stack_id,
            entry as u64,
        );
    }

    /// A span mapped by `entry` with its call stack (as above).
    #[inline]
    pub fn span_alloc_stack(
        entry: EntryPoint,
        base: usize,
        npages: usize,
        kind_class: u64,
        stack_id: u64,
    ) {
        emit_with_stack::<{ EventKind::SpanAllocStack as u8 }, true>(
            base as u64,
            npages as u64,
            kind_class,
            stack_id,
            entry as u64,
        );
    }

    /// A heap object freed by `entry`.
    #[inline]
    pub fn heap_object_free(entry: EntryPoint, addr: usize) {
        emit_tagged::<{ EventKind::HeapObjectFree as u8 }, true>(addr as u64, 0, 0, entry as u64);
    }

    /// A span mapped by `entry` (mmap, mremap).
    #[inline]
    pub fn span_alloc(entry: EntryPoint, base: usize, npages: usize, kind_class: u64) {
        emit_tagged::<{ EventKind::SpanAlloc as u8 }, true>(
            base as u64,
            npages as u64,
            kind_class,
            entry as u64,
        );
    }

    /// A span unmapped by `entry` (munmap).
    #[inline]
    pub fn span_free(entry: EntryPoint, base: usize) {
        emit_tagged::<{ EventKind::SpanFree as u8 }, true>(base as u64, 0, 0, entry as u64);
    }

    /// A call of `entry` that changed no memory: `free(NULL)`, a failed
    /// allocation.
    #[inline]
    pub fn call(entry: EntryPoint) {
        emit_tagged::<{ EventKind::Call as u8 }, true>(0, 0, 0, entry as u64);
    }
}
