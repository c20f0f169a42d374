//! One generation: its batches buffered while it is open, then its events
//! merged into time order once it is complete. Events batches and pages
//! batches (the page tracer) merge into one stream.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::ops::Range;

use alloctrace_format::{
    exact_log2, pages, restore_address, unzigzag, AddressClass, BatchKind, EventKind,
};

use crate::decode::{self, BatchContext, Cursor, PageEvent, PagesState, RawEvent};
use crate::event::{Event, EventData, GenerationEnd, GenerationInfo, ProcessInfo, TypeInfo};
use crate::stacks::Stacks;
use crate::ReadError;

/// The events and pages batches of one generation are kept as raw bytes: a
/// few bytes per event instead of a decoded `Event` each.
pub(crate) struct Generation {
    pub number: u64,
    pub info: Option<GenerationInfo>,
    pub types: BTreeMap<u64, TypeInfo>,
    pub end: Option<GenerationEnd>,
    /// The process batch (kind 13, version 4), at most one.
    pub process: Option<ProcessInfo>,
    /// Call stacks, registered frames and modules (batch kinds 10 to 12).
    pub stacks: Stacks,
    /// Bodies of the generation's events and pages batches, in file order
    /// (an events batch read straight from the input keeps its header
    /// before its body, unused). Pages bodies were checked when read
    /// (`decode::validate_pages`); events bodies are checked as they are
    /// merged, each event once.
    pub raw: Vec<u8>,
    pub batches: Vec<EventBatch>,
    /// Memory this generation holds, checked against the reader's limit.
    pub memory: u64,
}

pub(crate) struct EventBatch {
    /// `BatchKind::Events` or `BatchKind::Pages`.
    pub kind: BatchKind,
    pub thread: u64,
    pub base_ticks: u64,
    /// Where the body sits in `Generation::raw`.
    pub range: Range<usize>,
    /// File offset of the body's first byte.
    pub body_offset: u64,
    /// File offset of the batch's kind byte.
    pub batch_offset: u64,
    /// For a batch inside a compressed batch: the compressed batch's file
    /// offset; `body_offset` and `batch_offset` then count from the start
    /// of its decompressed data, and so do the offsets of errors in the
    /// body, which [`EventBatch::error`] maps to the file.
    pub inside: Option<u64>,
}

impl EventBatch {
    /// An error found in this batch's body, as the reader reports it:
    /// at a byte of the file (guarantee 2 in lib.rs).
    #[cold]
    fn error(&self, err: ReadError) -> ReadError {
        match self.inside {
            Some(compressed) => err.inside_compressed(compressed),
            None => err,
        }
    }
}

impl Generation {
    pub fn new(number: u64) -> Generation {
        Generation {
            number,
            info: None,
            types: BTreeMap::new(),
            end: None,
            process: None,
            stacks: Stacks::default(),
            raw: Vec::new(),
            batches: Vec::new(),
            memory: 0,
        }
    }
}

/// A generation's clock: turns its ticks into ns since the time origin
/// (FORMAT.md section 5), as [`Event::time_ns`] gives them. Times never go
/// down as ticks go up.
///
/// ns per tick is the fraction `ns_per / ticks_per`; `floor(dt * ns_per /
/// ticks_per)` is computed exactly without a division per event (see
/// `Clock::scale`).
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start_ticks: u64,
    start_mono_ns: u64,
    origin_ns: u64,
    /// `ns_per / ticks_per` and `ns_per % ticks_per`.
    whole: u64,
    rem: u64,
    ticks_per: u64,
    /// `floor(2^64 * rem / ticks_per)`: the fraction `rem / ticks_per` in
    /// 0.64 fixed point.
    frac: u64,
    /// `start_mono_ns - origin_ns`, when not negative.
    fast_base: u64,
    /// For `dt = ticks - start_ticks` below this (0 when `start_mono_ns`
    /// is below the origin), `fast_base + scale(dt)` needs no u128 and no
    /// saturation: it fits a u64, and `start_ticks + dt` does not wrap.
    fast_dt_limit: u64,
}

impl Clock {
    fn new(info: &GenerationInfo, end: Option<&GenerationEnd>, origin_ns: u64) -> Clock {
        let (ns_per, ticks_per) = match end {
            Some(end)
                if end.end_ticks > info.start_ticks && end.end_mono_ns >= info.start_mono_ns =>
            {
                (
                    end.end_mono_ns - info.start_mono_ns,
                    end.end_ticks - info.start_ticks,
                )
            }
            // No clock pair at the end (generation cut off): use the rate.
            _ => (1_000_000_000, info.ticks_per_sec.max(1)),
        };
        Clock::from_ratio(
            info.start_ticks,
            info.start_mono_ns,
            ns_per,
            ticks_per,
            origin_ns,
        )
    }

    /// `ticks_per` must not be 0.
    fn from_ratio(
        start_ticks: u64,
        start_mono_ns: u64,
        ns_per: u64,
        ticks_per: u64,
        origin_ns: u64,
    ) -> Clock {
        let ticks_per = ticks_per.max(1);
        let rem = ns_per % ticks_per;
        // rem < ticks_per, so the quotient is below 2^64.
        let frac = ((u128::from(rem) << 64) / u128::from(ticks_per)) as u64;
        let whole = ns_per / ticks_per;
        let (fast_base, fast_dt_limit) = match start_mono_ns.checked_sub(origin_ns) {
            // scale(dt) < dt * (whole + 1) for dt > 0 (rem < ticks_per), so
            // fast_base + scale(dt) fits below this limit; and below
            // 2^64 - start_ticks, ticks before start_ticks (which wrap to a
            // dt at least that large) never take the fast path.
            Some(base) => (
                base,
                ((u64::MAX - base) / whole.saturating_add(1)).min(u64::MAX - start_ticks),
            ),
            None => (0, 0),
        };
        Clock {
            start_ticks,
            start_mono_ns,
            origin_ns,
            whole,
            rem,
            ticks_per,
            frac,
            fast_base,
            fast_dt_limit,
        }
    }

    /// `floor(dt * ns_per / ticks_per)`, exactly, with multiplications only.
    ///
    /// 1. `dt * ns_per = dt * whole * ticks_per + dt * rem`, so the result
    ///    is `dt * whole + n` with `n = floor(y)`, `y = dt * rem / ticks_per`.
    /// 2. `frac` is `F = 2^64 * rem / ticks_per` rounded down, so
    ///    `F - 1 < frac <= F` and `z = dt * frac / 2^64` lies in
    ///    `(y - dt / 2^64, y]`, within `(y - 1, y]`: `est = floor(z)` is
    ///    `n - 1` or `n`.
    /// 3. It is `n - 1` exactly when `(est + 1) * ticks_per <= dt * rem`.
    ///
    /// No product overflows a u128: every factor is below 2^64 (`est < dt`
    /// because `rem < ticks_per`).
    #[inline(always)]
    fn scale(&self, dt: u64) -> u128 {
        let dt = u128::from(dt);
        let est = (dt * u128::from(self.frac)) >> 64;
        let low = u128::from((est + 1) * u128::from(self.ticks_per) <= dt * u128::from(self.rem));
        dt * u128::from(self.whole) + est + low
    }

    /// The time in ns since the time origin of an event at `ticks`.
    ///
    /// Saturates instead of overflowing: a corrupt timestamp gives a wrong
    /// time, never a panic. Times before the origin are 0.
    #[inline(always)]
    pub fn time_ns(&self, ticks: u64) -> u64 {
        let dt = ticks.wrapping_sub(self.start_ticks);
        if dt < self.fast_dt_limit {
            // Clock::scale in u64 (see its proof; no sum here overflows).
            let est = ((u128::from(dt) * u128::from(self.frac)) >> 64) as u64;
            let low = u128::from(est + 1) * u128::from(self.ticks_per)
                <= u128::from(dt) * u128::from(self.rem);
            return self.fast_base + dt * self.whole + est + u64::from(low);
        }
        self.time_ns_saturating(ticks)
    }

    /// [`time_ns`](Self::time_ns) for any ticks, saturating.
    #[inline(never)]
    fn time_ns_saturating(&self, ticks: u64) -> u64 {
        let start = u128::from(self.start_mono_ns);
        let origin = u128::from(self.origin_ns);
        let ns = if ticks >= self.start_ticks {
            // scale() is at most (2^64 - 1)^2, so adding a u64 cannot overflow.
            (start + self.scale(ticks - self.start_ticks)).saturating_sub(origin)
        } else {
            start
                .checked_sub(self.scale(self.start_ticks - ticks))
                .map_or(0, |ns| ns.saturating_sub(origin))
        };
        u64::try_from(ns).unwrap_or(u64::MAX)
    }
}

/// Hands out a complete generation's events in time order: a k-way merge of
/// its events and pages batches, each already in time order (deltas are
/// unsigned; a pages body whose time goes back is refused when read).
///
/// The batches are sorted by thread ID, keeping file order within a
/// thread, so a batch's index is its rank for ties, and a heap key
/// `ticks << 64 | index` orders exactly as "sort by ticks; ties by thread
/// ID, then file order". The heap holds one key per *open* batch with an
/// event pending: a batch opens (its first event's key enters the heap)
/// only when that key is the smallest left, so the heap holds about one
/// batch per thread, not every batch of the generation (a thread's batches
/// follow each other in time; if they overlap, both are open and the merge
/// stays exact). The top batch hands out events for as long as they sort
/// before every other batch's, open or not, so most events cost one
/// comparison, not a pop and a push.
pub(crate) struct Emitter {
    pub gen: Generation,
    info: GenerationInfo,
    out: Restore,
    heap: BinaryHeap<Reverse<u128>>,
    /// The first events' keys of the batches not open yet, in descending
    /// order: the next to open is the last.
    waiting: Vec<u128>,
    /// One per batch.
    cursors: Vec<BatchCursor>,
    /// An error met decoding a batch's next event after events were
    /// handed out in the same call: returned by the next call, so that
    /// runs of any length hand out the same events before it.
    error: Option<ReadError>,
}

/// Where the merge stands in one batch.
struct BatchCursor {
    /// Position of the next undecoded byte in the batch's body.
    pos: usize,
    /// The decoded event waiting in the heap, if any.
    pending: Option<Pending>,
    /// The sync state of a pages batch (unused for an events batch).
    pages: PagesState,
    /// Previous IDs of a compact events batch (FORMAT.md section 3).
    ids: Ids,
}

/// The previous short-form ID of each address class within a compact
/// events batch (FORMAT.md section 3), as `alloctrace_format::IdDeltas`
/// keeps them, plus a fourth slot that calls write and nothing reads: the
/// class comes from a table, with no branch.
#[derive(Clone, Copy, Default)]
struct Ids([u64; 4]);

/// Per kind byte value (low bits): the slot of [`Ids`] of its address
/// class; 3 for a call, whose argument is no ID.
const ID_SLOT: [usize; 16] = {
    let mut slots = [3; 16];
    let mut b = 0;
    while b < 16 {
        if let Some(kind) = EventKind::from_u8(b as u8) {
            slots[b] = match kind.address_class() {
                AddressClass::Span => 0,
                AddressClass::HeapObject => 1,
                AddressClass::Stack => 2,
                AddressClass::Raw => 3,
            };
        }
        b += 1;
    }
    slots
};

impl Ids {
    /// The ID of a short-form event of `kind` written as `arg`,
    /// remembered as its class's previous one; `arg` itself for a call.
    #[inline(always)]
    fn decode(&mut self, kind: EventKind, arg: u64) -> u64 {
        let slot = ID_SLOT[kind as usize % 16];
        let id = self.0[slot % 4].wrapping_add(unzigzag(arg) as u64);
        self.0[slot % 4] = id;
        if slot == 3 {
            arg
        } else {
            id
        }
    }
}

#[derive(Clone, Copy)]
enum Pending {
    Object(RawEvent),
    Page(PageEvent),
}

/// The heap key of batch `i`'s event at `ticks`.
fn key(ticks: u64, i: usize) -> u128 {
    u128::from(ticks) << 64 | i as u128
}

/// Turns decoded events of one generation into [`Event`]s: addresses
/// restored (FORMAT.md section 4), times in ns.
struct Restore {
    clock: Clock,
    generation: u64,
    min_heap_addr: u64,
    /// log2 of the info batch's `page_size`, `min_heap_align` and
    /// `min_stack_align` (powers of two: checked when it was read).
    span_shift: u32,
    heap_shift: u32,
    stack_shift: u32,
}

impl Emitter {
    /// `gen` must have its info batch.
    pub fn new(
        mut gen: Generation,
        info: GenerationInfo,
        origin_ns: u64,
    ) -> Result<Emitter, ReadError> {
        // Stable: file order stays within a thread.
        gen.batches.sort_by_key(|b| b.thread);
        if gen.end.is_none() {
            gen.stacks.set_cut();
        }
        let out = Restore {
            clock: Clock::new(&info, gen.end.as_ref(), origin_ns),
            generation: gen.number,
            min_heap_addr: info.min_heap_addr,
            span_shift: exact_log2(info.page_size).unwrap_or(0),
            heap_shift: exact_log2(info.min_heap_align).unwrap_or(0),
            stack_shift: exact_log2(info.min_stack_align).unwrap_or(0),
        };
        let mut cursors = Vec::with_capacity(gen.batches.len());
        let mut keys = Vec::with_capacity(gen.batches.len());
        for (i, batch) in gen.batches.iter().enumerate() {
            let mut cursor = BatchCursor {
                pos: 0,
                pending: None,
                pages: PagesState::new(batch.thread, batch.base_ticks),
                ids: Ids::default(),
            };
            if let Some((ticks, pending)) =
                decode_next(&gen.raw, &gen.stacks, batch, &mut cursor, batch.base_ticks)?
            {
                cursor.pending = Some(pending);
                keys.push(key(ticks, i));
            }
            cursors.push(cursor);
        }
        keys.sort_unstable_by(|a, b| b.cmp(a));
        Ok(Emitter {
            gen,
            info,
            out,
            heap: BinaryHeap::with_capacity(16),
            waiting: keys,
            cursors,
            error: None,
        })
    }

    /// Hands the next events, at most `max`, to `emit` in time order;
    /// returns how many (fewer than `max` only when every event is out, or
    /// an error follows: the next call returns it).
    #[inline]
    pub fn drain(&mut self, max: usize, mut emit: impl FnMut(&Event)) -> Result<usize, ReadError> {
        if let Some(err) = self.error.take() {
            return Err(err);
        }
        let Emitter {
            gen,
            out,
            heap,
            waiting,
            cursors,
            error,
            ..
        } = self;
        let mut n = 0;
        while n < max {
            let next_waiting = waiting.last().copied().unwrap_or(u128::MAX);
            let slots = heap.as_slice();
            let top = match slots.first() {
                Some(&Reverse(top)) if top < next_waiting => top,
                _ => {
                    // The smallest key is a batch not open yet: open it.
                    let Some(first) = waiting.pop() else {
                        break;
                    };
                    heap.push(Reverse(first));
                    continue;
                }
            };
            // The smaller child of the root is the second-smallest open key.
            let limit = slots
                .iter()
                .skip(1)
                .take(2)
                .map(|r| r.0)
                .min()
                .unwrap_or(u128::MAX)
                .min(next_waiting);
            let (mut ticks, i) = ((top >> 64) as u64, top as u64 as usize);
            let (Some(batch), Some(cursor)) = (gen.batches.get(i), cursors.get_mut(i)) else {
                heap.pop();
                continue;
            };
            // The run's next event stays in a local, not in the cursor:
            // stored and loaded back per event, it costs stalled loads.
            let Some(mut pending) = cursor.pending.take() else {
                heap.pop();
                continue;
            };
            if let Pending::Object(first) = pending {
                let run = Run {
                    raw: &gen.raw,
                    stacks: &gen.stacks,
                    batch,
                    index: i,
                    limit,
                    budget: max - n,
                };
                let (count, next) = run.drain(cursor, out, first, ticks, &mut emit);
                n += count;
                match next {
                    Ok(Some(t)) => {
                        if let Some(mut slot) = heap.peek_mut() {
                            *slot = Reverse(key(t, i));
                        }
                    }
                    Ok(None) => {
                        heap.pop();
                    }
                    // `count` is at least 1: the run's first event is out.
                    Err(err) => {
                        *error = Some(err);
                        return Ok(n);
                    }
                }
                continue;
            }
            loop {
                // Handed out where it was built: a copy of the Event, with
                // its one-byte fields, costs a stalled load.
                match pending {
                    Pending::Object(raw) => emit(&out.event(raw, ticks, batch.thread)),
                    Pending::Page(page) => emit(&out.page_event(page, batch.thread)),
                }
                n += 1;
                let next = match decode_next(&gen.raw, &gen.stacks, batch, cursor, ticks) {
                    Ok(next) => next,
                    Err(err) => {
                        *error = Some(err);
                        return Ok(n);
                    }
                };
                match next {
                    Some((t, p)) if n < max && key(t, i) < limit => (ticks, pending) = (t, p),
                    Some((t, p)) => {
                        cursor.pending = Some(p);
                        // A sift down from the root: the batch's new place.
                        if let Some(mut slot) = heap.peek_mut() {
                            *slot = Reverse(key(t, i));
                        }
                        break;
                    }
                    None => {
                        heap.pop();
                        break;
                    }
                }
            }
        }
        Ok(n)
    }

    pub fn info(&self) -> &GenerationInfo {
        &self.info
    }

    pub fn clock(&self) -> &Clock {
        &self.out.clock
    }

    /// Gives up the raw bytes once every event is out (emptied, for the
    /// reader to reuse); info and types stay.
    pub fn release(&mut self) -> Vec<u8> {
        let mut raw = std::mem::take(&mut self.gen.raw);
        raw.clear();
        self.gen.batches = Vec::new();
        self.cursors = Vec::new();
        self.heap = BinaryHeap::new();
        self.waiting = Vec::new();
        raw
    }
}

impl Restore {
    #[inline(never)]
    fn page_event(&self, page: PageEvent, thread: u64) -> Event {
        let npages = page.npages;
        let data = match page.kind {
            pages::KIND_ALLOC => EventData::PageAlloc { npages },
            pages::KIND_FREE => EventData::PageFree { npages },
            // KIND_SCAV: decode never returns a page event of kind 0.
            _ => EventData::PageScav { npages },
        };
        Event {
            time_ns: self.clock.time_ns(page.ticks),
            ticks: page.ticks,
            generation: self.generation,
            thread,
            long_form: page.long_form,
            addr: page.base,
            data,
            entry: None,
            stack_id: 0,
        }
    }

    #[inline(always)]
    fn event(&self, raw: RawEvent, ticks: u64, thread: u64) -> Event {
        let [first, second, third, stack_id] = raw.args;
        // The size of a stack: the short form carries its order, checked
        // to be at most 63.
        let stack_size = || {
            if raw.long_form {
                second
            } else {
                1u64.checked_shl(u32::try_from(second).unwrap_or(u32::MAX))
                    .unwrap_or(0)
            }
        };
        // One match for the data and the ID's alignment (no second jump
        // table for the address class); a call's argument is no address.
        let (data, shift) = match raw.kind {
            EventKind::SpanExists => (
                EventData::SpanExists {
                    npages: second,
                    kind_class: third,
                },
                Some(self.span_shift),
            ),
            EventKind::SpanAlloc | EventKind::SpanAllocStack => (
                EventData::SpanAlloc {
                    npages: second,
                    kind_class: third,
                },
                Some(self.span_shift),
            ),
            EventKind::SpanFree => (EventData::SpanFree, Some(self.span_shift)),
            EventKind::HeapObjectExists => (
                EventData::HeapObjectExists {
                    size: second,
                    type_id: third,
                },
                Some(self.heap_shift),
            ),
            EventKind::HeapObjectAlloc | EventKind::HeapObjectAllocStack => (
                EventData::HeapObjectAlloc {
                    size: second,
                    type_id: third,
                },
                Some(self.heap_shift),
            ),
            EventKind::HeapObjectFree => (EventData::HeapObjectFree, Some(self.heap_shift)),
            EventKind::StackExists => (
                EventData::StackExists { size: stack_size() },
                Some(self.stack_shift),
            ),
            EventKind::StackAlloc => (
                EventData::StackAlloc { size: stack_size() },
                Some(self.stack_shift),
            ),
            EventKind::StackFree => (EventData::StackFree, Some(self.stack_shift)),
            EventKind::Call => (EventData::Call, None),
        };
        let addr = match shift {
            Some(shift) if !raw.long_form => restore_address(first, self.min_heap_addr, shift),
            _ => first,
        };
        Event {
            time_ns: self.clock.time_ns(ticks),
            ticks,
            generation: self.generation,
            thread,
            long_form: raw.long_form,
            addr,
            data,
            entry: alloctrace_format::EntryPoint::from_tag(raw.entry),
            stack_id,
        }
    }
}

/// A run of one events batch's events: they are handed out while they sort
/// before every other batch's.
struct Run<'a> {
    raw: &'a [u8],
    /// The generation's call stacks: every stack ID an event names must be
    /// one of them.
    stacks: &'a Stacks,
    batch: &'a EventBatch,
    /// The batch's index, for its heap keys.
    index: usize,
    /// The heap key the run's events must sort before.
    limit: u128,
    /// At most this many events.
    budget: usize,
}

impl Run<'_> {
    /// Hands out `first` (at `ticks`) and the batch's events after it while
    /// the run lasts; returns how many, and the ticks of the batch's next
    /// event, which is left in `cursor.pending` (`None` at the end of the
    /// batch), or the error in that event. The position, the ID bases and
    /// the event stay in locals through the loop: kept in the cursor, every
    /// event would wait on stores of the one before.
    #[inline(always)]
    fn drain(
        &self,
        cursor: &mut BatchCursor,
        out: &Restore,
        first: RawEvent,
        mut ticks: u64,
        emit: &mut impl FnMut(&Event),
    ) -> (usize, Result<Option<u64>, ReadError>) {
        let body = self.raw.get(self.batch.range.clone()).unwrap_or(&[]);
        let compact = self.batch.kind == BatchKind::CompactEvents;
        let thread = self.batch.thread;
        // key(t, index) < limit exactly when t < ticks_limit: the run's
        // test without building a key per event.
        let ticks_limit = match self.limit.checked_sub(self.index as u128) {
            Some(room) => (room >> 64) + u128::from(room as u64 != 0),
            None => 0,
        };
        let mut pos = cursor.pos;
        // The ID bases stay in the cursor: they are stored per event
        // anyway (indexed by class), and a copy in a local, moved back in
        // wide loads when a short run ends, waits on those narrow stores.
        let ids = &mut cursor.ids;
        let mut ev = first;
        let mut n = 0;
        loop {
            // Handed out before the next is decoded: two events' fields are
            // never live at once (they would not fit the registers).
            emit(&out.event(ev, ticks, thread));
            n += 1;
            if pos >= body.len() {
                cursor.pos = pos;
                return (n, Ok(None));
            }
            let start = pos;
            let fast = decode::event_at(body, pos).and_then(|(e, end)| {
                pos = end;
                Some((ticks.checked_add(e.delta)?, e))
            });
            let (t, mut e) = match fast {
                Some(decoded) => decoded,
                None => match checked_event(self.raw, self.batch, start, ticks) {
                    Ok((t, e, end)) => {
                        pos = end;
                        (t, e)
                    }
                    Err(err) => return (n, Err(err)),
                },
            };
            if compact && !e.long_form {
                e.args[0] = ids.decode(e.kind, e.args[0]);
            }
            if e.args[3] != 0 && !self.stacks.accepts(e.args[3]) {
                return (n, Err(undefined_stack(self.raw, self.batch, start, &e)));
            }
            if n < self.budget && u128::from(t) < ticks_limit {
                (ticks, ev) = (t, e);
            } else {
                cursor.pos = pos;
                cursor.pending = Some(Pending::Object(e));
                return (n, Ok(Some(t)));
            }
        }
    }
}

/// The event at `start` in `batch`'s body by the checked decoder, for one
/// the fast decoder refused: its ticks (after `prev_ticks`), the event with
/// its arguments as written, and where it ends; or the error.
#[cold]
#[inline(never)]
fn checked_event(
    raw: &[u8],
    batch: &EventBatch,
    start: usize,
    prev_ticks: u64,
) -> Result<(u64, RawEvent, usize), ReadError> {
    let mut c = batch_cursor(raw, batch, start);
    let ev = decode::event(&mut c).map_err(|e| batch.error(e))?;
    let ticks = prev_ticks
        .checked_add(ev.delta)
        .ok_or_else(|| batch.error(c.error_at(start, "event timestamp overflows 64 bits")))?;
    Ok((ticks, ev, c.pos()))
}

/// Decodes `batch`'s next event; returns its ticks and the event, or
/// `None` at the end of the batch. `prev_ticks` is the time of its
/// previous event (events batches count from it; pages batches carry their
/// own time base).
///
/// Every check is made here: events bodies are not checked before the
/// merge (pages bodies are, and are decoded again with every check rather
/// than trusted). The fast decoder refuses all that the checked one does,
/// which then names the error.
#[inline(always)]
fn decode_next(
    raw: &[u8],
    stacks: &Stacks,
    batch: &EventBatch,
    cursor: &mut BatchCursor,
    prev_ticks: u64,
) -> Result<Option<(u64, Pending)>, ReadError> {
    if batch.kind == BatchKind::Pages {
        return decode_next_page(raw, batch, cursor);
    }
    let body = raw.get(batch.range.clone()).unwrap_or(&[]);
    let start = cursor.pos;
    if start >= body.len() {
        return Ok(None);
    }
    let Some((mut ev, pos)) = decode::event_at(body, start) else {
        return decode_next_slow(raw, stacks, batch, cursor, prev_ticks);
    };
    let Some(ticks) = prev_ticks.checked_add(ev.delta) else {
        return decode_next_slow(raw, stacks, batch, cursor, prev_ticks);
    };
    if ev.args[3] != 0 && !stacks.accepts(ev.args[3]) {
        return Err(undefined_stack(raw, batch, start, &ev));
    }
    if batch.kind == BatchKind::CompactEvents && !ev.long_form {
        ev.args[0] = cursor.ids.decode(ev.kind, ev.args[0]);
    }
    cursor.pos = pos;
    Ok(Some((ticks, Pending::Object(ev))))
}

/// [`decode_next`] for an event the fast decoder refused: the checked
/// decoder's verdict.
#[cold]
#[inline(never)]
fn decode_next_slow(
    raw: &[u8],
    stacks: &Stacks,
    batch: &EventBatch,
    cursor: &mut BatchCursor,
    prev_ticks: u64,
) -> Result<Option<(u64, Pending)>, ReadError> {
    let mut c = batch_cursor(raw, batch, cursor.pos);
    let start = c.pos();
    let mut ev = decode::event(&mut c).map_err(|e| batch.error(e))?;
    let ticks = prev_ticks
        .checked_add(ev.delta)
        .ok_or_else(|| batch.error(c.error_at(start, "event timestamp overflows 64 bits")))?;
    if ev.args[3] != 0 && !stacks.accepts(ev.args[3]) {
        return Err(undefined_stack(raw, batch, start, &ev));
    }
    if batch.kind == BatchKind::CompactEvents && !ev.long_form {
        ev.args[0] = cursor.ids.decode(ev.kind, ev.args[0]);
    }
    cursor.pos = c.pos();
    Ok(Some((ticks, Pending::Object(ev))))
}

/// [`decode_next`] for a pages batch.
#[inline(never)]
fn decode_next_page(
    raw: &[u8],
    batch: &EventBatch,
    cursor: &mut BatchCursor,
) -> Result<Option<(u64, Pending)>, ReadError> {
    let mut c = batch_cursor(raw, batch, cursor.pos);
    let next = decode::page_event(&mut c, &mut cursor.pages).map_err(|e| batch.error(e))?;
    cursor.pos = c.pos();
    Ok(next.map(|ev| (ev.ticks, Pending::Page(ev))))
}

/// The error for the event at `start` in `batch`'s body, whose stack ID
/// (`ev.args[3]`) the generation's call-stacks batches do not define.
#[cold]
#[inline(never)]
fn undefined_stack(raw: &[u8], batch: &EventBatch, start: usize, ev: &RawEvent) -> ReadError {
    let c = batch_cursor(raw, batch, 0);
    batch.error(c.error_at(
        start,
        format_args!(
            "{} event names stack ID {}, which no call-stacks batch of its generation defines",
            ev.kind.name(),
            ev.args[3]
        ),
    ))
}

/// A cursor at `pos` in `batch`'s body, for the checked decoders.
fn batch_cursor<'a>(raw: &'a [u8], batch: &EventBatch, pos: usize) -> Cursor<'a> {
    let body = raw.get(batch.range.clone()).unwrap_or(&[]);
    let ctx = BatchContext {
        kind: batch.kind,
        offset: batch.batch_offset,
    };
    let mut c = Cursor::new(body, batch.body_offset, ctx);
    c.skip(pos);
    c
}

#[cfg(test)]
mod tests {
    use super::Clock;

    /// `Clock::time_ns` against the i128 computation it replaces.
    fn check_time(
        ticks: u64,
        start_ticks: u64,
        start_mono_ns: u64,
        ns_per: u64,
        ticks_per: u64,
        origin_ns: u64,
    ) {
        let clock = Clock::from_ratio(start_ticks, start_mono_ns, ns_per, ticks_per, origin_ns);
        let (before, dt) = if ticks >= start_ticks {
            (false, ticks - start_ticks)
        } else {
            (true, start_ticks - ticks)
        };
        let scaled = u128::from(dt) * u128::from(ns_per) / u128::from(ticks_per.max(1));
        let scaled = i128::try_from(scaled).unwrap_or(i128::MAX);
        let start = i128::from(start_mono_ns);
        let ns = if before {
            start.saturating_sub(scaled)
        } else {
            start.saturating_add(scaled)
        };
        let want =
            u64::try_from(ns.saturating_sub(i128::from(origin_ns)).max(0)).unwrap_or(u64::MAX);
        assert_eq!(
            clock.time_ns(ticks),
            want,
            "ticks {ticks}, start {start_ticks} at {start_mono_ns} ns, {ns_per} ns per {ticks_per} ticks, origin {origin_ns}"
        );
    }

    #[test]
    fn time_ns_matches_the_saturating_formula() {
        let mut next = crate::test_util::xorshift(0x0123_4567_89ab_cdef);
        let edges = [
            0,
            1,
            2,
            1000,
            1 << 32,
            1 << 62,
            u64::MAX / 3,
            u64::MAX - 1,
            u64::MAX,
        ];
        let pick = move |r: u64| -> u64 {
            match r % 4 {
                0 => edges[(r >> 8) as usize % edges.len()],
                1 => r >> (r % 64),
                2 => (r >> 8) % 10_000,
                _ => r,
            }
        };
        for _ in 0..crate::test_util::rounds(300_000) {
            let v: Vec<u64> = (0..6).map(|_| pick(next())).collect();
            check_time(v[0], v[1], v[2], v[3], v[4].max(1), v[5]);
            // Near the start, on a real clock's scale.
            let start = v[1] % (1 << 50);
            let origin = v[5] % (1 << 40);
            check_time(
                start + v[0] % 4_000_000_000,
                start,
                origin + v[2] % 1_000_000,
                1_000_000_000,
                2_999_999_937,
                origin,
            );
        }
    }

    /// `Clock::scale` against the u128 division it replaces.
    fn check(dt: u64, ns_per: u64, ticks_per: u64) {
        let clock = Clock::from_ratio(0, 0, ns_per, ticks_per, 0);
        let want = u128::from(dt) * u128::from(ns_per) / u128::from(ticks_per);
        assert_eq!(
            clock.scale(dt),
            want,
            "dt {dt}, ns_per {ns_per}, ticks_per {ticks_per}"
        );
    }

    #[test]
    fn scale_is_the_exact_quotient() {
        let edges = [
            0,
            1,
            2,
            3,
            999_999_999,
            1_000_000_000,
            1_000_000_007,
            2_999_999_999,
            3_000_000_000,
            1 << 32,
            (1 << 32) - 1,
            1 << 63,
            (1 << 63) - 1,
            u64::MAX - 1,
            u64::MAX,
        ];
        for &dt in &edges {
            for &ns in &edges {
                for &tp in edges.iter().filter(|&&t| t > 0) {
                    check(dt, ns, tp);
                }
            }
        }
        // xorshift: many random triples, of every magnitude.
        let mut next = crate::test_util::xorshift(0x9e37_79b9_7f4a_7c15);
        for _ in 0..crate::test_util::rounds(200_000) {
            let (a, b, c) = (next(), next(), next());
            let (sa, sb, sc) = (
                (next() % 64) as u32,
                (next() % 64) as u32,
                (next() % 64) as u32,
            );
            check(a >> sa, b >> sb, (c >> sc).max(1));
        }
        // Rates of real clocks: a TSC near 3 GHz over a second of ns.
        for tp in [2_999_999_937u64, 3_000_000_000, 2_400_012_345] {
            for dt in (0..10_000_000_000u64).step_by(if cfg!(miri) { 99_991_000 } else { 99_991 }) {
                check(dt, 1_000_000_000, tp);
            }
        }
    }
}
