//! What the reader hands out: events, type-table entries, generation info.

use alloctrace_format::{EntryPoint, EventKind};

/// One entry of a generation's type table (types batch, FORMAT.md section 2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeInfo {
    /// Type ID, at least 1 (0 means "no type" and is never defined).
    pub id: u64,
    /// Size of one object of the type in bytes.
    pub size: u64,
    /// Bytes of the object that may hold pointers.
    pub ptr_bytes: u64,
    /// The registered name; invalid UTF-8 is replaced by U+FFFD.
    pub name: String,
}

/// A generation's info batch: how to restore its addresses and times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GenerationInfo {
    pub generation: u64,
    /// Base of the compressed address IDs.
    pub min_heap_addr: u64,
    /// Power of two; span IDs count pages of this size.
    pub page_size: u64,
    /// Power of two; heap object IDs count units of this size.
    pub min_heap_align: u64,
    /// Power of two; stack IDs count units of this size.
    pub min_stack_align: u64,
    /// Trace clock at the start of the generation, read with `start_mono_ns`.
    pub start_ticks: u64,
    /// CLOCK_MONOTONIC in ns at the start of the generation.
    pub start_mono_ns: u64,
    /// CLOCK_REALTIME in ns since the Unix epoch (for display only).
    pub start_wall_ns: u64,
    /// Estimated rate of the trace clock, greater than 0.
    pub ticks_per_sec: u64,
    /// Process ID of the traced process.
    pub pid: u64,
    /// The sampling mode's mean bytes between sampled allocations
    /// (format version 6): only sampled heap-object allocations, and the
    /// frees of those, are in the trace, and a reader estimates the rest
    /// (an allocation of `size` bytes stands for
    /// `1 / (1 - exp(-size / sample_bytes))` of them). 0: every allocation
    /// is recorded (and in traces before version 6).
    pub sample_bytes: u64,
}

impl GenerationInfo {
    /// The number of allocations one recorded heap-object allocation of
    /// `size` bytes stands for: 1 outside sampling mode, else Go pprof's
    /// unsampling weight `1 / (1 - exp(-size / sample_bytes))` (an
    /// allocation of `size` bytes was sampled with probability
    /// `1 - exp(-size / sample_bytes)`). A size of 0 weighs as 1 byte.
    pub fn sample_weight(&self, size: u64) -> f64 {
        sample_weight(size, self.sample_bytes)
    }
}

/// [`GenerationInfo::sample_weight`] for a mean of `sample_bytes` (0: not
/// sampled, weight 1).
pub fn sample_weight(size: u64, sample_bytes: u64) -> f64 {
    if sample_bytes == 0 {
        return 1.0;
    }
    let p = -(-(size.max(1) as f64) / sample_bytes as f64).exp_m1();
    if p > 0.0 {
        1.0 / p
    } else {
        1.0
    }
}

/// A generation's process batch (format version 4, FORMAT.md section 2):
/// the traced program's command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessInfo {
    /// The arguments, the program first (`argv`, as `/proc/PID/cmdline`
    /// had it when the session started); invalid UTF-8 is replaced by
    /// U+FFFD. Empty when the writer found none.
    pub command_line: Vec<String>,
    /// The command line was longer than the format's limit
    /// (`alloctrace_format::MAX_COMMAND_LINE` bytes) and was cut: arguments
    /// are missing at its end, and the last one may be cut.
    pub truncated: bool,
}

/// A generation's generation-end batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GenerationEnd {
    pub generation: u64,
    /// Trace clock when the generation ended, read with `end_mono_ns`.
    pub end_ticks: u64,
    /// CLOCK_MONOTONIC in ns when the generation ended.
    pub end_mono_ns: u64,
    /// Events of this generation the writer could not record.
    pub lost_events: u64,
    /// Allocations of this generation recorded without their stack (the
    /// allocation is in the trace; its stack is missing). 0 in traces of
    /// versions 1 and 2.
    pub lost_stacks: u64,
    /// The exact totals of a sampling session (format version 6; 0 when
    /// every allocation is recorded): every heap-object allocation the
    /// traced threads made in the generation, sampled or not, its bytes,
    /// and every free.
    pub totals: Totals,
}

/// Exact counts of a sampling session, which records only some
/// allocations (generation-end batch, format version 6). All 0 in a trace
/// that records every allocation, and before version 6.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Heap-object allocations, sampled or not.
    pub allocs: u64,
    /// Their bytes.
    pub alloc_bytes: u64,
    /// Heap-object frees (of non-null addresses), of sampled objects or not.
    pub frees: u64,
    /// Sampled allocations the tracer's set of sampled addresses had no
    /// room for: recorded, but their frees are not, so they read as live.
    pub sample_overflow: u64,
}

impl Totals {
    /// The sum of two counts, saturating.
    pub fn add(&mut self, other: &Totals) {
        self.allocs = self.allocs.saturating_add(other.allocs);
        self.alloc_bytes = self.alloc_bytes.saturating_add(other.alloc_bytes);
        self.frees = self.frees.saturating_add(other.frees);
        self.sample_overflow = self.sample_overflow.saturating_add(other.sample_overflow);
    }
}

/// One allocation event, with its address restored and its time in ns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Nanoseconds since the first generation's `start_mono_ns` (0 for an
    /// event stamped before it).
    pub time_ns: u64,
    /// The raw trace-clock timestamp.
    pub ticks: u64,
    pub generation: u64,
    /// Trace thread ID of the thread that recorded the event.
    pub thread: u64,
    /// The writer used the long form: the address (and, for a stack, the
    /// size) could not be compressed exactly, so it was written raw. For a
    /// page event: a long event (a base off the page grid or at or above
    /// 2^48, FORMAT.md section 7).
    pub long_form: bool,
    /// Address of the span, heap object or stack (0 for a call); the base
    /// of the run for a page event.
    pub addr: u64,
    pub data: EventData,
    /// The interposed function that made the event, for traces written by
    /// the LD_PRELOAD shim (FORMAT.md section 3, entry tag).
    pub entry: Option<EntryPoint>,
    /// The call stack that made the allocation, a stack ID of the
    /// generation's [`Stacks`](crate::Stacks) (event kinds 11 and 12); 0
    /// for none. Only `HeapObjectAlloc` and `SpanAlloc` events carry one.
    /// In a generation cut off by the end of a truncated trace the stack
    /// batches (written as a generation ends) may be missing: the ID is
    /// kept, and may resolve to nothing ([`Stacks::is_cut`](crate::Stacks::is_cut)).
    pub stack_id: u64,
}

impl Event {
    /// The event's kind as written in its kind byte: the kind of
    /// [`EventData::event_kind`], or for an allocation with a stack its
    /// kind with a stack (11 or 12). `None` for page events.
    pub fn kind(&self) -> Option<EventKind> {
        let kind = self.data.event_kind()?;
        Some(match kind {
            EventKind::HeapObjectAlloc if self.stack_id != 0 => EventKind::HeapObjectAllocStack,
            EventKind::SpanAlloc if self.stack_id != 0 => EventKind::SpanAllocStack,
            other => other,
        })
    }
}

/// The kind of an event and the arguments that kind carries besides the
/// address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventData {
    SpanExists {
        npages: u64,
        kind_class: u64,
    },
    SpanAlloc {
        npages: u64,
        kind_class: u64,
    },
    SpanFree,
    HeapObjectExists {
        size: u64,
        type_id: u64,
    },
    HeapObjectAlloc {
        size: u64,
        type_id: u64,
    },
    HeapObjectFree,
    /// `size` in bytes (the short form carries its log2).
    StackExists {
        size: u64,
    },
    StackAlloc {
        size: u64,
    },
    StackFree,
    /// A call that changed no memory (`free(NULL)`, a failed allocation);
    /// `Event::entry` names the function.
    Call,
    /// Page tracer (FORMAT.md section 7): `npages` pages of the info batch's
    /// `page_size` at `Event::addr` were allocated. Page times are at most
    /// one unit (`2^lost_bits` ticks) below the true time, so a page event
    /// may sort before an object event its thread recorded just before it.
    PageAlloc {
        npages: u64,
    },
    /// Page tracer: `npages` pages were freed.
    PageFree {
        npages: u64,
    },
    /// Page tracer: `npages` pages were scavenged (returned to the OS).
    PageScav {
        npages: u64,
    },
}

/// The names of the page-tracer events, as [`EventData::name`] gives them:
/// `page_alloc`, `page_free`, `page_scav`.
pub const PAGE_EVENT_NAMES: [&str; 3] = ["page_alloc", "page_free", "page_scav"];

impl EventData {
    /// The snake_case name the CLI prints, e.g. `"heap_object_alloc"`, or
    /// one of [`PAGE_EVENT_NAMES`].
    pub fn name(&self) -> &'static str {
        match (self.event_kind(), self) {
            (Some(kind), _) => kind.name(),
            (None, EventData::PageAlloc { .. }) => PAGE_EVENT_NAMES[0],
            (None, EventData::PageFree { .. }) => PAGE_EVENT_NAMES[1],
            (None, _) => PAGE_EVENT_NAMES[2],
        }
    }

    /// The event kind of the data, or `None` for page events, which travel
    /// as page words and have no kind byte. An allocation with a stack
    /// (kinds 11 and 12) has the data of one without (kinds 5 and 2): this
    /// gives the kind without a stack, [`Event::kind`] the kind written.
    pub fn event_kind(&self) -> Option<EventKind> {
        Some(match self {
            EventData::PageAlloc { .. }
            | EventData::PageFree { .. }
            | EventData::PageScav { .. } => return None,
            EventData::SpanExists { .. } => EventKind::SpanExists,
            EventData::SpanAlloc { .. } => EventKind::SpanAlloc,
            EventData::SpanFree => EventKind::SpanFree,
            EventData::HeapObjectExists { .. } => EventKind::HeapObjectExists,
            EventData::HeapObjectAlloc { .. } => EventKind::HeapObjectAlloc,
            EventData::HeapObjectFree => EventKind::HeapObjectFree,
            EventData::StackExists { .. } => EventKind::StackExists,
            EventData::StackAlloc { .. } => EventKind::StackAlloc,
            EventData::StackFree => EventKind::StackFree,
            EventData::Call => EventKind::Call,
        })
    }
}

/// What [`TraceReader::next_record`](crate::TraceReader::next_record)
/// returns: events, and a marker before each generation's events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// The events of `generation` follow; its info, type table and
    /// generation end are now what `info()`, `types()` and
    /// `generation_end()` return. Comes even for a generation without
    /// events.
    GenerationStart {
        generation: u64,
    },
    Event(Event),
}

/// What [`TraceReader::next_step`](crate::TraceReader::next_step) did: the
/// records of [`Record`], with the events a run at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// This many events (at least one) of the generation being read were
    /// handed to the closure, in time order.
    Events(usize),
    /// As [`Record::GenerationStart`]: the events of `generation` follow.
    GenerationStart { generation: u64 },
    /// The end of the trace ([`next_record`](crate::TraceReader::next_record)
    /// returns `None`); every later call returns it again.
    End,
}
