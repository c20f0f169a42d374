//! In-process native stack capture for alloctrace (DOC TODO)

#![warn(unsafe_op_in_unsafe_fn)]

mod bounds;
mod dwarf;
mod fp;
mod modules;

pub use bounds::StackBounds;
pub use dwarf::{capture_dwarf, capture_mixed, DwarfCache, DwarfUnwinder, MappedBytes};
pub use fp::{capture_fp, walk_fp_chain};
pub use modules::{LoadSegment, ModuleInfo, Modules};

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
