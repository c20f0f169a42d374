//! Streaming reader for alloctrace traces (docs/FORMAT.md, versions 1 and 2).
//!
//! ```no_run
//! use std::{fs::File, io::BufReader};
//! use alloctrace_reader::TraceReader;
//!
//! let file = BufReader::new(File::open("app.trace")?);
//! let mut reader = TraceReader::new(file)?;
//! while let Some(event) = reader.next_event()? {
//!     println!("{} {} {:#x}", event.time_ns, event.data.name(), event.addr);
//! }
//! if let Some(offset) = reader.truncated() {
//!     eprintln!("trace cut off at byte {offset}");
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Design
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
//! operation. [`TraceReader::next_events`] hands a run to a closure without
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
//!    cut is. In a version-2 file a batch whose trailer is cut off is cut
//!    too: it is not read.
//! 5. In a version-2 file every batch's checksum (FORMAT.md section 2) is
//!    verified right after the batch is read, before any of it is parsed
//!    or decompressed: a damaged batch is reported as such ("checksum
//!    mismatch in the batch at byte offset N ..."), never as whatever its
//!    damaged bytes would parse as. Version-1 files, without checksums,
//!    read as before.

#![forbid(unsafe_code)]

mod decode;
mod error;
mod event;
mod generation;
#[doc(hidden)]
pub mod testing;
mod unpack;

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Read};

use alloctrace_format::{
    batch_checksum, has_trailers, BatchKind, FileHeader, HeaderError, BATCH_PREFIX_LEN,
    FILE_HEADER_LEN, MAGIC, MAX_BATCH_PAYLOAD, READABLE_VERSIONS, TRAILER_LEN,
};

use decode::{BatchContext, Cursor, PagesState};
use generation::{Emitter, EventBatch, Generation};
use unpack::Unpacker;

pub use error::ReadError;
pub use event::{
    Event, EventData, GenerationEnd, GenerationInfo, Record, TypeInfo, PAGE_EVENT_NAMES,
};
pub use generation::Clock;

/// Default cap on the memory one open generation may hold (raw events plus
/// its type table): 1 GiB.
pub const DEFAULT_MAX_GENERATION_BYTES: u64 = 1 << 30;

/// Reads a trace from any [`Read`], streaming. Wrap files in a
/// [`std::io::BufReader`]: the reader makes small reads.
pub struct TraceReader<R: Read> {
    input: R,
    /// Bytes consumed from the input so far.
    offset: u64,
    /// Whether every batch in the file is followed by a checksum trailer
    /// (version 2).
    trailers: bool,
    /// Payload of the batch being parsed; reused to avoid an allocation per
    /// batch.
    scratch: Vec<u8>,
    /// The decompressed data of the compressed batch being read, the
    /// position of its next inner batch, and the compressed batch's offset.
    /// Inner batches are handed out one per read_batch call, as if they
    /// stood in the file.
    inner: Option<(Vec<u8>, usize, u64)>,
    /// The batches after the compressed batch being read, read from the
    /// input before their turn (at most `Unpacker::ahead()`): compressed
    /// ones are decompressed meanwhile. Only the last may be other than
    /// `Frame::Unpacking`.
    ahead: VecDeque<Frame>,
    /// Decompresses compressed batches on a thread of its own, started at
    /// the first compressed batch.
    unpacker: Option<Unpacker>,
    /// Generations with batches read but not yet handed out, oldest first;
    /// at most two. Only the oldest can be without a generation-end batch
    /// when the newest has one.
    open: Vec<Generation>,
    /// The newest generation handed out (or dropped at a cut).
    last_emitted: Option<u64>,
    /// The generation whose events are being handed out, or were last.
    current: Option<Emitter>,
    /// `start_mono_ns` of the first generation: event times count from it.
    time_origin_ns: Option<u64>,
    generations: u64,
    lost_events: u64,
    /// A trace-end batch or the end of the input was reached.
    input_done: bool,
    truncated: Option<u64>,
    /// The first error, returned again by every later call.
    failed: Option<ReadError>,
    max_generation_bytes: u64,
    /// What `types()` returns before the first generation.
    no_types: BTreeMap<u64, TypeInfo>,
    /// The emptied raw buffer of the last generation handed out, for the
    /// next generation to open: its pages are not faulted in and zeroed
    /// again. Kept only while no generation is open (else that generation
    /// takes it over, see `advance`), so no more raw buffers exist at once
    /// than without it.
    spare_raw: Vec<u8>,
}

impl<R: Read> TraceReader<R> {
    /// Reads and checks the file header.
    pub fn new(mut input: R) -> Result<TraceReader<R>, ReadError> {
        let mut header = [0u8; FILE_HEADER_LEN];
        let n = read_full(&mut input, &mut header).map_err(|e| ReadError::io(0, e))?;
        let magic_len = n.min(MAGIC.len());
        if header[..magic_len] != MAGIC[..magic_len] || n == 0 {
            return Err(ReadError::malformed(
                0,
                "not an alloctrace trace: the file does not start with \"ALCTRACE\"",
            ));
        }
        if n < FILE_HEADER_LEN {
            return Err(ReadError::malformed(
                0,
                format!(
                    "the file ends after {n} bytes, inside the {FILE_HEADER_LEN}-byte file header"
                ),
            ));
        }
        let trailers = match FileHeader::decode(&header) {
            Ok(h) => has_trailers(h.version),
            Err(HeaderError::BadMagic) => {
                return Err(ReadError::malformed(
                    0,
                    "not an alloctrace trace: bad magic",
                ));
            }
            Err(HeaderError::UnsupportedVersion(v)) => {
                let known: Vec<String> = READABLE_VERSIONS.iter().map(|v| v.to_string()).collect();
                return Err(ReadError::malformed(
                    8,
                    format!(
                        "unsupported format version {v}: this reader reads versions {} (a newer alloctrace wrote this trace?)",
                        known.join(" and ")
                    ),
                ));
            }
            Err(HeaderError::BadChecksum) => {
                return Err(ReadError::malformed(
                    0,
                    "checksum mismatch in the file header: the file is damaged",
                ));
            }
        };
        Ok(TraceReader {
            input,
            offset: FILE_HEADER_LEN as u64,
            trailers,
            scratch: Vec::new(),
            inner: None,
            open: Vec::new(),
            last_emitted: None,
            current: None,
            time_origin_ns: None,
            generations: 0,
            lost_events: 0,
            input_done: false,
            truncated: None,
            failed: None,
            max_generation_bytes: DEFAULT_MAX_GENERATION_BYTES,
            no_types: BTreeMap::new(),
            spare_raw: Vec::new(),
            ahead: VecDeque::new(),
            unpacker: None,
        })
    }

    /// The next event in time order, or `None` at the end of the trace.
    /// After an error, every later call returns the same error.
    pub fn next_event(&mut self) -> Result<Option<Event>, ReadError> {
        loop {
            match self.next_record()? {
                Some(Record::Event(event)) => return Ok(Some(event)),
                Some(Record::GenerationStart { .. }) => {}
                None => return Ok(None),
            }
        }
    }

    /// Like [`next_event`](Self::next_event), with a
    /// [`Record::GenerationStart`] before each generation's events.
    #[inline]
    pub fn next_record(&mut self) -> Result<Option<Record>, ReadError> {
        // The hot path, inlined into the caller's loop: the next event of
        // the generation being handed out.
        if let (None, Some(em)) = (&self.failed, &mut self.current) {
            match em.next() {
                Ok(Some(event)) => return Ok(Some(Record::Event(event))),
                Ok(None) => {}
                Err(err) => {
                    self.failed = Some(err.replay());
                    return Err(err);
                }
            }
        }
        self.next_record_slow()
    }

    /// Hands the next events of the generation being read to `f`, at most
    /// `max` of them, in the order [`next_event`](Self::next_event) would
    /// return them; returns how many. Faster than `next_event` for reading
    /// a whole trace: no `Event` is moved out of the reader.
    ///
    /// Returns 0 when the generation has no events left (or none has
    /// started): [`next_record`](Self::next_record) then gives the next
    /// generation's start, or the end. Within a call the generation does
    /// not change, so `types()`, `info()` and `generation_end()` hold for
    /// every event handed out. An error comes after the events before it:
    /// a call that has handed out events returns their number, the next
    /// call the error, and every later call the same error.
    ///
    /// ```no_run
    /// # use alloctrace_reader::{Record, TraceReader};
    /// # let mut reader = TraceReader::new(std::io::empty())?;
    /// let mut events = 0u64;
    /// loop {
    ///     while reader.next_events(1 << 16, |_event| events += 1)? > 0 {}
    ///     match reader.next_record()? {
    ///         Some(Record::GenerationStart { generation }) => println!("generation {generation}"),
    ///         Some(Record::Event(_event)) => events += 1,
    ///         None => break,
    ///     }
    /// }
    /// # Ok::<(), alloctrace_reader::ReadError>(())
    /// ```
    #[inline]
    pub fn next_events<F: FnMut(&Event)>(&mut self, max: usize, f: F) -> Result<usize, ReadError> {
        if let Some(err) = &self.failed {
            return Err(err.replay());
        }
        let Some(em) = &mut self.current else {
            return Ok(0);
        };
        em.drain(max, f)
            .inspect_err(|err| self.failed = Some(err.replay()))
    }

    /// Everything but the hot path of [`next_record`](Self::next_record).
    fn next_record_slow(&mut self) -> Result<Option<Record>, ReadError> {
        if let Some(err) = &self.failed {
            return Err(err.replay());
        }
        let result = self.advance();
        if let Err(err) = &result {
            self.failed = Some(err.replay());
        }
        result
    }

    /// Where the trace was cut short, once `next_event` has returned `None`:
    /// the offset of the incomplete batch, or the file length when only the
    /// trace-end batch is missing. `None` for a complete trace.
    pub fn truncated(&self) -> Option<u64> {
        self.truncated
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

    /// Generation-end batch of the generation of the last returned event;
    /// `None` for a generation cut off before it.
    pub fn generation_end(&self) -> Option<&GenerationEnd> {
        self.current.as_ref().and_then(|em| em.gen.end.as_ref())
    }

    /// Clock of the generation of the last returned event (`None` before
    /// the first generation): [`Clock::time_ns`] of an event's `ticks` is
    /// its `time_ns`. A copy lets a [`next_events`](Self::next_events)
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
        self.offset
    }

    /// Caps the memory one open generation may hold; a trace whose
    /// generation needs more is reported as malformed.
    pub fn set_max_generation_bytes(&mut self, max: u64) {
        self.max_generation_bytes = max;
    }

    fn advance(&mut self) -> Result<Option<Record>, ReadError> {
        loop {
            if let Some(em) = &mut self.current {
                if let Some(event) = em.next()? {
                    return Ok(Some(Record::Event(event)));
                }
                let mut raw = em.release();
                match self.open.first_mut() {
                    // The next generation is being read already: it moves
                    // into the larger buffer, and the smaller one is freed.
                    Some(next) => {
                        if raw.capacity() > next.raw.capacity() {
                            raw.extend_from_slice(&next.raw);
                            std::mem::swap(&mut next.raw, &mut raw);
                        }
                    }
                    None => self.spare_raw = raw,
                }
            }
            if let Some(generation) = self.start_next_generation()? {
                return Ok(Some(Record::GenerationStart { generation }));
            }
            if self.input_done {
                return Ok(None);
            }
            self.read_batch()?;
        }
    }

    /// Starts handing out the oldest open generation if it is complete (or
    /// the input has ended).
    fn start_next_generation(&mut self) -> Result<Option<u64>, ReadError> {
        loop {
            let ready = self
                .open
                .first()
                .is_some_and(|g| g.end.is_some() || self.input_done);
            if !ready {
                return Ok(None);
            }
            let gen = self.open.remove(0);
            self.last_emitted = Some(gen.number);
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
            self.current = Some(Emitter::new(gen, info, origin)?);
            return Ok(Some(number));
        }
    }

    /// Reads one batch, or notes the end of the input.
    fn read_batch(&mut self) -> Result<(), ReadError> {
        if self.inner.is_some() {
            return self.next_inner_batch();
        }
        let frame = match self.ahead.pop_front() {
            Some(frame) => frame,
            None => {
                let frame = self.read_frame();
                self.queue(frame)
            }
        };
        match frame {
            Frame::End { offset } | Frame::Cut { offset } => {
                self.cut_at(offset);
                Ok(())
            }
            Frame::Failed { err, .. } => Err(err),
            Frame::Batch { kind, offset, len } => {
                if matches!(kind, BatchKind::Events | BatchKind::CompactEvents)
                    && !self.open.is_empty()
                {
                    return self.read_events_in_place(kind, offset, len);
                }
                let mut payload = std::mem::take(&mut self.scratch);
                let result = match self.read_payload(&mut payload, kind, offset, len) {
                    Err(err) => Err(err),
                    Ok(false) => {
                        self.cut_at(offset);
                        Ok(())
                    }
                    Ok(true) => self.handle_batch(kind, offset, &payload, None),
                };
                self.scratch = payload;
                result
            }
            Frame::Unpacking { offset, seq } => {
                // The next compressed batches are decompressed while this
                // one's batches are read.
                self.read_ahead();
                let raw = match &mut self.unpacker {
                    Some(unpacker) => unpacker.wait(seq)?,
                    // Not reached: an Unpacking frame comes from the unpacker.
                    None => {
                        return Err(ReadError::malformed(
                            offset,
                            "internal error: no decompression under way",
                        ))
                    }
                };
                self.inner = Some((raw, 0, offset));
                self.next_inner_batch()
            }
        }
    }

    /// Reads the next batch's kind and payload length (FORMAT.md section
    /// 2), not its payload.
    fn read_frame(&mut self) -> Frame {
        let offset = self.offset;
        let mut prefix = [0u8; BATCH_PREFIX_LEN];
        // The first byte alone: an I/O error before it is the error a
        // trace-end batch's probe for more data would meet (trace_end).
        let n = match read_full(&mut self.input, &mut prefix[..1]) {
            Ok(1) => read_full(&mut self.input, &mut prefix[1..]).map(|n| n + 1),
            Ok(_) => return Frame::End { offset },
            Err(e) => {
                return Frame::Failed {
                    offset,
                    err: ReadError::io(offset, e),
                    nothing_read: true,
                }
            }
        };
        let n = match n {
            Ok(n) => n,
            Err(e) => {
                return Frame::Failed {
                    offset,
                    err: ReadError::io(offset, e),
                    nothing_read: false,
                }
            }
        };
        self.offset += n as u64;
        let Some(kind) = BatchKind::from_u8(prefix[0]) else {
            let err = ReadError::malformed(offset, format!("unknown batch kind {}", prefix[0]));
            return Frame::Failed {
                offset,
                err,
                nothing_read: false,
            };
        };
        if n < BATCH_PREFIX_LEN {
            return Frame::Cut { offset };
        }
        let len = u32::from_le_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]);
        if len > MAX_BATCH_PAYLOAD {
            let err = ReadError::malformed(
                offset,
                format!(
                    "{} batch declares a payload of {len} bytes, above the limit of {MAX_BATCH_PAYLOAD}",
                    kind.name()
                ),
            );
            return Frame::Failed {
                offset,
                err,
                nothing_read: false,
            };
        }
        Frame::Batch { kind, offset, len }
    }

    /// Reads the payload of `len` bytes of the batch at `batch_offset`
    /// into `payload`, and its trailer, which it verifies: `false` if the
    /// input ends first.
    fn read_payload(
        &mut self,
        payload: &mut Vec<u8>,
        kind: BatchKind,
        batch_offset: u64,
        len: u32,
    ) -> Result<bool, ReadError> {
        // read_to_end grows the buffer with the bytes that really arrive, so
        // a cut-off file never costs the declared length.
        payload.clear();
        let got = (&mut self.input)
            .take(u64::from(len))
            .read_to_end(payload)
            .map_err(|e| ReadError::io(self.offset, e))?;
        self.offset += got as u64;
        if got != len as usize {
            return Ok(false);
        }
        verify_trailer(
            &mut self.input,
            &mut self.offset,
            self.trailers,
            kind,
            batch_offset,
            payload,
        )
    }

    /// For a compressed batch: reads its payload and queues it for
    /// decompression (starting the thread at the first); any other frame
    /// is returned as it is.
    fn queue(&mut self, frame: Frame) -> Frame {
        let Frame::Batch {
            kind: kind @ (BatchKind::Compressed | BatchKind::CompressedModeled),
            offset,
            len,
        } = frame
        else {
            return frame;
        };
        let mut payload = self
            .unpacker
            .as_mut()
            .map(|u| u.payload_buffer())
            .unwrap_or_default();
        match self.read_payload(&mut payload, kind, offset, len) {
            Err(err) => {
                return Frame::Failed {
                    offset,
                    err,
                    nothing_read: false,
                }
            }
            Ok(false) => return Frame::Cut { offset },
            Ok(true) => {}
        }
        let seq = self
            .unpacker
            .get_or_insert_with(Unpacker::start)
            .submit(kind, offset, payload);
        Frame::Unpacking { offset, seq }
    }

    /// Reads and queues batches after the compressed batch being read, as
    /// far as the unpacker takes them: up to the first that is not a
    /// compressed batch (its payload is read in its turn).
    fn read_ahead(&mut self) {
        let want = self.unpacker.as_ref().map_or(0, |u| u.ahead());
        while self.ahead.len() < want
            && matches!(self.ahead.back(), None | Some(Frame::Unpacking { .. }))
        {
            let frame = self.read_frame();
            let frame = self.queue(frame);
            self.ahead.push_back(frame);
        }
    }

    /// Reads an events batch straight into the newest open generation's
    /// raw bytes, where its body stays (its header too, unused, before it):
    /// the common case, without a copy. A batch of another generation is
    /// moved out and handled as any other; the checks and their errors are
    /// those of `handle_batch`.
    fn read_events_in_place(
        &mut self,
        kind: BatchKind,
        batch_offset: u64,
        len: u32,
    ) -> Result<(), ReadError> {
        let max = self.max_generation_bytes;
        let TraceReader {
            input,
            offset,
            open,
            scratch,
            trailers,
            ..
        } = self;
        let Some(newest) = open.last_mut() else {
            return Ok(());
        };
        let start = newest.raw.len();
        // read_to_end grows the buffer with the bytes that really arrive, so
        // a cut-off file never costs the declared length.
        let got = input.take(u64::from(len)).read_to_end(&mut newest.raw);
        let got = match got {
            Ok(got) => got,
            Err(e) => {
                newest.raw.truncate(start);
                return Err(ReadError::io(*offset, e));
            }
        };
        *offset += got as u64;
        let complete = got == len as usize && {
            let payload = newest.raw.get(start..).unwrap_or(&[]);
            match verify_trailer(input, offset, *trailers, kind, batch_offset, payload) {
                Ok(complete) => complete,
                Err(err) => {
                    newest.raw.truncate(start);
                    return Err(err);
                }
            }
        };
        if !complete {
            newest.raw.truncate(start);
            self.cut_at(batch_offset);
            return Ok(());
        }
        let ctx = BatchContext {
            kind,
            offset: batch_offset,
        };
        let payload = newest.raw.get(start..).unwrap_or(&[]);
        let mut c = Cursor::new(payload, batch_offset + BATCH_PREFIX_LEN as u64, ctx);
        let header = decode::batch_header(&mut c);
        let header = match header {
            Ok(header) if header.generation == newest.number && newest.end.is_none() => header,
            // Another generation's, or an error: as any other batch.
            _ => {
                let mut payload = std::mem::take(scratch);
                payload.clear();
                payload.extend_from_slice(newest.raw.get(start..).unwrap_or(&[]));
                newest.raw.truncate(start);
                let result = self.handle_batch(kind, batch_offset, &payload, None);
                self.scratch = payload;
                return result;
            }
        };
        let body_pos = c.pos();
        let body_len = c.remaining();
        let body_offset = c.offset_of(body_pos);
        // The batch record, its merge cursor and heap slot count too.
        let overhead = (std::mem::size_of::<EventBatch>() + 128) as u64;
        let charged = if body_len == 0 {
            Ok(false)
        } else {
            charge(newest, body_len as u64 + overhead, max, batch_offset).map(|()| true)
        };
        match charged {
            Ok(true) => {
                newest.batches.push(EventBatch {
                    kind,
                    thread: header.thread,
                    base_ticks: header.base_ticks,
                    range: start + body_pos..newest.raw.len(),
                    body_offset,
                    batch_offset,
                    inside: None,
                });
                Ok(())
            }
            // An empty body, or over the memory limit.
            other => {
                newest.raw.truncate(start);
                other.map(|_| ())
            }
        }
    }

    /// Handles the next batch inside the compressed batch being read.
    fn next_inner_batch(&mut self) -> Result<(), ReadError> {
        let Some((raw, at, batch_offset)) = self.inner.take() else {
            return Ok(());
        };
        let inner_error = |e: ReadError| e.inside_compressed(batch_offset);
        let (Some(&kind_byte), Some(len)) = (raw.get(at), raw.get(at + 1..at + BATCH_PREFIX_LEN))
        else {
            return Err(inner_error(ReadError::malformed(
                at as u64,
                "batch cut short",
            )));
        };
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let kind = match BatchKind::from_u8(kind_byte) {
            Some(BatchKind::Compressed | BatchKind::CompressedModeled) => {
                return Err(inner_error(ReadError::malformed(
                    at as u64,
                    "a compressed batch inside another",
                )))
            }
            Some(k) => k,
            None => {
                return Err(inner_error(ReadError::malformed(
                    at as u64,
                    format!("unknown batch kind {kind_byte}"),
                )))
            }
        };
        let start = at + BATCH_PREFIX_LEN;
        let Some(inner) = raw.get(start..start.saturating_add(len)) else {
            return Err(inner_error(ReadError::malformed(
                at as u64,
                format!("{} batch cut short", kind.name()),
            )));
        };
        self.handle_batch(kind, at as u64, inner, Some(batch_offset))
            .map_err(inner_error)?;
        let next = start + len;
        if kind == BatchKind::TraceEnd {
            if next < raw.len() {
                return Err(inner_error(ReadError::malformed(
                    next as u64,
                    "data after the trace-end batch",
                )));
            }
            // Offsets in the file from here: not mapped.
            return self.nothing_after_trace_end();
        }
        if next < raw.len() {
            self.inner = Some((raw, next, batch_offset));
        } else if let Some(unpacker) = &mut self.unpacker {
            unpacker.recycle(raw);
        }
        Ok(())
    }

    fn cut_at(&mut self, offset: u64) {
        self.input_done = true;
        self.truncated = Some(offset);
    }

    /// Handles one batch other than a compressed one. `inside` is the file
    /// offset of the compressed batch holding it, if any: then
    /// `batch_offset` and every offset found here count from the start of
    /// its decompressed data (the caller maps the errors; the merge maps
    /// those of an events batch's body, kept with it).
    fn handle_batch(
        &mut self,
        kind: BatchKind,
        batch_offset: u64,
        payload: &[u8],
        inside: Option<u64>,
    ) -> Result<(), ReadError> {
        let ctx = BatchContext {
            kind,
            offset: batch_offset,
        };
        let mut c = Cursor::new(payload, batch_offset + BATCH_PREFIX_LEN as u64, ctx);
        let header = decode::batch_header(&mut c)?;
        let number = header.generation;
        if kind == BatchKind::TraceEnd {
            self.trace_end(&c, batch_offset)?;
            // Inside a compressed batch, the caller looks for more data
            // once it knows the trace end is the last batch inside.
            return if inside.is_none() {
                self.nothing_after_trace_end()
            } else {
                Ok(())
            };
        }
        let idx = self.open_generation(number, batch_offset)?;
        let max = self.max_generation_bytes;
        let Some(gen) = self.open.get_mut(idx) else {
            return Ok(());
        };
        match kind {
            BatchKind::Events | BatchKind::CompactEvents | BatchKind::Pages => {
                let body_pos = c.pos();
                // An events body is checked as it is merged, each event
                // once (see Design); a pages body (page events are rare)
                // here, and again as it is merged.
                let empty = if kind != BatchKind::Pages {
                    c.remaining() == 0
                } else {
                    let state = PagesState::new(header.thread, header.base_ticks);
                    decode::validate_pages(&mut c, state)? == 0
                };
                if empty {
                    return Ok(());
                }
                let body = payload.get(body_pos..).unwrap_or(&[]);
                // The batch record, its merge cursor and heap slot count too.
                let overhead = (std::mem::size_of::<EventBatch>() + 128) as u64;
                charge(gen, body.len() as u64 + overhead, max, batch_offset)?;
                let start = gen.raw.len();
                gen.raw.extend_from_slice(body);
                gen.batches.push(EventBatch {
                    kind,
                    thread: header.thread,
                    base_ticks: header.base_ticks,
                    range: start..gen.raw.len(),
                    body_offset: c.offset_of(body_pos),
                    batch_offset,
                    inside,
                });
            }
            BatchKind::Info => {
                if gen.info.is_some() {
                    return Err(ReadError::malformed(
                        batch_offset,
                        format!("second info batch for generation {number}"),
                    ));
                }
                gen.info = Some(decode::info(&mut c, number)?);
            }
            BatchKind::Types => {
                let memory = decode::types(&mut c, &mut gen.types)?;
                charge(gen, memory, max, batch_offset)?;
            }
            BatchKind::GenerationEnd => {
                if gen.info.is_none() {
                    return Err(ReadError::malformed(
                        batch_offset,
                        format!(
                            "generation-end batch of generation {number}, which has no info batch"
                        ),
                    ));
                }
                gen.end = Some(decode::generation_end(&mut c, number)?);
            }
            // Handled before the generation was looked up.
            BatchKind::TraceEnd => {}
            // read_batch hands compressed batches to handle_compressed, which
            // refuses them nested.
            BatchKind::Compressed | BatchKind::CompressedModeled => {
                return Err(ReadError::malformed(
                    batch_offset,
                    "a compressed batch inside another",
                ));
            }
        }
        Ok(())
    }

    fn trace_end(&mut self, c: &Cursor<'_>, batch_offset: u64) -> Result<(), ReadError> {
        if c.remaining() > 0 {
            return Err(c.error_at(
                c.pos(),
                format_args!("{} bytes of body, expected none", c.remaining()),
            ));
        }
        if let Some(gen) = self.open.first() {
            return Err(ReadError::malformed(
                batch_offset,
                format!(
                    "trace-end batch while generation {} has no generation-end batch",
                    gen.number
                ),
            ));
        }
        Ok(())
    }

    /// Checks that nothing follows a trace-end batch in the file, not even
    /// a batch read ahead (after a compressed batch holding the trace
    /// end), and ends the input.
    fn nothing_after_trace_end(&mut self) -> Result<(), ReadError> {
        match self.ahead.pop_front() {
            None => {
                let mut probe = [0u8; 1];
                let n = read_full(&mut self.input, &mut probe)
                    .map_err(|e| ReadError::io(self.offset, e))?;
                if n > 0 {
                    return Err(ReadError::malformed(
                        self.offset,
                        "data after the trace-end batch",
                    ));
                }
            }
            Some(Frame::End { .. }) => {}
            // What the probe would have met.
            Some(Frame::Failed {
                err,
                nothing_read: true,
                ..
            }) => return Err(err),
            Some(frame) => {
                return Err(ReadError::malformed(
                    frame.offset(),
                    "data after the trace-end batch",
                ));
            }
        }
        self.input_done = true;
        Ok(())
    }

    /// The index in `open` of generation `number`, opening it if the format
    /// allows (FORMAT.md section 6).
    fn open_generation(&mut self, number: u64, batch_offset: u64) -> Result<usize, ReadError> {
        let malformed = |what: String| Err(ReadError::malformed(batch_offset, what));
        if let Some(i) = self.open.iter().position(|g| g.number == number) {
            if self.open[i].end.is_some() {
                return malformed(format!(
                    "batch of generation {number} after its generation-end batch"
                ));
            }
            return Ok(i);
        }
        if self.last_emitted.is_some_and(|last| number <= last) {
            return malformed(format!("batch of generation {number}, which already ended"));
        }
        let expected = match (self.open.last(), self.last_emitted) {
            (Some(newest), _) => newest.number.saturating_add(1),
            (None, Some(last)) => last.saturating_add(1),
            (None, None) => number,
        };
        if number != expected || self.open.len() >= 2 {
            return malformed(match self.open.first() {
                Some(oldest) if number > oldest.number => format!(
                    "batch of generation {number} before generation {} ended (at most two consecutive generations may be open)",
                    oldest.number
                ),
                Some(oldest) => format!(
                    "batch of generation {number} after generation {} started (generations must start in order)",
                    oldest.number
                ),
                None => format!(
                    "batch of generation {number} right after generation {} ended: generation {expected} is missing",
                    expected.saturating_sub(1)
                ),
            });
        }
        let mut gen = Generation::new(number);
        gen.raw = std::mem::take(&mut self.spare_raw);
        self.open.push(gen);
        Ok(self.open.len() - 1)
    }
}

/// A batch as read from the input, in file order, before its turn.
enum Frame {
    /// The input ended cleanly before a batch, at `offset`.
    End { offset: u64 },
    /// The input ended inside the batch at `offset`.
    Cut { offset: u64 },
    /// The batch at `offset` is malformed, or the input failed there
    /// (`nothing_read`: before its first byte).
    Failed {
        offset: u64,
        err: ReadError,
        nothing_read: bool,
    },
    /// A batch whose payload is still to be read.
    Batch {
        kind: BatchKind,
        offset: u64,
        len: u32,
    },
    /// A compressed batch queued in the unpacker as job `seq`.
    Unpacking { offset: u64, seq: u64 },
}

impl Frame {
    /// File offset of the frame's batch.
    fn offset(&self) -> u64 {
        match self {
            Frame::End { offset }
            | Frame::Cut { offset }
            | Frame::Failed { offset, .. }
            | Frame::Batch { offset, .. }
            | Frame::Unpacking { offset, .. } => *offset,
        }
    }
}

/// Counts `bytes` against the generation's memory budget.
fn charge(gen: &mut Generation, bytes: u64, max: u64, batch_offset: u64) -> Result<(), ReadError> {
    gen.memory = gen.memory.saturating_add(bytes);
    if gen.memory > max {
        return Err(ReadError::malformed(
            batch_offset,
            format!(
                "generation {} needs more than {max} bytes of memory before its generation-end batch (the reader's limit)",
                gen.number
            ),
        ));
    }
    Ok(())
}

/// In a file with trailers, reads the trailer after the batch at
/// `batch_offset` and checks it against the batch's bytes: `false` when the
/// input ends inside the trailer (the batch is cut), an error when it does
/// not match. Without trailers, `true`.
fn verify_trailer(
    input: &mut impl Read,
    offset: &mut u64,
    trailers: bool,
    kind: BatchKind,
    batch_offset: u64,
    payload: &[u8],
) -> Result<bool, ReadError> {
    if !trailers {
        return Ok(true);
    }
    let mut trailer = [0u8; TRAILER_LEN];
    let n = read_full(input, &mut trailer).map_err(|e| ReadError::io(*offset, e))?;
    *offset += n as u64;
    if n < TRAILER_LEN {
        return Ok(false);
    }
    let mut prefix = [0u8; BATCH_PREFIX_LEN];
    prefix[0] = kind as u8;
    prefix[1..].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    if u32::from_le_bytes(trailer) != batch_checksum(&[&prefix, payload]) {
        return Err(ReadError::malformed(
            batch_offset,
            format!(
                "checksum mismatch in the batch at byte offset {batch_offset} (kind {}, {} bytes): the file is damaged",
                kind as u8,
                BATCH_PREFIX_LEN + payload.len()
            ),
        ));
    }
    Ok(true)
}

/// Fills `buf` as far as the input allows; returns how much was read (less
/// than `buf.len()` only at the end of the input).
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k.min(buf.len() - n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
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
}
