//! alloctrace: the C API of the alloctrace memory-allocation tracer
//! (`liballoctrace.so`, `liballoctrace.a`, `include/alloctrace.h`), and
//! its safe Rust API.
//!
//! For a Rust program: [`TracingAlloc`] as the global allocator,
//! [`Tracer`] to start a trace (stopped when its guard drops),
//! [`HeapStats`] for tests that assert on heap use.
//!
//! ```
//! #[global_allocator]
//! static ALLOC: alloctrace::TracingAlloc<std::alloc::System> =
//!     alloctrace::TracingAlloc::new(std::alloc::System);
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//! #   let dir = std::env::temp_dir();
//! #   std::env::set_current_dir(&dir)?;
//!     let guard = alloctrace::Tracer::new().path("run.trace").start()?; // stops and flushes on drop
//!     let v: Vec<u64> = (0..1000).collect();
//!     let s = alloctrace::HeapStats::now();
//!     assert!(s.live_bytes >= 8000 && s.total_allocations >= 1);
//!     drop(v);
//!     drop(guard);
//!     // `alloctrace top run.trace` now lists the allocation sites.
//! #   std::fs::remove_file("run.trace").ok();
//!     Ok(())
//! }
//! ```
//!
//! The writer core is the `alloctrace-writer` crate, re-exported here for
//! runtimes written in Rust (its `events` module has the event calls);
//! this crate adds the C ABI in [`capi`], from which cbindgen generates
//! the header.
#![warn(unsafe_op_in_unsafe_fn)]
#![allow(non_camel_case_types)]

pub use alloctrace_writer::*;

#[cfg(not(loom))]
mod heap_stats;
#[cfg(not(loom))]
mod tracer;
#[cfg(not(loom))]
mod tracing_alloc;

#[cfg(not(loom))]
pub use heap_stats::HeapStats;
#[cfg(not(loom))]
pub use tracer::{Tracer, TracerGuard};
#[cfg(not(loom))]
pub use tracing_alloc::TracingAlloc;

#[cfg(not(loom))]
pub mod capi;
