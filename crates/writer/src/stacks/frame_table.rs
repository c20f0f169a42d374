//! The frame table: frames of a runtime's own code (a Lua or Python
//! function, a JIT stub) registered with `trace_frame_register`, which its
//! call stacks name beside native return addresses (docs/FORMAT.md, "Call
//! stacks, frames and modules").
//!
//! Process-wide and append-only, like the type table, in memory of its own
//! (reserved.rs): registering never calls malloc nor locks, so a runtime
//! may register from inside its allocator. IDs are stable for the process;
//! each generation lists the frames its call stacks use: the writer thread,
//! as it lists a call-stack node naming a registered frame, lists the frame
//! first unless that generation's listing already has ([`take_unlisted`],
//! tables.rs).
//!
//! Frame 0 is not registered: it is the format's truncation marker.

use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use alloctrace_format::push_uvarint;

use crate::reserved::{Arena, Region, Span};

/// Most frames the table holds; registrations past it return 0.
pub(crate) const MAX_FRAMES: usize = 1 << 20;
/// Bytes reserved for all function and file names together.
const NAME_ARENA_LEN: usize = 64 << 20;
/// Longest function or file name kept; longer ones are cut.
pub(crate) const MAX_NAME_LEN: usize = 1024;

struct FrameEntry {
    line: u32,
    function: Span,
    file: Span,
    /// Set (Release) once the fields above are written.
    ready: AtomicBool,
    /// The writer thread's own: the last listing key (tables.rs) of each
    /// parity that listed the frame.
    listed: [AtomicU64; 2],
}

const ENTRIES_LEN: usize = MAX_FRAMES * core::mem::size_of::<FrameEntry>();

static ENTRIES: Region<ENTRIES_LEN> = Region::new();
/// The next frame ID; 0 is the truncation marker. May run past MAX_FRAMES.
static NEXT: AtomicUsize = AtomicUsize::new(1);
static NAMES: Arena<NAME_ARENA_LEN> = Arena::new();

/// The entry with ID `id` (`0 < id < MAX_FRAMES`), if its registration is
/// complete. No reference to an entry exists before: its plain fields may
/// be being written until `ready` is published.
fn ready_entry(entries: *mut u8, id: usize) -> Option<&'static FrameEntry> {
    debug_assert!(id > 0 && id < MAX_FRAMES);
    // SAFETY: id < MAX_FRAMES is inside the region, mapped for good
    // (reserved.rs invariant 1) and zeroed; only the atomic `ready` is
    // touched before it says the entry is written (Acquire), after which
    // the plain fields never change.
    unsafe {
        let e = entries.cast::<FrameEntry>().add(id);
        (*e).ready.load(Ordering::Acquire).then(|| &*e)
    }
}

/// Registers a frame and returns its ID (at least 1), or 0 when the table
/// is full or cannot be mapped. Names longer than [`MAX_NAME_LEN`] are cut;
/// out of name space, a frame keeps its line without names.
pub(crate) fn register(function: &[u8], file: &[u8], line: u32) -> u64 {
    let Some(entries) = ENTRIES.base() else {
        return 0;
    };
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    if id >= MAX_FRAMES {
        return 0;
    }
    let function = NAMES.push(&function[..function.len().min(MAX_NAME_LEN)]);
    let file = NAMES.push(&file[..file.len().min(MAX_NAME_LEN)]);
    // SAFETY: id < MAX_FRAMES is inside the region; fetch_add gave this call
    // the entry alone, and nobody reads its plain fields before `ready`.
    unsafe {
        let e = entries.cast::<FrameEntry>().add(id);
        core::ptr::addr_of_mut!((*e).line).write(line);
        core::ptr::addr_of_mut!((*e).function).write(function);
        core::ptr::addr_of_mut!((*e).file).write(file);
        (*e).ready.store(true, Ordering::Release);
    }
    id as u64
}

/// Whether `id` names a registered frame.
pub(crate) fn is_defined(id: u64) -> bool {
    let Some(entries) = ENTRIES.base_if_mapped() else {
        return false;
    };
    id > 0
        && id < MAX_FRAMES as u64
        && (id as usize) < NEXT.load(Ordering::Relaxed)
        && ready_entry(entries, id as usize).is_some()
}

/// A registered frame, as written into a frames batch.
pub(crate) struct FrameRecord<'a> {
    pub(crate) id: u64,
    pub(crate) line: u32,
    pub(crate) function: &'a [u8],
    pub(crate) file: &'a [u8],
}

impl FrameRecord<'_> {
    /// Appends the record as an entry of a frames batch (FORMAT.md,
    /// "Call stacks, frames and modules").
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        push_uvarint(out, self.id);
        push_uvarint(out, u64::from(self.line));
        for b in [self.function, self.file] {
            push_uvarint(out, b.len() as u64);
            out.extend_from_slice(b);
        }
    }
}

/// Frame `id`, if registered, without noting it listed (the writer
/// thread's snapshot, writer/snapshot.rs).
pub(crate) fn record(id: u64) -> Option<FrameRecord<'static>> {
    let entries = ENTRIES.base_if_mapped()?;
    if id == 0 || id >= MAX_FRAMES as u64 {
        return None;
    }
    let e = ready_entry(entries, id as usize)?;
    Some(FrameRecord {
        id,
        line: e.line,
        function: NAMES.get(e.function),
        file: NAMES.get(e.file),
    })
}

/// Frame `id`, unless the listing `key` of parity `parity` has listed it
/// already (then, or for an ID that names no frame, `None`); noted listed.
/// Writer thread only.
pub(crate) fn take_unlisted(id: u64, parity: usize, key: u64) -> Option<FrameRecord<'static>> {
    let entries = ENTRIES.base_if_mapped()?;
    if id == 0 || id >= MAX_FRAMES as u64 {
        return None;
    }
    let e = ready_entry(entries, id as usize)?;
    if e.listed[parity].swap(key, Ordering::Relaxed) == key {
        return None;
    }
    Some(FrameRecord {
        id,
        line: e.line,
        function: NAMES.get(e.function),
        file: NAMES.get(e.file),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_takes_each_registered_frame_once() {
        let a = register(b"eval_loop", b"vm.c", 120);
        let b = register(&[b'f'; MAX_NAME_LEN + 5], b"", 0);
        assert!(a >= 1 && b == a + 1);
        assert!(is_defined(a) && !is_defined(0) && !is_defined(u64::MAX));
        let f = take_unlisted(a, 1, 9).unwrap();
        assert_eq!(
            (f.id, f.line, f.function, f.file),
            (a, 120, &b"eval_loop"[..], &b"vm.c"[..])
        );
        assert!(take_unlisted(a, 1, 9).is_none(), "listed once per key");
        assert!(
            take_unlisted(a, 0, 9).is_some(),
            "the other parity lists its own"
        );
        assert!(
            take_unlisted(a, 1, 10).is_some(),
            "a new listing lists it again"
        );
        let long = take_unlisted(b, 1, 9).unwrap();
        assert_eq!(long.function.len(), MAX_NAME_LEN);
        assert!(take_unlisted(0, 1, 9).is_none() && take_unlisted(u64::MAX, 1, 9).is_none());
    }
}
