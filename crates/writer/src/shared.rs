//! The state every event reads, in one cache line.
//!
//! The inline event path of `include/alloctrace_inline.h` reads it too,
//! through the pointer `alloctrace_inline_v1` that liballoctrace exports
//! (src/capi.rs), so that a disabled call is a load and a branch in the
//! caller, with no call. The header mirrors this layout; the offsets are
//! asserted below and must change together with the header (and its
//! `ALLOCTRACE_INLINE_ABI`, the version in that symbol's name).
//!
//! The static itself is an ordinary Rust static: never exported, so the
//! LD_PRELOAD shim's copy of this crate and liballoctrace's never bind to
//! each other's state, and Rust code reaches it without the GOT.

use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64};

/// Offset of a batch buffer's batch bytes from its header (buffer.rs): the
/// inline event path appends events there. Generated into the header with
/// [`inline_mode`] (crates/header-gen).
pub use crate::buffer::DATA_OFFSET as BATCH_DATA_OFFSET;

/// The call-stack table's node layout, which the inline path reads to
/// find whether a stack is already marked in the generation
/// (stacks/call_stack_table.rs, invariant 6, which asserts its `Node`
/// against these): the most nodes, a node's bytes and the offset of its
/// `used` pair. Generated into the header with [`BATCH_DATA_OFFSET`].
pub const CALL_STACK_MAX_NODES: usize = 1 << 20;
/// See [`CALL_STACK_MAX_NODES`].
pub const CALL_STACK_NODE_SIZE: usize = 48;
/// See [`CALL_STACK_MAX_NODES`].
pub const CALL_STACK_NODE_USED_OFFSET: usize = 16;

/// What the header's inline event path may do in the running session
/// (the `inline_mode` field of [`Shared`]).
pub mod inline_mode {
    /// Call the out-of-line function for every event: tracing is off, or
    /// the session needs something the inline path does not do (a clock
    /// other than rdtsc, or symmetric fences because membarrier is missing).
    pub const OUT_OF_LINE: u32 = 0;
    /// Stamp events with rdtsc.
    pub const PRECISE: u32 = 1;
    /// Stamp events with the published time (clock.rs, coarse clock), or
    /// the batch's last time if that is later (it never is while the
    /// published time only grows; the check keeps deltas unsigned).
    pub const COARSE: u32 = 2;
}

/// What the library's own fast path (event/emit.rs `write_event_fast`) may do in the
/// running session, an [`inline_mode`] value: the header's inline mode,
/// except that a session capturing call stacks in the C API's plain calls
/// or sampling keeps it (the header's inline path, which can do neither,
/// is out of line then; the library's callers capture and sample before
/// they emit). Written by start, before the first event.
pub(crate) static FAST_MODE: AtomicU32 = AtomicU32::new(inline_mode::OUT_OF_LINE);

/// See the module docs. Every field is written only under the tracer's
/// CONTROL lock (start, advance, stop), except `published_ticks`, which the
/// advancer thread writes.
#[repr(C, align(64))]
pub struct Shared {
    /// The current generation, or 0 while tracing is off. Stored by start,
    /// advance and stop; loaded by every event (session/mod.rs, invariant 1).
    pub(crate) generation: AtomicU64,
    /// Address compression parameters of the running session: written by
    /// start before `generation` becomes non-zero; read by events after
    /// they load it.
    pub(crate) min_heap_addr: AtomicU64,
    /// The coarse clock's published time (clock.rs).
    pub(crate) published_ticks: AtomicU64,
    pub(crate) page_shift: AtomicU32,
    pub(crate) heap_shift: AtomicU32,
    pub(crate) stack_shift: AtomicU32,
    /// One of [`inline_mode`]; set by start before the first generation.
    pub(crate) inline_mode: AtomicU32,
    /// The call-stack table's node array, null until it is mapped; then
    /// stored once, for good (stacks/call_stack_table.rs, invariant 6).
    pub(crate) call_stack_nodes: AtomicPtr<u8>,
}

/// The one instance.
pub static SHARED: Shared = Shared {
    generation: AtomicU64::new(0),
    min_heap_addr: AtomicU64::new(0),
    published_ticks: AtomicU64::new(0),
    page_shift: AtomicU32::new(12),
    heap_shift: AtomicU32::new(3),
    stack_shift: AtomicU32::new(12),
    inline_mode: AtomicU32::new(inline_mode::OUT_OF_LINE),
    call_stack_nodes: AtomicPtr::new(core::ptr::null_mut()),
};

// The layout the header's `struct alloctrace_shared_` mirrors.
static_assertions::const_assert_eq!(core::mem::offset_of!(Shared, generation), 0);
static_assertions::const_assert_eq!(core::mem::offset_of!(Shared, min_heap_addr), 8);
static_assertions::const_assert_eq!(core::mem::offset_of!(Shared, published_ticks), 16);
static_assertions::const_assert_eq!(core::mem::offset_of!(Shared, page_shift), 24);
static_assertions::const_assert_eq!(core::mem::offset_of!(Shared, heap_shift), 28);
static_assertions::const_assert_eq!(core::mem::offset_of!(Shared, stack_shift), 32);
static_assertions::const_assert_eq!(core::mem::offset_of!(Shared, inline_mode), 36);
static_assertions::const_assert_eq!(core::mem::offset_of!(Shared, call_stack_nodes), 40);
