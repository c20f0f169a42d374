//! The analysis behind alloctrace's reports and exports.
//!
//! - [`stacks`]: call stacks interned across generations and traces.
//! - [`pass`]: one pass over a trace, every allocation paired with its
//!   free, handed to a [`Visitor`].
//! - [`profile`]: per allocation site (stack, thread, type, size) counts,
//!   leaks, temporaries and the composition of the peak.
//! - [`resolve`]: stacks as source frames (function, file, line,
//!   module, address) through the symbolizer.
//!
//! Reports (`top`, `leaks`, `flamegraph`, `report`, `diff`) and exports
//! (pprof, Chrome trace, Parquet) are visitors over one pass.

pub mod pass;
pub mod profile;
pub mod resolve;
pub mod stacks;

pub use pass::{Alloc, Free, Live, Memory, Pass, PassStats, Visitor};
pub use profile::{Breakdowns, Peak, Profile, Site};
pub use resolve::{Resolver, SourceFrame};
pub use stacks::{Frame, GenerationStacks, RegisteredFrame, StackId, StackTable};
