//! Events for the visitors' unit tests.

use crate::pass::{Alloc, Free, Memory};
use crate::stacks::StackId;

/// A new heap allocation of `size` bytes at `addr` by thread 1, with no
/// type and stack `stack`.
pub(crate) fn alloc(time_ns: u64, addr: u64, size: u64, stack: StackId) -> Alloc {
    Alloc {
        time_ns,
        thread: 1,
        addr,
        size,
        type_id: 0,
        stack,
        memory: Memory::Heap,
        entry: None,
        existed: false,
    }
}

/// An explicit free at `time_ns` by `thread`.
pub(crate) fn free(time_ns: u64, thread: u64) -> Free {
    Free {
        time_ns,
        thread,
        entry: None,
        implicit: false,
    }
}
