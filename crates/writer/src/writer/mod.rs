//! The writer thread: drains the session's queue of full buffers into the
//! output (output.rs) in queue order, compressing them when the session
//! asks (FORMAT.md section 2.2), and gives the buffers back to the pool.
//!
//! It is below the session layer and never imports it: what it needs of a
//! session is passed down ([`WriterHost`], implemented by session/mod.rs), and
//! its part of the session ([`Writer`]) is defined here. Before each batch
//! it writes the stack-table entries the batch's generation has come to
//! use (tables.rs), so the file never holds a stack ID before its
//! definition. It allocates nothing per batch (the compression state and
//! the listing's buffers are made before it is ready; a listing's buffers
//! grow only past their first size, and a module-table refresh allocates,
//! on this thread, outside every event); it blocks every signal (thread.rs
//! `spawn_internal`).
//!
//! In flight-recorder mode (flight.rs) the batches go to the session's
//! ring instead of the output, and the output gets only dumps, which this
//! thread writes itself: once the RSS crosses the threshold (read here,
//! at most every 20 ms, never on the event path) and the generation it
//! fired in has ended, and at a fatal signal's stop.

pub(crate) mod flight;
pub(crate) mod late;
pub(crate) mod live;
pub(crate) mod output;
pub(crate) mod snapshot;

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::buffer::BufferPool;
use crate::stacks::tables::Tables;
use crate::thread::{spawn_ready, InternalThread, ThreadSignals};
use crate::writer::flight::FlightRecorder;
use crate::writer::late::EndBatch;
use crate::writer::live::LiveTable;
use crate::writer::output::Output;
use crate::writer::snapshot::SnapshotSignals;

/// How long the writer sleeps when the queue is empty. Producers never wait
/// for it unless the memory bound is reached, and then they wake it.
const IDLE_SLEEP: Duration = Duration::from_millis(1);

/// The writer thread's part of a session: the output it writes to, and
/// what it and the session's other threads tell each other.
pub(crate) struct Writer {
    pub(crate) output: Output,
    /// Whether the writer thread compresses batches.
    pub(crate) compress: bool,
    /// Set by stop once every batch is queued; the writer drains and exits.
    pub(crate) stopping: AtomicBool,
    /// Set while the writer thread sleeps, so a waiting producer wakes it.
    pub(crate) sleeping: AtomicBool,
    /// First write error (errno), 0 if none.
    pub(crate) io_error: AtomicI32,
    /// The last generation whose end batch the writer thread has passed
    /// (written, or discarded after an error): a generation's parity may
    /// be reused once it has (lifecycle.rs, tables.rs).
    pub(crate) ended: AtomicU64,
    /// The writer thread, once it is ready; done when it has written
    /// everything and returns (a fatal-signal flush waits for that instead
    /// of joining: crash.rs).
    pub(crate) thread: ThreadSignals,
    /// Set by a stop at exit before the last generation ends: the writer
    /// thread writes each generation-end batch outside any compressed
    /// batch and keeps the last one in `end_batch` (late.rs).
    pub(crate) raw_end: AtomicBool,
    /// The last generation-end batch written while `raw_end` was set, and
    /// its offset. Written by the writer thread; read by the stop once the
    /// writer thread is done.
    pub(crate) end_batch: Mutex<Option<EndBatch>>,
    /// In flight-recorder mode, the ring the writer thread keeps batches
    /// in instead of writing them (flight.rs); `None`: batches go to the
    /// output.
    pub(crate) flight: Option<FlightRecorder>,
    /// The live table's snapshots (live.rs, snapshot.rs): asked by the
    /// control thread or `trace_snapshot_write`, written by this thread.
    pub(crate) snapshot: SnapshotSignals,
}

impl Writer {
    pub(crate) fn new(output: Output, compress: bool) -> Writer {
        Writer {
            output,
            compress,
            stopping: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            io_error: AtomicI32::new(0),
            ended: AtomicU64::new(0),
            thread: ThreadSignals::new(),
            raw_end: AtomicBool::new(false),
            end_batch: Mutex::new(None),
            flight: None,
            // Sampling's state is set up before the writer (lifecycle.rs).
            snapshot: SnapshotSignals::new(live::wanted(
                crate::sampling::SAMPLE_BYTES.load(Ordering::Relaxed) != 0,
            )),
        }
    }

    /// A writer in flight-recorder mode: batches go to `flight`, and the
    /// output gets only dumps (no compression: a dump is written as the
    /// ring holds it).
    pub(crate) fn flight_recorder(output: Output, flight: FlightRecorder) -> Writer {
        Writer {
            flight: Some(flight),
            snapshot: SnapshotSignals::new(false),
            ..Writer::new(output, false)
        }
    }

    /// Writer thread: writes the flight recorder's ring to the output, as
    /// the output's whole content (a later dump rewrites a regular file
    /// from its start; on a pipe it follows the earlier one).
    fn dump_to_output(&self) {
        let Some(flight) = &self.flight else {
            return;
        };
        if self.io_error.load(Ordering::Relaxed) != 0 {
            return;
        }
        if flight.output_dumps.fetch_add(1, Ordering::Relaxed) > 0 {
            self.output.rewind();
        }
        if let Err(e) = flight.dump(&self.output) {
            self.io_error.store(e, Ordering::Relaxed);
        }
    }

    /// Wakes the writer thread if it sleeps. A syscall: call only when a
    /// producer has to wait for a buffer.
    pub(crate) fn wake(&self) {
        if self.sleeping.load(Ordering::Relaxed) {
            self.thread.wake();
        }
    }

    /// Tells the writer thread to write what is queued and return, once
    /// every batch of the session is queued.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        self.thread.wake();
    }
}

/// What the writer thread needs of its session, implemented by the session
/// layer (which is above this module, so it is passed down, not imported).
pub(crate) trait WriterHost: Send + Sync + 'static {
    /// The writer's part of the session.
    fn writer(&self) -> &Writer;
    /// The buffers: full ones to write, free ones to give back.
    fn pool(&self) -> &BufferPool;
    /// Called after each batch written (or discarded after an error) with
    /// its length. Runs on the writer thread: must not allocate.
    fn count_written(&self, n: usize);
    /// Whether the session lists modules (it captures native stacks, or a
    /// caller interned a stack).
    fn lists_modules(&self) -> bool {
        false
    }
    /// The ticks generation `generation` started and (once it has) ended
    /// at.
    fn generation_span(&self, _generation: u64) -> (u64, Option<u64>) {
        (0, None)
    }
    /// Called when the writer has passed the end of `generation`, before
    /// it publishes that in [`Writer::ended`].
    fn generation_written(&self, _generation: u64) {}
    /// Called each time round the writer thread's loop, before it writes
    /// what is queued: work of the session's that must not run on the event
    /// path (it may allocate or take the loader's lock; no producer waits
    /// for it).
    fn idle(&self) {}
    /// Asks for the current generation to end soon (the advancer's work:
    /// the writer thread must never wait for an advance).
    fn want_advance(&self) {}
}

/// Starts the writer thread of a session and returns once it is ready
/// ([`spawn_ready`]). Called while tracing is still off: all the
/// compression state is allocated before the thread is ready.
pub(crate) fn spawn_writer<H: WriterHost>(session: &Arc<H>) -> std::io::Result<InternalThread> {
    spawn_ready(
        c"alloctrace-writer",
        session,
        |s| &s.writer().thread,
        |s| {
            let compression = if s.writer().compress {
                Compression::new()
            } else {
                None
            };
            s.writer().output.make_private();
            (compression, Tables::new())
        },
        |s, (compression, tables)| run_writer(s, compression, tables),
    )
}

/// Batches gathered for one compressed batch before it is written.
const COMPRESS_CHUNK: usize = 1 << 20;

/// How far behind the writer may fall while it compresses: with more than
/// this many bytes of full buffers waiting, it writes batches as they are
/// until it has caught up. Compression thus never makes producers wait for
/// buffers (the memory bound stays for the disk's speed alone), and
/// `trace_stop` waits for at most this much compression; the trace grows
/// only for the batches written while catching up (both kinds of batch mix
/// freely in a trace).
const COMPRESS_BACKLOG: usize = 8 << 20;

/// Whether the writer compresses the next batch, with `waiting` bytes of
/// full buffers queued behind it.
fn compress_next(waiting: usize) -> bool {
    waiting <= COMPRESS_BACKLOG
}

/// The zstd level of modeled batches. The model leaves zstd little to
/// find beyond what its fastest levels find: level 1 comes close to level
/// 3's size at several times its speed (bench/README.md has the figures).
const MODELED_LEVEL: i32 = 1;

/// The writer thread's compression state: batches waiting to be
/// compressed together, the model that transforms them, and a reusable
/// compressor. Every buffer is allocated here, once, with room for a
/// chunk: staging whole buffers of up to COMPRESS_CHUNK plus one more
/// thread buffer (64 KiB by default) never grows them, so the writer
/// allocates nothing per batch unless threads use larger buffers (then
/// the buffers grow once to the largest chunk seen).
struct Compression {
    staged: Vec<u8>,
    /// The modeled stream of `staged` (alloctrace_format::model).
    modeled: Vec<u8>,
    /// The zstd frame being written.
    frame: Vec<u8>,
    encoder: alloctrace_format::compression_model::Encoder,
    compressor: zstd::bulk::Compressor<'static>,
}

impl Compression {
    /// Runs on the writer thread only, never on the threads that emit
    /// events, before tracing is on.
    fn new() -> Option<Compression> {
        let room = COMPRESS_CHUNK + (64 << 10);
        let mut c = Compression {
            staged: Vec::with_capacity(room),
            modeled: Vec::with_capacity(room + room / 4),
            frame: Vec::with_capacity(room),
            encoder: alloctrace_format::compression_model::Encoder::with_capacity(room),
            compressor: zstd::bulk::Compressor::new(MODELED_LEVEL).ok()?,
        };
        // zstd sizes its workspace at the first compression, for the size
        // of the input: one of a chunk's size now, so it need not grow later.
        c.modeled.resize(COMPRESS_CHUNK, 0);
        let _ = c.compressor.compress_to_buffer(&c.modeled, &mut c.frame);
        c.modeled.clear();
        c.frame.clear();
        Some(c)
    }

    /// Writes the staged batches as one modeled compressed batch (FORMAT.md
    /// section 2.2), or as they are if compression fails or does not pay.
    fn flush(&mut self, output: &Output) -> Result<(), i32> {
        use alloctrace_format::{
            compression_model, put_uvarint, BatchKind, BATCH_PREFIX_LEN, MAX_VARINT_LEN,
        };
        if self.staged.is_empty() {
            return Ok(());
        }
        let raw_len = self.staged.len();
        // The frame must be smaller than the batches to pay: its buffer's
        // capacity bounds it (zstd fails when it would not fit).
        self.frame.reserve(raw_len.saturating_sub(self.frame.len()));
        let modeled = self.encoder.encode(&self.staged, &mut self.modeled)
            && self.modeled.len() as u64 <= compression_model::max_modeled_len(raw_len as u64);
        let compressed = modeled
            && matches!(
                self.compressor.compress_to_buffer(&self.modeled, &mut self.frame),
                Ok(n) if n + 16 < raw_len
            );
        if !compressed {
            return self.write_staged(output);
        }
        let result = {
            let mut head = [0u8; BATCH_PREFIX_LEN + MAX_VARINT_LEN];
            head[0] = BatchKind::CompressedModeled as u8;
            let n = put_uvarint(&mut head, BATCH_PREFIX_LEN, raw_len as u64);
            let payload = (n - BATCH_PREFIX_LEN + self.frame.len()) as u32;
            head[1..BATCH_PREFIX_LEN].copy_from_slice(&payload.to_le_bytes());
            output.write_batch(&[&head[..n], &self.frame])
        };
        self.staged.clear();
        result
    }

    /// Writes the staged batches as they are, each with its trailer.
    fn write_staged(&mut self, output: &Output) -> Result<(), i32> {
        if self.staged.is_empty() {
            return Ok(());
        }
        let result = output.write_batches(&self.staged);
        self.staged.clear();
        result
    }
}

thread_local! {
    static WRITER_THREAD: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
}

/// Whether the calling thread is a session's writer thread.
pub(crate) fn on_writer_thread() -> bool {
    WRITER_THREAD.with(|w| w.get())
}

/// Writes full batches out in queue order until the session stops, each
/// after the stack-table entries its generation has come to use
/// (tables.rs). After a write error it keeps draining (and discarding), so
/// producers never block on a dead output; stop reports the error.
fn run_writer<H: WriterHost>(
    session: &H,
    mut compression: Option<Compression>,
    mut tables: Tables,
) {
    WRITER_THREAD.with(|w| w.set(true));
    let (writer, pool) = (session.writer(), session.pool());
    // Its memory is mapped at the first allocation it keeps.
    let mut live = writer.snapshot.enabled.then(LiveTable::new);
    let record = |result: Result<(), i32>| {
        if let Err(e) = result {
            writer.io_error.store(e, Ordering::Relaxed);
        }
    };
    // Writes `bytes`, whole batches back to back, in queue order.
    let put = |compression: &mut Option<Compression>, bytes: &[u8]| {
        if bytes.is_empty() || writer.io_error.load(Ordering::Relaxed) != 0 {
            return;
        }
        match compression.as_mut() {
            Some(c) if compress_next(pool.full_bytes()) => {
                c.staged.extend_from_slice(bytes);
                if c.staged.len() >= COMPRESS_CHUNK {
                    record(c.flush(&writer.output));
                }
            }
            Some(c) => {
                // Behind: the staged batches and these go out as they
                // are, in queue order.
                record(c.write_staged(&writer.output));
                record(writer.output.write_batches(bytes));
            }
            None => record(writer.output.write_batches(bytes)),
        }
    };
    loop {
        let mut wrote = false;
        session.idle();
        if writer.flight.is_some() {
            check_rss(session);
        }
        if let Some(table) = &live {
            writer
                .snapshot
                .serve(table, writer.ended.load(Ordering::Acquire));
        }
        while let Some(buf) = pool.pop_full() {
            // SAFETY: popping the full queue hands this thread the buffer.
            let bytes = unsafe { (*buf.as_ptr()).bytes() };
            let seen = tables.before(bytes, session.lists_modules(), |g| {
                session.generation_span(g)
            });
            if let Some(table) = live.as_mut() {
                table.take(bytes);
            }
            if let Some(flight) = &writer.flight {
                // Flight-recorder mode: into the ring, nothing to the
                // output until a trigger.
                flight.append(&tables.out, bytes);
                session.count_written(tables.out.len());
            } else {
                put(&mut compression, &tables.out);
                session.count_written(tables.out.len());
                if seen.as_ref().is_some_and(|s| s.end) && writer.raw_end.load(Ordering::Acquire) {
                    write_end(writer, compression.as_mut(), bytes);
                } else {
                    put(&mut compression, bytes);
                }
            }
            session.count_written(bytes.len());
            pool.recycle(buf);
            if let Some(seen) = seen.filter(|s| s.end) {
                // The generation's batches leave the staging area with its
                // end, so the file holds it whole.
                if let Some(c) = compression.as_mut() {
                    if writer.io_error.load(Ordering::Relaxed) == 0 {
                        record(c.flush(&writer.output));
                    }
                }
                session.generation_written(seen.generation);
                writer.ended.store(seen.generation, Ordering::Release);
                if let Some(table) = live.as_mut() {
                    table.generation_ended(seen.generation);
                }
                if let Some(flight) = &writer.flight {
                    let after = flight.dump_after.load(Ordering::Acquire);
                    if after != 0 && seen.generation >= after {
                        flight.dump_after.store(0, Ordering::Relaxed);
                        writer.dump_to_output();
                    }
                }
            }
            if let Some(table) = &live {
                // Between two batches: a snapshot asked for is written
                // now, from the batches moved so far.
                writer
                    .snapshot
                    .serve(table, writer.ended.load(Ordering::Acquire));
            }
            wrote = true;
        }
        // The queue is empty: write what is staged rather than hold it.
        if let Some(c) = compression.as_mut() {
            if writer.io_error.load(Ordering::Relaxed) == 0 {
                record(c.flush(&writer.output));
            }
        }
        if writer.stopping.load(Ordering::Acquire) && pool.full_is_empty() {
            if writer
                .flight
                .as_ref()
                .is_some_and(|f| f.dump_at_stop.load(Ordering::Acquire))
            {
                writer.dump_to_output();
            }
            return;
        }
        if !wrote {
            writer.sleeping.store(true, Ordering::SeqCst);
            if pool.full_is_empty() && !writer.stopping.load(Ordering::Acquire) {
                std::thread::park_timeout(IDLE_SLEEP);
            }
            writer.sleeping.store(false, Ordering::Relaxed);
        }
    }
}

/// How often, at most, the writer thread reads the process's RSS for the
/// flight recorder's threshold.
const RSS_PERIOD_NS: u64 = 20_000_000;

/// Flight-recorder mode, writer thread: reads the process's RSS (at most
/// every [`RSS_PERIOD_NS`]) and, the first time it is at or above the
/// threshold, asks for the current generation to end and for a dump to
/// the output once it has (`dump_after`).
fn check_rss<H: WriterHost>(session: &H) {
    let Some(flight) = &session.writer().flight else {
        return;
    };
    if flight.rss_threshold == 0 || flight.rss_fired.load(Ordering::Relaxed) {
        return;
    }
    let now = crate::clock::mono_ns();
    if now.saturating_sub(flight.rss_checked_ns.load(Ordering::Relaxed)) < RSS_PERIOD_NS {
        return;
    }
    flight.rss_checked_ns.store(now, Ordering::Relaxed);
    // Before the first generation (the writer starts first) there is
    // nothing to dump yet: look again later.
    let current = crate::shared::SHARED.generation.load(Ordering::Acquire);
    if current != 0 && rss_bytes().is_some_and(|rss| rss >= flight.rss_threshold) {
        flight.rss_fired.store(true, Ordering::Relaxed);
        flight.dump_after.store(current, Ordering::Release);
        session.want_advance();
    }
}

/// The process's resident set in bytes, from /proc/self/statm (its second
/// field, in pages). Writer thread only: a few syscalls, no allocation.
fn rss_bytes() -> Option<u64> {
    // SAFETY: a NUL-terminated path; the result is checked.
    let fd = unsafe {
        libc::open(
            c"/proc/self/statm".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; 128];
    // SAFETY: buf is writable for its length; fd is ours.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: fd is ours, closed once.
    unsafe { libc::close(fd) };
    let text = buf.get(..usize::try_from(n).ok()?)?;
    let pages: u64 = std::str::from_utf8(text)
        .ok()?
        .split_ascii_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages.saturating_mul(u64::try_from(page).ok()?))
}

/// Writes a generation-end batch of a session stopping at exit: after
/// what is staged, outside any compressed batch, and keeps a copy of it
/// and its offset for late.rs. Allocates (once, the copy): the writer
/// thread is the tracer's own.
fn write_end(writer: &Writer, compression: Option<&mut Compression>, bytes: &[u8]) {
    if writer.io_error.load(Ordering::Relaxed) != 0 {
        return;
    }
    let mut result = compression.map_or(Ok(()), |c| c.flush(&writer.output));
    let offset = writer.output.position();
    if result.is_ok() {
        result = writer.output.write_batches(bytes);
    }
    match (result, offset) {
        (Err(e), _) => writer.io_error.store(e, Ordering::Relaxed),
        (Ok(()), Some(offset)) => {
            let mut kept = bytes.to_vec();
            kept.extend_from_slice(&alloctrace_format::batch_checksum(&[bytes]).to_le_bytes());
            *writer
                .end_batch
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(EndBatch {
                offset,
                bytes: kept,
            });
        }
        (Ok(()), None) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::{compress_next, Output, COMPRESS_BACKLOG};

    /// A session as the writer thread sees it, without the session layer:
    /// what `WriterHost` passes down is all the writer needs.
    struct Host {
        writer: super::Writer,
        pool: crate::buffer::BufferPool,
        counted: std::sync::atomic::AtomicUsize,
    }

    impl super::WriterHost for Host {
        fn writer(&self) -> &super::Writer {
            &self.writer
        }
        fn pool(&self) -> &crate::buffer::BufferPool {
            &self.pool
        }
        fn count_written(&self, n: usize) {
            self.counted
                .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn the_writer_thread_writes_and_counts_what_its_host_queues() {
        use std::sync::atomic::Ordering;
        let _serial = crate::buffer::tests::MAP_HOOK
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let dir = std::env::temp_dir().join(format!("alloctrace-host-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = std::ffi::CString::new(dir.join("t.trace").to_str().unwrap()).unwrap();
        let host = std::sync::Arc::new(Host {
            writer: super::Writer::new(Output::create(&path).unwrap(), false),
            pool: crate::buffer::BufferPool::new(4096, 4),
            counted: std::sync::atomic::AtomicUsize::new(0),
        });
        let mut batch_len = 0;
        for generation in 1..=2 {
            let buf = host
                .pool
                .take(crate::buffer::Want::Full, || {}, || false)
                .unwrap();
            // SAFETY: take gave us the buffer.
            let b = unsafe { &mut *buf.as_ptr() };
            b.begin(alloctrace_format::BatchKind::TraceEnd, generation, 0, 7);
            b.seal();
            batch_len += b.bytes().len();
            host.pool.push_full(buf);
        }
        let thread = super::spawn_writer(&host).unwrap();
        assert!(
            host.writer.thread.started(),
            "spawn_writer returns once it is ready"
        );
        host.writer.stop();
        thread.join();
        assert!(host.writer.thread.is_done());
        host.writer.output.close().unwrap();
        assert!(host.pool.full_is_empty());
        assert_eq!(host.writer.io_error.load(Ordering::Relaxed), 0);
        assert_eq!(host.counted.load(Ordering::Relaxed), batch_len);
        assert_eq!(
            std::fs::metadata(dir.join("t.trace")).unwrap().len() as usize,
            batch_len + 2 * alloctrace_format::TRAILER_LEN,
            "both batches, each with its trailer"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn compresses_until_the_backlog_passes_its_bound() {
        assert!(compress_next(0));
        assert!(compress_next(COMPRESS_BACKLOG));
        assert!(!compress_next(COMPRESS_BACKLOG + 1));
        assert!(!compress_next(usize::MAX));
    }
}
