//! Where the trace goes: the output descriptor and the writer thread that
//! drains the queue of full buffers into it.

use std::ffi::CStr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::tracer::Session;

/// How long the writer sleeps when the queue is empty. Producers never wait
/// for it unless the memory bound is reached, and then they wake it.
const IDLE_SLEEP: Duration = Duration::from_millis(1);

/// The trace's output descriptor.
pub struct Output {
    fd: libc::c_int,
    /// Whether trace_stop closes the descriptor (it does for a path it
    /// opened, not for a descriptor the caller passed).
    owned: bool,
}

impl Output {
    /// Creates the file at `path`: mode 0600, truncating an existing regular
    /// file, never following a symlink in the last component. Returns errno.
    pub fn create(path: &CStr) -> Result<Output, i32> {
        // SAFETY: path is a valid NUL-terminated string.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0o600 as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(errno());
        }
        Ok(Output { fd, owned: true })
    }

    /// Creates a new file at `path`, mode 0600, failing with EEXIST if
    /// anything (a file, a symlink) is there already: for output paths in
    /// directories others can write to. Returns errno.
    pub fn create_new(path: &CStr) -> Result<Output, i32> {
        // SAFETY: path is a valid NUL-terminated string.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0o600 as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(errno());
        }
        Ok(Output { fd, owned: true })
    }

    /// Writes to a descriptor the caller owns; it stays open after stop.
    pub fn borrowed_fd(fd: libc::c_int) -> Output {
        Output { fd, owned: false }
    }

    /// Writes all of `bytes`, retrying on EINTR and short writes.
    pub(crate) fn write_all(&self, mut bytes: &[u8]) -> Result<(), i32> {
        while !bytes.is_empty() {
            // SAFETY: bytes is a valid readable slice.
            let n = unsafe { libc::write(self.fd, bytes.as_ptr().cast(), bytes.len()) };
            if n < 0 {
                let e = errno();
                if e == libc::EINTR || e == libc::EAGAIN {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(libc::EIO);
            }
            bytes = &bytes[n as usize..];
        }
        Ok(())
    }

    /// Closes the descriptor if it is ours.
    pub(crate) fn close(&self) -> Result<(), i32> {
        if !self.owned {
            return Ok(());
        }
        // SAFETY: the descriptor is ours and nothing writes to it any more.
        if unsafe { libc::close(self.fd) } != 0 {
            return Err(errno());
        }
        Ok(())
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Starts the writer thread of a session and returns once it has marked
/// itself internal. Called while tracing is still off, so the allocations
/// the thread makes while starting (inside std, before our code runs) are
/// never traced as the host's.
///
/// The handshake is an atomic flag, not a channel: the writer thread must
/// not allocate or free anything once tracing is on (a custom allocator
/// that traces itself would see calls that are not the host's).
pub(crate) fn spawn_writer(session: Arc<Session>) -> std::io::Result<crate::thread::InternalThread> {
    let theirs = Arc::clone(&session);
    let handle = crate::thread::spawn_internal(c"alloctrace-writer", move || {
        // Before the handshake, so while tracing is still off: all the
        // compression state is allocated here.
        let compression = if theirs.compress { Compression::new() } else { None };
        let _ = theirs.writer_thread.set(std::thread::current());
        theirs.writer_ready.store(true, Ordering::Release);
        run_writer(&theirs, compression);
        theirs.writer_done.store(true, Ordering::Release);
    })?;
    while !session.writer_ready.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    Ok(handle)
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
/// find beyond what its fastest levels find: on the benchmark workload
/// level 1 is within 2% of level 3's size at several times its speed.
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
    encoder: alloctrace_format::model::Encoder,
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
            encoder: alloctrace_format::model::Encoder::with_capacity(room),
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
        use alloctrace_format::{model, put_uvarint, BatchKind, BATCH_PREFIX_LEN, MAX_VARINT_LEN};
        if self.staged.is_empty() {
            return Ok(());
        }
        let raw_len = self.staged.len();
        // The frame must be smaller than the batches to pay: its buffer's
        // capacity bounds it (zstd fails when it would not fit).
        self.frame.reserve(raw_len.saturating_sub(self.frame.len()));
        let modeled = self.encoder.encode(&self.staged, &mut self.modeled)
            && self.modeled.len() as u64 <= model::max_modeled_len(raw_len as u64);
        let compressed = modeled && matches!(
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
            output.write_all(&head[..n]).and_then(|()| output.write_all(&self.frame))
        };
        self.staged.clear();
        result
    }

    /// Writes the staged batches as they are.
    fn write_staged(&mut self, output: &Output) -> Result<(), i32> {
        if self.staged.is_empty() {
            return Ok(());
        }
        let result = output.write_all(&self.staged);
        self.staged.clear();
        result
    }
}

/// Writes full batches out in queue order until the session stops. After a
/// write error it keeps draining (and discarding), so producers never block
/// on a dead output; stop reports the error.
fn run_writer(session: &Session, mut compression: Option<Compression>) {
    let record = |result: Result<(), i32>| {
        if let Err(e) = result {
            session.io_error.store(e, Ordering::Relaxed);
        }
    };
    loop {
        let mut wrote = false;
        while let Some(buf) = session.pool.pop_full() {
            // SAFETY: popping the full queue hands this thread the buffer.
            let bytes = unsafe { (*buf.as_ptr()).bytes() };
            if session.io_error.load(Ordering::Relaxed) == 0 {
                match compression.as_mut() {
                    Some(c) if compress_next(session.pool.full_bytes()) => {
                        c.staged.extend_from_slice(bytes);
                        if c.staged.len() >= COMPRESS_CHUNK {
                            record(c.flush(&session.output));
                        }
                    }
                    Some(c) => {
                        // Behind: the staged batches and this one go out
                        // as they are, in queue order.
                        record(c.write_staged(&session.output));
                        record(session.output.write_all(bytes));
                    }
                    None => record(session.output.write_all(bytes)),
                }
            }
            session.count_written(bytes.len());
            session.pool.recycle(buf);
            wrote = true;
        }
        // The queue is empty: write what is staged rather than hold it.
        if let Some(c) = compression.as_mut() {
            if session.io_error.load(Ordering::Relaxed) == 0 {
                record(c.flush(&session.output));
            }
        }
        if session.stopping.load(Ordering::Acquire) && session.pool.full_is_empty() {
            return;
        }
        if !wrote {
            session.writer_sleeping.store(true, Ordering::SeqCst);
            if session.pool.full_is_empty() && !session.stopping.load(Ordering::Acquire) {
                std::thread::park_timeout(IDLE_SLEEP);
            }
            session.writer_sleeping.store(false, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{compress_next, COMPRESS_BACKLOG};

    #[test]
    fn compresses_until_the_backlog_passes_its_bound() {
        assert!(compress_next(0));
        assert!(compress_next(COMPRESS_BACKLOG));
        assert!(!compress_next(COMPRESS_BACKLOG + 1));
        assert!(!compress_next(usize::MAX));
    }
}
