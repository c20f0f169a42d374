//! Decompressing compressed batches (FORMAT.md sections 2.1 and 2.2), on
//! a background thread ahead of the reader.
//!
//! ## Design
//! The reader reads compressed batches' payloads a few batches ahead
//! ([`UNPACK_AHEAD`]) and queues them here, in file order. One thread,
//! started at the first compressed batch, takes the oldest queued job and
//! decompresses it (zstd, then for kind 9 the model's inverse), so that
//! this work runs while the reader merges and hands out events. When the
//! reader needs a batch that is not done yet, it does not just wait: it
//! takes the oldest job nobody has started (its own, or one after it) and
//! runs it itself, so while the reader has nothing else to do both threads
//! decompress.
//!
//! ## Invariants
//! 1. A job's result MUST be handed to the reader only when it asks for
//!    that job, in file order. Otherwise an error found ahead would be
//!    reported before the batches in front of it were read.
//! 2. At most [`UNPACK_AHEAD`] jobs MUST be queued or done and not yet
//!    asked for. Otherwise memory would not stay bounded (about a
//!    compressed payload plus a decompressed batch per job).
//! 3. A job's result MUST depend only on its payload, kind and offset
//!    (each kind-9 batch decodes on its own). Otherwise a result would
//!    depend on which thread ran it.
//!
//! ## Corner cases
//! - No thread can be spawned: nothing is read ahead and every job runs on
//!   the reader's thread when asked for, as if there were no pipeline.
//! - A panic while decompressing (there should be none) on the thread is
//!   caught and raised again on the reader's thread when it asks for that
//!   job, as it would have been without the thread.
//! - The reader is dropped with jobs under way: the thread finishes the job
//!   it runs, drops the rest and exits; the drop waits for it.

use std::any::Any;
use std::collections::VecDeque;
use std::io::Read;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use alloctrace_format::compression_model::{self, Decoder};
use alloctrace_format::{BatchKind, BATCH_PREFIX_LEN, MAX_DECOMPRESSED_LEN};

use crate::ReadError;

/// How many compressed batches the reader reads and queues ahead of the
/// one it is reading (when the thread runs): each is about 1 MiB once
/// decompressed (at most `MAX_DECOMPRESSED_LEN`).
pub(crate) const UNPACK_AHEAD: usize = 2;

/// What one thread needs to decompress: the model's inverse (about
/// 0.7 MiB, made at the first compressed-modeled batch) and the buffer of
/// the modeled stream.
#[derive(Default)]
struct Scratch {
    model: Option<Box<Decoder>>,
    modeled: Vec<u8>,
}

/// A compressed batch to decompress into `out`.
struct Job {
    /// Its place in file order among the compressed batches.
    seq: u64,
    kind: BatchKind,
    /// The file offset of its kind byte.
    offset: u64,
    payload: Vec<u8>,
    out: Vec<u8>,
}

/// A job done: its payload buffer back, and the decompressed data or the
/// error (or the panic).
struct Done {
    seq: u64,
    payload: Vec<u8>,
    result: Result<Result<Vec<u8>, ReadError>, Box<dyn Any + Send>>,
}

/// What the reader and the thread share, under one lock.
#[derive(Default)]
struct State {
    /// Jobs not started, oldest first. Pushed by the reader; popped by
    /// the thread or by the reader (see `Unpacker::wait`).
    queue: VecDeque<Job>,
    /// Jobs done by the thread, not yet asked for. Pushed by the thread,
    /// removed by the reader.
    done: Vec<Done>,
    /// Set by the reader when it goes away; the thread then exits.
    closed: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when a job is queued, or the reader goes away.
    queued: Condvar,
    /// Signalled when the thread finishes a job.
    finished: Condvar,
}

impl Shared {
    /// The state; never poisoned in practice (no code panics while holding
    /// the lock), and if it were the state is still consistent: every
    /// change under the lock is a single push or pop.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The reader's end of the pipeline.
pub(crate) struct Unpacker {
    shared: Arc<Shared>,
    /// The thread, if it could be spawned; joined when the reader goes
    /// away, so that it never outlives the reader.
    thread: Option<JoinHandle<()>>,
    next_seq: u64,
    /// For the jobs the reader runs itself.
    scratch: Scratch,
    /// Emptied buffers, for the next jobs' payloads and output.
    payloads: Vec<Vec<u8>>,
    outs: Vec<Vec<u8>>,
}

impl Unpacker {
    /// Starts the thread (or, if it cannot be spawned, an unpacker that
    /// runs every job on the reader's thread).
    pub fn start() -> Unpacker {
        Unpacker::new(true)
    }

    /// With the thread when `spawn` (and it can be spawned), else without.
    fn new(spawn: bool) -> Unpacker {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            queued: Condvar::new(),
            finished: Condvar::new(),
        });
        let theirs = Arc::clone(&shared);
        let thread = spawn
            .then(|| {
                std::thread::Builder::new()
                    .name("alloctrace-unpack".into())
                    .spawn(move || work(&theirs))
                    .ok()
            })
            .flatten();
        Unpacker {
            shared,
            thread,
            next_seq: 0,
            scratch: Scratch::default(),
            payloads: Vec::new(),
            outs: Vec::new(),
        }
    }

    /// How many compressed batches to queue ahead of the one being read:
    /// none without a thread.
    pub fn ahead(&self) -> usize {
        if self.thread.is_some() {
            UNPACK_AHEAD
        } else {
            0
        }
    }

    /// An emptied buffer for the next payload.
    pub fn payload_buffer(&mut self) -> Vec<u8> {
        self.payloads.pop().unwrap_or_default()
    }

    /// Takes back a decompressed batch's buffer once its batches are read.
    pub fn recycle(&mut self, mut out: Vec<u8>) {
        out.clear();
        if self.outs.len() <= UNPACK_AHEAD {
            self.outs.push(out);
        }
    }

    /// Queues the compressed batch of `kind` at file offset `offset`;
    /// returns its number for [`wait`](Self::wait).
    pub fn submit(&mut self, kind: BatchKind, offset: u64, payload: Vec<u8>) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        let out = self.outs.pop().unwrap_or_default();
        let job = Job {
            seq,
            kind,
            offset,
            payload,
            out,
        };
        self.shared.lock().queue.push_back(job);
        self.shared.queued.notify_one();
        seq
    }

    /// The decompressed data of job `seq` (its batches, FORMAT.md section
    /// 2.1), or the error the batch has. Until it is done, runs the oldest
    /// job not started, here.
    pub fn wait(&mut self, seq: u64) -> Result<Vec<u8>, ReadError> {
        let shared = Arc::clone(&self.shared);
        let done = loop {
            let mut state = shared.lock();
            if let Some(i) = state.done.iter().position(|d| d.seq == seq) {
                break state.done.swap_remove(i);
            }
            // Without the thread, always job `seq` itself.
            if let Some(job) = state.queue.pop_front() {
                drop(state);
                let done = run(job, &mut self.scratch);
                if done.seq == seq {
                    break done;
                }
                shared.lock().done.push(done);
                continue;
            }
            // Job `seq` was submitted, so it is under way on the thread,
            // which notifies when it is done.
            drop(
                shared
                    .finished
                    .wait(state)
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
            );
        };
        self.payloads.push(done.payload);
        match done.result {
            Ok(result) => result,
            Err(panic) => panic::resume_unwind(panic),
        }
    }
}

impl Drop for Unpacker {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.closed = true;
        state.queue.clear();
        drop(state);
        self.shared.queued.notify_all();
        // It finishes the job it runs, if any, and exits.
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The thread: runs the oldest queued job until the reader goes away.
fn work(shared: &Shared) {
    let mut scratch = Scratch::default();
    loop {
        let job = {
            let mut state = shared.lock();
            loop {
                if state.closed {
                    return;
                }
                if let Some(job) = state.queue.pop_front() {
                    break job;
                }
                state = shared
                    .queued
                    .wait(state)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
        };
        let done = run(job, &mut scratch);
        shared.lock().done.push(done);
        shared.finished.notify_one();
    }
}

/// Runs one job, catching a panic so that the reader's thread raises it.
fn run(job: Job, scratch: &mut Scratch) -> Done {
    let Job {
        seq,
        kind,
        offset,
        payload,
        out,
    } = job;
    let result = panic::catch_unwind(AssertUnwindSafe(|| {
        unpack(kind, offset, &payload, out, scratch)
    }));
    if result.is_err() {
        // The model may be half way through a batch: start afresh.
        *scratch = Scratch::default();
    }
    Done {
        seq,
        payload,
        result,
    }
}

/// Decompresses a compressed batch (FORMAT.md section 2.1), or turns a
/// compressed-modeled one's stream back into batches (section 2.2), into
/// `out`: exactly its `raw_len` bytes, or the error, at a file offset.
fn unpack(
    kind: BatchKind,
    batch_offset: u64,
    payload: &[u8],
    mut out: Vec<u8>,
    scratch: &mut Scratch,
) -> Result<Vec<u8>, ReadError> {
    let name = kind.name();
    let modeled = kind == BatchKind::CompressedModeled;
    let at_payload = batch_offset + BATCH_PREFIX_LEN as u64;
    let mut pos = 0;
    let raw_len = alloctrace_format::get_uvarint(payload, &mut pos).map_err(|_| {
        ReadError::malformed(
            at_payload,
            format!("{name} batch: its raw_len varint is truncated or overflows"),
        )
    })?;
    if raw_len > MAX_DECOMPRESSED_LEN {
        return Err(ReadError::malformed(
            at_payload,
            format!("{name} batch declares {raw_len} decompressed bytes, above the limit of {MAX_DECOMPRESSED_LEN}"),
        ));
    }
    // What the frame may hold: the batches, or their modeled stream.
    let frame_limit = if modeled {
        compression_model::max_modeled_len(raw_len)
    } else {
        raw_len
    };
    let frame = payload.get(pos..).unwrap_or(&[]);
    let does_not_decompress = |e: &dyn std::fmt::Display| {
        ReadError::malformed(
            at_payload + pos as u64,
            format!("{name} batch does not decompress: {e}"),
        )
    };
    // Streamed, so memory grows with the bytes that really come out,
    // never with the declared raw_len (a few bytes can declare 64 MiB):
    // room for what a frame of this size commonly holds is made ahead.
    let data = if modeled {
        &mut scratch.modeled
    } else {
        &mut out
    };
    data.clear();
    data.reserve(
        (frame_limit as usize).min(frame.len().saturating_mul(16).saturating_add(1 << 16)),
    );
    // The window a frame declares is allocated before anything comes out:
    // capped (alloctrace_format::MAX_WINDOW_LOG), so a few bytes cannot ask
    // for gigabytes.
    zstd::stream::read::Decoder::with_buffer(frame)
        .and_then(|mut decoder| {
            decoder.window_log_max(alloctrace_format::MAX_WINDOW_LOG)?;
            decoder
                .take(frame_limit.saturating_add(1))
                .read_to_end(data)
        })
        .map_err(|e| does_not_decompress(&e))?;
    if data.len() as u64 > frame_limit {
        return Err(does_not_decompress(&format_args!(
            "it holds more than the {frame_limit} bytes {} {raw_len} raw bytes may take",
            if modeled {
                "the modeled stream of"
            } else {
                "its"
            }
        )));
    }
    if modeled {
        let data = &scratch.modeled;
        out.clear();
        out.reserve((raw_len as usize).min(data.len().saturating_mul(4).saturating_add(1 << 16)));
        let decoder = scratch.model.get_or_insert_with(Default::default);
        decoder.decode(data, raw_len, &mut out).map_err(|e| {
            ReadError::malformed(
                batch_offset,
                format!(
                    "{name} batch: at byte {} of its modeled stream: {}",
                    e.at, e.what
                ),
            )
        })?;
    }
    if out.len() as u64 != raw_len {
        return Err(ReadError::malformed(
            at_payload,
            format!(
                "{name} batch decompresses to {} bytes, not the {raw_len} it declares",
                out.len()
            ),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compressed batches of kind 8, one in `broken` not a zstd frame.
    fn jobs(broken: usize) -> Vec<(u64, Vec<u8>, Vec<u8>)> {
        (0..6u8)
            .map(|i| {
                let raw = vec![i; 1000 + usize::from(i)];
                let mut payload = Vec::new();
                crate::testing::varint(&mut payload, raw.len() as u64);
                if usize::from(i) == broken {
                    payload.extend_from_slice(b"not zstd");
                } else {
                    payload.extend(zstd::bulk::compress(&raw, 1).unwrap());
                }
                (100 * u64::from(i), payload, raw)
            })
            .collect()
    }

    /// With the thread or without, queued ahead or not, each job's result
    /// comes out when asked for, in order, the error at its batch.
    #[test]
    #[cfg_attr(miri, ignore = "zstd is C, which Miri cannot run")]
    fn results_come_out_in_order_with_or_without_the_thread() {
        for threaded in [true, false] {
            let mut unpacker = Unpacker::new(threaded);
            let jobs = jobs(4);
            let mut seqs = Vec::new();
            for (offset, payload, _) in &jobs {
                seqs.push(unpacker.submit(BatchKind::Compressed, *offset, payload.clone()));
            }
            for ((offset, _, raw), seq) in jobs.iter().zip(seqs) {
                match unpacker.wait(seq) {
                    Ok(out) => {
                        assert_eq!(&out, raw);
                        unpacker.recycle(out);
                    }
                    Err(err) => {
                        assert_eq!(*offset, 400);
                        // At the frame, after the prefix and raw_len.
                        assert_eq!(err.offset(), 407, "{err}");
                        assert!(err.to_string().contains("does not decompress"), "{err}");
                    }
                }
            }
            assert_eq!(unpacker.ahead(), if threaded { UNPACK_AHEAD } else { 0 });
        }
    }
}
