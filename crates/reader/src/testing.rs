//! Builds traces byte by byte per docs/FORMAT.md, for tests of the reader
//! and the CLI that must not depend on the writer library. Also builds
//! deliberately broken traces: every method takes raw values unchecked.
//!
//! Behind the `testing` feature (this crate's tests, the CLI's and the
//! fuzz target's enable it); not part of the stable API.

use alloctrace_format::stacks::{CallStackNode, FrameEntry, FrameWord, ModuleEntry};
use alloctrace_format::{
    batch_checksum, compress_address, encode_event, exact_log2, pages, AddressClass, BatchKind,
    EventKind, FileHeader, BATCH_PREFIX_LEN, ENTRY_TAG, FILE_HEADER_LEN, LONG_FORM, MAX_EVENT_LEN,
    MAX_VARINT_LEN, VERSION, VERSION_1, VERSION_2,
};

use crate::{EventData, GenerationInfo, TypeInfo};

/// Appends `v` as a varint.
pub fn varint(out: &mut Vec<u8>, v: u64) {
    alloctrace_format::push_uvarint(out, v);
}

/// Info for generation `generation` with round numbers: heap from 0x10000,
/// 4 KiB pages, 16-byte heap and 4 KiB stack alignment, a 1 GHz clock
/// starting at tick 1000 and monotonic time 5,000,000 ns.
pub fn info(generation: u64) -> GenerationInfo {
    GenerationInfo {
        generation,
        min_heap_addr: 0x10000,
        page_size: 4096,
        min_heap_align: 16,
        min_stack_align: 4096,
        start_ticks: 1000,
        start_mono_ns: 5_000_000,
        start_wall_ns: 1_700_000_000_000_000_000,
        ticks_per_sec: 1_000_000_000,
        pid: 4242,
        sample_bytes: 0,
    }
}

/// A trace under construction: version 6 (a checksum trailer after every
/// batch; call stacks; the process batch; stack tables as the generation
/// goes) from [`TraceBuilder::new`], version 4 from [`TraceBuilder::v4`],
/// version 3 from [`TraceBuilder::v3`], version 2 from
/// [`TraceBuilder::v2`], version 1 from [`TraceBuilder::v1`].
pub struct TraceBuilder {
    bytes: Vec<u8>,
    trailers: bool,
}

impl Default for TraceBuilder {
    fn default() -> Self {
        TraceBuilder::new()
    }
}

impl TraceBuilder {
    /// A trace of the current version (6) with its file header.
    pub fn new() -> TraceBuilder {
        TraceBuilder::with_version(VERSION)
    }

    /// A version-4 trace (call stacks and the process batch, stack tables
    /// once per generation) with its file header.
    pub fn v4() -> TraceBuilder {
        TraceBuilder::with_version(alloctrace_format::VERSION_4)
    }

    /// A version-3 trace (call stacks, no process batch) with its file
    /// header.
    pub fn v3() -> TraceBuilder {
        TraceBuilder::with_version(alloctrace_format::VERSION_3)
    }

    /// A version-2 trace (trailers, no call stacks) with its file header.
    pub fn v2() -> TraceBuilder {
        TraceBuilder::with_version(VERSION_2)
    }

    /// A version-1 trace (no trailers) with its file header.
    pub fn v1() -> TraceBuilder {
        TraceBuilder::with_version(VERSION_1)
    }

    /// A trace of any version from 2 on (its header; trailers after each
    /// batch).
    pub fn with_version(version: u16) -> TraceBuilder {
        let header = FileHeader { version, flags: 0 }.encode();
        TraceBuilder {
            bytes: header.to_vec(),
            trailers: alloctrace_format::has_trailers(version),
        }
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn finish(&self) -> Vec<u8> {
        self.bytes.clone()
    }

    /// Appends bytes as they are.
    pub fn raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(bytes);
        self
    }

    /// Appends a whole batch as it is (`batch` starts with its kind byte
    /// and payload length), then its trailer in a version-2 trace.
    pub fn raw_batch(&mut self, batch: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(batch);
        if self.trailers {
            self.bytes
                .extend_from_slice(&batch_checksum(&[batch]).to_le_bytes());
        }
        self
    }

    /// A batch: kind byte, payload length, the batch header varints, `body`.
    pub fn batch(
        &mut self,
        kind: u8,
        generation: u64,
        thread: u64,
        base_ticks: u64,
        body: &[u8],
    ) -> &mut Self {
        let mut payload = Vec::with_capacity(body.len() + 3 * MAX_VARINT_LEN);
        varint(&mut payload, generation);
        varint(&mut payload, thread);
        varint(&mut payload, base_ticks);
        payload.extend_from_slice(body);
        let mut batch = vec![kind];
        batch.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        batch.extend_from_slice(&payload);
        self.raw_batch(&batch)
    }

    pub fn info(&mut self, info: &GenerationInfo) -> &mut Self {
        let mut body = Vec::new();
        for v in [
            info.min_heap_addr,
            info.page_size,
            info.min_heap_align,
            info.min_stack_align,
            info.start_ticks,
            info.start_mono_ns,
            info.start_wall_ns,
            info.ticks_per_sec,
            info.pid,
        ] {
            varint(&mut body, v);
        }
        // Version 6's field, written only when sampling (so the bytes of
        // the other tests' traces stay as they were).
        if info.sample_bytes != 0 {
            varint(&mut body, info.sample_bytes);
        }
        self.batch(
            BatchKind::Info as u8,
            info.generation,
            0,
            info.start_ticks,
            &body,
        )
    }

    pub fn types(&mut self, generation: u64, types: &[TypeInfo]) -> &mut Self {
        let mut body = Vec::new();
        for t in types {
            varint(&mut body, t.id);
            varint(&mut body, t.size);
            varint(&mut body, t.ptr_bytes);
            varint(&mut body, t.name.len() as u64);
            body.extend_from_slice(t.name.as_bytes());
        }
        self.batch(BatchKind::Types as u8, generation, 0, 0, &body)
    }

    /// An events batch of `thread` with the events of `events`.
    pub fn events(&mut self, generation: u64, thread: u64, events: &EventsBody) -> &mut Self {
        self.batch(
            BatchKind::Events as u8,
            generation,
            thread,
            events.base_ticks,
            &events.bytes,
        )
    }

    /// A pages batch of `thread` with the words of `body`.
    pub fn pages(&mut self, generation: u64, thread: u64, body: &PagesBody) -> &mut Self {
        self.batch(
            BatchKind::Pages as u8,
            generation,
            thread,
            body.base_ticks,
            &body.bytes(),
        )
    }

    pub fn generation_end(
        &mut self,
        generation: u64,
        end_ticks: u64,
        end_mono_ns: u64,
        lost_events: u64,
    ) -> &mut Self {
        let mut body = Vec::new();
        varint(&mut body, end_ticks);
        varint(&mut body, end_mono_ns);
        varint(&mut body, lost_events);
        self.batch(
            BatchKind::GenerationEnd as u8,
            generation,
            0,
            end_ticks,
            &body,
        )
    }

    /// A version-3 generation-end batch: `lost_stacks` after `lost_events`.
    pub fn generation_end_v3(
        &mut self,
        generation: u64,
        end_ticks: u64,
        end_mono_ns: u64,
        lost_events: u64,
        lost_stacks: u64,
    ) -> &mut Self {
        let mut body = Vec::new();
        for v in [end_ticks, end_mono_ns, lost_events, lost_stacks] {
            varint(&mut body, v);
        }
        self.batch(
            BatchKind::GenerationEnd as u8,
            generation,
            0,
            end_ticks,
            &body,
        )
    }

    /// A version-6 generation-end batch: `lost_stacks`, then a sampling
    /// session's totals.
    pub fn generation_end_v6(
        &mut self,
        generation: u64,
        end_ticks: u64,
        end_mono_ns: u64,
        totals: &crate::Totals,
    ) -> &mut Self {
        let mut body = Vec::new();
        for v in [
            end_ticks,
            end_mono_ns,
            0,
            0,
            totals.allocs,
            totals.alloc_bytes,
            totals.frees,
            totals.sample_overflow,
        ] {
            varint(&mut body, v);
        }
        self.batch(
            BatchKind::GenerationEnd as u8,
            generation,
            0,
            end_ticks,
            &body,
        )
    }

    /// A modules batch (kind 10) of the tracer (thread 0).
    pub fn modules(&mut self, generation: u64, modules: &[ModuleEntry<'_>]) -> &mut Self {
        let body = encode_entries(modules.iter().map(|m| (m.encoded_len(), Entry::Module(m))));
        self.batch(BatchKind::Modules as u8, generation, 0, 0, &body)
    }

    /// A frames batch (kind 11) of the tracer.
    pub fn frames(&mut self, generation: u64, frames: &[FrameEntry<'_>]) -> &mut Self {
        let body = encode_entries(frames.iter().map(|f| (f.encoded_len(), Entry::Frame(f))));
        self.batch(BatchKind::Frames as u8, generation, 0, 0, &body)
    }

    /// A call-stacks batch (kind 12) of the tracer.
    pub fn call_stacks(&mut self, generation: u64, nodes: &[CallStackNode]) -> &mut Self {
        let body = encode_entries(nodes.iter().map(|n| (n.encoded_len(), Entry::Node(n))));
        self.batch(BatchKind::CallStacks as u8, generation, 0, 0, &body)
    }

    /// A process batch (kind 13, version 4) of the tracer: `flags`, then
    /// the arguments.
    pub fn process(&mut self, generation: u64, flags: u64, args: &[&[u8]]) -> &mut Self {
        let mut body = Vec::new();
        varint(&mut body, flags);
        varint(&mut body, args.len() as u64);
        for arg in args {
            varint(&mut body, arg.len() as u64);
            body.extend_from_slice(arg);
        }
        self.batch(BatchKind::Process as u8, generation, 0, 0, &body)
    }

    pub fn trace_end(&mut self, generation: u64) -> &mut Self {
        self.batch(BatchKind::TraceEnd as u8, generation, 0, 0, &[])
    }
}

/// One entry of a call-stack batch, for [`encode_entries`].
enum Entry<'a, 'b> {
    Module(&'a ModuleEntry<'b>),
    Frame(&'a FrameEntry<'b>),
    Node(&'a CallStackNode),
}

/// The entries one after the other, by the format crate's encoders.
fn encode_entries<'a, 'b: 'a>(entries: impl Iterator<Item = (usize, Entry<'a, 'b>)>) -> Vec<u8> {
    let mut body = Vec::new();
    for (len, entry) in entries {
        let start = body.len();
        body.resize(start + len, 0);
        let end = match entry {
            Entry::Module(m) => m.encode(&mut body, start),
            Entry::Frame(f) => f.encode(&mut body, start),
            Entry::Node(n) => n.encode(&mut body, start),
        };
        assert_eq!(end, Some(body.len()), "encoded_len and encode disagree");
    }
    body
}

/// A call-stack node, for tests: `frame` is a [`FrameWord`].
pub fn node(id: u64, parent: u64, frame: FrameWord) -> CallStackNode {
    CallStackNode {
        id,
        parent,
        frame: frame.word(),
    }
}

/// The body of an events batch, built one event at a time with absolute
/// timestamps (the builder writes the deltas).
#[derive(Clone, Debug)]
pub struct EventsBody {
    base_ticks: u64,
    last_ticks: u64,
    bytes: Vec<u8>,
}

impl EventsBody {
    pub fn new(base_ticks: u64) -> EventsBody {
        EventsBody {
            base_ticks,
            last_ticks: base_ticks,
            bytes: Vec::new(),
        }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// An event with a raw kind byte and raw arguments. `ticks` below the
    /// previous event's wraps around (a huge delta), for broken traces.
    pub fn raw_event(&mut self, kind_byte: u8, ticks: u64, args: &[u64]) -> &mut Self {
        self.bytes.push(kind_byte);
        varint(&mut self.bytes, ticks.wrapping_sub(self.last_ticks));
        self.last_ticks = ticks;
        for &a in args {
            varint(&mut self.bytes, a);
        }
        self
    }

    /// An event as the writer would write it: short form when the address
    /// (and a stack's size) compress exactly with `info`, long form
    /// otherwise.
    pub fn event(
        &mut self,
        info: &GenerationInfo,
        ticks: u64,
        addr: u64,
        data: &EventData,
    ) -> &mut Self {
        let align = match kind_of(data).address_class() {
            AddressClass::Span => info.page_size,
            AddressClass::HeapObject => info.min_heap_align,
            AddressClass::Stack | AddressClass::Raw => info.min_stack_align,
        };
        let id =
            exact_log2(align).and_then(|shift| compress_address(addr, info.min_heap_addr, shift));
        let order = match data {
            EventData::StackExists { size } | EventData::StackAlloc { size } => {
                exact_log2(*size).map(u64::from)
            }
            _ => Some(0),
        };
        match (id, order) {
            (Some(id), Some(order)) => self.encode(false, ticks, id, order, data),
            _ => self.long_event(ticks, addr, data),
        }
    }

    /// An allocation with a stack (kind 11 for a heap object alloc, 12 for
    /// a span alloc), short form when the address compresses exactly.
    /// `stack_id` is written as it is (0 makes a malformed event).
    pub fn event_with_stack(
        &mut self,
        info: &GenerationInfo,
        ticks: u64,
        addr: u64,
        data: &EventData,
        stack_id: u64,
    ) -> &mut Self {
        let (kind, align, second, third) = match *data {
            EventData::HeapObjectAlloc { size, type_id } => (
                EventKind::HeapObjectAllocStack,
                info.min_heap_align,
                size,
                type_id,
            ),
            EventData::SpanAlloc { npages, kind_class } => (
                EventKind::SpanAllocStack,
                info.page_size,
                npages,
                kind_class,
            ),
            _ => panic!("only heap object and span allocs carry a stack"),
        };
        let id =
            exact_log2(align).and_then(|shift| compress_address(addr, info.min_heap_addr, shift));
        match id {
            Some(id) => self.raw_event(kind as u8, ticks, &[id, second, third, stack_id]),
            None => self.raw_event(
                kind as u8 | LONG_FORM,
                ticks,
                &[addr, second, third, stack_id],
            ),
        }
    }

    /// An event in long form: raw address, raw stack size.
    pub fn long_event(&mut self, ticks: u64, addr: u64, data: &EventData) -> &mut Self {
        let size = match data {
            EventData::StackExists { size } | EventData::StackAlloc { size } => *size,
            _ => 0,
        };
        self.encode(true, ticks, addr, size, data)
    }

    fn encode(
        &mut self,
        long: bool,
        ticks: u64,
        first: u64,
        stack_size: u64,
        data: &EventData,
    ) -> &mut Self {
        let kind = kind_of(data);
        let mut flags = if long { LONG_FORM } else { 0 };
        let (second, third, entry) = match *data {
            EventData::SpanExists { npages, kind_class }
            | EventData::SpanAlloc { npages, kind_class } => (npages, kind_class, 0),
            EventData::HeapObjectExists { size, type_id }
            | EventData::HeapObjectAlloc { size, type_id } => (size, type_id, 0),
            EventData::StackExists { .. } | EventData::StackAlloc { .. } => (stack_size, 0, 0),
            // A call is always tagged; the builder tags it as a malloc.
            EventData::Call => {
                flags |= ENTRY_TAG;
                (0, 0, 1)
            }
            _ => (0, 0, 0),
        };
        // The format's encoder, as the writer's.
        let mut out = [0u8; MAX_EVENT_LEN];
        let delta = ticks.wrapping_sub(self.last_ticks);
        let n = encode_event(
            &mut out,
            kind,
            flags,
            delta,
            [first, second, third, 0, entry],
        );
        self.bytes.extend_from_slice(&out[..n]);
        self.last_ticks = ticks;
        self
    }
}

fn kind_of(data: &EventData) -> EventKind {
    data.event_kind()
        .expect("page events go in a PagesBody, not an events batch")
}

/// The body of a pages batch (FORMAT.md section 7), built one event at a
/// time with absolute timestamps, as the writer builds it: it opens with
/// the layout, thread and time-base words, adds a time-base word whenever a
/// delta would not fit in 16 bits, and writes the short, large or long form
/// by the same rules. [`PagesBody::word`] appends anything, for broken
/// traces.
#[derive(Clone, Debug)]
pub struct PagesBody {
    layout: pages::Layout,
    base_ticks: u64,
    /// The current time base, in units.
    time_base: u64,
    words: Vec<u64>,
}

impl PagesBody {
    /// A body of `thread` for pages of `1 << page_shift` bytes, starting at
    /// `base_ticks` (also the batch header's base timestamp), with the
    /// writer's lost bits.
    pub fn new(page_shift: u32, thread: u64, base_ticks: u64) -> PagesBody {
        let layout = pages::Layout {
            page_shift,
            lost_bits: pages::TIME_LOST_BITS,
        };
        let time_base = base_ticks >> layout.lost_bits;
        PagesBody {
            layout,
            base_ticks,
            time_base,
            words: vec![
                layout.word(),
                pages::sync_word(pages::SYNC_THREAD, thread),
                pages::sync_word(pages::SYNC_TIME, time_base),
            ],
        }
    }

    /// A body with no words at all (not even the layout word).
    pub fn empty(page_shift: u32, base_ticks: u64) -> PagesBody {
        let mut body = PagesBody::new(page_shift, 0, base_ticks);
        body.words.clear();
        body
    }

    pub fn layout(&self) -> pages::Layout {
        self.layout
    }

    pub fn base_ticks(&self) -> u64 {
        self.base_ticks
    }

    /// Appends a raw word.
    pub fn word(&mut self, w: u64) -> &mut Self {
        self.words.push(w);
        self
    }

    /// Number of words so far.
    pub fn len(&self) -> usize {
        self.words.len()
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// A page event at `ticks` (not below the previous event's), as the
    /// writer writes it. `data` must be a page event.
    pub fn event(&mut self, ticks: u64, base: u64, data: &EventData) -> &mut Self {
        let (kind, npages) = match *data {
            EventData::PageAlloc { npages } => (pages::KIND_ALLOC, npages),
            EventData::PageFree { npages } => (pages::KIND_FREE, npages),
            EventData::PageScav { npages } => (pages::KIND_SCAV, npages),
            _ => panic!("not a page event: {data:?}"),
        };
        let units = ticks >> self.layout.lost_bits;
        if units.wrapping_sub(self.time_base) >> pages::DELTA_BITS != 0 {
            self.time_base = units;
            self.words.push(pages::sync_word(pages::SYNC_TIME, units));
        }
        let delta = units.wrapping_sub(self.time_base);
        if self.layout.fits(base) {
            self.words
                .push(self.layout.event_word(kind, base, npages, delta));
            if self.layout.is_large(npages) {
                self.words.push(npages);
            }
        } else {
            self.words
                .push(pages::sync_word(pages::SYNC_LONG_EVENT, kind | delta << 2));
            self.words.push(base);
            self.words.push(npages);
        }
        self
    }
}

/// A small deterministic PRNG (xorshift64*) for mutation tests: no extra
/// dependency, same sequence on every run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform-ish in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// The current version's form of a version-1 trace: the version-4 header,
/// and a trailer after every batch (none inside compressed batches). A cut
/// last batch stays cut, without a trailer.
pub fn checksummed(v1: &[u8]) -> Vec<u8> {
    checksummed_as(v1, VERSION)
}

/// [`checksummed`] with the header of `version` (2 to 4).
pub fn checksummed_as(v1: &[u8], version: u16) -> Vec<u8> {
    let mut out = FileHeader { version, flags: 0 }.encode().to_vec();
    let mut batches = split_batches(v1);
    let cut = match batches.last() {
        Some(b) if b.len() != batch_len(b) => batches.pop(),
        _ => None,
    };
    for batch in batches {
        out.extend_from_slice(batch);
        out.extend_from_slice(&batch_checksum(&[batch]).to_le_bytes());
    }
    if let Some(cut) = cut {
        out.extend_from_slice(cut);
    }
    out
}

/// The batches of a trace without trailers (version 1, or the decompressed
/// data of a compressed batch when `trace` has no file header), as framed
/// by their lengths; the last may be cut short.
pub fn split_batches(trace: &[u8]) -> Vec<&[u8]> {
    let mut rest = trace.get(FILE_HEADER_LEN..).unwrap_or(&[]);
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (batch, tail) = rest.split_at(batch_len(rest).min(rest.len()));
        out.push(batch);
        rest = tail;
    }
    out
}

/// The length of the batch `bytes` starts with, prefix included.
fn batch_len(bytes: &[u8]) -> usize {
    match bytes.get(1..BATCH_PREFIX_LEN) {
        Some(l) => BATCH_PREFIX_LEN + u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize,
        None => bytes.len(),
    }
}

/// A small valid trace touching every batch kind and every event kind but
/// those of call stacks ([`stacks_trace`]), in short and long form, across
/// two threads and two interleaved generations. Used by tests and as a
/// fuzzing seed. The current version (5), a version-1 trace
/// [`checksummed`].
pub fn sample_trace() -> Vec<u8> {
    checksummed(&sample_trace_v1())
}

/// [`sample_trace`] in version 1, without trailers.
pub fn sample_trace_v1() -> Vec<u8> {
    let g1 = info(1);
    let mut g2 = info(2);
    g2.start_ticks = 5000;
    g2.start_mono_ns = 5_004_000;
    let mut t = TraceBuilder::v1();
    t.info(&g1);
    let mut a = EventsBody::new(1100);
    a.event(
        &g1,
        1100,
        0x20000,
        &EventData::SpanExists {
            npages: 2,
            kind_class: 7,
        },
    )
    .event(
        &g1,
        1200,
        0x10040,
        &EventData::HeapObjectExists {
            size: 48,
            type_id: 1,
        },
    )
    .event(&g1, 1300, 0x40000, &EventData::StackExists { size: 8192 })
    .event(
        &g1,
        1400,
        0x22000,
        &EventData::SpanAlloc {
            npages: 1,
            kind_class: 3,
        },
    )
    .event(
        &g1,
        1500,
        0x10080,
        &EventData::HeapObjectAlloc {
            size: 32,
            type_id: 2,
        },
    )
    .event(&g1, 1600, 0x10040, &EventData::HeapObjectFree);
    t.events(1, 1, &a);
    let mut b = EventsBody::new(1250);
    b.event(&g1, 1250, 0x50000, &EventData::StackAlloc { size: 3000 })
        .event(
            &g1,
            1300,
            0x10008,
            &EventData::HeapObjectAlloc {
                size: 24,
                type_id: 0,
            },
        )
        .event(&g1, 1700, 0x50000, &EventData::StackFree)
        .event(&g1, 1800, 0x22000, &EventData::SpanFree);
    t.events(1, 2, &b);
    t.info(&g2);
    let mut c = EventsBody::new(5100);
    c.event(&g2, 5100, 0x10080, &EventData::HeapObjectFree)
        .event(&g2, 5200, 0x40000, &EventData::StackFree)
        .event(&g2, 5300, 0x10008, &EventData::HeapObjectFree);
    t.events(2, 1, &c);
    let types = [
        TypeInfo {
            id: 1,
            size: 48,
            ptr_bytes: 16,
            name: "struct node".into(),
        },
        TypeInfo {
            id: 2,
            size: 32,
            ptr_bytes: 0,
            name: "char[32]".into(),
        },
    ];
    t.types(1, &types);
    t.generation_end(1, 5000, 5_004_000, 0);
    t.types(2, &types);
    t.generation_end(2, 6000, 5_005_000, 3);
    t.trace_end(2);
    t.finish()
}

/// A small valid version-3 trace with call stacks: two generations, each
/// with modules, a registered frame and a call-stacks batch re-listing the
/// nodes it uses (IDs stable across them), allocations with stacks (kinds
/// 11 and 12, short and long form) and without, a truncated stack, and
/// `lost_stacks` in the generation ends. Used by tests and as a fuzzing
/// seed.
///
/// Generation 1's stacks: 1 = `[main]` (app+0x1100), 2 = `[make_name,
/// main]` (libfoo.so+0x234), 3 = `[lua:f, make_name, main]` (registered
/// frame 1, `f` at `a.lua:7`), 4 = `[truncated]`. Generation 2 re-lists 1
/// and 2 and adds 5 = `[0x9000 (no module), main]`.
pub fn stacks_trace() -> Vec<u8> {
    let g1 = info(1);
    let mut g2 = info(2);
    g2.start_ticks = 5000;
    g2.start_mono_ns = 5_004_000;
    let app = ModuleEntry {
        id: 1,
        start: 0x40_0000,
        end: 0x50_0000,
        bias: 0x40_0000,
        eh_frame_hdr: 0x48_0000,
        load_ticks: 0,
        unload_ticks: 0,
        build_id: &[0xde, 0xad, 0xbe, 0xef],
        path: b"/usr/bin/app",
    };
    let libfoo = ModuleEntry {
        id: 2,
        start: 0x7f00_0000_0000,
        end: 0x7f00_0001_0000,
        bias: 0x7f00_0000_0000,
        eh_frame_hdr: 0,
        load_ticks: 1200,
        unload_ticks: 0,
        build_id: &[],
        path: b"/lib/libfoo.so",
    };
    let lua = FrameEntry {
        id: 1,
        line: 7,
        func: b"f",
        file: b"a.lua",
    };
    let main = FrameWord::Native(0x40_1100);
    let make_name = FrameWord::Native(0x7f00_0000_0234);
    let mut t = TraceBuilder::new();
    t.info(&g1);
    let mut a = EventsBody::new(1100);
    let alloc = |size| EventData::HeapObjectAlloc { size, type_id: 0 };
    a.event_with_stack(&g1, 1100, 0x10040, &alloc(16), 1)
        .event_with_stack(&g1, 1300, 0x10080, &alloc(100), 2)
        .event_with_stack(&g1, 1400, 0x10081, &alloc(7), 3)
        .event(&g1, 1500, 0x100c0, &alloc(8))
        .event_with_stack(
            &g1,
            1600,
            0x22000,
            &EventData::SpanAlloc {
                npages: 2,
                kind_class: 1,
            },
            4,
        )
        .event(&g1, 1700, 0x10040, &EventData::HeapObjectFree);
    t.events(1, 1, &a);
    t.modules(1, &[app, libfoo])
        .frames(1, &[lua])
        .call_stacks(
            1,
            &[
                node(1, 0, main),
                node(2, 1, make_name),
                node(3, 2, FrameWord::Registered(1)),
                node(4, 0, FrameWord::TRUNCATED),
            ],
        )
        .generation_end_v3(1, 5000, 5_004_000, 0, 2);
    t.info(&g2);
    let mut b = EventsBody::new(5100);
    b.event_with_stack(&g2, 5100, 0x10100, &alloc(24), 2)
        .event_with_stack(&g2, 5200, 0x10140, &alloc(32), 5)
        .event(&g2, 5300, 0x10080, &EventData::HeapObjectFree);
    t.events(2, 2, &b);
    // Loaded before generation 2 started: load tick 0 there.
    let libfoo_2 = ModuleEntry {
        load_ticks: 0,
        ..libfoo
    };
    t.modules(2, &[app, libfoo_2])
        .call_stacks(
            2,
            &[
                node(1, 0, main),
                node(2, 1, make_name),
                node(5, 1, FrameWord::Native(0x9000)),
            ],
        )
        .generation_end_v3(2, 6000, 5_005_000, 0, 1)
        .trace_end(2);
    t.finish()
}

/// A small valid version-4 trace with process batches: generation 1's
/// command line `["/bin/app", "--size", "3", "x\u{fffd}y"]` (the last
/// argument with an invalid UTF-8 byte), generation 2's a cut one
/// (`PROCESS_TRUNCATED`), `["/bin/app", "-"]`, each with an allocation.
/// Used by tests and as a fuzzing seed.
pub fn process_trace() -> Vec<u8> {
    let g1 = info(1);
    let mut g2 = info(2);
    g2.start_ticks = 5000;
    g2.start_mono_ns = 5_004_000;
    let alloc = EventData::HeapObjectAlloc {
        size: 16,
        type_id: 0,
    };
    let mut t = TraceBuilder::new();
    t.info(&g1)
        .process(1, 0, &[b"/bin/app", b"--size", b"3", b"x\xffy"]);
    let mut a = EventsBody::new(1100);
    a.event(&g1, 1100, 0x10040, &alloc);
    t.events(1, 1, &a)
        .generation_end_v3(1, 5000, 5_004_000, 0, 0);
    t.info(&g2).process(
        2,
        alloctrace_format::PROCESS_TRUNCATED,
        &[b"/bin/app", b"-"],
    );
    let mut b = EventsBody::new(5100);
    b.event(&g2, 5100, 0x10080, &alloc);
    t.events(2, 1, &b)
        .generation_end_v3(2, 6000, 5_005_000, 0, 0)
        .trace_end(2);
    t.finish()
}

/// A hostile trace's call stacks (issue 20): one generation whose nodes
/// form a trunk of `trunk` nodes, each calling the one before (node 1 the
/// outermost), and `leaves` nodes called from the trunk's innermost node,
/// every node the stack of one leaked 16-byte allocation. Native frames
/// no module holds, all distinct. A trunk deeper than
/// [`MAX_STACK_DEPTH`](alloctrace_format::stacks::MAX_STACK_DEPTH) is
/// malformed (at its first node too deep); `stack_tree_trace(1023, n)`
/// has `n + 1` stacks of the greatest depth a reader takes.
pub fn stack_tree_trace(trunk: u64, leaves: u64) -> Vec<u8> {
    let g = info(1);
    let n = trunk + leaves;
    let nodes: Vec<CallStackNode> = (1..=n)
        .map(|id| {
            let parent = if id <= trunk { id - 1 } else { trunk };
            node(id, parent, FrameWord::Native(0x40_0000 + 16 * id))
        })
        .collect();
    let mut events = EventsBody::new(g.start_ticks);
    for id in 1..=n {
        let alloc = EventData::HeapObjectAlloc {
            size: 16,
            type_id: 0,
        };
        events.event_with_stack(&g, g.start_ticks + id, 0x10000 + 16 * id, &alloc, id);
    }
    let end = g.start_ticks + n + 1;
    let mut t = TraceBuilder::new();
    t.info(&g)
        .call_stacks(1, &nodes)
        .events(1, 1, &events)
        .generation_end_v3(1, end, g.start_mono_ns + n + 1, 0, 0)
        .trace_end(1);
    t.finish()
}

/// The fuzz target's checks (fuzz/fuzz_targets/reader.rs), for it and for
/// the tests that replay its seeds and crashes: reads `data` to its end and
/// panics, naming `name`, on a broken rule: an offset outside the input, a
/// failed reader that fails differently the next time, more records than
/// input bytes. (A panic inside the reader fails the caller all the same.)
pub fn fuzz_check(name: &str, data: &[u8]) {
    use crate::{Record, Step, TraceReader};
    let len = data.len() as u64;
    let mut reader = match TraceReader::new(data) {
        Ok(reader) => reader,
        Err(err) => {
            assert!(err.offset() <= len, "{name}: {err}");
            return;
        }
    };
    let mut records = 0u64;
    loop {
        match reader.next_record() {
            Ok(Some(Record::GenerationStart { .. })) => {
                // The accessors must hold up on whatever was read.
                let _ = (reader.types().len(), reader.info(), reader.generation_end());
                if let Some(args) = reader.command_line() {
                    // Lossy UTF-8 turns a byte into at most 3.
                    let max = alloctrace_format::MAX_COMMAND_LINE as usize;
                    let bytes: usize = args.iter().map(|a| a.len()).sum();
                    assert!(args.len() <= max && bytes <= 3 * max, "{name}");
                }
                let stacks = reader.stacks();
                let max = alloctrace_format::stacks::MAX_STACK_DEPTH;
                for id in stacks.ids() {
                    let frames = stacks.frames(id).map_or(0, |f| f.count());
                    assert!(frames <= stacks.len(), "{name}: stack {id} loops");
                    assert!(frames <= max, "{name}: stack {id} of {frames} frames");
                    assert_eq!(stacks.depth(id), Some(frames), "{name}: stack {id}");
                }
            }
            Ok(Some(Record::Event(event))) => {
                let _ = event.data.name();
                if event.stack_id != 0 && !reader.stacks().is_cut() {
                    assert!(
                        reader.stacks().contains(event.stack_id),
                        "{name}: an event names an undefined stack"
                    );
                }
            }
            Ok(None) => {
                assert!(reader.truncated().is_none_or(|cut| cut <= len), "{name}");
                break;
            }
            Err(err) => {
                assert!(err.offset() <= len, "{name}: {err}");
                // A failed reader keeps failing the same way.
                assert_eq!(
                    reader.next_event().err().map(|e| e.offset()),
                    Some(err.offset()),
                    "{name}"
                );
                break;
            }
        }
        records += 1;
        // Every event takes at least 3 bytes and every generation a batch.
        assert!(records <= len, "{name}: more records than input bytes");
    }
    assert!(reader.bytes_read() <= len, "{name}");
    // The same records and the same end a run of events at a time, read
    // in step with `next_record` (nothing is kept: a few bytes of input
    // can decompress to millions of events).
    let (Ok(mut one), Ok(mut runs)) = (TraceReader::new(data), TraceReader::new(data)) else {
        panic!("{name}: a file header read once does not read again");
    };
    let mut run = Vec::new();
    loop {
        let step = runs.next_step(5, |e| run.push(e.clone()));
        for event in run.drain(..) {
            let got = one.next_record().map_err(|e| e.to_string());
            assert_eq!(got, Ok(Some(Record::Event(event))), "{name}");
        }
        if let Ok(Step::Events(n)) = step {
            assert!((1..=5).contains(&n), "{name}: {n} events");
            continue;
        }
        let got = one.next_record();
        match step {
            Ok(Step::Events(_)) => {}
            Ok(Step::GenerationStart { generation }) => {
                let want = Some(Record::GenerationStart { generation });
                assert_eq!(got.map_err(|e| e.to_string()), Ok(want), "{name}");
            }
            Ok(Step::End) => {
                assert_eq!(got.map_err(|e| e.to_string()), Ok(None), "{name}");
                break;
            }
            Err(err) => {
                let got = got.map(|_| ()).map_err(|e| (e.offset(), e.to_string()));
                assert_eq!(got, Err((err.offset(), err.to_string())), "{name}");
                break;
            }
        }
    }
}
