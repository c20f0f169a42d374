//! The generations being read: each batch the source hands out is checked
//! and filed under its generation (FORMAT.md section 6), until a
//! generation is complete and the reader hands its events out.

use std::collections::VecDeque;

use alloctrace_format::{BatchKind, BATCH_PREFIX_LEN};

use crate::decode::{self, BatchContext, Cursor, PagesState};
use crate::generation::{EventBatch, Generation};
use crate::ReadError;

/// Generations with batches read but not yet handed out.
pub(crate) struct OpenGenerations {
    /// Oldest first; at most two. Only the oldest can be without a
    /// generation-end batch when the newest has one.
    open: VecDeque<Generation>,
    /// The newest generation handed out (or dropped at a cut).
    last_emitted: Option<u64>,
    /// Cap on the memory one open generation may hold.
    max_bytes: u64,
    /// The emptied raw buffer of the last generation handed out, for the
    /// next generation to open: its pages are not faulted in and zeroed
    /// again. Kept only while no generation is open (else that generation
    /// takes it over, see `take_back`), so no more raw buffers exist at
    /// once than without it.
    spare_raw: Vec<u8>,
    /// An events batch read into the newest generation that belongs
    /// elsewhere is moved here to be handled as any other batch; reused.
    moved: Vec<u8>,
}

impl OpenGenerations {
    pub fn new(max_bytes: u64) -> OpenGenerations {
        OpenGenerations {
            open: VecDeque::new(),
            last_emitted: None,
            max_bytes,
            spare_raw: Vec::new(),
            moved: Vec::new(),
        }
    }

    pub fn set_max_bytes(&mut self, max: u64) {
        self.max_bytes = max;
    }

    /// The oldest open generation, once it is complete (or `input_done`:
    /// the input has ended, and it never will be): it is no longer open.
    pub fn pop_ready(&mut self, input_done: bool) -> Option<Generation> {
        let ready = self
            .open
            .front()
            .is_some_and(|g| g.end.is_some() || input_done);
        if !ready {
            return None;
        }
        let gen = self.open.pop_front()?;
        self.last_emitted = Some(gen.number);
        Some(gen)
    }

    /// Takes back the emptied raw buffer of a generation handed out.
    pub fn take_back(&mut self, mut raw: Vec<u8>) {
        match self.open.front_mut() {
            // The next generation is being read already: it moves into the
            // larger buffer, and the smaller one is freed.
            Some(next) if raw.capacity() > next.raw.capacity() => {
                raw.extend_from_slice(&next.raw);
                std::mem::swap(&mut next.raw, &mut raw);
            }
            Some(_) => {}
            None if raw.capacity() >= self.spare_raw.capacity() => self.spare_raw = raw,
            None => {}
        }
    }

    /// The raw bytes of the newest open generation, where an events batch
    /// read from the file goes without a copy (then
    /// [`events_appended`](Self::events_appended)).
    pub fn newest_raw(&mut self) -> Option<&mut Vec<u8>> {
        self.open.back_mut().map(|g| &mut g.raw)
    }

    /// Files the events batch of `kind` at file offset `batch_offset`
    /// whose payload was appended to [`newest_raw`](Self::newest_raw) at
    /// `start`, where its body stays (its header too, unused, before it):
    /// the common case, without a copy. A batch of another generation is
    /// moved out and handled as any other; the checks and their errors are
    /// those of `handle_batch`.
    pub fn events_appended(
        &mut self,
        kind: BatchKind,
        batch_offset: u64,
        start: usize,
    ) -> Result<(), ReadError> {
        let max = self.max_bytes;
        let Some(newest) = self.open.back_mut() else {
            return Ok(());
        };
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
                let mut payload = std::mem::take(&mut self.moved);
                payload.clear();
                payload.extend_from_slice(newest.raw.get(start..).unwrap_or(&[]));
                newest.raw.truncate(start);
                let result = self.handle_batch(kind, batch_offset, &payload, None);
                self.moved = payload;
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

    /// Checks one batch other than a compressed one and files it under its
    /// generation. `inside` is the file offset of the compressed batch
    /// holding it, if any: then `batch_offset` and every offset found here
    /// count from the start of its decompressed data (the caller maps the
    /// errors; the merge maps those of an events batch's body, kept with
    /// it). A trace-end batch is checked here; the caller then makes sure
    /// nothing follows it.
    pub fn handle_batch(
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
            return self.trace_end(&c, batch_offset);
        }
        let idx = self.open_generation(number, batch_offset)?;
        let max = self.max_bytes;
        let Some(gen) = self.open.get_mut(idx) else {
            return Ok(());
        };
        match kind {
            BatchKind::Events | BatchKind::CompactEvents | BatchKind::Pages => {
                let body_pos = c.pos();
                // An events body is checked as it is merged, each event
                // once (see lib.rs, Design); a pages body (page events are
                // rare) here, and again as it is merged.
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
            BatchKind::Process => {
                if gen.process.is_some() {
                    return Err(ReadError::malformed(
                        batch_offset,
                        format!("second process batch for generation {number}"),
                    ));
                }
                let (process, memory) = decode::process(&mut c)?;
                charge(gen, memory, max, batch_offset)?;
                gen.process = Some(process);
            }
            BatchKind::Modules => {
                let memory = gen.stacks.read_modules(&mut c)?;
                charge(gen, memory, max, batch_offset)?;
            }
            BatchKind::Frames => {
                let memory = gen.stacks.read_frames(&mut c)?;
                charge(gen, memory, max, batch_offset)?;
            }
            BatchKind::CallStacks => {
                let memory = gen.stacks.read_call_stacks(&mut c)?;
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
            // The source hands out the batches inside compressed batches,
            // and refuses them nested.
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
        if let Some(gen) = self.open.front() {
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
        let expected = match (self.open.back(), self.last_emitted) {
            (Some(newest), _) => newest.number.saturating_add(1),
            (None, Some(last)) => last.saturating_add(1),
            (None, None) => number,
        };
        if number != expected || self.open.len() >= 2 {
            return malformed(match self.open.front() {
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
        self.open.push_back(gen);
        Ok(self.open.len() - 1)
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
