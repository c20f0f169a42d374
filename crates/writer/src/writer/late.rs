//! Events after the end: a session stopped as its process exits
//! ([`crate::stop_at_exit`]) leaves its trace complete, and still counts
//! the events that come after the stop (another thread still running, an
//! exit handler that runs after the one that stopped the session): they
//! are lost events of the trace's last generation, rewritten in place.
//!
//! ## Design
//!
//! The last generation-end batch of such a trace is written outside any
//! compressed batch, with its `lost_events` varint padded to 10 bytes
//! (FORMAT.md: a varint takes 1 to 10 bytes), and the writer thread keeps
//! a copy of the batch and its file offset ([`EndBatch`]). Once the
//! writer thread has written everything, the stop arms this module with
//! that copy and a descriptor of its own for the file. Each late event
//! ([`late_event`]) adds one to [`COUNT`] and rewrites the batch at its
//! offset with the stop's count plus [`COUNT`], and its checksum: one
//! `pwrite` of the same length, so the file stays a complete, valid trace
//! whatever moment the process ends at.
//!
//! ## Invariants
//!
//! 1. A late event MUST add to [`COUNT`] before it reads [`READY`], and
//!    [`arm`] MUST set [`READY`] before it reads [`COUNT`] (both SeqCst).
//!    Otherwise an event counted while the stop arms could be in neither
//!    rewrite.
//! 2. One thread at a time rewrites ([`REWRITING`]); it MUST read
//!    [`COUNT`] again after each `pwrite` and after letting go, and write
//!    again if it changed. Otherwise a count added meanwhile could be in
//!    no rewrite. The others only count, so threads still running at exit
//!    pay an atomic add per call, and the one rewriting a `pwrite` per
//!    change. A process that ends in the middle of a rewrite leaves the
//!    count of the last one (the calls of its last microseconds may be
//!    missing from it), never a broken batch: each `pwrite` writes a
//!    whole batch.
//! 3. A rewrite MUST check that its descriptor still names the trace.
//!    Otherwise an exit handler that closed it and opened another file
//!    under the number would get trace bytes.
//!
//! ## Corner cases
//!
//! - The late path runs inside the program's calls, after the session:
//!   it never allocates or locks; its system calls (fstat, pwrite) are
//!   paid only by calls made after the session ended at exit.
//! - A forked child (of an exit handler) counts nothing into its parent's
//!   trace: fork.rs disarms it.
//! - A trace whose end batch could not be kept (a write error, a
//!   descriptor the program closed) counts nothing more: the trace says
//!   it was cut or reports the error as before.

use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use alloctrace_format::{batch_checksum, get_uvarint, BatchKind, BATCH_PREFIX_LEN, TRAILER_LEN};

use crate::writer::output::Output;

/// Bytes of a padded varint.
pub(crate) const PADDED_VARINT_LEN: usize = 10;

/// `v` as a varint of [`PADDED_VARINT_LEN`] bytes, whatever its value.
pub(crate) fn padded_varint(v: u64) -> [u8; PADDED_VARINT_LEN] {
    let mut out = [0u8; PADDED_VARINT_LEN];
    for (i, b) in out.iter_mut().enumerate() {
        let group = ((v >> (7 * i)) & 0x7f) as u8;
        *b = if i + 1 < PADDED_VARINT_LEN {
            group | 0x80
        } else {
            group
        };
    }
    out
}

/// The largest generation-end batch kept: prefix, a header of three
/// varints, eight body varints (version 6's four totals included),
/// trailer. A longer batch would be refused by [`lost_field`], and the
/// late events of its trace counted nowhere.
const CAP: usize = BATCH_PREFIX_LEN + 11 * PADDED_VARINT_LEN + TRAILER_LEN;

/// The last generation-end batch as the writer thread wrote it (trailer
/// included) and its file offset.
pub(crate) struct EndBatch {
    pub(crate) offset: u64,
    pub(crate) bytes: Vec<u8>,
}

/// Late events counted since the stop began.
static COUNT: AtomicU64 = AtomicU64::new(0);
/// Set once the fields below describe the batch to rewrite.
static READY: AtomicBool = AtomicBool::new(false);
/// The batch, trailer included, with its lost count as the stop wrote it.
static BATCH: [AtomicU8; CAP] = [const { AtomicU8::new(0) }; CAP];
static LEN: AtomicUsize = AtomicUsize::new(0);
/// Where the padded `lost_events` starts in the batch.
static LOST_AT: AtomicUsize = AtomicUsize::new(0);
/// The lost count the stop wrote.
static BASE: AtomicU64 = AtomicU64::new(0);
static OFFSET: AtomicU64 = AtomicU64::new(0);
/// The descriptor of this module's own (close-on-exec, high), never closed.
static FD: AtomicI32 = AtomicI32::new(-1);
/// What [`FD`] names: st_dev, st_ino.
static DEV: AtomicU64 = AtomicU64::new(0);
static INO: AtomicU64 = AtomicU64::new(0);

/// Where the padded `lost_events` of a generation-end batch starts, and
/// its value; `None` unless the batch is one as [`EndBatch`] keeps.
fn lost_field(batch: &[u8]) -> Option<(usize, u64)> {
    if batch.len() > CAP
        || batch.len() < BATCH_PREFIX_LEN + TRAILER_LEN
        || batch[0] != BatchKind::GenerationEnd as u8
    {
        return None;
    }
    let mut pos = BATCH_PREFIX_LEN;
    // generation, thread, base_ticks, end_ticks, end_mono_ns.
    for _ in 0..5 {
        get_uvarint(batch, &mut pos).ok()?;
    }
    let field = batch.get(pos..pos + PADDED_VARINT_LEN)?;
    if field[..PADDED_VARINT_LEN - 1].iter().any(|b| b & 0x80 == 0) {
        return None;
    }
    let mut at = pos;
    let lost = get_uvarint(batch, &mut at).ok()?;
    Some((pos, lost))
}

/// Arms the late count with the trace's last generation-end batch and a
/// descriptor of its own for `output` (when `output` still names the
/// trace), then writes what was counted meanwhile. Called once the writer
/// thread has written everything.
pub(crate) fn arm(output: &Output, end: &EndBatch) {
    let Some((lost_at, base)) = lost_field(&end.bytes) else {
        return;
    };
    let Some((fd, dev, ino)) = output.duplicate_if_ours() else {
        return;
    };
    for (slot, &b) in BATCH.iter().zip(&end.bytes) {
        slot.store(b, Ordering::Relaxed);
    }
    LEN.store(end.bytes.len(), Ordering::Relaxed);
    LOST_AT.store(lost_at, Ordering::Relaxed);
    BASE.store(base, Ordering::Relaxed);
    OFFSET.store(end.offset, Ordering::Relaxed);
    DEV.store(dev, Ordering::Relaxed);
    INO.store(ino, Ordering::Relaxed);
    let old = FD.swap(fd, Ordering::Relaxed);
    if old >= 0 {
        // SAFETY: our own descriptor of an earlier trace, no longer used.
        unsafe { libc::close(old) };
    }
    // Invariant 1.
    READY.store(true, Ordering::SeqCst);
    if COUNT.load(Ordering::SeqCst) > 0 {
        rewrite();
    }
}

/// Starts counting for a session that is about to stop at exit.
pub(crate) fn reset() {
    READY.store(false, Ordering::SeqCst);
    COUNT.store(0, Ordering::SeqCst);
}

/// In a forked child: the parent's trace is not the child's to count into.
pub(crate) fn disarm_in_child() {
    READY.store(false, Ordering::SeqCst);
    let fd = FD.swap(-1, Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: the child's copy of our own descriptor.
        unsafe { libc::close(fd) };
    }
}

/// Set while a thread rewrites the batch: the others only count.
static REWRITING: AtomicBool = AtomicBool::new(false);

/// Counts one event made after the session ended at exit, into the trace's
/// last generation-end batch. Never allocates, waits or locks: while
/// another thread rewrites the batch, only counts (that thread writes the
/// new count before it lets go).
pub fn late_event() {
    // Invariant 1.
    COUNT.fetch_add(1, Ordering::SeqCst);
    if READY.load(Ordering::SeqCst) {
        rewrite();
    }
}

/// Rewrites the batch until it holds the current count, unless another
/// thread does (invariant 2: the thread that lets go reads the count
/// again, SeqCst, after letting go; a count added while it held on is
/// seen there, or by its adder, which then finds the flag clear).
#[cold]
fn rewrite() {
    loop {
        if REWRITING.swap(true, Ordering::SeqCst) {
            return;
        }
        let written = rewrite_until_stable();
        REWRITING.store(false, Ordering::SeqCst);
        if written.is_none_or(|n| COUNT.load(Ordering::SeqCst) == n) {
            return;
        }
    }
}

/// Rewrites the batch with the current count until the count stays the
/// same across a write (invariants 2 and 3); the count written last, or
/// `None` when the batch can no longer be written.
fn rewrite_until_stable() -> Option<u64> {
    let len = LEN.load(Ordering::Relaxed);
    let lost_at = LOST_AT.load(Ordering::Relaxed);
    let fd = FD.load(Ordering::Relaxed);
    let mut buf = [0u8; CAP];
    for (b, slot) in buf.iter_mut().zip(&BATCH).take(len) {
        *b = slot.load(Ordering::Relaxed);
    }
    loop {
        let n = COUNT.load(Ordering::SeqCst);
        let lost = padded_varint(BASE.load(Ordering::Relaxed).saturating_add(n));
        buf[lost_at..lost_at + PADDED_VARINT_LEN].copy_from_slice(&lost);
        let crc = batch_checksum(&[&buf[..len - TRAILER_LEN]]);
        buf[len - TRAILER_LEN..len].copy_from_slice(&crc.to_le_bytes());
        // SAFETY: an all-zero stat is a valid out-buffer.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: st is a valid out-pointer.
        if unsafe { libc::fstat(fd, &mut st) } != 0
            || st.st_dev != DEV.load(Ordering::Relaxed)
            || st.st_ino != INO.load(Ordering::Relaxed)
        {
            return None;
        }
        let offset = OFFSET.load(Ordering::Relaxed) as libc::off_t;
        // SAFETY: buf holds len bytes.
        let written = unsafe { libc::pwrite(fd, buf.as_ptr().cast(), len, offset) };
        if written < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        if written != len as isize {
            return None;
        }
        if COUNT.load(Ordering::SeqCst) == n {
            return Some(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_padded_varint_reads_as_its_value_in_ten_bytes() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let bytes = padded_varint(v);
            let mut pos = 0;
            assert_eq!(get_uvarint(&bytes, &mut pos), Ok(v));
            assert_eq!(pos, PADDED_VARINT_LEN);
        }
    }

    #[test]
    fn the_lost_field_is_found_only_padded_in_a_generation_end() {
        let mut batch = vec![BatchKind::GenerationEnd as u8, 0, 0, 0, 0];
        batch.extend([1, 0, 5, 100, 7]); // header; end_ticks 100; mono 7
        let at = batch.len();
        batch.extend(padded_varint(42));
        batch.push(0); // lost_stacks
        batch.extend([0; TRAILER_LEN]);
        assert_eq!(lost_field(&batch), Some((at, 42)));
        // Every varint as long as a varint gets, version 6's four totals
        // included: the longest generation end there is.
        let mut longest = vec![BatchKind::GenerationEnd as u8, 0, 0, 0, 0];
        for _ in 0..5 {
            longest.extend(padded_varint(u64::MAX));
        }
        let lost_at = longest.len();
        for _ in 0..6 {
            longest.extend(padded_varint(u64::MAX));
        }
        longest.extend([0; TRAILER_LEN]);
        assert_eq!(lost_field(&longest), Some((lost_at, u64::MAX)));
        let mut short = batch.clone();
        short[at] = 42; // a one-byte varint: not padded
        assert_eq!(lost_field(&short), None);
        batch[0] = BatchKind::TraceEnd as u8;
        assert_eq!(lost_field(&batch), None);
    }
}
