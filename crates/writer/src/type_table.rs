//! The type table: `trace_type_register` appends, each generation's end
//! writes every registered type into that generation's types batches.
//!
//! The table is process-wide (types may be registered before tracing starts)
//! and append-only. It lives in two lazily mapped regions reserved with
//! MAP_NORESERVE, so registering never calls malloc and never takes a lock:
//! a runtime may register types from inside its allocator.

use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};

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
    name_offset: usize,
    name_len: usize,
    /// Set (release) once the fields above are written; readers skip an
    /// entry whose registration is still under way.
    ready: AtomicBool,
}

/// The lazily mapped storage.
struct Table {
    entries: AtomicPtr<TypeEntry>,
    names: AtomicPtr<u8>,
    /// 0: not mapped, 1: mapping under way, 2: ready, 3: the kernel refused.
    state: AtomicU8,
    /// Next type index (type id - 1); may run past MAX_TYPES on overflow.
    next_entry: AtomicUsize,
    /// Next free byte of the name arena.
    next_name: AtomicUsize,
}

static TABLE: Table = Table {
    entries: AtomicPtr::new(ptr::null_mut()),
    names: AtomicPtr::new(ptr::null_mut()),
    state: AtomicU8::new(0),
    next_entry: AtomicUsize::new(0),
    next_name: AtomicUsize::new(0),
};

fn map_reserved(len: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping with no hint has no preconditions.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            // Miri (`make miri`) maps only MAP_PRIVATE | MAP_ANONYMOUS.
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | if cfg!(miri) { 0 } else { libc::MAP_NORESERVE },
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        ptr::null_mut()
    } else {
        p.cast()
    }
}

/// Maps the table on first use. Returns false if the kernel refused.
fn ensure_mapped() -> bool {
    loop {
        match TABLE.state.load(Ordering::Acquire) {
            2 => return true,
            3 => return false,
            0 => {
                if TABLE
                    .state
                    .compare_exchange(0, 1, Ordering::Acquire, Ordering::Acquire)
                    .is_err()
                {
                    continue;
                }
                let entries = map_reserved(MAX_TYPES * core::mem::size_of::<TypeEntry>());
                let names = map_reserved(NAME_ARENA_LEN);
                if entries.is_null() || names.is_null() {
                    TABLE.state.store(3, Ordering::Release);
                    return false;
                }
                TABLE.entries.store(entries.cast(), Ordering::Relaxed);
                TABLE.names.store(names, Ordering::Relaxed);
                TABLE.state.store(2, Ordering::Release);
                return true;
            }
            _ => std::thread::yield_now(),
        }
    }
}

/// Registers a type and returns its ID (at least 1), or 0 when the table is
/// full or could not be mapped. Every call makes a new ID.
///
/// Must not allocate or lock: a runtime may call it from inside malloc.
pub(crate) fn register(name: &[u8], size: u64, ptr_bytes: u64) -> u64 {
    if !ensure_mapped() {
        return 0;
    }
    let index = TABLE.next_entry.fetch_add(1, Ordering::Relaxed);
    if index >= MAX_TYPES {
        return 0;
    }
    let name = &name[..name.len().min(MAX_NAME_LEN)];
    let mut name_offset = TABLE.next_name.fetch_add(name.len(), Ordering::Relaxed);
    let mut name_len = name.len();
    if name_offset + name_len > NAME_ARENA_LEN {
        // Out of name space: keep the type, drop its name.
        name_offset = 0;
        name_len = 0;
    }
    let entries = TABLE.entries.load(Ordering::Relaxed);
    let names = TABLE.names.load(Ordering::Relaxed);
    // SAFETY: index < MAX_TYPES and name_offset + name_len <= NAME_ARENA_LEN
    // are inside the mappings; fetch_add gave this call exclusive use of the
    // entry and of the name bytes.
    unsafe {
        ptr::copy_nonoverlapping(name.as_ptr(), names.add(name_offset), name_len);
        let entry = entries.add(index);
        ptr::addr_of_mut!((*entry).size).write(size);
        ptr::addr_of_mut!((*entry).ptr_bytes).write(ptr_bytes);
        ptr::addr_of_mut!((*entry).name_offset).write(name_offset);
        ptr::addr_of_mut!((*entry).name_len).write(name_len);
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
    if TABLE.state.load(Ordering::Acquire) != 2 {
        return;
    }
    let count = TABLE.next_entry.load(Ordering::Relaxed).min(MAX_TYPES);
    let entries = TABLE.entries.load(Ordering::Relaxed);
    let names = TABLE.names.load(Ordering::Relaxed);
    for index in 0..count {
        // SAFETY: index < MAX_TYPES is inside the mapping; an entry is read
        // only after its ready flag (acquire) says its fields are written,
        // and they are never written again.
        unsafe {
            let entry = &*entries.add(index);
            if !entry.ready.load(Ordering::Acquire) {
                continue;
            }
            let name = core::slice::from_raw_parts(names.add(entry.name_offset), entry.name_len);
            f(TypeRecord {
                id: index as u64 + 1,
                size: entry.size,
                ptr_bytes: entry.ptr_bytes,
                name,
            });
        }
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
