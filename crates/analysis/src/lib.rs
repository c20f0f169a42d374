//! The analysis behind alloctrace's reports and exports.
//!
//! - [`feed`]: the hand-over of a trace's events, in order and in
//!   chunks, from the reading thread to a worker thread.
//! - [`stacks`]: call stacks interned across generations and traces.
//! - [`pass`]: one pass over a trace, every allocation paired with its
//!   free, handed to a [`Visitor`].
//! - [`profile`]: per allocation site (stack, thread, type, size) counts,
//!   leaks, temporaries and the composition of the peak.
//! - [`resolve`]: stacks as source frames (function, file, line,
//!   module, address) through the symbolizer.
//! - [`timeline`]: the live memory over time, downsampled.
//! - [`summary`]: allocations by size and lifetime; each run's pid,
//!   start and duration.
//! - [`sampling`]: what a sampled trace's allocations stand for (every
//!   visitor above weighs them).
//!
//! Reports (`top`, `leaks`, `flamegraph`, `report`, `diff`) and exports
//! (pprof, Chrome trace, Parquet) are visitors over one pass.

pub mod feed;
pub mod pass;
pub mod profile;
pub mod resolve;
pub mod sampling;
pub mod stacks;
pub mod summary;
pub mod timeline;

#[cfg(test)]
pub(crate) mod testing;

pub use feed::{Feed, Shape, Work};
pub use pass::{
    Alloc, Anomaly, Both, Entry, Free, GenerationView, Live, Memory, Op, Pass, PassStats, Peaks,
    Size, Visitor,
};
pub use profile::{Breakdowns, Peak, Profile, Site};
pub use resolve::{Resolver, SourceFrame};
pub use sampling::{estimate, Estimate, Sampling};
pub use stacks::{Frame, GenerationStacks, RegisteredFrame, StackId, StackTable};
pub use summary::{log2_bucket, log2_bucket_min, Histogram, RunFacts, Summary};
pub use timeline::{Bucket, Levels, Range, Series, Timeline};
