//! The unwinder captures use, and its replacement when libraries come and
//! go: built from a module snapshot at set-up, rebuilt by a refresh (after a
//! `dlopen`, around a `dlclose`, at a generation's end, and by the writer
//! thread when a capture stopped in code no known module holds), freed
//! after a grace period (the module docs' "The unwinder", invariant 2 and
//! the `dlclose` corner case).

use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use alloctrace_unwind::{DwarfUnwinder, Modules};

use crate::stacks::module_table;
use crate::thread::{self, ThreadSlot};
use crate::{clock, handshake};
/// What captures unwind with: the unwinder and the address ranges of the
/// modules it was built from (sorted), to notice code it does not know.
pub(super) struct Unwinding {
    pub(super) unwinder: DwarfUnwinder,
    pub(super) ranges: Vec<(u64, u64)>,
}

impl Unwinding {
    /// The unwinder of `modules`: with compact tables when `tables` (those
    /// of `prev` reused for the modules it had), else framehop alone.
    pub(super) fn new(modules: &Modules, tables: bool, prev: Option<&Unwinding>) -> Box<Unwinding> {
        let mut ranges: Vec<(u64, u64)> = modules
            .modules()
            .iter()
            .flat_map(|m| m.segments.iter().map(|s| (s.start, s.end)))
            .collect();
        ranges.sort_unstable();
        Box::new(Unwinding {
            // SAFETY: the objects of the snapshot are loaded now; before a
            // dlclose can unmap one, unloading_begin replaces this unwinder
            // with one without it and waits for the captures using it.
            unwinder: unsafe {
                if tables {
                    DwarfUnwinder::from_modules_reusing(modules, prev.map(|p| &p.unwinder))
                } else {
                    DwarfUnwinder::from_modules_without_tables(modules)
                }
            },
            ranges,
        })
    }

    /// Whether `addr` lies in a segment of a known module.
    pub(super) fn knows(&self, addr: u64) -> bool {
        let i = self.ranges.partition_point(|&(start, _)| start <= addr);
        i.checked_sub(1)
            .and_then(|i| self.ranges.get(i))
            .is_some_and(|&(_, end)| addr < end)
    }
}

/// Set when the unwinder in use has no compact tables and a capture wants
/// them: the writer thread then builds them ([`refresh_if_stale`]).
pub(super) static TABLES_WANTED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Set while the writer thread refreshes: only it builds the compact
    /// tables of a session's start (a dlopen's refresh keeps what it has).
    static ON_WRITER: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

/// Whether this refresh may build the compact tables (the writer thread's).
pub(super) fn force_tables() -> bool {
    ON_WRITER.with(|w| w.get())
}

/// The unwinding captures use (invariant 2); null until a session sets up.
pub(super) static UNWINDER: AtomicPtr<Unwinding> = AtomicPtr::new(core::ptr::null_mut());
/// Set by a capture that stopped in code no known module holds (a library
/// loaded since the last refresh); the writer thread then refreshes.
pub(super) static STALE: AtomicBool = AtomicBool::new(false);
/// When the last refresh ran (ticks), to refresh at most every
/// [`STALE_REFRESH_MS`] (JIT code is in no module, and stays unknown).
pub(super) static LAST_REFRESH: AtomicU64 = AtomicU64::new(0);
pub(super) const STALE_REFRESH_MS: u64 = 100;
/// Serialises set-up and refreshes (never taken by a capture).
pub(super) static REFRESH: Mutex<()> = Mutex::new(());
/// What a refresh calls after it (set_up's `after_refresh`).
pub(super) static AFTER_REFRESH: OnceLock<fn()> = OnceLock::new();

/// Takes the refresh lock (fork.rs holds it across a fork, so that a child
/// never inherits it locked by the writer thread).
pub(crate) fn lock_refresh() -> std::sync::MutexGuard<'static, ()> {
    REFRESH.lock().unwrap_or_else(|p| p.into_inner())
}

/// How many `dlclose` calls are between [`unloading_begin`] and
/// [`unloading_end`]; read under `REFRESH`.
pub(super) static UNLOADING: AtomicUsize = AtomicUsize::new(0);

/// The start addresses of the objects loaded with the program (the first
/// set-up's snapshot in this process image; a forked child inherits it):
/// the only ones an unwinder built during a `dlclose` knows.
pub(super) static PERMANENT: OnceLock<Vec<u64>> = OnceLock::new();

/// The loaded objects may have changed (after a `dlopen` or `dlclose`
/// returned): refreshes the module table and, if it changed, replaces the
/// unwinder. Not for the event path: it allocates, takes the loader's lock
/// and waits for captures in progress. Does nothing before a session has
/// set up stacks.
pub fn modules_changed() {
    refresh(false);
}

/// A `dlclose` is about to run (the shim calls this before the real call,
/// as its own code): refreshes the module table (an object loaded since the
/// last look is listed while it is still loaded) and swaps in an unwinder
/// that knows only the objects loaded with the program, waiting until no
/// capture uses the old one. Until the matching [`unloading_end`], every
/// refresh builds such an unwinder. Not for the event path (as
/// [`modules_changed`]).
pub fn unloading_begin() {
    UNLOADING.fetch_add(1, Ordering::SeqCst);
    refresh(true);
}

/// The `dlclose` that [`unloading_begin`] announced has returned:
/// refreshes the module table (noting the unload) and, once no other
/// dlclose is running, swaps in an unwinder of every loaded object again.
pub fn unloading_end() {
    UNLOADING.fetch_sub(1, Ordering::SeqCst);
    refresh(true);
}

/// Re-reads the loaded objects; replaces the unwinder when they changed
/// or when `force`d (a dlclose starts or ends).
pub(super) fn refresh(force: bool) {
    if UNWINDER.load(Ordering::Acquire).is_null() {
        return;
    }
    {
        let _guard = REFRESH.lock().unwrap_or_else(|p| p.into_inner());
        let current = UNWINDER.load(Ordering::Acquire);
        // SAFETY: unwinders are freed only by swap_unwinder, under
        // REFRESH, which this thread holds.
        let current = unsafe { current.as_ref() };
        // The compact tables once the writer thread built them (reused for
        // the modules that stay); until then framehop alone.
        let tables = current.is_some_and(|u| u.unwinder.has_tables())
            || (force_tables() && TABLES_WANTED.swap(false, Ordering::Relaxed));
        let force = force || current.is_some_and(|u| tables && !u.unwinder.has_tables());
        let mut modules = Modules::snapshot();
        let now = clock::ticks();
        LAST_REFRESH.store(now, Ordering::Relaxed);
        let changed = module_table::refresh(modules.modules(), now);
        if changed || force {
            if UNLOADING.load(Ordering::SeqCst) > 0 {
                let permanent = PERMANENT.get().map_or(&[][..], Vec::as_slice);
                modules.retain(|m| permanent.contains(&m.start));
            }
            swap_unwinder(Unwinding::new(&modules, tables, current));
        }
    }
    // A module gone: a new generation (lifecycle.rs).
    if let Some(after) = AFTER_REFRESH.get() {
        after();
    }
}

/// Refreshes the module table if a capture found code outside every known
/// module and the last refresh is at least [`STALE_REFRESH_MS`] old. The
/// writer thread calls this as it goes round (it may allocate and take the
/// loader's lock; no producer waits for it while it does).
pub(crate) fn refresh_if_stale() {
    if TABLES_WANTED.load(Ordering::Relaxed) {
        // The session's first unwinder has no compact tables: build them
        // here, on the writer thread.
        ON_WRITER.with(|w| w.set(true));
        refresh(false);
        ON_WRITER.with(|w| w.set(false));
    }
    if !STALE.load(Ordering::Relaxed) {
        return;
    }
    let since = clock::ticks().saturating_sub(LAST_REFRESH.load(Ordering::Relaxed));
    if since < clock::ticks_per_sec() / 1000 * STALE_REFRESH_MS {
        return;
    }
    STALE.store(false, Ordering::Relaxed);
    modules_changed();
}

/// Publishes `new` and frees the unwinder it replaces once no capture can
/// be using it (invariant 2).
pub(super) fn swap_unwinder(new: Box<Unwinding>) {
    let old = UNWINDER.swap(Box::into_raw(new), Ordering::AcqRel);
    if old.is_null() {
        return;
    }
    handshake::heavy_barrier();
    let mine = thread::current().map_or(core::ptr::null(), |s| s as *const ThreadSlot);
    for slot in thread::used_slots() {
        if core::ptr::eq(slot, mine) {
            if slot.capture_seq.is_odd() {
                // Called from a signal handler inside this thread's own
                // capture, which still uses `old`: leave it.
                return;
            }
            continue;
        }
        slot.capture_seq.wait_quiescent();
    }
    // SAFETY: `old` came from Box::into_raw in an earlier swap, and no
    // capture section that could have loaded it is still open.
    drop(unsafe { Box::from_raw(old) });
}

/// A walk `out` stopped before its limit: when no known module holds its
/// last address (a library loaded since the last refresh), asks the
/// writer thread for a refresh (`refresh_if_stale`).
#[cold]
#[inline(never)]
pub(super) fn note_unknown(out: &[u64]) {
    let Some(&ra) = out.last() else {
        return;
    };
    // SAFETY: called inside the capture section (invariant 2).
    if let Some(unwinding) = unsafe { UNWINDER.load(Ordering::Acquire).as_ref() } {
        if !unwinding.knows(ra) {
            STALE.store(true, Ordering::Relaxed);
        }
    }
}
