//! The module table: the native code objects (executable, shared
//! libraries, the vDSO) of the process, so that a reader can symbolize the
//! return addresses of native call stacks offline, on another machine
//! (docs/FORMAT.md, "Call stacks, frames and modules": the modules batch).
//!
//! ## Design
//!
//! The table is read from the loader (`dl_iterate_phdr`, through
//! alloctrace-unwind's `Modules::snapshot`) when a session starts and
//! again ([`refresh`], through stacks/capture) after every `dlclose` the
//! LD_PRELOAD shim sees, at every generation's end, and when a capture
//! stops in code no known module holds; never per allocation. A refresh compares the new snapshot with the table: an
//! object not seen before gets the next ID and the refresh's tick as its
//! load time; an object gone gets the refresh's tick as its unload time and
//! stays listed until the generation that saw it go has been written.
//!
//! Every generation lists every module alive during any part of it: loaded
//! before its end, not unloaded before its start. The writer thread lists
//! them as it goes, before the batches of the generation it writes
//! ([`list_pending`], tables.rs): every module known by then, once, and a
//! module again when its unload has become known since (the format lets a
//! later listing of an ID replace the earlier one). Load and unload ticks
//! inside the generation are written as they are, others as 0 (loaded
//! before the generation started / still loaded at its end), as the format
//! says.
//!
//! A refresh that finds a module gone says so ([`take_unloaded`]): the
//! session then starts a new generation (lifecycle.rs), so that no
//! generation lists two modules at one range when the loader reuses it,
//! and the stacks of a generation name the code of one load.
//!
//! ## Invariants
//!
//! 1. The table is behind a mutex that only set-up paths take: session
//!    start, a refresh (the shim's dlclose wrapper, after the real call, in
//!    the shim's own state; the writer thread) and the generation end. The
//!    event path never touches it, so no allocator can hold the lock while
//!    an event waits for it.
//! 2. IDs are at least 1, stable for the session, and never reused within
//!    it: a library loaded again at the same address is a new module.
//! 3. A module is dropped only after a generation whose end is later than
//!    its unload has listed it: every generation in which it was alive
//!    lists it.
//!
//! ## Corner cases
//!
//! - Objects opened and closed again between two refreshes are never seen
//!   (the shim refreshes after every dlclose, so only another thread's
//!   dlopen/dlclose pair racing with one refresh could hide one).
//! - A library loaded during a generation is listed with a load time just
//!   after the previous refresh (the latest moment known to be before its
//!   load), so every event of the generation that ran in it finds it.

use std::sync::Mutex;

use alloctrace_format::push_uvarint;
use alloctrace_format::stacks::MAX_MODULE_PATH_LEN;
use alloctrace_unwind::ModuleInfo;

struct Entry {
    id: u64,
    info: ModuleInfo,
    /// 0 when loaded before the session started.
    load_ticks: u64,
    /// 0 while still loaded.
    unload_ticks: u64,
    /// Per generation parity: the listing key (tables.rs) that last listed
    /// the module, and the unload tick it listed.
    listed: [(u64, u64); 2],
}

struct Table {
    entries: Vec<Entry>,
    next_id: u64,
    /// The tick of the last reset or refresh.
    last_refresh: u64,
    /// Counts the changes (a reset, a refresh that changed something).
    version: u64,
    /// A refresh found a module unloaded since the last [`take_unloaded`].
    unloaded: bool,
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    entries: Vec::new(),
    next_id: 1,
    last_refresh: 0,
    version: 0,
    unloaded: false,
});

fn table() -> std::sync::MutexGuard<'static, Table> {
    TABLE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn same_object(a: &ModuleInfo, b: &ModuleInfo) -> bool {
    a.start == b.start && a.end == b.end && a.path == b.path && a.build_id == b.build_id
}

/// Starts the table afresh for a new session from `modules` (all loaded
/// before its start).
pub(crate) fn reset(modules: &[ModuleInfo], now: u64) {
    let mut t = table();
    t.entries.clear();
    t.unloaded = false;
    t.next_id = 1;
    t.last_refresh = now;
    for info in modules {
        let id = t.next_id;
        t.next_id += 1;
        t.entries.push(Entry {
            id,
            info: info.clone(),
            load_ticks: 0,
            unload_ticks: 0,
            listed: [(0, 0); 2],
        });
    }
    t.version += 1;
}

/// Notes that the table was known to be current at tick `now` (the
/// session's first generation started with the table read just before):
/// an object found later was loaded after `now`.
pub(crate) fn current_at(now: u64) {
    let mut t = table();
    t.last_refresh = t.last_refresh.max(now);
}

/// Brings the table up to date with `modules`, a snapshot taken at tick
/// `now`: missing objects were unloaded at `now` (the shim refreshes right
/// after each dlclose); new ones were loaded at some time since the last
/// refresh, and are noted as loaded just after it, so that no event made
/// after their load finds them not yet loaded (their range was free since
/// then: an unload is always followed by a refresh). Returns whether
/// anything changed.
pub(crate) fn refresh(modules: &[ModuleInfo], now: u64) -> bool {
    let mut t = table();
    let mut changed = false;
    let mut unloaded = false;
    let loaded = t.last_refresh.saturating_add(1);
    t.last_refresh = now;
    for e in t.entries.iter_mut().filter(|e| e.unload_ticks == 0) {
        if !modules.iter().any(|m| same_object(m, &e.info)) {
            e.unload_ticks = now.max(1);
            changed = true;
            unloaded = true;
        }
    }
    for info in modules {
        let known = t
            .entries
            .iter()
            .any(|e| e.unload_ticks == 0 && same_object(info, &e.info));
        if !known {
            let id = t.next_id;
            t.next_id += 1;
            t.entries.push(Entry {
                id,
                info: info.clone(),
                load_ticks: loaded,
                unload_ticks: 0,
                listed: [(0, 0); 2],
            });
            changed = true;
        }
    }
    if changed {
        t.version += 1;
    }
    t.unloaded |= unloaded;
    changed
}

/// Whether a refresh found a module unloaded since the last call.
pub(crate) fn take_unloaded() -> bool {
    core::mem::take(&mut table().unloaded)
}

/// The table's change count: a listing that saw this version has nothing
/// new to list until it moves.
pub(crate) fn version() -> u64 {
    table().version
}

/// One module as a generation's batch lists it (docs/FORMAT.md).
pub(crate) struct ModuleRecord<'a> {
    pub(crate) id: u64,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) bias: u64,
    pub(crate) eh_frame_hdr: u64,
    pub(crate) load_ticks: u64,
    pub(crate) unload_ticks: u64,
    pub(crate) build_id: &'a [u8],
    pub(crate) path: &'a [u8],
}

impl<'a> ModuleRecord<'a> {
    /// Entry `e` with these load and unload ticks (0: outside the listing's
    /// generation).
    fn of(e: &'a Entry, load_ticks: u64, unload_ticks: u64) -> ModuleRecord<'a> {
        ModuleRecord {
            id: e.id,
            start: e.info.start,
            end: e.info.end,
            bias: e.info.bias,
            eh_frame_hdr: e.info.eh_frame_hdr,
            load_ticks,
            unload_ticks,
            build_id: &e.info.build_id,
            // A reader refuses longer paths (never seen: the loader's
            // names are file paths).
            path: &e.info.path[..e.info.path.len().min(MAX_MODULE_PATH_LEN)],
        }
    }

    /// Appends the record as an entry of a modules batch (FORMAT.md,
    /// "Call stacks, frames and modules").
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        for v in [
            self.id,
            self.start,
            self.end,
            self.bias,
            self.eh_frame_hdr,
            self.load_ticks,
            self.unload_ticks,
        ] {
            push_uvarint(out, v);
        }
        for b in [self.build_id, self.path] {
            push_uvarint(out, b.len() as u64);
            out.extend_from_slice(b);
        }
    }
}

/// Calls `f` for every module loaded now, as loaded for the whole of a
/// generation (load and unload ticks 0), without noting it listed: the
/// writer thread's snapshot (writer/snapshot.rs).
pub(crate) fn for_each_loaded(mut f: impl FnMut(ModuleRecord<'_>)) {
    let t = table();
    for e in t.entries.iter().filter(|e| e.unload_ticks == 0) {
        f(ModuleRecord::of(e, 0, 0));
    }
}

/// Calls `f`, in ID order, for every module alive during the generation
/// (of parity `parity`) that started at tick `start`, up to `now` (the
/// present, or the generation's end),
/// that the listing `key` has not listed, or listed before its unload
/// became known; notes them listed. Writer thread only.
pub(crate) fn list_pending(
    parity: usize,
    key: u64,
    start: u64,
    now: u64,
    mut f: impl FnMut(ModuleRecord<'_>),
) {
    let mut t = table();
    for e in t.entries.iter_mut() {
        let loaded_before_end = e.load_ticks <= now;
        let unloaded_before_start = e.unload_ticks != 0 && e.unload_ticks <= start;
        if !loaded_before_end || unloaded_before_start {
            continue;
        }
        let inside = |ticks: u64| {
            if ticks > start && ticks <= now {
                ticks
            } else {
                0
            }
        };
        let unload = inside(e.unload_ticks);
        if e.listed[parity] == (key, unload) {
            continue;
        }
        e.listed[parity] = (key, unload);
        f(ModuleRecord::of(e, inside(e.load_ticks), unload));
    }
}

/// Drops the modules unloaded before tick `start`, once every generation
/// that started before it has been listed whole (invariant 3): the writer
/// thread calls it as it writes a generation's end, with the start of the
/// generation after it.
pub(crate) fn forget_unloaded_before(start: u64) {
    table()
        .entries
        .retain(|e| e.unload_ticks == 0 || e.unload_ticks >= start);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a generation `[start, end)` lists, as one listing of its own.
    fn listing(start: u64, end: u64) -> Vec<(u64, u64, u64)> {
        static KEY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1 << 40);
        let key = KEY.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut out = Vec::new();
        list_pending(0, key, start, end, |m| {
            out.push((m.id, m.load_ticks, m.unload_ticks))
        });
        out
    }

    #[test]
    fn a_generation_lists_what_was_alive_in_it_with_its_load_and_unload_ticks() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let snapshot = alloctrace_unwind::Modules::snapshot().modules().to_vec();
        assert!(snapshot.len() > 1);
        reset(&snapshot, 50);
        let first = listing(100, 200);
        assert_eq!(first.len(), snapshot.len());
        assert!(first.iter().all(|&(id, l, u)| id >= 1 && l == 0 && u == 0));
        // Nothing changed: a refresh says so.
        assert!(!refresh(&snapshot, 250));
        assert!(!take_unloaded());
        // An object that disappears at 300 is listed with its unload tick in
        // the generation [200, 400), then no more once forgotten.
        let gone = &snapshot[1..];
        assert!(refresh(gone, 300));
        assert!(take_unloaded() && !take_unloaded());
        let second = listing(200, 400);
        assert!(second.contains(&(first[0].0, 0, 300)));
        forget_unloaded_before(400);
        let third = listing(400, 500);
        assert!(!third.iter().any(|m| m.0 == first[0].0));
        // Loaded again, found at 600: a new ID, loaded just after the
        // last refresh (300).
        assert!(refresh(&snapshot, 600));
        let max_id = first.iter().map(|f| f.0).max().unwrap_or(0);
        let fourth = listing(500, 700);
        assert_eq!(fourth.iter().filter(|m| m.0 > max_id).count(), 1);
        assert!(fourth.iter().any(|&(id, l, _)| id > max_id && l == 0));
        let fifth = listing(250, 700);
        assert!(fifth.iter().any(|&(id, l, _)| id > max_id && l == 301));
    }

    #[test]
    fn a_listing_lists_a_module_once_and_again_when_its_unload_is_known() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let snapshot = alloctrace_unwind::Modules::snapshot().modules().to_vec();
        reset(&snapshot, 50);
        let mut out = Vec::new();
        list_pending(1, 5, 100, 150, |m| out.push((m.id, m.unload_ticks)));
        assert_eq!(out.len(), snapshot.len());
        out.clear();
        list_pending(1, 5, 100, 160, |m| out.push((m.id, m.unload_ticks)));
        assert!(out.is_empty(), "listed already: {out:?}");
        let v = version();
        assert!(refresh(&snapshot[1..], 170));
        assert!(version() > v);
        list_pending(1, 5, 100, 180, |m| out.push((m.id, m.unload_ticks)));
        assert_eq!(out.len(), 1, "the unloaded one, again, with its unload");
        assert_eq!(out[0].1, 170);
    }

    /// The table is process-wide: its tests take turns.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
}
