//! The batch source: a trace file's bytes turned into batches, in file
//! order (FORMAT.md section 2). It checks the file header, reads each
//! batch's prefix and payload, verifies version-2 checksum trailers, hands
//! out the batches inside compressed ones (decompressed a few batches ahead
//! by the unpacker, src/unpack.rs), and keeps the offset and where the
//! input ended or was cut. It knows nothing of generations: the reader
//! decodes what it hands out.
//!
//! ## Invariants
//! 1. Batches come out in file order, those inside a compressed batch in
//!    their order inside it, as if each stood in the file: reading ahead
//!    (for the unpacker) never changes what comes out, nor which error
//!    comes first.
//! 2. Nothing is read into memory beyond a checked length: a payload
//!    length is checked against `MAX_BATCH_PAYLOAD` before its payload is
//!    read, and grows the buffer only with the bytes that really arrive.
//! 3. In a file with trailers, a batch's payload is handed out only once
//!    its trailer is read and matches.
//!
//! ## Corner cases
//! - The input ends inside a batch (or its trailer): the batch is not
//!   handed out, the input is done, and [`BatchSource::truncated`] names
//!   the batch's offset. It ends between batches without a trace-end
//!   batch: the same, at the file's length.
//! - A trace-end batch: the reader checks it, then calls
//!   [`BatchSource::after_trace_end`], which refuses any data after it
//!   (inside its compressed batch, read ahead, or still in the input).
//! - Once done, [`BatchSource::next`] hands out nothing more and changes
//!   nothing (the reader never asks, but a caller that did would not see
//!   a complete trace turn into a cut one).

use std::collections::VecDeque;
use std::io::{self, Read};

use alloctrace_format::{
    batch_checksum, has_trailers, BatchKind, FileHeader, HeaderError, BATCH_PREFIX_LEN,
    FILE_HEADER_LEN, MAGIC, MAX_BATCH_PAYLOAD, READABLE_VERSIONS, TRAILER_LEN,
};

use crate::unpack::Unpacker;
use crate::ReadError;

/// A batch as the source hands it out.
pub(crate) enum Batch<'a> {
    /// A batch in the file, other than a compressed one, whose payload is
    /// still to be read: with [`BatchSource::read_payload`], or
    /// [`BatchSource::append_payload`] where the caller wants it.
    InFile {
        kind: BatchKind,
        /// File offset of its kind byte.
        offset: u64,
        len: u32,
    },
    /// A batch inside the compressed batch at file offset `compressed`:
    /// `offset` counts from the start of the decompressed data, and so do
    /// the offsets of errors found in `payload` (the caller maps them with
    /// `ReadError::inside_compressed`).
    Inner {
        kind: BatchKind,
        offset: u64,
        payload: &'a [u8],
        compressed: u64,
    },
}

/// Reads batches from any [`Read`] (see the module docs).
pub(crate) struct BatchSource<R: Read> {
    input: R,
    /// Bytes consumed from the input so far.
    offset: u64,
    /// Whether every batch in the file is followed by a checksum trailer
    /// (version 2).
    trailers: bool,
    /// The file header's flags (FORMAT.md section 1).
    flags: u16,
    /// Payload of the batch handed out by `read_payload`; reused to avoid
    /// an allocation per batch.
    scratch: Vec<u8>,
    /// The compressed batch being read: its inner batches are handed out
    /// one per `next` call, as if they stood in the file.
    inner: Option<Inner>,
    /// The batches after the compressed batch being read, read from the
    /// input before their turn (at most `Unpacker::ahead()`): compressed
    /// ones are decompressed meanwhile. Only the last may be other than
    /// `Frame::Unpacking`.
    ahead: VecDeque<Frame>,
    /// Decompresses compressed batches on a thread of its own, started at
    /// the first compressed batch.
    unpacker: Option<Unpacker>,
    /// A trace-end batch or the end of the input was reached.
    done: bool,
    truncated: Option<u64>,
}

/// The decompressed data of the compressed batch being read.
struct Inner {
    raw: Vec<u8>,
    /// Position of its next inner batch.
    at: usize,
    /// The compressed batch's file offset.
    compressed: u64,
}

impl<R: Read> BatchSource<R> {
    /// Reads and checks the file header.
    pub fn new(mut input: R) -> Result<BatchSource<R>, ReadError> {
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
        let (trailers, flags) = match FileHeader::decode(&header) {
            Ok(h) => (has_trailers(h.version), h.flags),
            Err(HeaderError::BadMagic) => {
                return Err(ReadError::malformed(
                    0,
                    "not an alloctrace trace: bad magic",
                ));
            }
            Err(HeaderError::UnsupportedVersion(v)) => {
                let known: Vec<String> = READABLE_VERSIONS.iter().map(|v| v.to_string()).collect();
                let known = match known.split_last() {
                    Some((last, [])) => last.clone(),
                    Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
                    None => String::new(),
                };
                return Err(ReadError::malformed(
                    8,
                    format!(
                        "unsupported format version {v}: this reader reads versions {known} (a newer alloctrace wrote this trace?)"
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
        Ok(BatchSource {
            input,
            offset: FILE_HEADER_LEN as u64,
            trailers,
            flags,
            scratch: Vec::new(),
            inner: None,
            ahead: VecDeque::new(),
            unpacker: None,
            done: false,
            truncated: None,
        })
    }

    /// The file header's flags.
    pub fn flags(&self) -> u16 {
        self.flags
    }

    /// Bytes consumed from the input so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Whether a trace-end batch or the end of the input was reached:
    /// [`next`](Self::next) has nothing more.
    pub fn done(&self) -> bool {
        self.done
    }

    /// Where the input was cut (see the module docs), once it is done.
    pub fn truncated(&self) -> Option<u64> {
        self.truncated
    }

    /// The next batch, or `None` when the input has ended (cleanly or cut:
    /// the source is then done) or a trace-end batch was read.
    pub fn next(&mut self) -> Result<Option<Batch<'_>>, ReadError> {
        if self.done {
            return Ok(None);
        }
        if let Some(inner) = &self.inner {
            if inner.at < inner.raw.len() {
                return self.next_inner().map(Some);
            }
            if let (Some(inner), Some(unpacker)) = (self.inner.take(), &mut self.unpacker) {
                unpacker.recycle(inner.raw);
            }
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
                Ok(None)
            }
            Frame::Failed { err, .. } => Err(err),
            Frame::Batch { kind, offset, len } => Ok(Some(Batch::InFile { kind, offset, len })),
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
                self.inner = Some(Inner {
                    raw,
                    at: 0,
                    compressed: offset,
                });
                self.next_inner().map(Some)
            }
        }
    }

    /// Reads the payload of the [`Batch::InFile`] `kind` at `batch_offset`
    /// of `len` bytes, and checks its trailer; `None` when the input ends
    /// first (the source is then done, cut at the batch).
    pub fn read_payload(
        &mut self,
        kind: BatchKind,
        batch_offset: u64,
        len: u32,
    ) -> Result<Option<&[u8]>, ReadError> {
        let mut payload = std::mem::take(&mut self.scratch);
        payload.clear();
        let complete = self.append_payload(&mut payload, kind, batch_offset, len);
        self.scratch = payload;
        Ok(complete?.then_some(self.scratch.as_slice()))
    }

    /// [`read_payload`](Self::read_payload) at the end of `buf`: `false`
    /// when the input ends first (the source is then done, cut at the
    /// batch). On `false` or an error, `buf` is as it was.
    pub fn append_payload(
        &mut self,
        buf: &mut Vec<u8>,
        kind: BatchKind,
        batch_offset: u64,
        len: u32,
    ) -> Result<bool, ReadError> {
        let start = buf.len();
        // read_to_end grows the buffer with the bytes that really arrive, so
        // a cut-off file never costs the declared length.
        let got = (&mut self.input).take(u64::from(len)).read_to_end(buf);
        let complete = match got {
            Ok(got) => {
                self.offset += got as u64;
                got == len as usize && {
                    let payload = buf.get(start..).unwrap_or(&[]);
                    self.verify_trailer(kind, batch_offset, payload)
                        .inspect_err(|_| buf.truncate(start))?
                }
            }
            Err(e) => {
                buf.truncate(start);
                return Err(ReadError::io(self.offset, e));
            }
        };
        if !complete {
            buf.truncate(start);
            self.cut_at(batch_offset);
        }
        Ok(complete)
    }

    /// Checks that nothing follows a trace-end batch the caller was just
    /// handed and found good: not in its compressed batch, not in a batch
    /// read ahead, not in the input. The source is then done.
    pub fn after_trace_end(&mut self) -> Result<(), ReadError> {
        if let Some(inner) = self.inner.take() {
            if inner.at < inner.raw.len() {
                return Err(ReadError::malformed(
                    inner.at as u64,
                    "data after the trace-end batch",
                )
                .inside_compressed(inner.compressed));
            }
        }
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
        self.done = true;
        Ok(())
    }

    fn cut_at(&mut self, offset: u64) {
        self.done = true;
        self.truncated = Some(offset);
    }

    /// The next batch inside the compressed batch being read, which has
    /// one left.
    fn next_inner(&mut self) -> Result<Batch<'_>, ReadError> {
        let Some(Inner {
            raw,
            at,
            compressed,
        }) = &mut self.inner
        else {
            return Err(ReadError::malformed(
                self.offset,
                "internal error: no compressed batch under way",
            ));
        };
        let (batch_at, compressed) = (*at, *compressed);
        let inner_error = |e: ReadError| e.inside_compressed(compressed);
        let (Some(&kind_byte), Some(len)) = (
            raw.get(batch_at),
            raw.get(batch_at + 1..batch_at + BATCH_PREFIX_LEN),
        ) else {
            return Err(inner_error(ReadError::malformed(
                batch_at as u64,
                "batch cut short",
            )));
        };
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let kind = match BatchKind::from_u8(kind_byte) {
            Some(BatchKind::Compressed | BatchKind::CompressedModeled) => {
                return Err(inner_error(ReadError::malformed(
                    batch_at as u64,
                    "a compressed batch inside another",
                )))
            }
            Some(k) => k,
            None => {
                return Err(inner_error(ReadError::malformed(
                    batch_at as u64,
                    format!("unknown batch kind {kind_byte}"),
                )))
            }
        };
        let start = batch_at + BATCH_PREFIX_LEN;
        let end = start.saturating_add(len);
        let Some(payload) = raw.get(start..end) else {
            return Err(inner_error(ReadError::malformed(
                batch_at as u64,
                format!("{} batch cut short", kind.name()),
            )));
        };
        *at = end;
        Ok(Batch::Inner {
            kind,
            offset: batch_at as u64,
            payload,
            compressed,
        })
    }

    /// Reads the next batch's kind and payload length (FORMAT.md section
    /// 2), not its payload.
    fn read_frame(&mut self) -> Frame {
        let offset = self.offset;
        let mut prefix = [0u8; BATCH_PREFIX_LEN];
        // The first byte alone: an I/O error before it is the error a
        // trace-end batch's probe for more data would meet
        // (after_trace_end).
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
        payload.clear();
        let got = (&mut self.input)
            .take(u64::from(len))
            .read_to_end(&mut payload)
            .map_err(|e| ReadError::io(self.offset, e));
        let complete = got.and_then(|got| {
            self.offset += got as u64;
            if got == len as usize {
                self.verify_trailer(kind, offset, &payload)
            } else {
                Ok(false)
            }
        });
        match complete {
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

    /// In a file with trailers, reads the trailer after the batch at
    /// `batch_offset` and checks it against the batch's bytes: `false`
    /// when the input ends inside the trailer (the batch is cut), an error
    /// when it does not match. Without trailers, `true`.
    fn verify_trailer(
        &mut self,
        kind: BatchKind,
        batch_offset: u64,
        payload: &[u8],
    ) -> Result<bool, ReadError> {
        if !self.trailers {
            return Ok(true);
        }
        let mut trailer = [0u8; TRAILER_LEN];
        let n =
            read_full(&mut self.input, &mut trailer).map_err(|e| ReadError::io(self.offset, e))?;
        self.offset += n as u64;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{info, varint, EventsBody, TraceBuilder};
    use crate::EventData;

    /// What a batch handed out says: kind, offset, payload length, and the
    /// compressed batch holding it.
    type Seen = (BatchKind, u64, usize, Option<u64>);

    /// Every batch `source` hands out, payloads read; the error that ended
    /// the reading, if any.
    fn drain(source: &mut BatchSource<&[u8]>) -> (Vec<Seen>, Option<ReadError>) {
        let mut seen = Vec::new();
        loop {
            let (kind, offset, len) = match source.next() {
                Ok(None) => return (seen, None),
                Err(err) => return (seen, Some(err)),
                Ok(Some(Batch::Inner {
                    kind,
                    offset,
                    payload,
                    compressed,
                })) => {
                    seen.push((kind, offset, payload.len(), Some(compressed)));
                    if kind == BatchKind::TraceEnd {
                        if let Err(err) = source.after_trace_end() {
                            return (seen, Some(err));
                        }
                    }
                    continue;
                }
                Ok(Some(Batch::InFile { kind, offset, len })) => (kind, offset, len),
            };
            match source.read_payload(kind, offset, len) {
                Ok(Some(payload)) => seen.push((kind, offset, payload.len(), None)),
                Ok(None) => {}
                Err(err) => return (seen, Some(err)),
            }
            if kind == BatchKind::TraceEnd {
                if let Err(err) = source.after_trace_end() {
                    return (seen, Some(err));
                }
            }
        }
    }

    /// An info batch in the file, then a compressed batch holding an
    /// events batch, the generation end and the trace end; and the inner
    /// batches' bytes.
    fn trace() -> (Vec<u8>, Vec<u8>) {
        let mut inner = TraceBuilder::v1();
        let mut body = EventsBody::new(1000);
        body.event(&info(1), 1001, 0x10010, &EventData::HeapObjectFree);
        inner
            .events(1, 1, &body)
            .generation_end(1, 2000, 5_001_000, 0)
            .trace_end(1);
        let inner = inner.bytes()[FILE_HEADER_LEN..].to_vec();
        let mut payload = Vec::new();
        varint(&mut payload, inner.len() as u64);
        payload.extend(zstd::bulk::compress(&inner, 1).unwrap());
        let mut compressed = vec![BatchKind::Compressed as u8];
        compressed.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        compressed.extend_from_slice(&payload);
        let mut t = TraceBuilder::new();
        t.info(&info(1)).raw_batch(&compressed);
        (t.finish(), inner)
    }

    #[test]
    #[cfg_attr(miri, ignore = "zstd is C, which Miri cannot run")]
    fn batches_come_out_in_file_order_those_inside_compressed_ones_too() {
        let (bytes, inner) = trace();
        let mut source = BatchSource::new(bytes.as_slice()).unwrap();
        let (seen, err) = drain(&mut source);
        assert!(err.is_none(), "{err:?}");
        let compressed = seen[0].1 + (BATCH_PREFIX_LEN + seen[0].2 + TRAILER_LEN) as u64;
        let kinds: Vec<(BatchKind, Option<u64>)> = seen.iter().map(|s| (s.0, s.3)).collect();
        assert_eq!(
            kinds,
            [
                (BatchKind::Info, None),
                (BatchKind::Events, Some(compressed)),
                (BatchKind::GenerationEnd, Some(compressed)),
                (BatchKind::TraceEnd, Some(compressed)),
            ]
        );
        assert_eq!(seen[0].1, FILE_HEADER_LEN as u64);
        // Inner offsets count from the start of the decompressed data.
        assert_eq!(seen[1].1, 0);
        let inner_end = seen[3].1 as usize + BATCH_PREFIX_LEN + seen[3].2;
        assert_eq!(inner_end, inner.len());
        assert!(source.done());
        assert_eq!(source.truncated(), None);
        assert_eq!(source.offset(), bytes.len() as u64);
    }

    #[test]
    #[cfg_attr(miri, ignore = "zstd is C, which Miri cannot run")]
    fn a_cut_trailer_cuts_its_batch_and_data_after_the_trace_end_is_refused() {
        let (bytes, _) = trace();
        // Cut inside the compressed batch's trailer: only the info batch.
        let cut = &bytes[..bytes.len() - 1];
        let mut source = BatchSource::new(cut).unwrap();
        let (seen, err) = drain(&mut source);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(seen.len(), 1);
        assert!(source.done());
        let compressed = FILE_HEADER_LEN + BATCH_PREFIX_LEN + seen[0].2 + TRAILER_LEN;
        assert_eq!(source.truncated(), Some(compressed as u64));
        // A byte after the trace end (here after the compressed batch that
        // holds it): refused at that byte, after every batch before it.
        let mut longer = bytes.clone();
        longer.push(0);
        let mut source = BatchSource::new(longer.as_slice()).unwrap();
        let (seen, err) = drain(&mut source);
        assert_eq!(seen.len(), 4);
        let err = err.expect("data after the trace end");
        assert_eq!(err.offset(), bytes.len() as u64, "{err}");
        assert!(
            err.what().contains("data after the trace-end batch"),
            "{err}"
        );
    }
}
