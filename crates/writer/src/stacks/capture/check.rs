//! The stack check mode, a testing aid (the shim's
//! `ALLOCTRACE_CHECK_STACKS=1`, [`set_check_stacks`]): every walk of the
//! shim's captures ([`super::capture_stack_from`]) is made three ways from
//! the same start registers, the memo walk the capture uses
//! (alloctrace-unwind's `capture_from`), the full compact walk without a
//! memo (`capture_from_compact`) and framehop's alone
//! (`capture_from_framehop`), and compared frame for frame, addresses and
//! `truncated`. Counts and the first mismatching walks are kept in
//! statics; [`check_stacks_report`] says what they hold (the shim prints it
//! when its session ends).
//!
//! The reference walks read the same words as the memo walk: they start
//! in the program's frame, above every frame of the tracer's, and nothing
//! runs on the thread in between (a signal handler's allocation finds the
//! capture section taken). framehop has no end-of-stack rule for the
//! thread-start trampoline (`set_walk_end`): its walk is cut after the
//! first frame returning there, as the compact walks end.
//!
//! Off, the capture pays one relaxed load and a branch; on, every capture
//! costs two more walks and about 4 KiB more of the program's stack (the
//! reference walks' buffers live there: no allocation inside malloc).

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use alloctrace_unwind::{
    capture_from, capture_from_compact, capture_from_framehop, DwarfCache, DwarfUnwinder, MemoWalk,
    Modules, StackBounds, StartRegs, WalkMemo,
};

use super::{MAX_DEPTH, THREAD_START, THREAD_START_LEN};

/// Whether the running session checks its walks; set before a session
/// starts, read by every capture (the only cost of the mode when off).
pub(super) static ENABLED: AtomicBool = AtomicBool::new(false);

/// Captures of the session whose three walks were compared with the
/// compact tables built.
static COMPARED: AtomicU64 = AtomicU64::new(0);
/// Captures compared before the writer thread had built the compact
/// tables: the compact walks then step by framehop too, so the framehop
/// walk is the only independent reference.
static WITHOUT_TABLES: AtomicU64 = AtomicU64::new(0);
/// Captures whose walks differed.
static MISMATCHES: AtomicU64 = AtomicU64::new(0);
/// The current session's number (sessions of this process image counted
/// from 1), to tell its recorded mismatches from an earlier session's.
static SESSION: AtomicU64 = AtomicU64::new(0);

/// The longest walk a capture makes (the depth limit and 4 more).
const WALK_LEN: usize = MAX_DEPTH + 4;

/// How many mismatching walks are kept (the first ones of the process
/// image; each slot is written once).
const RECORDS: usize = 4;

/// One mismatch: the three walks (memo, compact, framehop) as made.
#[derive(Clone, Copy)]
struct Mismatch {
    session: u64,
    /// Whether the compact tables were built.
    tables: bool,
    len: [usize; 3],
    truncated: [bool; 3],
    frames: [[u64; WALK_LEN]; 3],
}

/// A slot of [`RECORDED`]: written once, by the thread whose claim
/// ([`CLAIMED`]) returned its index, then `ready` is stored (Release);
/// read only after `ready` is seen (Acquire).
struct Slot {
    ready: AtomicBool,
    data: UnsafeCell<Mismatch>,
}

// SAFETY: `data` has one writer (the claimant), before `ready`, and
// readers only after it (see Slot).
unsafe impl Sync for Slot {}

static RECORDED: [Slot; RECORDS] = [const {
    Slot {
        ready: AtomicBool::new(false),
        data: UnsafeCell::new(Mismatch {
            session: 0,
            tables: false,
            len: [0; 3],
            truncated: [false; 3],
            frames: [[0; WALK_LEN]; 3],
        }),
    }
}; RECORDS];
/// Slots claimed (may exceed [`RECORDS`]; never reset).
static CLAIMED: AtomicUsize = AtomicUsize::new(0);

/// Turns the check mode on or off for the session about to start, with
/// counts from 0. Call before the session starts (the shim's
/// `start_session`), not on the event path.
pub fn set_check_stacks(on: bool) {
    COMPARED.store(0, Ordering::Relaxed);
    WITHOUT_TABLES.store(0, Ordering::Relaxed);
    MISMATCHES.store(0, Ordering::Relaxed);
    SESSION.fetch_add(1, Ordering::Relaxed);
    ENABLED.store(on, Ordering::Relaxed);
}

/// What the check mode saw in the current (or last) session, lines to
/// print (without the `alloctrace: ` prefix), `None` when it is off: first
/// `check-stacks: N captures compared, M mismatches (K more before the
/// compact tables were built: memo and framehop only)`, then each recorded
/// mismatch's three walks (each frame as `file+offset`). Not for the
/// event path (it allocates and reads the loaded objects).
pub fn check_stacks_report() -> Option<Vec<String>> {
    if !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    let session = SESSION.load(Ordering::Relaxed);
    let modules = &Modules::snapshot();
    let mut lines = vec![format!(
        "check-stacks: {} captures compared, {} mismatches ({} more before the compact tables were built: memo and framehop only)",
        COMPARED.load(Ordering::Relaxed),
        MISMATCHES.load(Ordering::Relaxed),
        WITHOUT_TABLES.load(Ordering::Relaxed),
    )];
    for slot in &RECORDED {
        if !slot.ready.load(Ordering::Acquire) {
            continue;
        }
        // SAFETY: written once, before `ready` (Slot).
        let m = unsafe { &*slot.data.get() };
        if m.session != session {
            continue;
        }
        lines.push(format!(
            "check-stacks: mismatch{}:",
            if m.tables { "" } else { " (no compact tables)" }
        ));
        let walks = m.frames.iter().zip(m.len).zip(m.truncated);
        for (name, ((frames, len), truncated)) in ["memo", "compact", "framehop"].iter().zip(walks)
        {
            let frames = frames.get(..len).unwrap_or(&[]);
            let addrs: Vec<String> = frames.iter().map(|&a| where_is(modules, a)).collect();
            lines.push(format!(
                "check-stacks:   {name:8} {len} frames{}: {}",
                if truncated { ", truncated" } else { "" },
                addrs.join(" ")
            ));
        }
    }
    Some(lines)
}

/// `addr` as `file+offset` (the offset in the file, for addr2line), or
/// in hex when no loaded module holds it.
fn where_is(modules: &Modules, addr: u64) -> String {
    match modules.find(addr) {
        Some(m) => {
            let name = m.path.rsplit(|&c| c == b'/').next().unwrap_or(&m.path);
            format!(
                "{}+{:#x}",
                String::from_utf8_lossy(name),
                addr.wrapping_sub(m.bias)
            )
        }
        None => format!("{addr:#x}"),
    }
}

/// A word no walk writes (not a canonical user-space address).
const POISON: u64 = 0xdead_0000_dead_0000;

/// The memo walk of a capture in check mode (as `capture_from`, into `out`,
/// with `memo`), then the two reference walks from `start`, compared with
/// it. Returns the memo walk, for the capture to go on with.
///
/// Must not allocate, lock or make a system call: it runs inside malloc
/// (the reference walks' buffers are on the stack, the records static).
#[cold]
#[inline(never)]
pub(super) fn walk_and_compare(
    start: StartRegs,
    bounds: &StackBounds,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    memo: &mut WalkMemo,
    out: &mut [u64],
) -> MemoWalk {
    // The buffer holds the previous walk: poisoned first, so that a memo
    // walk that left addresses unwritten cannot pass for the same stack.
    out.fill(POISON);
    let walk = capture_from(start, bounds, unwinder, cache, memo, out);
    let len = out.len().min(WALK_LEN);
    let mut compact = [0u64; WALK_LEN];
    let mut framehop = [0u64; WALK_LEN];
    let (Some(c_out), Some(f_out)) = (compact.get_mut(..len), framehop.get_mut(..len)) else {
        return walk;
    };
    let c = capture_from_compact(start, bounds, unwinder, cache, c_out);
    let f = capture_from_framehop(start, bounds, unwinder, cache, f_out);
    let (c_len, c_trunc) = (c.len.min(len), c.truncated);
    let (f_len, f_trunc) = ended_at_thread_start(f_out, f.len.min(len), f.truncated);
    let m_len = walk.len.min(len);
    let memo_frames = out.get(..m_len).unwrap_or(&[]);
    let c_frames = c_out.get(..c_len).unwrap_or(&[]);
    let f_frames = f_out.get(..f_len).unwrap_or(&[]);
    let tables = unwinder.has_tables();
    if tables {
        COMPARED.fetch_add(1, Ordering::Relaxed);
    } else {
        WITHOUT_TABLES.fetch_add(1, Ordering::Relaxed);
    }
    let same = walk.truncated == c_trunc
        && c_trunc == f_trunc
        && memo_frames == c_frames
        && c_frames == f_frames;
    if !same {
        MISMATCHES.fetch_add(1, Ordering::Relaxed);
        record(
            tables,
            [memo_frames, c_frames, f_frames],
            [walk.truncated, c_trunc, f_trunc],
        );
    }
    walk
}

/// framehop's walk `out[..len]` as the compact walks end it: after the
/// first frame returning into the thread-start trampoline, not truncated.
fn ended_at_thread_start(out: &[u64], len: usize, truncated: bool) -> (usize, bool) {
    let (start, span) = (
        THREAD_START.load(Ordering::Relaxed),
        THREAD_START_LEN.load(Ordering::Relaxed),
    );
    let frames = out.get(..len).unwrap_or(&[]);
    match frames.iter().position(|&ra| ra.wrapping_sub(start) < span) {
        Some(k) => (k + 1, false),
        None => (len, truncated),
    }
}

/// Keeps a mismatch's walks in the next free slot, if any.
// Must not allocate: runs inside malloc.
#[cold]
#[inline(never)]
fn record(tables: bool, walks: [&[u64]; 3], truncated: [bool; 3]) {
    let i = CLAIMED.fetch_add(1, Ordering::Relaxed);
    let Some(slot) = RECORDED.get(i) else {
        return;
    };
    // SAFETY: slot `i` was claimed by this thread alone (the counter
    // only grows) and nobody reads it before `ready`.
    let m = unsafe { &mut *slot.data.get() };
    m.session = SESSION.load(Ordering::Relaxed);
    m.tables = tables;
    m.truncated = truncated;
    for ((frames, len), walk) in m.frames.iter_mut().zip(m.len.iter_mut()).zip(walks) {
        let n = walk.len().min(WALK_LEN);
        if let (Some(dst), Some(src)) = (frames.get_mut(..n), walk.get(..n)) {
            dst.copy_from_slice(src);
        }
        *len = n;
    }
    slot.ready.store(true, Ordering::Release);
}
