//! Entry-point tags: which interposed function made an event.

/// The interposed functions of the LD_PRELOAD shim, as entry-point tags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum EntryPoint {
    Malloc = 1,
    Calloc = 2,
    Realloc = 3,
    Free = 4,
    PosixMemalign = 5,
    AlignedAlloc = 6,
    Memalign = 7,
    Valloc = 8,
    Pvalloc = 9,
    Reallocarray = 10,
    Mmap = 11,
    Munmap = 12,
    Mremap = 13,
}

/// All entry points, in tag order.
pub const ENTRY_POINTS: [EntryPoint; 13] = [
    EntryPoint::Malloc,
    EntryPoint::Calloc,
    EntryPoint::Realloc,
    EntryPoint::Free,
    EntryPoint::PosixMemalign,
    EntryPoint::AlignedAlloc,
    EntryPoint::Memalign,
    EntryPoint::Valloc,
    EntryPoint::Pvalloc,
    EntryPoint::Reallocarray,
    EntryPoint::Mmap,
    EntryPoint::Munmap,
    EntryPoint::Mremap,
];

impl EntryPoint {
    /// The entry point for a tag, or `None`.
    pub fn from_tag(tag: u64) -> Option<EntryPoint> {
        ENTRY_POINTS.get((tag as usize).wrapping_sub(1)).copied()
    }

    /// The function's name, as used in `stats --json` `entry_points`.
    pub const fn name(self) -> &'static str {
        match self {
            EntryPoint::Malloc => "malloc",
            EntryPoint::Calloc => "calloc",
            EntryPoint::Realloc => "realloc",
            EntryPoint::Free => "free",
            EntryPoint::PosixMemalign => "posix_memalign",
            EntryPoint::AlignedAlloc => "aligned_alloc",
            EntryPoint::Memalign => "memalign",
            EntryPoint::Valloc => "valloc",
            EntryPoint::Pvalloc => "pvalloc",
            EntryPoint::Reallocarray => "reallocarray",
            EntryPoint::Mmap => "mmap",
            EntryPoint::Munmap => "munmap",
            EntryPoint::Mremap => "mremap",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_points_round_trip() {
        for (i, e) in ENTRY_POINTS.iter().enumerate() {
            assert_eq!(EntryPoint::from_tag(i as u64 + 1), Some(*e));
        }
        assert_eq!(EntryPoint::from_tag(0), None);
        assert_eq!(EntryPoint::from_tag(14), None);
    }
}
