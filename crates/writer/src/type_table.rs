//! The type table: `trace_type_register` appends, each generation's end
//! writes every registered type into that generation's types batches.
//!
//! The table is process-wide (types may be registered before tracing starts)
//! and append-only. It lives in two lazily mapped regions reserved with
//! MAP_NORESERVE, so registering never calls malloc and never takes a lock:
//! a runtime may register types from inside its allocator.

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::reserved::{Arena, Region, Span};

/// Most types the table holds; registrations past it return 0 ("no type").
pub(crate) const MAX_TYPES: usize = 1 << 20;
/// Bytes reserved for all type names together.
const NAME_ARENA_LEN: usize = 64 << 20;
/// Longest name kept; longer names are cut to this many bytes.
pub(crate) const MAX_NAME_LEN: usize = 1024;

/// One registered type.
struct TypeEntry {
    size: u64,
    ptr_bytes: u64,
    name: Span,
    /// Set (release) once the fields above are written; readers skip an
    /// entry whose registration is still under way.
    ready: AtomicBool,
}

const ENTRIES_LEN: usize = MAX_TYPES * core::mem::size_of::<TypeEntry>();

/// The entries, in ID order (type ID = index + 1).
static ENTRIES: Region<ENTRIES_LEN> = Region::new();
/// Next type index; may run past MAX_TYPES on overflow.
static NEXT_ENTRY: AtomicUsize = AtomicUsize::new(0);
static NAMES: Arena<NAME_ARENA_LEN> = Arena::new();

/// Registers a type and returns its ID (at least 1), or 0 when the table is
/// full or could not be mapped. Every call makes a new ID.
///
/// Must not allocate or lock: a runtime may call it from inside malloc.
pub(crate) fn register(name: &[u8], size: u64, ptr_bytes: u64) -> u64 {
    let Some(entries) = ENTRIES.base() else {
        return 0;
    };
    let index = NEXT_ENTRY.fetch_add(1, Ordering::Relaxed);
    if index >= MAX_TYPES {
        return 0;
    }
    // Out of name space, the type is kept without its name.
    let name = NAMES.push(&name[..name.len().min(MAX_NAME_LEN)]);
    // SAFETY: index < MAX_TYPES is inside the region, which is zeroed
    // memory (a valid TypeEntry: zero sizes, an empty span, not ready);
    // fetch_add gave this call the entry alone.
    unsafe {
        let entry = entries.cast::<TypeEntry>().add(index);
        core::ptr::addr_of_mut!((*entry).size).write(size);
        core::ptr::addr_of_mut!((*entry).ptr_bytes).write(ptr_bytes);
        core::ptr::addr_of_mut!((*entry).name).write(name);
        (*entry).ready.store(true, Ordering::Release);
    }
    index as u64 + 1
}

/// A registered type, as written into a types batch.
pub(crate) struct TypeRecord<'a> {
    pub(crate) id: u64,
    pub(crate) size: u64,
    pub(crate) ptr_bytes: u64,
    pub(crate) name: &'a [u8],
}

/// Calls `f` for every fully registered type, in ID order.
pub(crate) fn for_each(mut f: impl FnMut(TypeRecord<'_>)) {
    let Some(entries) = ENTRIES.base_if_mapped() else {
        return;
    };
    let count = NEXT_ENTRY.load(Ordering::Relaxed).min(MAX_TYPES);
    for index in 0..count {
        // SAFETY: index < MAX_TYPES is inside the region; only the atomic
        // ready flag is touched until it says (Acquire) the entry's plain
        // fields are written, after which they never change.
        let entry = unsafe {
            let e = entries.cast::<TypeEntry>().add(index);
            if !(*e).ready.load(Ordering::Acquire) {
                continue;
            }
            &*e
        };
        f(TypeRecord {
            id: index as u64 + 1,
            size: entry.size,
            ptr_bytes: entry.ptr_bytes,
            name: NAMES.get(entry.name),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Registration and the walk over the table, every unsafe access of
    /// this file on the way (Miri runs it: `make miri`): IDs in order,
    /// names cut at MAX_NAME_LEN, empty names, the entries read back
    /// exactly.
    #[test]
    fn registered_types_come_back_in_id_order_with_their_names() {
        let long = vec![b'x'; MAX_NAME_LEN + 10];
        let a = register(b"node", 48, 16);
        let b = register(&long, 8, 0);
        let c = register(b"", 0, 0);
        assert!(a >= 1 && b == a + 1 && c == b + 1);
        let mut seen = Vec::new();
        for_each(|t| seen.push((t.id, t.size, t.ptr_bytes, t.name.to_vec())));
        let ours: Vec<_> = seen.into_iter().filter(|t| t.0 >= a).collect();
        assert_eq!(
            ours,
            vec![
                (a, 48, 16, b"node".to_vec()),
                (b, 8, 0, vec![b'x'; MAX_NAME_LEN]),
                (c, 0, 0, Vec::new()),
            ]
        );
    }
}
