//! The event path: what an event call does, from the check that tracing is
//! on to the bytes in the thread's batch buffer. `emit` and `emit_tagged`
//! (heap objects, spans, stacks), `emit_page` (the page tracer), the fast
//! path `write_event_fast` and the slow path `emit_slow` with its `refill`.
//!
//! Relies on invariants 1 (the seqlock section around every read of the
//! generation and every buffer touched), 3 (a thread's own flush takes only
//! the current parity), 6 (no allocation, lock or panic; syscalls only on
//! refill) and 7 (every event not recorded is counted) of session/mod.rs.
//! Speed: the fast path is `#[inline(always)]` throughout with no call in
//! it; everything else is `#[cold]` or out of line.

use core::ptr::NonNull;
use core::sync::atomic::Ordering;

use alloctrace_format::{
    AddressClass, BatchKind, EventKind, ENTRY_TAG, LONG_FORM, MAX_BATCH_HEADER_LEN, MAX_EVENT_LEN,
};

use crate::buffer::{Buffer, Want};
use crate::clock;
use crate::lost::{LOST_STACKS, LOST_WITHOUT_SLOT};
use crate::session::SESSION;
use crate::shared::{inline_mode, FAST_MODE, SHARED};
use crate::stacks::call_stack_table;
use crate::thread::{self, Stream, ThreadSlot};

/// Whether tracing is on.
#[inline(always)]
pub fn enabled() -> bool {
    SHARED.generation.load(Ordering::Relaxed) != 0
}

/// Records one event. `addr` is compressed into an ID with the alignment of
/// the kind's class; `arg1`, `arg2` are the remaining arguments (for stack
/// alloc/exists, `arg1` is the size in bytes, written as its log2).
///
/// Must not allocate, lock or panic: runs inside the host's malloc.
#[inline(always)]
pub(crate) fn emit<const KIND: u8>(addr: u64, arg1: u64, arg2: u64) {
    emit_tagged::<KIND, false>(addr, arg1, arg2, 0);
}

/// [`emit`] with an entry-point tag (when `TAGGED`), for the LD_PRELOAD
/// shim. `KIND` is an [`EventKind`] as u8: a const parameter, so each event
/// kind gets its own out-of-line body with its address class, argument
/// count and stack-size logic folded away.
#[inline(always)]
pub(crate) fn emit_tagged<const KIND: u8, const TAGGED: bool>(
    addr: u64,
    arg1: u64,
    arg2: u64,
    entry: u64,
) {
    // Tracing off: one relaxed load and a branch.
    if SHARED.generation.load(Ordering::Relaxed) == 0 {
        return;
    }
    emit_enabled::<KIND, TAGGED>(addr, arg1, arg2, entry);
}

/// An allocation with its call stack `stack` (kinds 11 and 12: `KIND` is
/// the kind with a stack). Stack 0 records the allocation without one (its
/// kind without a stack, by the ordinary path); an ID that names no stack
/// does too, and counts in the generation's `lost_stacks`. Otherwise the
/// stack's nodes are marked used by the generation (call_stack_table.rs
/// invariant 3: inside the seqlock section, as the event is written) and
/// the event carries the ID. A stack the generation has already marked
/// goes by the fast path; the marking is the slow path's.
#[inline(always)]
pub(crate) fn emit_with_stack<const KIND: u8, const TAGGED: bool>(
    addr: u64,
    arg1: u64,
    arg2: u64,
    stack: u64,
    entry: u64,
) {
    if SHARED.generation.load(Ordering::Relaxed) == 0 {
        return;
    }
    emit_with_stack_enabled::<KIND, TAGGED>(addr, arg1, arg2, stack, entry);
}

/// The common case, a stack this generation already used (a loop
/// allocating from one place, a call stack met before): no marking to do,
/// the fast path writes it. Everything else is [`emit_with_stack_slow`],
/// out of line, so this body saves few registers.
#[inline(never)]
fn emit_with_stack_enabled<const KIND: u8, const TAGGED: bool>(
    addr: u64,
    arg1: u64,
    arg2: u64,
    stack: u64,
    entry: u64,
) {
    let Some(kind) = EventKind::from_u8(KIND) else {
        return;
    };
    let entry = if TAGGED { entry } else { 0 };
    if stack != 0 && write_event_fast(kind, addr, arg1, arg2, stack, entry) {
        return;
    }
    emit_with_stack_slow::<KIND, TAGGED>(addr, arg1, arg2, stack, entry);
}

/// [`emit_with_stack_enabled`]'s rest: stack 0, a stack this generation
/// has not marked yet (marked here, inside the seqlock section before the
/// event is written: call_stack_table.rs invariant 3), an ID that names no
/// stack, and whatever else the fast path leaves ([`emit_slow`]'s cases).
#[cold]
#[inline(never)]
fn emit_with_stack_slow<const KIND: u8, const TAGGED: bool>(
    addr: u64,
    arg1: u64,
    arg2: u64,
    stack: u64,
    entry: u64,
) {
    let Some(kind) = EventKind::from_u8(KIND) else {
        return;
    };
    let entry = if TAGGED { entry } else { 0 };
    let plain = kind.without_stack();
    if stack == 0 {
        if !write_event_fast(plain, addr, arg1, arg2, 0, entry) {
            emit_slow(plain, addr, arg1, arg2, entry);
        }
        return;
    }
    let defined = stack <= u64::from(u32::MAX) && call_stack_table::is_defined(stack);
    with_slot(
        #[inline(always)]
        |slot, generation| {
            if defined {
                call_stack_table::mark_used(stack as u32, generation);
                write_event(slot, generation, kind, addr, arg1, arg2, stack, entry);
            } else {
                LOST_STACKS[(generation & 1) as usize].fetch_add(1, Ordering::Relaxed);
                write_event(slot, generation, plain, addr, arg1, arg2, 0, entry);
            }
        },
    );
}

/// Runs `write` for one event inside the calling thread's seqlock section
/// (invariant 1), with the generation it read. Counts the event as lost when
/// the thread has no slot or is already inside the event path.
#[inline(always)]
fn with_slot(write: impl FnOnce(&ThreadSlot, u64)) {
    let Some(slot) = thread::current_or_claim() else {
        count_lost_without_slot();
        return;
    };
    if !slot.seq.try_begin() {
        // A signal handler interrupted an event on this thread.
        let generation = SHARED.generation.load(Ordering::Relaxed);
        slot.lost[(generation & 1) as usize].fetch_add(1, Ordering::Relaxed);
        return;
    }
    let generation = SHARED.generation.load(Ordering::Acquire);
    if generation != 0 {
        write(slot, generation);
    }
    slot.seq.end();
}

/// Out of line, so the disabled path at every call site stays a load and a
/// branch with no stack frame.
#[inline(never)]
fn emit_enabled<const KIND: u8, const TAGGED: bool>(addr: u64, arg1: u64, arg2: u64, entry: u64) {
    let Some(kind) = EventKind::from_u8(KIND) else {
        return;
    };
    let entry = if TAGGED { entry } else { 0 };
    if !write_event_fast(kind, addr, arg1, arg2, 0, entry) {
        emit_slow(kind, addr, arg1, arg2, entry);
    }
}

/// Everything the fast path leaves: a thread without a slot yet, a full or
/// missing buffer, a new generation, the long form, an event interrupted by
/// a signal handler.
#[cold]
#[inline(never)]
fn emit_slow(kind: EventKind, addr: u64, arg1: u64, arg2: u64, entry: u64) {
    with_slot(
        #[inline(always)]
        |slot, generation| write_event(slot, generation, kind, addr, arg1, arg2, 0, entry),
    );
}

/// The common case of [`write_event`], with no call in it (so no stack
/// frame): a thread with a slot and room in its buffer, an address on the
/// grid, a precise or coarse clock where the advancer uses membarrier.
/// The same steps and bytes as the header's inline path
/// (include/alloctrace_inline.h; c_tests/test_inline_encoding.c compares
/// them). Returns false, having recorded nothing and left the seqlock even,
/// when the slow path must run instead. `stack` is the stack ID of kinds
/// 11 and 12, written here only when the generation has already marked it
/// used (call_stack_table.rs invariant 3: the slow path marks); 0 for the
/// other kinds, which folds the check away.
#[inline(always)]
fn write_event_fast(
    kind: EventKind,
    addr: u64,
    arg1: u64,
    arg2: u64,
    stack: u64,
    entry: u64,
) -> bool {
    let mode = FAST_MODE.load(Ordering::Relaxed);
    let class = kind.address_class();
    if mode == inline_mode::OUT_OF_LINE || class == AddressClass::Raw {
        return false;
    }
    let Some(slot) = thread::current() else {
        return false;
    };
    let Some(s) = slot.seq.try_begin_asymmetric() else {
        return false;
    };
    let generation = SHARED.generation.load(Ordering::Acquire);
    let buf = slot.bufs[(generation & 1) as usize][Stream::Events as usize].load(Ordering::Relaxed);
    // No panic below (invariant 6): short_form and encode_event (format
    // crate) use only wrapping, bitwise and checked operations on the
    // caller's values; the shifts are trailing_zeros of powers of two
    // Config::validate checked, so < 64; the parity index is 0 or 1 into
    // arrays of 2.
    let short = short_form(kind, addr, arg1);
    let room = if generation != 0 {
        // SAFETY: a non-null pointer in the slot's current-parity entry is
        // held by this thread (invariant 1).
        unsafe { event_room(buf) }
    } else {
        None
    };
    let (Some((id, second)), Some(out)) = (short, room) else {
        slot.seq.end_from(s);
        return false;
    };
    if stack != 0 && !call_stack_table::used_by(stack, generation) {
        slot.seq.end_from(s);
        return false;
    }
    // SAFETY: non-null (event_room gave room in it), and this thread's.
    let b = unsafe { &mut *buf };
    let ticks = next_ticks(slot, mode == inline_mode::COARSE);
    let first = b.ids.encode(class, id);
    let flags = if entry != 0 { ENTRY_TAG } else { 0 };
    append_event(
        b,
        out,
        kind,
        flags,
        ticks,
        [first, second, arg2, stack, entry],
    );
    slot.seq.end_from(s);
    true
}

/// log2 of the alignment IDs of `class` are compressed with, in the running
/// session (0 for [`AddressClass::Raw`], which is not compressed).
#[inline(always)]
fn align_shift(class: AddressClass) -> u32 {
    match class {
        AddressClass::Span => SHARED.page_shift.load(Ordering::Relaxed),
        AddressClass::HeapObject => SHARED.heap_shift.load(Ordering::Relaxed),
        AddressClass::Stack => SHARED.stack_shift.load(Ordering::Relaxed),
        AddressClass::Raw => 0,
    }
}

/// The short form of the event's first two arguments in the running
/// session ([`alloctrace_format::short_form`]), or `None` for long form.
#[inline(always)]
fn short_form(kind: EventKind, addr: u64, arg1: u64) -> Option<(u64, u64)> {
    let min = SHARED.min_heap_addr.load(Ordering::Relaxed);
    alloctrace_format::short_form(kind, addr, arg1, min, align_shift(kind.address_class()))
}

/// The bytes one event may take at the end of `buf`'s batch, or `None` when
/// `buf` is null or has less than [`MAX_EVENT_LEN`] bytes of room.
///
/// # Safety
/// `buf` is null or a buffer the calling thread holds, and stays so while
/// the result lives.
#[inline(always)]
unsafe fn event_room<'a>(buf: *mut Buffer) -> Option<&'a mut [u8; MAX_EVENT_LEN]> {
    // SAFETY: the caller's guarantee.
    let b = unsafe { buf.as_mut() }?;
    if b.room() < MAX_EVENT_LEN {
        return None;
    }
    // SAFETY: MAX_EVENT_LEN bytes at `len` are inside the batch capacity
    // (checked above), after the header, and only this thread touches them.
    Some(unsafe { &mut *b.data().add(b.len).cast::<[u8; MAX_EVENT_LEN]>() })
}

/// Appends one event to `b`, in `out` (its [`event_room`]), with the
/// format's encoder ([`alloctrace_format::encode_event`]) and makes `ticks`
/// the batch's time base.
#[inline(always)]
fn append_event(
    b: &mut Buffer,
    out: &mut [u8; MAX_EVENT_LEN],
    kind: EventKind,
    flags: u8,
    ticks: u64,
    args: [u64; 5],
) {
    let n =
        alloctrace_format::encode_event(out, kind, flags, ticks.wrapping_sub(b.last_ticks), args);
    b.len += n;
    b.last_ticks = ticks;
}

/// The calling thread's next timestamp, for every event: with the precise
/// clock the clock, kept strictly above the thread's previous one; with the
/// coarse clock the published time, which only grows (clock::publish), or
/// the thread's previous time should it be later (the max keeps deltas
/// unsigned). The inline path of the header does the same.
#[inline(always)]
fn next_ticks(slot: &ThreadSlot, coarse: bool) -> u64 {
    let last = slot.last_ticks.load(Ordering::Relaxed);
    let ticks = if coarse {
        SHARED.published_ticks.load(Ordering::Relaxed).max(last)
    } else {
        let ticks = clock::ticks();
        if ticks <= last {
            last.wrapping_add(1)
        } else {
            ticks
        }
    };
    slot.last_ticks.store(ticks, Ordering::Relaxed);
    ticks
}

/// The slot's buffer for `generation` and `stream` with at least `need`
/// bytes of room, refilled when needed. `None` (the event counted as lost)
/// only when no buffer could be had at all.
#[inline(always)]
fn buffer_with_room(
    slot: &ThreadSlot,
    generation: u64,
    stream: Stream,
    need: usize,
    ticks: u64,
) -> Option<&'static mut Buffer> {
    let parity = (generation & 1) as usize;
    let mut buf = slot.bufs[parity][stream as usize].load(Ordering::Relaxed);
    // SAFETY: a non-null pointer in the slot's current-parity entry is held
    // by this thread (invariant 1).
    if buf.is_null() || unsafe { (*buf).room() } < need {
        match refill(slot, generation, stream, ticks) {
            Some(b) => buf = b.as_ptr(),
            None => {
                slot.lost[parity].fetch_add(1, Ordering::Relaxed);
                return None;
            }
        }
    }
    // SAFETY: as above; the buffer stays this thread's until the event ends.
    Some(unsafe { &mut *buf })
}

/// The page tracer's word layout for the running session.
#[inline(always)]
fn page_layout() -> alloctrace_format::pages::Layout {
    alloctrace_format::pages::Layout {
        page_shift: SHARED.page_shift.load(Ordering::Relaxed),
        lost_bits: alloctrace_format::pages::TIME_LOST_BITS,
    }
}

/// Records one page tracer event (a kind from `alloctrace_format::pages`).
///
/// Must not allocate, lock or panic: runs inside the host's page allocator.
#[inline(always)]
pub(crate) fn emit_page(kind: u64, base: u64, npages: u64) {
    if SHARED.generation.load(Ordering::Relaxed) == 0 {
        return;
    }
    emit_page_enabled(kind, base, npages);
}

#[inline(never)]
fn emit_page_enabled(kind: u64, base: u64, npages: u64) {
    with_slot(
        #[inline(always)]
        |slot, generation| write_page_event(slot, generation, kind, base, npages),
    );
}

/// Most bytes one page event takes: a time sync word, then a long event
/// (sync word, base, npages).
const MAX_PAGE_EVENT_LEN: usize = 4 * 8;

#[inline(always)]
fn write_page_event(slot: &ThreadSlot, generation: u64, kind: u64, base: u64, npages: u64) {
    use alloctrace_format::pages::{self, SYNC_LONG_EVENT, SYNC_TIME};
    let ticks = next_ticks(slot, clock::COARSE.load(Ordering::Relaxed));
    let Some(b) = buffer_with_room(slot, generation, Stream::Pages, MAX_PAGE_EVENT_LEN, ticks)
    else {
        return;
    };
    // No panic below: `base`, `npages` (the caller's) only meet bitwise
    // operations; the layout's page shift is the validated one (16..2^40:
    // 4..=40), so its shifts and `page_shift - 3` stay in range, and
    // put_word checks its room.
    let layout = page_layout();
    let units = ticks >> pages::TIME_LOST_BITS;
    // A pages buffer keeps its time base, in units, in last_ticks.
    if units.wrapping_sub(b.last_ticks) >> pages::DELTA_BITS != 0 {
        b.put_word(pages::sync_word(SYNC_TIME, units));
        b.last_ticks = units;
    }
    let delta = units.wrapping_sub(b.last_ticks);
    if layout.page_shift >= pages::MIN_PAGE_SHIFT && layout.fits(base) {
        b.put_word(layout.event_word(kind, base, npages, delta));
        if layout.is_large(npages) {
            b.put_word(npages);
        }
    } else {
        // Off the page grid or above 48 bits: recorded exactly, long form.
        b.put_word(pages::sync_word(SYNC_LONG_EVENT, kind | delta << 2));
        b.put_word(base);
        b.put_word(npages);
    }
}

/// Counts one event of this generation as lost: a thread without a slot,
/// or one the shim no longer traces (`events::lost`).
#[cold]
pub(crate) fn count_lost_without_slot() {
    if thread::is_internal() {
        return;
    }
    let generation = SHARED.generation.load(Ordering::Relaxed);
    LOST_WITHOUT_SLOT[(generation & 1) as usize].fetch_add(1, Ordering::Relaxed);
}

/// Encodes one event into the slot's buffer for `generation`. `stack` is
/// the stack ID of kinds 11 and 12 (ignored by the others); `entry` an
/// entry-point tag, or 0 for none.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn write_event(
    slot: &ThreadSlot,
    generation: u64,
    kind: EventKind,
    addr: u64,
    arg1: u64,
    arg2: u64,
    stack: u64,
    entry: u64,
) {
    let short = short_form(kind, addr, arg1);
    let ticks = next_ticks(slot, clock::COARSE.load(Ordering::Relaxed));
    let Some(b) = buffer_with_room(slot, generation, Stream::Events, MAX_EVENT_LEN, ticks) else {
        return;
    };
    let buf: *mut Buffer = b;
    // SAFETY: buffer_with_room gave this thread's buffer, with the room.
    let Some(out) = (unsafe { event_room(buf) }) else {
        return;
    };
    // SAFETY: as above.
    let b = unsafe { &mut *buf };
    let tag = if entry != 0 { ENTRY_TAG } else { 0 };
    match short {
        // Short-form IDs travel as deltas from the batch's previous ID of
        // the same class (FORMAT.md section 3, compact events).
        Some((id, second)) => {
            let first = b.ids.encode(kind.address_class(), id);
            append_event(
                b,
                out,
                kind,
                tag,
                ticks,
                [first, second, arg2, stack, entry],
            );
        }
        // Odd arguments go in long form, raw.
        None => append_event(
            b,
            out,
            kind,
            LONG_FORM | tag,
            ticks,
            [addr, arg1, arg2, stack, entry],
        ),
    }
}

/// Replaces the slot's buffer for `generation` and `stream` with an empty one
/// holding a fresh batch header, handing the old one to the writer.
///
/// Must not allocate or lock: runs inside the host's malloc. Waits (lossless
/// back-pressure) when the writer is behind and the memory bound is reached.
#[cold]
#[inline(never)]
fn refill(
    slot: &ThreadSlot,
    generation: u64,
    stream: Stream,
    ticks: u64,
) -> Option<NonNull<Buffer>> {
    // The syscalls below (mmap, futex, sched_yield) may set errno; the
    // program's errno must come out of an event call as it went in.
    let _errno = KeepErrno::new();
    // SAFETY: the caller read a non-zero generation inside its seqlock
    // section, so the session outlives this call (stop waits for us).
    let session = unsafe { SESSION.load(Ordering::SeqCst).as_ref() }?;
    let parity = (generation & 1) as usize;
    let entry = &slot.bufs[parity][stream as usize];
    // Between the swap and the push the old batch is in neither the slot
    // nor the queue: a fatal-signal flush (crash.rs) on this thread would
    // lose it. Signals wait for the push instead (two system calls per
    // buffer, not per event).
    // The first buffer of a generation is a small one (buffer.rs
    // `SMALL_BUFFER_CAP`): most threads record little.
    let mut want = Want::Small;
    thread::without_signals(|| {
        if let Some(old) = NonNull::new(entry.swap(core::ptr::null_mut(), Ordering::Relaxed)) {
            want = Want::Refill;
            session.hand_over(old);
        }
    });
    let buf = session.pool.take(
        want,
        || session.writer.wake(),
        crate::session::deadline::past_deadline,
    )?;
    // SAFETY: take gave us the buffer; it has room for a header and an event
    // because buffer sizes are at least SMALL_BUFFER_CAP.
    let b = unsafe { &mut *buf.as_ptr() };
    debug_assert!(b.cap >= MAX_BATCH_HEADER_LEN + 3 * 8 + MAX_EVENT_LEN.max(MAX_PAGE_EVENT_LEN));
    let thread_id = slot.id.load(Ordering::Relaxed);
    match stream {
        Stream::Events => b.begin(BatchKind::CompactEvents, generation, thread_id, ticks),
        Stream::Pages => {
            use alloctrace_format::pages::{self, SYNC_THREAD, SYNC_TIME};
            b.begin(BatchKind::Pages, generation, thread_id, ticks);
            let units = ticks >> pages::TIME_LOST_BITS;
            b.put_word(page_layout().word());
            b.put_word(pages::sync_word(SYNC_THREAD, thread_id));
            b.put_word(pages::sync_word(SYNC_TIME, units));
            b.last_ticks = units;
        }
    }
    entry.store(buf.as_ptr(), Ordering::Relaxed);
    Some(buf)
}

/// Restores the calling thread's errno when dropped: event calls leave
/// errno as they found it (a program reads it after its malloc failed, and
/// the LD_PRELOAD shim records events in between).
struct KeepErrno(libc::c_int);

impl KeepErrno {
    fn new() -> KeepErrno {
        // SAFETY: __errno_location always returns this thread's errno.
        KeepErrno(unsafe { *libc::__errno_location() })
    }
}

impl Drop for KeepErrno {
    fn drop(&mut self) {
        // SAFETY: as in new.
        unsafe { *libc::__errno_location() = self.0 };
    }
}
