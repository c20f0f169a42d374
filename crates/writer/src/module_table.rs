//! The module table: the native code objects (executable, shared
//! libraries, the vDSO) of the process, so that a reader can symbolize the
//! return addresses of native call stacks offline, on another machine
//! (docs/FORMAT.md, "Call stacks, frames and modules": the modules batch).
//!
//! ## Design
//!
//! The table is read from the loader (`dl_iterate_phdr`, through
//! alloctrace-unwind's `Modules::snapshot`) when a session starts and
//! again ([`refresh`], through capture.rs) after every `dlclose` the
//! LD_PRELOAD shim sees, at every generation's end, and when a capture
//! stops in code no known module holds; never per allocation. A refresh compares the new snapshot with the table: an
//! object not seen before gets the next ID and the refresh's tick as its
//! load time; an object gone gets the refresh's tick as its unload time and
//! stays listed until the generation that saw it go has been written.
//!
//! Every generation lists every module alive during any part of it
//! ([`write_generation`]): loaded before its end, not unloaded before its
//! start. Load and unload ticks inside the generation are written as they
//! are, others as 0 (loaded before the generation started / still loaded at
//! its end), as the format says.
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

use alloctrace_format::stacks::MAX_MODULE_PATH_LEN;
use alloctrace_unwind::ModuleInfo;

struct Entry {
    id: u64,
    info: ModuleInfo,
    /// 0 when loaded before the session started.
    load_ticks: u64,
    /// 0 while still loaded.
    unload_ticks: u64,
}

struct Table {
    entries: Vec<Entry>,
    next_id: u64,
    /// The tick of the last reset or refresh.
    last_refresh: u64,
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    entries: Vec::new(),
    next_id: 1,
    last_refresh: 0,
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
        });
    }
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
    let loaded = t.last_refresh.saturating_add(1);
    t.last_refresh = now;
    for e in t.entries.iter_mut().filter(|e| e.unload_ticks == 0) {
        if !modules.iter().any(|m| same_object(m, &e.info)) {
            e.unload_ticks = now.max(1);
            changed = true;
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
            });
            changed = true;
        }
    }
    changed
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

/// Calls `f` for every module alive during the generation that ran from
/// tick `start` to tick `end`, in ID order, then drops the modules
/// unloaded before `end` (invariant 3: the generations after this one
/// start later than their unload).
pub(crate) fn write_generation(start: u64, end: u64, mut f: impl FnMut(ModuleRecord<'_>)) {
    let mut t = table();
    for e in &t.entries {
        let loaded_before_end = e.load_ticks < end;
        let unloaded_before_start = e.unload_ticks != 0 && e.unload_ticks <= start;
        if !loaded_before_end || unloaded_before_start {
            continue;
        }
        let inside = |ticks: u64| {
            if ticks > start && ticks < end {
                ticks
            } else {
                0
            }
        };
        f(ModuleRecord {
            id: e.id,
            start: e.info.start,
            end: e.info.end,
            bias: e.info.bias,
            eh_frame_hdr: e.info.eh_frame_hdr,
            load_ticks: inside(e.load_ticks),
            unload_ticks: inside(e.unload_ticks),
            build_id: &e.info.build_id,
            // A reader refuses longer paths (never seen: the loader's
            // names are file paths).
            path: &e.info.path[..e.info.path.len().min(MAX_MODULE_PATH_LEN)],
        });
    }
    t.entries
        .retain(|e| e.unload_ticks == 0 || e.unload_ticks >= end);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generation_lists_what_was_alive_in_it_with_its_load_and_unload_ticks() {
        let snapshot = alloctrace_unwind::Modules::snapshot().modules().to_vec();
        assert!(snapshot.len() > 1);
        reset(&snapshot, 50);
        let mut first = Vec::new();
        write_generation(100, 200, |m| {
            first.push((m.id, m.load_ticks, m.unload_ticks))
        });
        assert_eq!(first.len(), snapshot.len());
        assert!(first.iter().all(|&(id, l, u)| id >= 1 && l == 0 && u == 0));
        // Nothing changed: a refresh says so.
        assert!(!refresh(&snapshot, 250));
        // An object that disappears at 300 is listed with its unload tick in
        // the generation [200, 400), then no more.
        let gone = &snapshot[1..];
        assert!(refresh(gone, 300));
        let mut second = Vec::new();
        write_generation(200, 400, |m| second.push((m.id, m.unload_ticks)));
        assert!(second.contains(&(first[0].0, 300)));
        let mut third = Vec::new();
        write_generation(400, 500, |m| third.push(m.id));
        assert!(!third.contains(&first[0].0));
        // Loaded again, found at 600: a new ID, loaded just after the
        // last refresh (300).
        assert!(refresh(&snapshot, 600));
        let mut fourth = Vec::new();
        write_generation(500, 700, |m| fourth.push((m.id, m.load_ticks)));
        let max_id = first.iter().map(|f| f.0).max().unwrap_or(0);
        assert_eq!(fourth.iter().filter(|&&(id, _)| id > max_id).count(), 1);
        assert!(fourth.iter().any(|&(id, l)| id > max_id && l == 0));
        let mut fifth = Vec::new();
        write_generation(250, 700, |m| fifth.push((m.id, m.load_ticks)));
        assert!(fifth.iter().any(|&(id, l)| id > max_id && l == 301));
    }
}
