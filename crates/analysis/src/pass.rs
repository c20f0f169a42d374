//! One pass over a trace's events, allocations paired with their frees.
//!
//! [`Pass::run`] reads a trace to its end and hands every allocation and
//! every free to a [`Visitor`]: a free comes with the allocation it ends
//! (its size, stack, time and thread), which the pass finds in its table of
//! live memory. Three kinds of memory live apart, since a runtime's span
//! and the first object in it share an address: heap objects, spans (pages
//! and `mmap`s) and goroutine-style stacks.
//!
//! Several traces (one per process of a program) may go through one
//! [`Pass`]: stacks are interned across them (their frames are keyed by
//! module and module-relative address, so ASLR does not split them), while
//! each trace's live memory is its own.
//!
//! Memory: the live table (one 48-byte [`Alloc`] per live allocation) and
//! the stack table (per distinct call-stack node), whatever the trace's
//! length.

use std::io::Read;

use alloctrace_format::EntryPoint;
use alloctrace_reader::{EventData, ReadError, Step, TraceReader};
use hashbrown::HashMap;
use rustc_hash::FxBuildHasher;

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

/// What the pass hands out. Every method but `alloc` and `free` has a
/// default that does nothing.
pub trait Visitor {
    /// A trace starts (`index` counts the traces of the pass from 0).
    fn trace_start(&mut self, _index: usize) {}
    /// A generation's events follow; `reader` describes it (info, types,
    /// stacks, generation end).
    fn generation<R: Read>(&mut self, _reader: &TraceReader<R>, _stacks: &StackTable) {}
    fn alloc(&mut self, alloc: &Alloc);
    /// `alloc` ends: the allocation as it was made.
    fn free(&mut self, alloc: &Alloc, free: &Free);
    /// The trace ended; `live` holds what was never freed.
    fn trace_end(&mut self, _live: &Live) {}
}

/// Live memory: address to allocation, per [`Memory`].
#[derive(Default)]
pub struct Live {
    tables: [HashMap<u64, Alloc, FxBuildHasher>; 3],
}

impl Live {
    /// Every live allocation (in no particular order).
    pub fn iter(&self) -> impl Iterator<Item = &Alloc> + '_ {
        self.tables.iter().flat_map(|t| t.values())
    }

    /// The live allocations of one kind of memory.
    pub fn of(&self, memory: Memory) -> impl Iterator<Item = &Alloc> + '_ {
        self.tables[memory as usize].values()
    }

    pub fn len(&self) -> usize {
        self.tables.iter().map(|t| t.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Counts over every trace of the pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassStats {
    /// Events read (page events included).
    pub events: u64,
    pub allocs: u64,
    pub frees: u64,
    /// Frees of memory the trace never saw allocated (it was allocated
    /// before tracing started, or its alloc event was lost).
    pub unmatched_frees: u64,
    /// Allocations at an address already live (the free was missed): the
    /// old one is ended with an implicit free.
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

/// Events handed out per step of the reader.
const STEP_EVENTS: usize = 1 << 16;

impl Pass {
    pub fn new() -> Pass {
        Pass::default()
    }

    /// Reads one trace to its end. `progress` gets the bytes read so far
    /// after every run of events.
    pub fn run<R: Read, V: Visitor>(
        &mut self,
        reader: &mut TraceReader<R>,
        visitor: &mut V,
        mut progress: impl FnMut(u64),
    ) -> Result<Live, ReadError> {
        let index = self.traces;
        self.traces += 1;
        visitor.trace_start(index);
        let mut live = Live::default();
        let mut gen_stacks = GenerationStacks::default();
        let mut page_size = 0u64;
        let stats = &mut self.stats;
        loop {
            let step = reader.next_step(STEP_EVENTS, |event| {
                stats.events += 1;
                let time_ns = event.time_ns;
                if stats.first_time_ns.is_none() {
                    stats.first_time_ns = Some(time_ns);
                }
                stats.last_time_ns = time_ns;
                let (memory, size, type_id, existed) = match event.data {
                    EventData::HeapObjectAlloc { size, type_id } => {
                        (Memory::Heap, size, type_id, false)
                    }
                    EventData::HeapObjectExists { size, type_id } => {
                        (Memory::Heap, size, type_id, true)
                    }
                    EventData::SpanAlloc { npages, .. } => {
                        (Memory::Span, npages.saturating_mul(page_size), 0, false)
                    }
                    EventData::SpanExists { npages, .. } => {
                        (Memory::Span, npages.saturating_mul(page_size), 0, true)
                    }
                    EventData::StackAlloc { size } => (Memory::Stack, size, 0, false),
                    EventData::StackExists { size } => (Memory::Stack, size, 0, true),
                    EventData::HeapObjectFree | EventData::SpanFree | EventData::StackFree => {
                        let memory = match event.data {
                            EventData::HeapObjectFree => Memory::Heap,
                            EventData::SpanFree => Memory::Span,
                            _ => Memory::Stack,
                        };
                        match live.tables[memory as usize].remove(&event.addr) {
                            Some(alloc) => {
                                stats.frees += 1;
                                let free = Free {
                                    time_ns,
                                    thread: event.thread,
                                    entry: event.entry,
                                    implicit: false,
                                };
                                visitor.free(&alloc, &free);
                            }
                            None => stats.unmatched_frees += 1,
                        }
                        return;
                    }
                    _ => return,
                };
                let stack = gen_stacks.get(event.stack_id);
                if stack == 0 && event.stack_id != 0 {
                    stats.unresolved_stacks += 1;
                }
                let alloc = Alloc {
                    time_ns,
                    thread: event.thread,
                    addr: event.addr,
                    size,
                    type_id,
                    stack,
                    memory,
                    entry: event.entry,
                    existed,
                };
                let table = &mut live.tables[memory as usize];
                if existed && table.contains_key(&event.addr) {
                    return;
                }
                stats.allocs += 1;
                if let Some(old) = table.insert(event.addr, alloc) {
                    stats.replaced += 1;
                    let free = Free {
                        time_ns,
                        thread: event.thread,
                        entry: None,
                        implicit: true,
                    };
                    visitor.free(&old, &free);
                }
                visitor.alloc(&alloc);
            })?;
            match step {
                Step::Events(_) => progress(reader.bytes_read()),
                Step::GenerationStart { .. } => {
                    stats.generations += 1;
                    page_size = reader.info().map_or(0, |i| i.page_size);
                    if let Some(end) = reader.generation_end() {
                        stats.lost_events += end.lost_events;
                        stats.lost_stacks += end.lost_stacks;
                    }
                    gen_stacks = self.stacks.add_generation(reader.stacks());
                    visitor.generation(reader, &self.stacks);
                }
                Step::End => break,
            }
        }
        progress(reader.bytes_read());
        stats.truncated.push(reader.truncated());
        visitor.trace_end(&live);
        Ok(live)
    }
}
