//! One pass over a trace's events, allocations paired with their frees.
//!
//! [`Pass::run`] reads a trace to its end and hands every allocation and
//! every free to a [`Visitor`]: a free comes with the allocation it ends
//! (its size, stack, time and thread), which the pass finds in its table of
//! live memory. Three kinds of memory live apart, since a runtime's span
//! and the first object in it share an address: heap objects, spans (pages
//! and `mmap`s) and goroutine-style stacks. Every event comes first as it
//! is ([`Visitor::event`]: calls and page events too), and what does not
//! add up with live memory as an [`Anomaly`] (`stats`' and `check`'s).
//!
//! The trace is read on the calling thread and paired on a second one,
//! fed through a [`Feed`].
//!
//! Several traces (one per process of a program) may go through one
//! [`Pass`]: stacks are interned across them (their frames are keyed by
//! module and module-relative address, so ASLR does not split them), while
//! each trace's live memory is its own.
//!
//! The live table is the one account of live memory: besides what is
//! live, it keeps the live bytes per [`Memory`] and their [`Peaks`]
//! (`stats` prints them; the reports' peak is taken on the same rule).
//! What it keeps per allocation is the visitor's choice, an [`Entry`]:
//! the whole [`Alloc`] (the reports), or its [`Size`] alone (`stats`,
//! `check`, `pages`: no call stacks interned, 16 bytes a live allocation
//! with its address).
//!
//! ## Anomalies
//! - A free of an address not live in its kind of memory is
//!   [`Anomaly::UnknownFree`], and changes nothing. In a flight-recorder
//!   window (the header's flag, FORMAT.md section 1: the last generations
//!   of a run) it is no anomaly but a free of memory allocated before the
//!   window: the pass counts it ([`PassStats::frees_before_window`]) and
//!   hands it to [`Visitor::free_before_window`] instead, so every visitor
//!   gets the same answer.
//! - An allocation *or an exists event* at an address already live in its
//!   kind of memory is [`Anomaly::DoubleAlloc`]: the live allocation ends
//!   with an implicit [`Free`] and the new record replaces it, its size
//!   included (the newer record is the better word on that memory; the
//!   free of the old one was missed).
//!
//! Memory: the live table (per live allocation, an [`Entry`] and its
//! address) and the stack table (per distinct call-stack node; empty for
//! [`Size`]), whatever the trace's length.

use std::io::Read;

use alloctrace_format::EntryPoint;
use std::collections::BTreeMap;
use std::sync::Arc;

use alloctrace_reader::{
    EventData, GenerationEnd, GenerationInfo, ProcessInfo, ReadError, Stacks, Step, TraceReader,
    TypeInfo,
};
use hashbrown::HashMap;
use rustc_hash::FxBuildHasher;

use crate::feed::{Feed, Shape, Work};
use crate::stacks::{GenerationStacks, StackId, StackTable};

/// Which table of live memory an allocation belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Memory {
    /// Heap objects (`malloc`'s blocks; a runtime's objects).
    Heap = 0,
    /// Spans: runs of pages a runtime manages, and the shim's `mmap`s.
    Span = 1,
    /// Goroutine-style stacks of a runtime.
    Stack = 2,
}

impl Memory {
    pub const ALL: [Memory; 3] = [Memory::Heap, Memory::Span, Memory::Stack];

    /// `"heap"`, `"span"` or `"stack"`.
    pub fn name(self) -> &'static str {
        match self {
            Memory::Heap => "heap",
            Memory::Span => "span",
            Memory::Stack => "stack",
        }
    }
}

/// One allocation: what an alloc or exists event said, with its stack
/// mapped to the analysis's [`StackTable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Alloc {
    /// Nanoseconds on the trace's clock (the reader's `Event::time_ns`).
    pub time_ns: u64,
    pub thread: u64,
    pub addr: u64,
    /// Bytes (a span's pages times the page size).
    pub size: u64,
    /// The heap object's type ID (C API), else 0.
    pub type_id: u64,
    /// 0: no stack recorded.
    pub stack: StackId,
    pub memory: Memory,
    /// The interposed function (shim traces).
    pub entry: Option<EntryPoint>,
    /// An exists event: the memory was live before tracing started (its
    /// time is when the trace learnt of it).
    pub existed: bool,
}

/// The end of an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Free {
    pub time_ns: u64,
    pub thread: u64,
    pub entry: Option<EntryPoint>,
    /// No free event: a new allocation at the same live address replaced
    /// it (a missed free; counted in [`PassStats::replaced`]).
    pub implicit: bool,
}

/// What the live table keeps per allocation, and hands to
/// [`Visitor::alloc`], [`Visitor::free`] and [`Visitor::trace_end`].
pub trait Entry: Copy + Send {
    /// Whether the pass interns the generations' call stacks (for
    /// [`Alloc::stack`]); without, [`Pass::stacks`] stays empty.
    const STACKS: bool;
    /// The entry of `alloc` (built from the event, then dropped).
    fn of(alloc: &Alloc) -> Self;
    /// Bytes (what the live bytes count).
    fn size(&self) -> u64;
}

impl Entry for Alloc {
    const STACKS: bool = true;

    #[inline(always)]
    fn of(alloc: &Alloc) -> Self {
        *alloc
    }

    #[inline(always)]
    fn size(&self) -> u64 {
        self.size
    }
}

/// The lean entry: an allocation's bytes alone, for visitors that need
/// no call stack, time or thread of a live allocation (`stats`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size(pub u64);

impl Entry for Size {
    const STACKS: bool = false;

    #[inline(always)]
    fn of(alloc: &Alloc) -> Self {
        Size(alloc.size)
    }

    #[inline(always)]
    fn size(&self) -> u64 {
        self.0
    }
}

/// An event that does not add up with live memory, as `alloctrace stats`
/// and `check` count it (their `anomaly_kinds`; see the module's
/// "Anomalies").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anomaly {
    /// A free of an address not live in its kind of memory
    /// ([`PassStats::unmatched_frees`]).
    UnknownFree,
    /// An allocation or an exists event at an address already live in its
    /// kind of memory ([`PassStats::replaced`]): the live one ends with an
    /// implicit free, the new one replaces it.
    DoubleAlloc,
}

impl Anomaly {
    /// What it is, in `stats`' and `check`'s words.
    pub fn what(self) -> &'static str {
        match self {
            Anomaly::UnknownFree => "free of an address that is not live",
            Anomaly::DoubleAlloc => "allocation of an address that is already live",
        }
    }
}

/// What the pass hands out; `E` is what the live table keeps per
/// allocation ([`Entry`]). Every method but `alloc` and `free` has a
/// default that does nothing.
pub trait Visitor<E: Entry = Alloc> {
    /// A trace starts (`index` counts the traces of the pass from 0).
    fn trace_start(&mut self, _index: usize) {}
    /// A generation's events follow; `generation` describes it (info,
    /// types, generation end, command line), `stacks` holds its stacks.
    fn generation(&mut self, _generation: &GenerationView, _stacks: &StackTable) {}
    /// Every event, in trace order, before what it does to live memory
    /// (`alloc` or `free`) is handed out.
    #[inline]
    fn event(&mut self, _op: &Op) {}
    /// `op` (handed to `event` just before) is an anomaly; then, for an
    /// allocation or exists event replacing a live allocation, come the
    /// old one's implicit `free` and the new one's `alloc`.
    #[cold]
    fn anomaly(&mut self, _op: &Op, _anomaly: Anomaly) {}
    /// `op` (handed to `event` just before) frees an address not live, in
    /// a flight-recorder window: memory allocated before the window (the
    /// module's "Anomalies"), not an anomaly.
    #[cold]
    fn free_before_window(&mut self, _op: &Op) {}
    /// An allocation (or an exists event) is live; the live table holds
    /// its bytes already.
    fn alloc(&mut self, alloc: &E);
    /// `alloc` ends: the allocation as it was made.
    fn free(&mut self, alloc: &E, free: &Free);
    /// The trace ended; `live` holds what was never freed.
    fn trace_end(&mut self, _live: &Live<E>) {}
}

/// Two visitors of one pass: each gets every call, the first first.
/// Nest them for more (`Both(a, Both(b, c))`).
pub struct Both<A, B>(pub A, pub B);

impl<E: Entry, A: Visitor<E>, B: Visitor<E>> Visitor<E> for Both<A, B> {
    fn trace_start(&mut self, index: usize) {
        self.0.trace_start(index);
        self.1.trace_start(index);
    }

    fn generation(&mut self, reader: &GenerationView, stacks: &StackTable) {
        self.0.generation(reader, stacks);
        self.1.generation(reader, stacks);
    }

    #[inline]
    fn event(&mut self, op: &Op) {
        self.0.event(op);
        self.1.event(op);
    }

    fn anomaly(&mut self, op: &Op, anomaly: Anomaly) {
        self.0.anomaly(op, anomaly);
        self.1.anomaly(op, anomaly);
    }

    fn free_before_window(&mut self, op: &Op) {
        self.0.free_before_window(op);
        self.1.free_before_window(op);
    }

    #[inline]
    fn alloc(&mut self, alloc: &E) {
        self.0.alloc(alloc);
        self.1.alloc(alloc);
    }

    #[inline]
    fn free(&mut self, alloc: &E, free: &Free) {
        self.0.free(alloc, free);
        self.1.free(alloc, free);
    }

    fn trace_end(&mut self, live: &Live<E>) {
        self.0.trace_end(live);
        self.1.trace_end(live);
    }
}

/// What the reader said of a generation, as visitors see it (on the pass's
/// pairing thread, away from the reader): the reader's methods of the
/// same names.
#[derive(Clone, Debug, Default)]
pub struct GenerationView {
    generation: u64,
    info: Option<GenerationInfo>,
    types: BTreeMap<u64, TypeInfo>,
    end: Option<GenerationEnd>,
    command_line: Option<Vec<String>>,
    process: Option<ProcessInfo>,
    time_origin_ns: Option<u64>,
    flight_window: bool,
}

impl GenerationView {
    /// The trace is a flight-recorder window (the reader's
    /// `flight_window`): its first generation is not the run's.
    pub fn flight_window(&self) -> bool {
        self.flight_window
    }

    /// The generation's number (the reader's `Event::generation` of its
    /// events).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The generation's info batch.
    pub fn info(&self) -> Option<&GenerationInfo> {
        self.info.as_ref()
    }

    /// The type table (C API traces).
    pub fn types(&self) -> &BTreeMap<u64, TypeInfo> {
        &self.types
    }

    /// The generation-end batch; `None` for a generation cut off before it.
    pub fn generation_end(&self) -> Option<&GenerationEnd> {
        self.end.as_ref()
    }

    /// The traced program's command line (format version 4).
    pub fn command_line(&self) -> Option<&[String]> {
        self.command_line.as_deref()
    }

    /// The first process batch read so far (format version 4).
    pub fn process(&self) -> Option<&ProcessInfo> {
        self.process.as_ref()
    }

    /// The trace's time origin in ns (what event times count from).
    pub fn time_origin_ns(&self) -> Option<u64> {
        self.time_origin_ns
    }
}

/// Live memory: address to allocation ([`Entry`]), per [`Memory`]; the
/// live bytes and their peaks.
pub struct Live<E = Alloc> {
    tables: [HashMap<u64, E, FxBuildHasher>; 3],
    /// Live bytes per [`Memory`]. u128 so that odd sizes (long-form events
    /// may carry any value) cannot overflow.
    bytes: [u128; 3],
    peaks: Peaks,
}

impl<E> Default for Live<E> {
    fn default() -> Self {
        Live {
            tables: Default::default(),
            bytes: [0; 3],
            peaks: Peaks::default(),
        }
    }
}

/// The most live memory of a trace at any moment: each number's own
/// moment, but `total_bytes` of heap objects and spans at one moment (not
/// the sum of their peaks). Taken after each allocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peaks {
    pub heap_bytes: u128,
    pub heap_objects: u64,
    pub span_bytes: u128,
    pub spans: u64,
    /// Heap-object plus span bytes.
    pub total_bytes: u128,
}

impl<E: Entry> Live<E> {
    /// Every live allocation (in no particular order).
    pub fn iter(&self) -> impl Iterator<Item = &E> + '_ {
        self.tables.iter().flat_map(|t| t.values())
    }

    pub fn len(&self) -> usize {
        self.tables.iter().map(|t| t.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Live allocations of `memory`.
    pub fn count(&self, memory: Memory) -> usize {
        self.tables[memory as usize].len()
    }

    /// Live bytes of `memory`.
    pub fn bytes(&self, memory: Memory) -> u128 {
        self.bytes[memory as usize]
    }

    pub fn peaks(&self) -> &Peaks {
        &self.peaks
    }

    /// `entry` at `addr` is live; returns the live allocation it
    /// replaces, if any.
    #[inline(always)]
    fn insert(&mut self, memory: Memory, addr: u64, entry: E) -> Option<E> {
        let m = memory as usize;
        let old = self.tables[m].insert(addr, entry);
        let gone = old.map_or(0, |old| u128::from(old.size()));
        self.bytes[m] = self.bytes[m].saturating_sub(gone) + u128::from(entry.size());
        if memory != Memory::Stack {
            self.new_peak(memory);
        }
        old
    }

    #[inline(always)]
    fn new_peak(&mut self, memory: Memory) {
        let p = &mut self.peaks;
        let [heap, span, _] = self.bytes;
        if memory == Memory::Heap {
            p.heap_bytes = p.heap_bytes.max(heap);
            p.heap_objects = p.heap_objects.max(self.tables[0].len() as u64);
        } else {
            p.span_bytes = p.span_bytes.max(span);
            p.spans = p.spans.max(self.tables[1].len() as u64);
        }
        p.total_bytes = p.total_bytes.max(heap + span);
    }

    /// The allocation at `addr` ends, if one is live.
    #[inline(always)]
    fn remove(&mut self, memory: Memory, addr: u64) -> Option<E> {
        let m = memory as usize;
        let old = self.tables[m].remove(&addr)?;
        self.bytes[m] = self.bytes[m].saturating_sub(u128::from(old.size()));
        Some(old)
    }
}

/// Counts over every trace of the pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassStats {
    /// Events read (page events included).
    pub events: u64,
    /// Allocations and exists events.
    pub allocs: u64,
    pub frees: u64,
    /// Frees of memory the trace never saw allocated (it was allocated
    /// before tracing started, or its alloc event was lost); none in a
    /// flight-recorder window, which counts them as `frees_before_window`.
    pub unmatched_frees: u64,
    /// In a flight-recorder window: frees of memory allocated before the
    /// window (the module's "Anomalies").
    pub frees_before_window: u64,
    /// Allocations and exists events at an address already live (the
    /// free was missed): the old one is ended with an implicit free.
    pub replaced: u64,
    /// Allocation events whose stack ID resolved to no stack (a generation
    /// cut off before its stack batches).
    pub unresolved_stacks: u64,
    /// Events and stacks the writer counted as lost.
    pub lost_events: u64,
    pub lost_stacks: u64,
    pub generations: u64,
    /// Per trace of the pass, where it was cut off (`None`: complete).
    pub truncated: Vec<Option<u64>>,
    /// First and last event times, ns.
    pub first_time_ns: Option<u64>,
    pub last_time_ns: u64,
}

/// Pairs allocations with frees over one or more traces.
#[derive(Default)]
pub struct Pass {
    pub stacks: StackTable,
    pub stats: PassStats,
    traces: usize,
}

/// How the reading thread hands events to the pairing one.
const SHAPE: Shape = Shape {
    chunk: 4096,
    queue: 4,
};

/// An event as the pairing thread hands it to [`Visitor::event`]: the
/// reader's `Event` less its ticks and generation (the visitor's last
/// [`Visitor::generation`] is its generation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    /// Nanoseconds on the trace's clock (the reader's `Event::time_ns`).
    pub time_ns: u64,
    pub thread: u64,
    /// The reader's `Event::addr` (a page event's: the base of its run).
    pub addr: u64,
    /// The generation's stack ID (0: none).
    pub stack_id: u64,
    /// What the event says; a span's size in pages.
    pub data: EventData,
    pub entry: Option<EntryPoint>,
    /// The writer used the long form (the reader's `Event::long_form`).
    pub long_form: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum What {
    Alloc(Memory),
    Exists(Memory),
    Free(Memory),
    /// Counted, nothing else (calls, page events).
    Other,
}

/// What `data` does to live memory: the [`What`], the size (bytes, or
/// pages for a span) and the type ID.
#[inline(always)]
fn what(data: &EventData) -> (What, u64, u64) {
    match *data {
        EventData::HeapObjectAlloc { size, type_id } => (What::Alloc(Memory::Heap), size, type_id),
        EventData::HeapObjectExists { size, type_id } => {
            (What::Exists(Memory::Heap), size, type_id)
        }
        EventData::SpanAlloc { npages, .. } => (What::Alloc(Memory::Span), npages, 0),
        EventData::SpanExists { npages, .. } => (What::Exists(Memory::Span), npages, 0),
        EventData::StackAlloc { size } => (What::Alloc(Memory::Stack), size, 0),
        EventData::StackExists { size } => (What::Exists(Memory::Stack), size, 0),
        EventData::HeapObjectFree => (What::Free(Memory::Heap), 0, 0),
        EventData::SpanFree => (What::Free(Memory::Span), 0, 0),
        EventData::StackFree => (What::Free(Memory::Stack), 0, 0),
        _ => (What::Other, 0, 0),
    }
}

/// The header of the pairing thread's chunks: the generation their events
/// are of (`None` before the first).
type Generation = Option<Arc<(GenerationView, Stacks)>>;

impl Pass {
    pub fn new() -> Pass {
        Pass::default()
    }

    /// Reads one trace to its end. `progress` gets the bytes read so far
    /// after every run of events.
    ///
    /// Two threads: the calling one reads and decodes the trace, a second
    /// one pairs allocations with frees and runs the visitor, on the
    /// events in trace order (a [`Feed`] of `SHAPE`). The result is that
    /// of one thread doing both.
    ///
    /// The live table keeps an `E` per allocation (see [`Entry`]).
    pub fn run<R: Read, E: Entry, V: Visitor<E> + Send>(
        &mut self,
        reader: &mut TraceReader<R>,
        visitor: &mut V,
        mut progress: impl FnMut(u64),
    ) -> Result<Live<E>, ReadError> {
        let index = self.traces;
        self.traces += 1;
        visitor.trace_start(index);
        let pairing = Pairing {
            live: Live::default(),
            generation: None,
            gen_stacks: GenerationStacks::default(),
            page_size: 0,
            table: &mut self.stacks,
            stats: &mut self.stats,
            visitor: &mut *visitor,
        };
        let (result, live) = std::thread::scope(|scope| {
            let mut feed = Feed::start(scope, "alloctrace-pass", SHAPE, None, pairing)
                .expect("spawning the pass's pairing thread");
            let result = read(reader, &mut feed, E::STACKS, &mut progress);
            let pairing = match feed.finish() {
                Ok(pairing) => pairing,
                Err(panic) => std::panic::resume_unwind(panic),
            };
            (result, pairing.live)
        });
        visitor.trace_end(&live);
        result?;
        self.stats.truncated.push(reader.truncated());
        Ok(live)
    }
}

/// The reading thread: decodes the trace into the feed of the pairing one
/// (`stacks`: with each generation's call stacks).
fn read<'scope, R: Read, W: Work<Op, Generation> + 'scope>(
    reader: &mut TraceReader<R>,
    feed: &mut Feed<'scope, Op, Generation, W>,
    stacks: bool,
    progress: &mut impl FnMut(u64),
) -> Result<(), ReadError> {
    loop {
        let step = reader.next_step(SHAPE.chunk, |event| {
            feed.push(Op {
                time_ns: event.time_ns,
                thread: event.thread,
                addr: event.addr,
                stack_id: event.stack_id,
                data: event.data.clone(),
                entry: event.entry,
                long_form: event.long_form,
            });
        })?;
        // The pairing thread is gone (it panicked; `finish` says so).
        if feed.is_gone() {
            return Ok(());
        }
        match step {
            Step::Events(_) => progress(reader.bytes_read()),
            Step::GenerationStart { generation } => {
                let view = GenerationView {
                    generation,
                    info: reader.info().copied(),
                    types: reader.types().clone(),
                    end: reader.generation_end().copied(),
                    command_line: reader.command_line().map(<[String]>::to_vec),
                    process: reader.process().cloned(),
                    time_origin_ns: reader.time_origin_ns(),
                    flight_window: reader.flight_window(),
                };
                let stacks = match stacks {
                    true => reader.stacks().clone(),
                    false => Stacks::default(),
                };
                feed.open(Some(Arc::new((view, stacks))));
                // Sent even before any event: every generation is seen.
                feed.flush();
            }
            Step::End => {
                progress(reader.bytes_read());
                return Ok(());
            }
        }
    }
}

/// The pairing thread's state: every event in order, allocations paired
/// with their frees, handed to the visitor.
struct Pairing<'a, E, V> {
    live: Live<E>,
    /// The generation being paired.
    generation: Generation,
    gen_stacks: GenerationStacks,
    page_size: u64,
    table: &'a mut StackTable,
    stats: &'a mut PassStats,
    visitor: &'a mut V,
}

impl<E: Entry, V: Visitor<E> + Send> Work<Op, Generation> for Pairing<'_, E, V> {
    fn chunk(&mut self, header: &Generation, ops: &[Op]) {
        if let Some(generation) = header {
            let new = match &self.generation {
                Some(current) => !Arc::ptr_eq(current, generation),
                None => true,
            };
            if new {
                self.generation = Some(Arc::clone(generation));
                self.start_generation(&generation.0, &generation.1);
            }
        }
        self.pair(ops);
    }
}

impl<E: Entry, V: Visitor<E>> Pairing<'_, E, V> {
    fn start_generation(&mut self, view: &GenerationView, stacks: &Stacks) {
        let stats = &mut *self.stats;
        stats.generations += 1;
        self.page_size = view.info.map_or(0, |i| i.page_size);
        if let Some(end) = view.end {
            stats.lost_events += end.lost_events;
            stats.lost_stacks += end.lost_stacks;
        }
        if E::STACKS {
            self.gen_stacks = self.table.add_generation(stacks);
        }
        self.visitor.generation(view, self.table);
    }

    fn pair(&mut self, ops: &[Op]) {
        let Pairing {
            live,
            generation,
            gen_stacks,
            page_size,
            stats,
            visitor,
            ..
        } = self;
        let page_size = *page_size;
        let window = generation.as_ref().is_some_and(|g| g.0.flight_window);
        stats.events += ops.len() as u64;
        if let (Some(first), Some(last)) = (ops.first(), ops.last()) {
            stats.first_time_ns.get_or_insert(first.time_ns);
            stats.last_time_ns = last.time_ns;
        }
        for op in ops {
            visitor.event(op);
            let (what, size, type_id) = what(&op.data);
            let (memory, existed) = match what {
                What::Alloc(memory) => (memory, false),
                What::Exists(memory) => (memory, true),
                What::Free(memory) => {
                    match live.remove(memory, op.addr) {
                        Some(alloc) => {
                            stats.frees += 1;
                            let free = Free {
                                time_ns: op.time_ns,
                                thread: op.thread,
                                entry: op.entry,
                                implicit: false,
                            };
                            visitor.free(&alloc, &free);
                        }
                        None if window => {
                            stats.frees_before_window += 1;
                            visitor.free_before_window(op);
                        }
                        None => {
                            stats.unmatched_frees += 1;
                            visitor.anomaly(op, Anomaly::UnknownFree);
                        }
                    }
                    continue;
                }
                What::Other => continue,
            };
            let size = if memory == Memory::Span {
                size.saturating_mul(page_size)
            } else {
                size
            };
            let stack = if E::STACKS {
                let stack = gen_stacks.get(op.stack_id);
                if stack == 0 && op.stack_id != 0 {
                    stats.unresolved_stacks += 1;
                }
                stack
            } else {
                0
            };
            let alloc = E::of(&Alloc {
                time_ns: op.time_ns,
                thread: op.thread,
                addr: op.addr,
                size,
                type_id,
                stack,
                memory,
                entry: op.entry,
                existed,
            });
            stats.allocs += 1;
            // An exists event too: see the module's "Anomalies".
            if let Some(old) = live.insert(memory, op.addr, alloc) {
                stats.replaced += 1;
                visitor.anomaly(op, Anomaly::DoubleAlloc);
                let free = Free {
                    time_ns: op.time_ns,
                    thread: op.thread,
                    entry: None,
                    implicit: true,
                };
                visitor.free(&old, &free);
            }
            visitor.alloc(&alloc);
        }
    }
}

#[cfg(test)]
mod tests {
    use alloctrace_reader::testing::{info, EventsBody, TraceBuilder};
    use alloctrace_reader::{EventData, TraceReader};

    use super::{Alloc, Anomaly, Entry, Free, Live, Memory, Op, Pass, Size, Visitor};

    /// The events and anomalies handed out, by address and name.
    #[derive(Default)]
    struct Seen {
        events: usize,
        anomalies: Vec<(u64, &'static str, Anomaly)>,
        allocs: Vec<(u64, u64)>,
        before_window: Vec<u64>,
    }

    impl Visitor for Seen {
        fn event(&mut self, _op: &Op) {
            self.events += 1;
        }

        fn anomaly(&mut self, op: &Op, anomaly: Anomaly) {
            self.anomalies.push((op.addr, op.data.name(), anomaly));
        }

        fn free_before_window(&mut self, op: &Op) {
            self.before_window.push(op.addr);
        }

        fn alloc(&mut self, alloc: &Alloc) {
            self.allocs.push((alloc.addr, alloc.size));
        }

        fn free(&mut self, _alloc: &Alloc, _free: &Free) {}
    }

    /// The pass reports the anomalies `stats` counts (cli's tests: the
    /// same trace gives `"unknown_free": 2, "double_alloc": 1`), and an
    /// exists event at a live address as a double allocation too, which
    /// replaces the live allocation.
    fn anomaly_trace() -> Vec<u8> {
        let g = info(1);
        let heap = |size| EventData::HeapObjectAlloc { size, type_id: 0 };
        let mut b = EventsBody::new(1000);
        b.event(&g, 1001, 0x10010, &heap(100))
            .event(&g, 1002, 0x10020, &heap(50))
            .event(&g, 1003, 0x10010, &heap(10))
            .event(&g, 1004, 0x10030, &EventData::HeapObjectFree)
            .event(
                &g,
                1005,
                0x20000,
                &EventData::SpanAlloc {
                    npages: 1,
                    kind_class: 0,
                },
            )
            .event(&g, 1006, 0x20000, &EventData::StackAlloc { size: 4096 })
            .event(&g, 1007, 0x20000, &EventData::SpanFree)
            .event(&g, 1008, 0x20000, &EventData::SpanFree)
            .event(
                &g,
                1009,
                0x10020,
                &EventData::HeapObjectExists {
                    size: 70,
                    type_id: 0,
                },
            );
        let mut t = TraceBuilder::new();
        t.info(&g)
            .events(1, 5, &b)
            .generation_end(1, 2000, 5_001_000, 0)
            .trace_end(1);
        t.finish()
    }

    #[test]
    fn anomalies_are_reported() {
        let bytes = anomaly_trace();
        let mut reader = TraceReader::new(&bytes[..]).unwrap();
        let mut seen = Seen::default();
        let mut pass = Pass::new();
        pass.run(&mut reader, &mut seen, |_| {}).unwrap();
        assert_eq!(seen.events, 9);
        assert_eq!(
            seen.anomalies,
            [
                (0x10010, "heap_object_alloc", Anomaly::DoubleAlloc),
                (0x10030, "heap_object_free", Anomaly::UnknownFree),
                (0x20000, "span_free", Anomaly::UnknownFree),
                (0x10020, "heap_object_exists", Anomaly::DoubleAlloc),
            ]
        );
        // The exists event replaces the allocation of 50 bytes.
        assert!(seen.allocs.contains(&(0x10020, 70)));
        let stats = &pass.stats;
        assert_eq!((stats.unmatched_frees, stats.replaced), (2, 2));
    }

    /// In a flight-recorder window (the header's flag), the pass itself
    /// takes a free of an address not live for memory allocated before
    /// the window: no anomaly, counted apart, handed to
    /// `free_before_window`. Double allocations stay anomalies.
    #[test]
    fn a_window_frees_memory_allocated_before_it() {
        let mut bytes = anomaly_trace();
        use alloctrace_format::{FileHeader, FILE_HEADER_LEN, FLAG_FLIGHT_WINDOW};
        let mut header = FileHeader::decode(bytes[..FILE_HEADER_LEN].try_into().unwrap()).unwrap();
        header.flags |= FLAG_FLIGHT_WINDOW;
        bytes[..FILE_HEADER_LEN].copy_from_slice(&header.encode());
        let mut reader = TraceReader::new(&bytes[..]).unwrap();
        assert!(reader.flight_window());
        let mut seen = Seen::default();
        let mut pass = Pass::new();
        pass.run(&mut reader, &mut seen, |_| {}).unwrap();
        assert_eq!(seen.before_window, [0x10030, 0x20000]);
        assert!(seen.anomalies.iter().all(|a| a.2 == Anomaly::DoubleAlloc));
        let stats = &pass.stats;
        assert_eq!(
            (
                stats.unmatched_frees,
                stats.frees_before_window,
                stats.replaced
            ),
            (0, 2, 2)
        );
    }

    /// Counts the visitor's calls, whatever the entry.
    #[derive(Default)]
    struct Calls(usize);

    impl<E: Entry> Visitor<E> for Calls {
        fn alloc(&mut self, _alloc: &E) {
            self.0 += 1;
        }

        fn free(&mut self, _alloc: &E, _free: &Free) {
            self.0 += 1;
        }
    }

    /// The live table's bytes and peaks are the same whether it keeps
    /// whole allocations or their sizes, and follow the replacements; the
    /// lean pass interns no stacks.
    #[test]
    fn lean_and_full_entries_account_alike() {
        let bytes = anomaly_trace();
        fn run<E: Entry>(bytes: &[u8], pass: &mut Pass) -> (Live<E>, usize) {
            let mut reader = TraceReader::new(bytes).unwrap();
            let mut calls = Calls::default();
            (pass.run(&mut reader, &mut calls, |_| {}).unwrap(), calls.0)
        }
        let mut full_pass = Pass::new();
        let (full, full_calls) = run::<Alloc>(&bytes, &mut full_pass);
        let mut lean_pass = Pass::new();
        let (lean, lean_calls) = run::<Size>(&bytes, &mut lean_pass);
        assert_eq!(full_calls, lean_calls);
        assert_eq!(full_pass.stats, lean_pass.stats);
        assert_eq!(full.peaks(), lean.peaks());
        for memory in Memory::ALL {
            assert_eq!(full.count(memory), lean.count(memory), "{memory:?}");
            assert_eq!(full.bytes(memory), lean.bytes(memory), "{memory:?}");
        }
        // Heap: 100 and 50 live, then 10 for the 100 and 70 for the 50.
        assert_eq!(lean.bytes(Memory::Heap), 80);
        assert_eq!(lean.count(Memory::Heap), 2);
        assert_eq!(lean.peaks().heap_bytes, 150);
        assert_eq!(lean.peaks().heap_objects, 2);
        assert_eq!(
            (lean.count(Memory::Span), lean.count(Memory::Stack)),
            (0, 1)
        );
        assert!(lean_pass.stacks.is_empty());
    }
}
