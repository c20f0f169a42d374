//! The alloctrace writer core: records the allocations and frees of a
//! runtime or a custom allocator into a compact binary trace, at a few
//! nanoseconds per event. It exports no C symbols: the C API (the root
//! `alloctrace` crate, `liballoctrace.so`) and the LD_PRELOAD shim
//! (`crates/preload`) are both built on this crate's Rust API.
//!
//! Layers, top first, as folders (tests/module_graph.rs at the
//! workspace's root checks them, from the same table, with no module
//! cycle in any folder): a layer never imports one above it; what a lower
//! layer needs of a higher one is passed down (a trait, a function
//! pointer, a closure).
//! - `event/`: the event calls (`calls`, public as [`events`]) and the
//!   event path under them (`emit`);
//! - `session/`: the session's state (its module docs state the design
//!   and invariants of the layer), `lifecycle` (start, advance, stop),
//!   `meta` (the tracer's own batches; `process`, the command line its
//!   process batch carries), `host` (the session as the writer thread's
//!   `WriterHost`), `advancer`, `fork`, `crash`
//!   ([`flush_for_fatal_signal`], saving the trace from the handler of a
//!   signal that is about to kill the process) and its `deadline`;
//! - `writer/`: the writer thread, its `output`, `late` (the end batch
//!   that events after a stop at exit rewrite) and `flight` (the flight
//!   recorder's ring and its dumps);
//! - `stacks/`: call stacks: [`capture`] and the tables that intern them
//!   (`call_stack_table`, `frame_table`, `module_table`), listed before
//!   each batch (`tables`), so a cut trace keeps its stacks;
//! - the machinery, at the top level: `buffer`, `thread` (the slots),
//!   `handshake` (the seqlock and the heavy barrier), `sync`, `clock`,
//!   `shared`, [`tls`], `type_table`, `reserved` (the tables' memory),
//!   [`AddressSet`] (a lock-free set of addresses), `sampling` (sampling
//!   mode's countdowns, exact counts and set of sampled addresses), and
//!   the leaves `lost` (the lost counters) and `limits`.
//!
//! The wire format is specified in docs/FORMAT.md and coded in the
//! `alloctrace-format` crate, which the reader shares.
#![warn(unsafe_op_in_unsafe_fn)]

mod handshake;
mod sync;

#[cfg(not(loom))]
mod address_set;
#[cfg(not(loom))]
mod buffer;
#[cfg(not(loom))]
mod clock;
#[cfg(not(loom))]
mod event;
#[cfg(not(loom))]
mod limits;
#[cfg(not(loom))]
mod lost;
#[cfg(not(loom))]
mod reserved;
#[cfg(not(loom))]
mod sampling;
#[cfg(not(loom))]
mod session;
#[cfg(not(loom))]
pub mod shared;
#[cfg(not(loom))]
mod stacks;
#[cfg(not(loom))]
mod thread;
#[cfg(not(loom))]
mod thread_counts;
#[cfg(not(loom))]
pub mod tls;
#[cfg(not(loom))]
mod type_table;
#[cfg(not(loom))]
mod writer;

#[cfg(not(loom))]
pub use address_set::AddressSet;
#[cfg(not(loom))]
pub use event::calls as events;
#[cfg(not(loom))]
pub use stacks::capture;

#[cfg(not(loom))]
pub use clock::{ClockKind, COARSE_PERIOD};
#[cfg(not(loom))]
pub use event::emit::enabled;

/// Whether the calling thread is one of the tracer's own (the writer,
/// the advancer, the control thread): its allocations are not the
/// program's, and its events are never recorded. For a global allocator
/// that counts allocations itself (the `alloctrace` crate's
/// `TracingAlloc`). Never allocates.
#[cfg(not(loom))]
#[inline]
pub fn on_internal_thread() -> bool {
    thread::is_internal()
}
#[cfg(not(loom))]
pub use session::channel::request_from_signal as request_snapshot_from_signal;
#[cfg(not(loom))]
pub use session::crash::{flush_for_fatal_signal, FatalFlush};
#[cfg(not(loom))]
pub use session::lifecycle::{
    advance, flight_recorder_write, flight_stats, snapshot_bytes, snapshot_write,
    snapshot_write_bytes, start, start_with, stop, stop_at_exit,
};
#[cfg(not(loom))]
pub use session::meta::{written_totals, WrittenTotals};
#[cfg(not(loom))]
pub use session::{
    session_stats, Config, Error, SessionStats, DEFAULT_BUFFER_SIZE, DEFAULT_GENERATION_BYTES,
    MAX_BUFFER_SIZE, MIN_BUFFER_SIZE,
};
#[cfg(not(loom))]
pub use writer::flight::{FlightStats, MAX_FLIGHT_RECORDER_BYTES, MIN_FLIGHT_RECORDER_BYTES};
#[cfg(not(loom))]
pub use writer::late::late_event;
#[cfg(not(loom))]
pub use writer::output::Output;
#[cfg(not(loom))]
pub use writer::snapshot::SnapshotBytes;

#[cfg(loom)]
pub use handshake::{heavy_barrier, SeqLock};

/// The handshake's heavy side (membarrier), for a counter kept by one
/// thread until a second one counts (the `alloctrace` crate's HeapStats).
#[cfg(not(loom))]
#[doc(hidden)]
pub use handshake::heavy_barrier;

/// Test hooks of the handshake (tests/membarrier_failure.rs).
#[cfg(not(loom))]
#[doc(hidden)]
pub use handshake::{asymmetric_fences, inject_membarrier_failures, MEMBARRIER_ATTEMPTS};

/// Test hook of the sampled set (tests/sampling.rs).
#[cfg(not(loom))]
#[doc(hidden)]
pub use sampling::inject_overflow as inject_sample_set_overflow;

/// Test hook of the buffer pool (tests/map_failure.rs).
#[cfg(not(loom))]
#[doc(hidden)]
pub use buffer::inject_map_failures;
