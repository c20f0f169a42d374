//! The alloctrace writer core: records the allocations and frees of a
//! runtime or a custom allocator into a compact binary trace, at a few
//! nanoseconds per event. It exports no C symbols: the C API (the root
//! `alloctrace` crate, `liballoctrace.so`) and the LD_PRELOAD shim
//! (`crates/preload`) are both built on this crate's Rust API.
//!
//! Layers:
//! - [`events`]: the event calls (heap objects, spans, stacks, pages) and
//!   the type table;
//! - the session layer: `session` (the session's state; its module docs
//!   state the design and invariants of the layer), `emit` (the event
//!   path), `meta` (the tracer's own batches; `process`, the command line
//!   its process batch carries), `lifecycle` (start, advance,
//!   stop), `late` (the events after a stop at exit, counted), `advancer`,
//!   `fork`;
//! - `thread`, `handshake`, `buffer`, `writer` (the writer thread),
//!   `tables` (the stack tables it lists before each batch, so a cut
//!   trace keeps its stacks), `output`, `clock`, `type_table`, `shared`, `tls`: the machinery under
//!   it, which never imports the session layer (what it needs of a session
//!   is passed down);
//! - `crash`: [`flush_for_fatal_signal`], saving the trace from the handler
//!   of a signal that is about to kill the process.
//!
//! The wire format is specified in docs/FORMAT.md and coded in the
//! `alloctrace-format` crate, which the reader shares.
#![warn(unsafe_op_in_unsafe_fn)]

mod handshake;
mod sync;

#[cfg(not(loom))]
mod advancer;
#[cfg(not(loom))]
mod buffer;
#[cfg(not(loom))]
mod call_stack_table;
#[cfg(not(loom))]
pub mod capture;
#[cfg(not(loom))]
mod clock;
#[cfg(not(loom))]
mod crash;
#[cfg(not(loom))]
mod deadline;
#[cfg(not(loom))]
mod emit;
#[cfg(not(loom))]
pub mod events;
#[cfg(not(loom))]
mod fork;
#[cfg(not(loom))]
mod frame_table;
#[cfg(not(loom))]
mod host;
#[cfg(not(loom))]
mod late;
#[cfg(not(loom))]
mod lifecycle;
#[cfg(not(loom))]
mod limits;
#[cfg(not(loom))]
mod lost;
#[cfg(not(loom))]
mod meta;
#[cfg(not(loom))]
mod module_table;
#[cfg(not(loom))]
mod output;
#[cfg(not(loom))]
mod process;
#[cfg(not(loom))]
mod reserved;
#[cfg(not(loom))]
mod session;
#[cfg(not(loom))]
pub mod shared;
#[cfg(not(loom))]
mod tables;
#[cfg(not(loom))]
mod thread;
#[cfg(not(loom))]
pub mod tls;
#[cfg(not(loom))]
mod type_table;
#[cfg(not(loom))]
mod writer;

#[cfg(not(loom))]
pub use clock::{ClockKind, COARSE_PERIOD};
#[cfg(not(loom))]
pub use crash::{flush_for_fatal_signal, FatalFlush};
#[cfg(not(loom))]
pub use emit::enabled;
#[cfg(not(loom))]
pub use late::late_event;
#[cfg(not(loom))]
pub use lifecycle::{advance, start, start_with, stop, stop_at_exit};
#[cfg(not(loom))]
pub use meta::{written_totals, WrittenTotals};
#[cfg(not(loom))]
pub use output::Output;
#[cfg(not(loom))]
pub use session::{
    session_stats, Config, Error, SessionStats, DEFAULT_BUFFER_SIZE, DEFAULT_GENERATION_BYTES,
    MAX_BUFFER_SIZE, MIN_BUFFER_SIZE,
};

#[cfg(loom)]
pub use handshake::{heavy_barrier, SeqLock};

/// Test hooks of the handshake (tests/membarrier_failure.rs).
#[cfg(not(loom))]
#[doc(hidden)]
pub use handshake::{asymmetric_fences, inject_membarrier_failures, MEMBARRIER_ATTEMPTS};

/// Test hook of the buffer pool (tests/map_failure.rs).
#[cfg(not(loom))]
#[doc(hidden)]
pub use buffer::inject_map_failures;
