//! Streaming reader for alloctrace traces (docs/FORMAT.md, versions 1 to
//! 6: `alloctrace_format::READABLE_VERSIONS`).
//!
//! ## Reading protocol
//! A trace reads as one sequence of records: for each generation, a
//! [`Record::GenerationStart`] (from then on [`TraceReader::types`],
//! [`TraceReader::info`], [`TraceReader::generation_end`] and
//! [`TraceReader::clock`] describe that generation), then its events in
//! time order; then the end. There are two ways through the same sequence:
//!
//! - [`TraceReader::next_record`]: one record at a time, each event moved
//!   out as a [`Record::Event`]; `None` at the end.
//! - [`TraceReader::next_step`]: a run of the generation's events at a
//!   time, handed to a closure by reference ([`Step::Events`] says how
//!   many), or else the next [`Step::GenerationStart`] or [`Step::End`].
//!   Faster for reading a whole trace: no `Event` is moved out of the
//!   reader.
//!
//! Both may be mixed: each call takes up where the other left off. After
//! an error, every later call returns the same error. A trace cut short
//! ends as a complete one does, and [`TraceReader::truncated`] then says
//! where it was cut. [`TraceReader::next_event`] is `next_record` without
//! the generation starts.
//!
//! ```no_run
//! use std::{fs::File, io::BufReader};
//! use alloctrace_reader::{Step, TraceReader};
//!
//! let file = BufReader::new(File::open("app.trace")?);
//! let mut reader = TraceReader::new(file)?;
//! let mut frees = 0u64;
//! loop {
//!     match reader.next_step(1 << 16, |event| frees += u64::from(event.data.name().ends_with("free")))? {
//!         Step::Events(_) => {}
//!         Step::GenerationStart { generation } => {
//!             println!("generation {generation}: {} types", reader.types().len())
//!         }
//!         Step::End => break,
//!     }
//! }
//! println!("{frees} frees");
//! if let Some(offset) = reader.truncated() {
//!     eprintln!("trace cut off at byte {offset}");
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! One record at a time:
//!
//! ```no_run
//! # use alloctrace_reader::{Record, TraceReader};
//! # let mut reader = TraceReader::new(std::io::empty())?;
//! while let Some(record) = reader.next_record()? {
//!     match record {
//!         Record::GenerationStart { generation } => println!("generation {generation}"),
//!         Record::Event(e) => println!("{} {} {:#x}", e.time_ns, e.data.name(), e.addr),
//!     }
//! }
//! # Ok::<(), alloctrace_reader::ReadError>(())
//! ```
//!
//! ## Design
//! Three layers, each in its own file. The batch source (src/source.rs)
//! turns the file's bytes into batches in file order: framing, checksum
//! trailers, offsets, where the input was cut, and the batches inside
//! compressed ones. The open generations (src/open.rs) check each batch and
//! file it under its generation. The reader (this file) hands out each
//! complete generation's events through the merge (src/generation.rs).
//!
//! Batches of one generation arrive interleaved across threads and with the
//! next generation's batches; only a generation-end batch says a generation
//! is complete. So the reader keeps each open generation's events and pages
//! batches as raw bytes and, when a generation ends, merges its batches into
//! time order and hands the events out one by one. At most two generations
//! are open at once (FORMAT.md section 6), so memory is at most two
//! generations of raw batch bytes, capped by
//! [`TraceReader::set_max_generation_bytes`], whatever the trace's length.
//!
//! Batch framing, headers, info, types, generation-end and pages bodies are
//! checked as they arrive, in file order. An events body is checked as it
//! is merged, each event decoded once with every check: the error comes
//! when the merge reaches the bad event, that is after the event before it
//! in its batch has been handed out (for the first event of a batch: when
//! its generation would start).
//!
//! The merge is a k-way merge over the generation's batches (sorted by
//! thread, so a batch's index breaks ties) whose top batch hands out a run
//! of events for as long as they sort first: one thread's batches follow
//! each other in time, so most events cost a comparison, not a heap
//! operation. [`TraceReader::next_step`] hands a run to a closure without
//! moving each `Event` out.
//!
//! Compressed batches (kinds 8 and 9) are decompressed a few batches ahead
//! on a thread of the reader's own, started at the first compressed batch
//! (src/unpack.rs): zstd and the model's inverse run while events are
//! merged. Their results, errors included, are used in file order, as if
//! each were decompressed in its turn.
//!
//! ## Guarantees
//! 1. No input makes the reader panic, hang, or allocate more than a
//!    checked length: a payload length is checked against
//!    `MAX_BATCH_PAYLOAD` before anything is read into memory.
//! 2. Every error names the byte offset from the start of the file where
//!    the bad item starts; for an item inside a compressed batch, the
//!    compressed batch's offset, with the item's offset in its
//!    decompressed data in the message ("inside the compressed batch, at
//!    byte N of its decompressed data: ..."), whenever the error is found
//!    (an events body's as it is merged, too).
//! 3. Page-tracer events (pages batches, FORMAT.md section 7) come out as
//!    [`EventData::PageAlloc`], [`EventData::PageFree`] and
//!    [`EventData::PageScav`], merged by time with the other events of their
//!    generation. Their ticks are `(time base + delta) << lost_bits`, at
//!    most one unit below the true time. Besides the malformed cases of
//!    section 7, a pages body whose thread word disagrees with its batch
//!    header, or whose event times go back, is malformed. A body without a
//!    time-base word counts from its batch header's `base_ticks`.
//! 4. A trace cut short (EOF inside a batch, or no trace-end batch) is not an
//!    error: every complete batch's events come out, generations without a
//!    generation-end included, and [`TraceReader::truncated`] says where the
//!    cut is. In a version-2 or 3 file a batch whose trailer is cut off is cut
//!    too: it is not read.
//! 5. In a version-2 or 3 file every batch's checksum (FORMAT.md section 2) is
//!    verified right after the batch is read, before any of it is parsed
//!    or decompressed: a damaged batch is reported as such ("checksum
//!    mismatch in the batch at byte offset N ..."), never as whatever its
//!    damaged bytes would parse as. Version-1 files, without checksums,
//!    read as before.
//! 6. Call stacks (version 3, FORMAT.md section 10): a generation's
//!    modules, registered frames and call-stack nodes are checked as their
//!    batches arrive (IDs, parents, frame words, lengths; errors at the
//!    entry), and every stack ID an event names is checked defined in its
//!    generation when the merge reaches the event (the error at the
//!    event), except in a generation cut off by the end of a truncated
//!    trace, whose stack batches (written as a generation ends) may be
//!    missing: its events keep their stack IDs, unchecked.
//!    [`TraceReader::stacks`] offers them once the generation starts; [`Event::stack_id`] is 0 for an event without a stack, and a
//!    trace of version 1 or 2 reads exactly as before.
//! 7. The process batch (version 4): at most one per generation, its
//!    argument count and bytes checked against `MAX_COMMAND_LINE` before
//!    they are kept; [`TraceReader::command_line`] offers it once the
//!    generation starts.

#![forbid(unsafe_code)]

mod decode;
mod error;
mod event;
mod generation;
mod open;
mod source;
mod stacks;
/// Builds traces for tests (the `testing` feature; not a stable API).
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod testing;
mod unpack;

use std::collections::BTreeMap;
use std::io::Read;

use alloctrace_format::BatchKind;

use generation::Emitter;
use open::OpenGenerations;
use source::{Batch, BatchSource};

pub use error::ReadError;
pub use event::{
    sample_weight, Event, EventData, GenerationEnd, GenerationInfo, ProcessInfo, Record, Step,
    Totals, TypeInfo, PAGE_EVENT_NAMES,
};
pub use generation::Clock;
pub use stacks::{Frame, Module, RegisteredFrame, Stacks};

/// Default cap on the memory one open generation may hold (raw events plus
/// its type table): 1 GiB.
pub const DEFAULT_MAX_GENERATION_BYTES: u64 = 1 << 30;

/// Reads a trace from any [`Read`], streaming (see the crate docs for the
/// reading protocol). Wrap files in a [`std::io::BufReader`]: the reader
/// makes small reads.
pub struct TraceReader<R: Read> {
    /// The file's batches, in file order.
    source: BatchSource<R>,
    /// Generations with batches read but not yet handed out.
    open: OpenGenerations,
    /// The generation whose events are being handed out, or were last.
    current: Option<Emitter>,
    /// `start_mono_ns` of the first generation: event times count from it.
    time_origin_ns: Option<u64>,
    generations: u64,
    lost_events: u64,
    lost_stacks: u64,
    totals: Totals,
    sample_bytes: u64,
    /// The first error, returned again by every later call.
    failed: Option<ReadError>,
    /// What `types()` returns before the first generation.
    no_types: BTreeMap<u64, TypeInfo>,
    /// What `stacks()` returns before the first generation.
    no_stacks: Stacks,
}

impl<R: Read> TraceReader<R> {
    /// Reads and checks the file header.
    pub fn new(input: R) -> Result<TraceReader<R>, ReadError> {
        Ok(TraceReader {
            source: BatchSource::new(input)?,
            open: OpenGenerations::new(DEFAULT_MAX_GENERATION_BYTES),
            current: None,
            time_origin_ns: None,
            generations: 0,
            lost_events: 0,
            lost_stacks: 0,
            totals: Totals::default(),
            sample_bytes: 0,
            failed: None,
            no_types: BTreeMap::new(),
            no_stacks: Stacks::default(),
        })
    }

    /// The next record: a generation's start or one of its events (see the
    /// crate docs), or `None` at the end of the trace. After an error,
    /// every later call returns the same error.
    #[inline]
    pub fn next_record(&mut self) -> Result<Option<Record>, ReadError> {
        let mut event = None;
        let step = self.next_step(1, |e| event = Some(e.clone()))?;
        Ok(match step {
            Step::Events(_) => event.map(Record::Event),
            Step::GenerationStart { generation } => Some(Record::GenerationStart { generation }),
            Step::End => None,
        })
    }

    /// The next event in time order, or `None` at the end of the trace:
    /// [`next_record`](Self::next_record) without the generation starts.
    pub fn next_event(&mut self) -> Result<Option<Event>, ReadError> {
        loop {
            match self.next_record()? {
                Some(Record::Event(event)) => return Ok(Some(event)),
                Some(Record::GenerationStart { .. }) => {}
                None => return Ok(None),
            }
        }
    }

    /// The next records, the protocol of [`next_record`](Self::next_record)
    /// a run at a time: hands the generation's next events, at least one
    /// and at most `max` (`0` counts as `1`), to `on_event` and returns
    /// [`Step::Events`] with their number; when the generation has none
    /// left, returns the next generation's start, or the end.
    ///
    /// Within a call the generation does not change, so `types()`,
    /// `info()`, `generation_end()` and `clock()` hold for every event
    /// handed out. An error comes after the events before it: a call that
    /// has handed out events returns their number, the next call the
    /// error, and every later call the same error.
    ///
    /// ```no_run
    /// # use alloctrace_reader::{Step, TraceReader};
    /// # let mut reader = TraceReader::new(std::io::empty())?;
    /// let mut events = 0u64;
    /// loop {
    ///     match reader.next_step(1 << 16, |_event| events += 1)? {
    ///         Step::Events(_) => {}
    ///         Step::GenerationStart { generation } => println!("generation {generation}"),
    ///         Step::End => break,
    ///     }
    /// }
    /// # Ok::<(), alloctrace_reader::ReadError>(())
    /// ```
    #[inline]
    pub fn next_step<F: FnMut(&Event)>(
        &mut self,
        max: usize,
        on_event: F,
    ) -> Result<Step, ReadError> {
        // The hot path, inlined into the caller's loop: the next events of
        // the generation being handed out.
        if let Some(err) = &self.failed {
            return Err(err.replay());
        }
        if let Some(em) = &mut self.current {
            match em.drain(max.max(1), on_event) {
                Ok(0) => {}
                Ok(n) => return Ok(Step::Events(n)),
                Err(err) => {
                    self.failed = Some(err.replay());
                    return Err(err);
                }
            }
        }
        self.next_generation()
    }

    /// Everything but the hot path of [`next_step`](Self::next_step): the
    /// generation being handed out has no events left.
    #[inline(never)]
    fn next_generation(&mut self) -> Result<Step, ReadError> {
        let result = self.advance();
        if let Err(err) = &result {
            self.failed = Some(err.replay());
        }
        result
    }

    /// Where the trace was cut short, once the end has been read: the
    /// offset of the incomplete batch, or the file length when only the
    /// trace-end batch is missing. `None` for a complete trace.
    pub fn truncated(&self) -> Option<u64> {
        self.source.truncated()
    }

    /// Whether the trace is a flight recorder's dump (the header's
    /// `FLAG_FLIGHT_WINDOW`, FORMAT.md section 1): a window of the run, its
    /// first generation not the run's first, so frees of objects allocated
    /// before it are expected, not anomalies.
    pub fn flight_window(&self) -> bool {
        self.source.flags() & alloctrace_format::FLAG_FLIGHT_WINDOW != 0
    }

    /// Number of generations whose events have been (or are being) handed
    /// out.
    pub fn generations(&self) -> u64 {
        self.generations
    }

    /// Sum of `lost_events` over the generations handed out so far.
    pub fn lost_events(&self) -> u64 {
        self.lost_events
    }

    /// Sum of `lost_stacks` over the generations handed out so far:
    /// allocations recorded without their stack (0 before version 3).
    pub fn lost_stacks(&self) -> u64 {
        self.lost_stacks
    }

    /// Sum of the generations' exact totals (format version 6) over the
    /// generations handed out so far: all 0 unless the trace samples.
    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// The sampling mean of the generations handed out so far (the last
    /// non-zero `sample_bytes` of their info batches): 0 when every
    /// allocation is recorded.
    pub fn sample_bytes(&self) -> u64 {
        self.sample_bytes
    }

    /// Call stacks, registered frames and modules of the generation of the
    /// last returned event (empty before the first generation, and for a
    /// trace without stacks). An event's [`Event::stack_id`] names one of
    /// its stacks: [`Stacks::frames`] gives its frames, innermost first.
    pub fn stacks(&self) -> &Stacks {
        match &self.current {
            Some(em) => &em.gen.stacks,
            None => &self.no_stacks,
        }
    }

    /// Type table of the generation of the last returned event (empty before
    /// the first generation).
    pub fn types(&self) -> &BTreeMap<u64, TypeInfo> {
        match &self.current {
            Some(em) => &em.gen.types,
            None => &self.no_types,
        }
    }

    /// Info batch of the generation of the last returned event.
    pub fn info(&self) -> Option<&GenerationInfo> {
        self.current.as_ref().map(|em| em.info())
    }

    /// Process batch (format version 4) of the generation of the last
    /// returned event: the traced program's command line. `None` before
    /// the first generation and for a generation without one (traces of
    /// versions 1 to 3, or a writer that did not know it).
    pub fn process(&self) -> Option<&ProcessInfo> {
        self.current.as_ref().and_then(|em| em.gen.process.as_ref())
    }

    /// The command line of the generation of the last returned event
    /// (see [`process`](Self::process)), the program first.
    pub fn command_line(&self) -> Option<&[String]> {
        self.process().map(|p| p.command_line.as_slice())
    }

    /// Generation-end batch of the generation of the last returned event;
    /// `None` for a generation cut off before it.
    pub fn generation_end(&self) -> Option<&GenerationEnd> {
        self.current.as_ref().and_then(|em| em.gen.end.as_ref())
    }

    /// Clock of the generation of the last returned event (`None` before
    /// the first generation): [`Clock::time_ns`] of an event's `ticks` is
    /// its `time_ns`. A copy lets a [`next_step`](Self::next_step)
    /// closure that needs only a few events' times convert their ticks
    /// itself: when nothing reads `Event::time_ns`, the compiler can drop
    /// its computation from the inlined loop.
    pub fn clock(&self) -> Option<Clock> {
        self.current.as_ref().map(|em| *em.clock())
    }

    /// `start_mono_ns` of the first generation, which event times count from.
    pub fn time_origin_ns(&self) -> Option<u64> {
        self.time_origin_ns
    }

    /// Bytes consumed from the input so far.
    pub fn bytes_read(&self) -> u64 {
        self.source.offset()
    }

    /// Caps the memory one open generation may hold; a trace whose
    /// generation needs more is reported as malformed.
    pub fn set_max_generation_bytes(&mut self, max: u64) {
        self.open.set_max_bytes(max);
    }

    /// Reads batches until the next generation can start, or the input
    /// ends. The generation being handed out has no events left.
    fn advance(&mut self) -> Result<Step, ReadError> {
        if let Some(em) = &mut self.current {
            self.open.take_back(em.release());
        }
        loop {
            if let Some(generation) = self.start_next_generation()? {
                return Ok(Step::GenerationStart { generation });
            }
            if self.source.done() {
                return Ok(Step::End);
            }
            self.read_batch()?;
        }
    }

    /// Starts handing out the oldest open generation if it is complete (or
    /// the input has ended).
    fn start_next_generation(&mut self) -> Result<Option<u64>, ReadError> {
        while let Some(gen) = self.open.pop_ready(self.source.done()) {
            // Only a generation cut off by the end of the input can lack its
            // info batch (a generation-end requires one). Its events cannot
            // be restored; the truncation is reported.
            let Some(info) = gen.info else { continue };
            let number = gen.number;
            let origin = *self.time_origin_ns.get_or_insert(info.start_mono_ns);
            self.generations += 1;
            self.lost_events = self
                .lost_events
                .saturating_add(gen.end.map_or(0, |e| e.lost_events));
            self.lost_stacks = self
                .lost_stacks
                .saturating_add(gen.end.map_or(0, |e| e.lost_stacks));
            if let Some(end) = &gen.end {
                self.totals.add(&end.totals);
            }
            if info.sample_bytes != 0 {
                self.sample_bytes = info.sample_bytes;
            }
            self.current = Some(Emitter::new(gen, info, origin)?);
            return Ok(Some(number));
        }
        Ok(None)
    }

    /// Reads one batch and files it under its generation, or notes the end
    /// of the input.
    fn read_batch(&mut self) -> Result<(), ReadError> {
        let (kind, offset, len) = match self.source.next()? {
            None => return Ok(()),
            Some(Batch::Inner {
                kind,
                offset,
                payload,
                compressed,
            }) => {
                self.open
                    .handle_batch(kind, offset, payload, Some(compressed))
                    .map_err(|e| e.inside_compressed(compressed))?;
                if kind == BatchKind::TraceEnd {
                    self.source.after_trace_end()?;
                }
                return Ok(());
            }
            Some(Batch::InFile { kind, offset, len }) => (kind, offset, len),
        };
        if matches!(kind, BatchKind::Events | BatchKind::CompactEvents) {
            // Straight into the newest open generation's raw bytes, where
            // its body stays: the common case, without a copy.
            if let Some(raw) = self.open.newest_raw() {
                let start = raw.len();
                if self.source.append_payload(raw, kind, offset, len)? {
                    self.open.events_appended(kind, offset, start)?;
                }
                return Ok(());
            }
        }
        if let Some(payload) = self.source.read_payload(kind, offset, len)? {
            self.open.handle_batch(kind, offset, payload, None)?;
            if kind == BatchKind::TraceEnd {
                self.source.after_trace_end()?;
            }
        }
        Ok(())
    }
}

/// Helpers shared by the unit tests.
#[cfg(test)]
mod test_util {
    /// A xorshift64 generator: reproducible pseudo-random test inputs.
    pub(crate) fn xorshift(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// A randomized test's number of rounds: `n`, or a thousandth of it
    /// under Miri (`make miri`), which interprets about a thousand times
    /// slower.
    pub(crate) const fn rounds(n: usize) -> usize {
        if cfg!(miri) {
            n / 1000
        } else {
            n
        }
    }
}
