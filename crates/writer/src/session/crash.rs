//! Saving the trace of a process that a signal is about to kill.
//!
//! [`flush_for_fatal_signal`] runs inside a signal handler (the LD_PRELOAD
//! shim's, for a signal whose action is to end the process), on the thread
//! the signal hit, while the program's other threads, the writer and the
//! advancer go on running. It ends the session as `trace_stop` would when
//! it can, and otherwise saves what it safely can.
//!
//! ## Design
//!
//! 1. **The crashing thread's own buffers first**, directly, never by
//!    waiting on its own seqlock (it would wait for itself):
//!    - seqlock even (the thread was in the program's code: the common
//!      case): inside a seqlock section of its own, as an event would, it
//!      hands the buffers of the generation it reads to the writer. An
//!      advance or stop running meanwhile on another thread waits for that
//!      section, so these batches are queued before that generation's end.
//!    - seqlock odd (the signal interrupted an event of this very thread):
//!      its buffers of the current generation are handed over as they are.
//!      An events buffer's length grows once per complete event, so it holds
//!      complete events only; a pages buffer grows word by word, so it is
//!      first cut back to its last complete event. The interrupted event is
//!      counted lost (it may have written its last byte just before the
//!      signal: then it is in the trace and counted lost too; nothing can
//!      tell the two apart, and a count one too high is better than a loss
//!      not counted), and the seqlock made even, so that an advance or stop
//!      waiting for it goes on. The interrupted code must then never resume
//!      ([`FatalFlush::mid_event`]): it holds a buffer that is no longer its.
//! 2. **Then the whole session**, as stop does, if [`CONTROL`] can be taken
//!    within [`CONTROL_WAIT`]: generation 0, the handshake with every other
//!    thread (a thread still inside an event after [`QUIESCE_WAIT`] keeps
//!    its buffers: they may be half written), every previous-generation
//!    buffer handed over, the type table, the generation end, the trace end;
//!    then the writer drains the queue and returns, waited for up to
//!    [`DRAIN_WAIT`] (a flag, not a join: a join frees memory). The trace is
//!    then complete.
//! 3. **Otherwise** the thread's own batches are queued and the trace is
//!    cut where the writer stops (readers say so): CONTROL was held by this
//!    very thread (a signal in the middle of start, advance or stop: the
//!    writer is given up to [`DRAIN_WAIT`] to take what is queued), or by
//!    another thread for all of [`CONTROL_WAIT`] (then the session may be
//!    ending under that thread and is not touched at all).
//!
//! ## Invariants
//!
//! 1. Every wait MUST be bounded (a deadline read from CLOCK_MONOTONIC).
//!    Otherwise a process killed by a signal could hang instead of dying.
//! 2. Nothing here MUST allocate, free, or take a lock except CONTROL with
//!    `try_lock` (the signal may have hit inside malloc, holding its lock).
//!    Hence the session is leaked, never dropped, and the tracer's threads
//!    are left unjoined.
//! 3. A batch MUST be queued only while its generation is still open: the
//!    thread's own batches inside a seqlock section (or while its odd
//!    seqlock holds any advance back), the others' after the handshake.
//!    Otherwise a batch could follow its generation's end, or the trace's.
//!
//! ## Corner cases
//!
//! - Flight-recorder mode (writer/flight.rs): when step 2 ends the
//!   session, the writer thread writes the ring, the last generation
//!   included, to the output before it returns (within [`DRAIN_WAIT`]);
//!   in step 3 nothing is dumped (the session is not ended).
//! - Several threads hit at once: the first one flushes, the others wait
//!   for it (bounded) and do nothing themselves.
//! - The tracer's own threads (writer, advancer) block every signal, so only
//!   a fault of their own reaches a handler there: nothing is flushed (the
//!   writer could not write it anyway).
//! - No session running: nothing to do.
//! - A signal handler that returns (the process goes on after all, e.g. a
//!   fault that does not repeat): the session is over, the program runs on
//!   untraced; CONTROL is released and `start` works again.

use core::sync::atomic::{AtomicU8, Ordering};
use std::sync::TryLockError;

use alloctrace_format::{get_uvarint, pages, BatchKind, BATCH_PREFIX_LEN};

use crate::buffer::Buffer;
use crate::lost::LOST_WITHOUT_SLOT;
use crate::session::deadline::{self, now_ns};
use crate::session::meta::{finish_generation, MetaWriter};
use crate::session::{Session, CONTROL, IN_CONTROL, SESSION};
use crate::shared::SHARED;
use crate::thread::{self, Stream, ThreadSlot, STREAMS};

/// Longest wait for [`CONTROL`] (an advance or stop in progress on another
/// thread usually ends within milliseconds).
pub const CONTROL_WAIT: core::time::Duration = core::time::Duration::from_secs(1);
/// Longest wait for all the other threads to leave their events.
pub const QUIESCE_WAIT: core::time::Duration = core::time::Duration::from_millis(500);
/// Longest wait for the writer to write out what is queued.
pub const DRAIN_WAIT: core::time::Duration = core::time::Duration::from_secs(2);

const IDLE: u8 = 0;
const FLUSHING: u8 = 1;

/// Whether a fatal-signal flush is under way (one at a time).
static STATE: AtomicU8 = AtomicU8::new(IDLE);

/// What [`flush_for_fatal_signal`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FatalFlush {
    /// The calling thread's buffers were queued for the writer.
    pub own_flushed: bool,
    /// The session was ended: tracing is off, and the trace-end batch was
    /// queued after every batch that could be collected.
    pub ended: bool,
    /// The writer wrote everything queued and returned: with `ended`, the
    /// trace is complete.
    pub drained: bool,
    /// The signal interrupted the calling thread inside an event: the code
    /// it interrupted must not resume (deliver the signal again instead of
    /// returning into a repeating fault).
    pub mid_event: bool,
}

fn after(d: core::time::Duration) -> u64 {
    now_ns().saturating_add(d.as_nanos() as u64)
}

/// A short pause between polls, safe in a signal handler.
fn pause() {
    // SAFETY: sched_yield has no preconditions.
    unsafe { libc::sched_yield() };
}

/// Saves what can be saved of the trace before a signal kills the process.
/// Call from the handler of a signal whose action is to end the process,
/// on the thread it hit (see the module docs for what is done when).
///
/// Async-signal-safe: no allocation, no blocking lock, every wait bounded
/// (at most `CONTROL_WAIT` + `QUIESCE_WAIT` + `DRAIN_WAIT`; a few
/// milliseconds normally). Never panics.
pub fn flush_for_fatal_signal() -> FatalFlush {
    let mut result = FatalFlush::default();
    if thread::is_internal() {
        return result;
    }
    if STATE
        .compare_exchange(IDLE, FLUSHING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        // Another thread flushes: its end of the session takes
        // this thread's buffers too. Wait for it, so the process does not
        // die under it.
        let until = after(CONTROL_WAIT + QUIESCE_WAIT + DRAIN_WAIT);
        while STATE.load(Ordering::Acquire) == FLUSHING && now_ns() < until {
            pause();
        }
        return result;
    }
    if let Some(slot) = thread::current() {
        result.mid_event = flush_own(slot);
        result.own_flushed = true;
    }
    if IN_CONTROL.with(|c| c.get()) {
        drain_queue();
    } else {
        (result.ended, result.drained) = end_session();
    }
    STATE.store(IDLE, Ordering::Release);
    result
}

/// Design step 1: queues the calling thread's buffers of the current
/// generation. Returns whether the thread was inside an event.
fn flush_own(slot: &ThreadSlot) -> bool {
    let mid_event = slot.seq.is_odd();
    if !mid_event && !slot.seq.try_begin() {
        return false;
    }
    let generation = SHARED.generation.load(Ordering::Acquire);
    // SAFETY: a non-zero generation read inside the seqlock section (or
    // while an odd seqlock holds every advance and stop back) keeps the
    // session alive until seq.end().
    let session = unsafe { SESSION.load(Ordering::SeqCst).as_ref() };
    if let (1.., Some(session)) = (generation, session) {
        let parity = (generation & 1) as usize;
        for stream in 0..STREAMS {
            if let Some(buf) = slot.take_buffer(parity, stream) {
                if mid_event && stream == Stream::Pages as usize {
                    // SAFETY: taken from this thread's slot: no one else
                    // holds it.
                    cut_to_complete_page_events(unsafe { &mut *buf.as_ptr() });
                }
                session.hand_over(buf);
            }
        }
        if mid_event {
            slot.lost[parity].fetch_add(1, Ordering::Relaxed);
        }
    }
    // Even again: an advance or stop waiting for this thread goes on. After
    // an interrupted event this ends that event for good.
    slot.seq.end();
    mid_event
}

/// Cuts a pages batch back to its last complete event: an interrupted
/// page event may have written only the first words of its two or three.
fn cut_to_complete_page_events(b: &mut Buffer) {
    let len = b.len;
    let bytes = b.bytes();
    let mut pos = BATCH_PREFIX_LEN;
    // The batch header: generation, thread, base time.
    for _ in 0..3 {
        if get_uvarint(bytes, &mut pos).is_err() {
            return;
        }
    }
    let mut complete = pos;
    // `bytes` holds `len` bytes (len <= cap < 2^24, so no sum below
    // overflows); `get` keeps even a torn length from panicking.
    while let Some(word) = bytes.get(pos..pos + 8) {
        let mut w8 = [0u8; 8];
        w8.copy_from_slice(word);
        let w = u64::from_le_bytes(w8);
        let words = if w & 3 == pages::KIND_SYNC {
            if (w >> 2) & 3 == pages::SYNC_LONG_EVENT {
                3
            } else {
                1
            }
        } else if (w >> 2) & 1 != 0 {
            2
        } else {
            1
        };
        if pos + 8 * words > len {
            break;
        }
        pos += 8 * words;
        complete = pos;
    }
    b.len = complete;
}

/// Design step 3, when this thread runs start, advance or stop (it holds
/// CONTROL, so the session cannot go away under it): waits, bounded, for
/// the writer to take every queued batch.
fn drain_queue() {
    // SAFETY: the session is alive while this thread holds CONTROL (only
    // stop drops it, after clearing SESSION).
    let Some(session) = (unsafe { SESSION.load(Ordering::SeqCst).as_ref() }) else {
        return;
    };
    session.writer.wake();
    let until = after(DRAIN_WAIT);
    while !session.pool.full_is_empty() && now_ns() < until {
        pause();
    }
}

/// Design step 2: ends the session as stop does, with every wait bounded.
/// Returns whether the session was ended and whether the writer drained.
fn end_session() -> (bool, bool) {
    let until = after(CONTROL_WAIT);
    let mut control = loop {
        match CONTROL.try_lock() {
            Ok(guard) => break guard,
            Err(TryLockError::Poisoned(poisoned)) => break poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                if now_ns() >= until {
                    return (false, false);
                }
                pause();
            }
        }
    };
    let Some(session) = control.session.take() else {
        // Not tracing, or stop has ended the session already.
        return (false, false);
    };
    let drained = end_locked(&session);
    // Invariant 2: never drop the session or join a thread here. The
    // writer and the advancer exit on their own (the advancer once it gets
    // CONTROL and finds no session).
    core::mem::forget(session);
    // Handles without a Drop: taking them leaves the threads unjoined.
    let _ = control.writer.take();
    let _ = control.advancer.take();
    drop(control);
    (true, drained)
}

/// Ends `session` (CONTROL held): the last generation, the trace end, the
/// writer's drain. Returns whether the writer drained.
fn end_locked(session: &Session) -> bool {
    session.advancer.exit.store(true, Ordering::Release);
    let last = SHARED.generation.load(Ordering::Relaxed);
    if last == 0 {
        return false;
    }
    SHARED.generation.store(0, Ordering::SeqCst);
    let parity = (last & 1) as usize;
    let quiet_until = after(QUIESCE_WAIT);
    // Without a process-wide barrier no slot is known quiescent
    // (handshake.rs, "When membarrier fails at run time"): take no buffer.
    let barrier = crate::handshake::heavy_barrier_within(|| now_ns() >= quiet_until);
    let mut lost = LOST_WITHOUT_SLOT[parity].swap(0, Ordering::Relaxed);
    for slot in thread::used_slots() {
        // Events that begin now read generation 0 and touch no buffer; only
        // an event already under way may still write into one.
        if !barrier || !slot.seq.wait_quiescent_bounded(|| now_ns() >= quiet_until) {
            continue;
        }
        for stream in 0..STREAMS {
            if let Some(buf) = slot.take_buffer(parity, stream) {
                session.hand_over(buf);
            }
        }
        lost += slot.lost[parity].swap(0, Ordering::Relaxed);
    }
    let drain_until = after(DRAIN_WAIT);
    // The tracer's own batches take free buffers: give up at the deadline
    // rather than wait for a writer that may be stuck.
    deadline::set(drain_until);
    finish_generation(session, last, lost, false);
    MetaWriter::new(session, BatchKind::TraceEnd, last).finish();
    deadline::set(0);
    SESSION.store(core::ptr::null_mut(), Ordering::SeqCst);
    if let Some(flight) = &session.writer.flight {
        // Flight-recorder mode: the writer thread writes the ring, this
        // last generation included, to the output before it returns.
        flight.dump_at_stop.store(true, Ordering::Release);
    }
    session.writer.stop();
    while !session.writer.thread.is_done() {
        if now_ns() >= drain_until {
            return false;
        }
        pause();
    }
    true
}

#[cfg(test)]
mod tests {
    use super::cut_to_complete_page_events;
    use crate::buffer::BufferPool;
    use alloctrace_format::pages::{
        self, Layout, KIND_ALLOC, SYNC_LONG_EVENT, SYNC_THREAD, SYNC_TIME,
    };
    use alloctrace_format::BatchKind;

    #[test]
    fn cuts_a_pages_batch_back_to_its_last_complete_event() {
        let _serial = crate::buffer::tests::MAP_HOOK
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let pool = BufferPool::new(4096, 4);
        let buf = pool
            .take(crate::buffer::Want::Full, || {}, || false)
            .unwrap();
        // SAFETY: take gave us the buffer.
        let b = unsafe { &mut *buf.as_ptr() };
        let layout = Layout {
            page_shift: 12,
            lost_bits: pages::TIME_LOST_BITS,
        };
        b.begin(BatchKind::Pages, 1, 1, 300);
        b.put_word(layout.word());
        b.put_word(pages::sync_word(SYNC_THREAD, 1));
        b.put_word(pages::sync_word(SYNC_TIME, 2));
        let header = b.len;
        cut_to_complete_page_events(b);
        assert_eq!(b.len, header, "sync words are complete entries");
        let short = layout.event_word(KIND_ALLOC, 0x1000, 1, 0);
        let large = layout.event_word(KIND_ALLOC, 0x2000, 1 << 40, 0);
        let long = pages::sync_word(SYNC_LONG_EVENT, KIND_ALLOC);
        // Each event written whole, then each cut after 1..n-1 of its words.
        for words in [vec![short], vec![large, 1 << 40], vec![long, 0x3001, 2]] {
            let before = b.len;
            for &w in &words {
                b.put_word(w);
            }
            let whole = b.len;
            cut_to_complete_page_events(b);
            assert_eq!(b.len, whole, "a complete event stays");
            for k in 1..words.len() {
                b.len = before;
                for &w in &words[..k] {
                    b.put_word(w);
                }
                cut_to_complete_page_events(b);
                assert_eq!(b.len, before, "{k} of {} words are cut", words.len());
            }
            b.len = before;
            for &w in &words {
                b.put_word(w);
            }
        }
        pool.recycle(buf);
    }
}
