//! Batch buffers and the pool that recycles them.
//!
//! A buffer is one mmap'd region: a small header ([`Buffer`]) followed by the
//! bytes of exactly one batch. Buffers never come from malloc, so a thread can
//! take a new one from inside the host's malloc. Full buffers travel to the
//! writer thread through a preallocated lock-free queue and come back empty
//! through another.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use alloctrace_format::{put_uvarint, BatchKind, BATCH_PREFIX_LEN};
use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;

/// How long [`BufferPool::take`] waits for a buffer once the kernel has
/// refused an mmap below the memory bound.
pub(crate) const MAP_REFUSED_WAIT: Duration = Duration::from_secs(1);

/// Test hook: mmaps of batch buffers still to fail before real ones are
/// made. Zero outside tests.
static INJECTED_MAP_FAILURES: AtomicU32 = AtomicU32::new(0);

/// Test hook: makes the next `n` buffer mmaps fail as if the kernel
/// refused them (ENOMEM). Returns how many injected failures were left unused.
#[doc(hidden)]
pub fn inject_map_failures(n: u32) -> u32 {
    INJECTED_MAP_FAILURES.swap(n, Ordering::SeqCst)
}

/// Offset of the batch bytes from the start of the mapping; the header sits
/// before them in its own cache line.
pub const DATA_OFFSET: usize = 64;

/// The header of a batch buffer.
///
/// A buffer has one holder at a time: the free pool, one thread writing into
/// it, or the full queue and then the writer thread. Only the holder touches
/// its fields, so they are plain (the queues' push/pop order the handover).
#[repr(C)]
pub(crate) struct Buffer {
    /// Bytes of the batch written so far, prefix and header included.
    pub(crate) len: usize,
    /// Capacity of the batch bytes.
    pub(crate) cap: usize,
    /// Timestamp of the last event written: the base of the next delta.
    pub(crate) last_ticks: u64,
    /// The previous ID of each address class in this batch: the base of the
    /// next ID's delta (compact events batches).
    pub(crate) ids: alloctrace_format::IdDeltas,
    /// Size of the whole mapping, for munmap.
    map_len: usize,
    /// A full-size buffer that a thread's event path took: counted in
    /// [`BufferPool::slot_large`] until it comes back to the free pool.
    slot_large: bool,
}

static_assertions::const_assert!(core::mem::size_of::<Buffer>() <= DATA_OFFSET);
// The layout the header's `struct alloctrace_batch_` mirrors (the inline
// event path appends events as the Rust one does).
static_assertions::const_assert_eq!(core::mem::offset_of!(Buffer, len), 0);
static_assertions::const_assert_eq!(core::mem::offset_of!(Buffer, cap), 8);
static_assertions::const_assert_eq!(core::mem::offset_of!(Buffer, last_ticks), 16);
static_assertions::const_assert_eq!(core::mem::offset_of!(Buffer, ids), 24);
static_assertions::const_assert_eq!(DATA_OFFSET, 64);

impl Buffer {
    /// Maps a new buffer with room for `cap` batch bytes, or `None` when the
    /// kernel refuses.
    ///
    /// Makes a syscall: called only when the pool is empty, never for an
    /// ordinary event. A raw one, like the munmap of [`Buffer::unmap`]: an
    /// interposer of mmap (the LD_PRELOAD shim, a profiler) must not see
    /// the tracer's own memory, nor be re-entered from inside an event.
    ///
    /// `cap` is the session's validated buffer size (at most
    /// `MAX_BUFFER_SIZE`, 16 MiB): the length sum cannot overflow.
    fn map(cap: usize) -> Option<NonNull<Buffer>> {
        let injected = INJECTED_MAP_FAILURES.load(Ordering::Relaxed);
        if injected > 0 {
            INJECTED_MAP_FAILURES.store(injected - 1, Ordering::Relaxed);
            return None;
        }
        let map_len = (DATA_OFFSET + cap).next_multiple_of(4096);
        // Miri interprets libc's mmap but not the raw syscall: under Miri
        // (`make miri`) the same mapping comes from there.
        #[cfg(miri)]
        // SAFETY: as below; MAP_FAILED is -1.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            ) as libc::c_long
        };
        #[cfg(not(miri))]
        // SAFETY: an anonymous private mapping with no address hint has no
        // preconditions; we check for failure (-1) below.
        let p = unsafe {
            libc::syscall(
                libc::SYS_mmap,
                core::ptr::null_mut::<libc::c_void>(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                // Faulted in now, in one call, rather than page by page by
                // the thread that writes it.
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1 as libc::c_int,
                0 as libc::off_t,
            )
        };
        if p == -1 {
            return None;
        }
        // An integer to a pointer: takes the exposed provenance of the
        // whole mapping, which data() relies on.
        let buf = core::ptr::with_exposed_provenance_mut::<Buffer>(p as usize);
        // SAFETY: the mapping is fresh, writable, page-aligned and larger
        // than a Buffer.
        unsafe {
            buf.write(Buffer {
                len: 0,
                cap,
                last_ticks: 0,
                ids: Default::default(),
                map_len,
                slot_large: false,
            })
        };
        NonNull::new(buf)
    }

    /// Unmaps a buffer.
    ///
    /// # Safety
    /// `buf` came from [`Buffer::map`] and nothing refers to it any more.
    unsafe fn unmap(buf: NonNull<Buffer>) {
        // SAFETY: the caller guarantees the buffer is ours and unused.
        unsafe {
            let len = (*buf.as_ptr()).map_len;
            #[cfg(miri)]
            libc::munmap(buf.as_ptr().cast::<libc::c_void>(), len);
            #[cfg(not(miri))]
            libc::syscall(libc::SYS_munmap, buf.as_ptr().cast::<libc::c_void>(), len);
        }
    }

    /// Pointer to the first batch byte.
    ///
    /// Derived from the mapping's address, not from `self`: a reference to
    /// the header carries provenance for the header's bytes only, so a
    /// pointer computed from it may not reach the batch bytes that follow
    /// (Miri's Stacked Borrows rejects that). The mapping's provenance was
    /// exposed when [`Buffer::map`] turned the mmap's integer result into
    /// a pointer; the address gets it back. The same machine code.
    #[inline(always)]
    pub(crate) fn data(&mut self) -> *mut u8 {
        core::ptr::with_exposed_provenance_mut::<u8>((self as *mut Buffer).addr() + DATA_OFFSET)
    }

    /// Bytes still free in the batch.
    ///
    /// Cannot underflow: `len <= cap` always. `len` is set by
    /// [`Buffer::begin`] (at most `MAX_BATCH_HEADER_LEN`, below every cap, which
    /// is at least `MIN_BUFFER_SIZE`), grows by [`Buffer::put_varint`] and
    /// [`Buffer::put_bytes`] (clamped to `cap`), [`Buffer::put_word`] (only
    /// with 8 bytes of room) and the event path's `append_event` (only with
    /// `MAX_EVENT_LEN` bytes of room, emit.rs), and is reset to 0 by
    /// recycle. No foreign value reaches it. A plain subtraction, on the
    /// event path's fast path.
    #[inline(always)]
    pub(crate) fn room(&self) -> usize {
        self.cap - self.len
    }

    /// The batch bytes written so far.
    pub(crate) fn bytes(&mut self) -> &[u8] {
        let len = self.len;
        // SAFETY: the first `len` bytes were written by the holder.
        unsafe { core::slice::from_raw_parts(self.data(), len) }
    }

    /// The batch bytes as a mutable slice of the whole capacity.
    fn all_bytes_mut(&mut self) -> &mut [u8] {
        let cap = self.cap;
        // SAFETY: the mapping holds `cap` writable bytes after the header.
        unsafe { core::slice::from_raw_parts_mut(self.data(), cap) }
    }

    /// Starts a batch: kind, a length to be patched by [`Buffer::seal`], and
    /// the batch header.
    ///
    /// Must not allocate: runs on the event path when a buffer is refilled.
    /// Cannot panic: `put_uvarint` skips bytes past the slice, and the cap
    /// (at least `MIN_BUFFER_SIZE`) holds `MAX_BATCH_HEADER_LEN` anyway.
    pub(crate) fn begin(&mut self, kind: BatchKind, generation: u64, thread: u64, base_ticks: u64) {
        let bytes = self.all_bytes_mut();
        if let Some(b) = bytes.first_mut() {
            *b = kind as u8;
        }
        let mut pos = BATCH_PREFIX_LEN;
        pos = put_uvarint(bytes, pos, generation);
        pos = put_uvarint(bytes, pos, thread);
        pos = put_uvarint(bytes, pos, base_ticks);
        self.len = pos.min(self.cap);
        self.last_ticks = base_ticks;
        self.ids = Default::default();
    }

    /// Appends one varint. The caller has checked that there is room.
    pub(crate) fn put_varint(&mut self, v: u64) {
        let pos = self.len;
        self.len = put_uvarint(self.all_bytes_mut(), pos, v).min(self.cap);
    }

    /// Appends one little-endian 8-byte word (page tracer). The caller has
    /// checked that there is room.
    ///
    /// Must not allocate: runs on the event path.
    #[inline(always)]
    pub(crate) fn put_word(&mut self, w: u64) {
        if self.room() >= 8 {
            let pos = self.len;
            // SAFETY: 8 bytes at pos are inside the batch capacity.
            unsafe {
                self.data()
                    .add(pos)
                    .cast::<[u8; 8]>()
                    .write_unaligned(w.to_le_bytes())
            };
            self.len += 8;
        }
    }

    /// Appends raw bytes. The caller has checked that there is room.
    /// Cannot panic: clamped to the room left.
    pub(crate) fn put_bytes(&mut self, src: &[u8]) {
        let pos = self.len;
        let n = src.len().min(self.room());
        if let (Some(dst), Some(src)) = (self.all_bytes_mut().get_mut(pos..pos + n), src.get(..n)) {
            dst.copy_from_slice(src);
            self.len += n;
        }
    }

    /// Whether a varint-headed entry of `n` more bytes fits.
    pub(crate) fn fits(&self, n: usize) -> bool {
        self.room() >= n
    }

    /// Writes the payload length into the batch prefix.
    ///
    /// Cannot panic: `len` is at least the prefix after [`Buffer::begin`]
    /// (saturating anyway), below 2^32 (caps are at most
    /// `MAX_BATCH_PAYLOAD`), and the prefix lies inside every cap.
    pub(crate) fn seal(&mut self) {
        let payload = self.len.saturating_sub(BATCH_PREFIX_LEN) as u32;
        if let Some(dst) = self.all_bytes_mut().get_mut(1..BATCH_PREFIX_LEN) {
            dst.copy_from_slice(&payload.to_le_bytes());
        }
    }
}

/// An owned pointer to a buffer, moved between threads through the queues.
pub(crate) struct BufferRef(pub(crate) NonNull<Buffer>);

// SAFETY: a BufferRef is the unique handle to its buffer (one holder at a
// time, see Buffer); moving it to another thread moves that ownership.
unsafe impl Send for BufferRef {}

/// Batch bytes of a small buffer: one page, header included. A thread's
/// first buffer of a generation, per stream, is a small one, so that a
/// thread that records little (most of 10,000 threads waiting at a barrier)
/// holds one page of buffer memory, not a full-size buffer; a thread that
/// fills it gets full-size ones. Holds a batch header and many events (the
/// event path needs `MAX_BATCH_HEADER_LEN + 3 * 8 + MAX_EVENT_LEN`).
pub(crate) const SMALL_BUFFER_CAP: usize = 4096 - DATA_OFFSET;

/// Most small buffers a pool maps: one per slot, stream and generation
/// parity (what the slots can hold at once, an advance being between its
/// generation store and its take), and some for the writer's pipeline. A
/// thread asking for a small one therefore always finds one free or on its
/// way back from the writer: the buffers held by other slots can never use
/// them all up (the asking thread holds none of its own in that entry).
/// Mapped only as needed: 10,000 threads that each hold one cost 40 MB.
pub(crate) const MAX_SMALL_BUFFERS: usize =
    2 * crate::limits::STREAMS * crate::limits::MAX_THREADS + 64;

/// Full-size buffers the threads' event path may hold in all (in their
/// slots, or on their way to the writer) stay this many below the memory
/// bound, so that the tracer's own batches (generation info, tables:
/// [`crate::session::meta::MetaWriter`]), which need full-size buffers, always find
/// one coming back even when idle threads keep full-size buffers they have
/// begun.
const META_RESERVE: usize = 8;

/// Which buffer a take asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    /// A thread's first buffer of a generation for a stream (one page).
    Small,
    /// A thread's next buffer, once it filled one: full-size while the
    /// threads hold fewer than the memory bound allows (less
    /// [`META_RESERVE`]), else a small one when the writer has nothing
    /// queued that would give one back (idle threads hold them all).
    Refill,
    /// A full-size buffer, waiting for one at the memory bound (the
    /// tracer's own batches, whose entries may need a whole buffer).
    Full,
}

/// Buffers of one size: the free ones, and how many are mapped.
struct Class {
    /// Empty buffers ready to be taken.
    free: ArrayQueue<BufferRef>,
    /// Buffers mapped so far; never above `max`.
    mapped: CachePadded<AtomicUsize>,
    /// Batch bytes per buffer.
    cap: usize,
    /// Most buffers of this size mapped at once.
    max: usize,
}

/// What a class could give.
enum Got {
    Buffer(NonNull<Buffer>),
    /// None free and the class at its bound.
    Exhausted,
    /// None free and the kernel refused an mmap below the bound.
    Refused,
}

impl Class {
    fn new(cap: usize, max: usize) -> Class {
        Class {
            free: ArrayQueue::new(max),
            mapped: CachePadded::new(AtomicUsize::new(0)),
            cap,
            max,
        }
    }

    /// A free buffer, else a newly mapped one below the bound.
    fn get(&self) -> Got {
        match self.free.pop() {
            Some(b) => Got::Buffer(b.0),
            None => self.map_one(),
        }
    }

    /// A newly mapped buffer below the bound.
    fn map_one(&self) -> Got {
        loop {
            let n = self.mapped.load(Ordering::Relaxed);
            if n >= self.max {
                return Got::Exhausted;
            }
            if self
                .mapped
                .compare_exchange(n, n + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            return match Buffer::map(self.cap) {
                Some(b) => Got::Buffer(b),
                None => {
                    self.mapped.fetch_sub(1, Ordering::Relaxed);
                    Got::Refused
                }
            };
        }
    }
}

/// The free pools and the queue of full buffers of one tracing session.
///
/// Two sizes: full-size buffers (the session's buffer size), bounded by
/// the memory bound, and small ones ([`SMALL_BUFFER_CAP`]), one per thread
/// and stream as it starts a generation ([`MAX_SMALL_BUFFERS`]). A thread
/// that records an event or two therefore costs one page, and any number
/// of idle threads holding begun buffers can neither exhaust the
/// full-size ones for everyone else nor, holding small ones, make another
/// thread wait forever.
pub(crate) struct BufferPool {
    /// Full-size buffers.
    large: Class,
    /// One-page buffers.
    small: Class,
    /// Sealed batches waiting for the writer thread, in push order.
    full: ArrayQueue<BufferRef>,
    /// Bytes of the batches in `full` (pushed, not yet popped).
    queued_bytes: CachePadded<AtomicUsize>,
    /// Full-size buffers taken by threads' event path and not yet back in
    /// the free pool; at most `large.max - META_RESERVE`.
    slot_large: CachePadded<AtomicUsize>,
    /// Times a producer found no free buffer and had to wait for the writer.
    waits: CachePadded<AtomicUsize>,
    /// Set when a take gave up on a refused mmap; cleared when a buffer
    /// comes back or an mmap succeeds (see [`BufferPool::take`]).
    starved: AtomicBool,
}

impl BufferPool {
    /// A pool of at most `max_buffers` buffers of `buffer_size` bytes (at
    /// least `2 * META_RESERVE`), and small ones, none mapped yet.
    /// Allocates the queues: call only from trace_start.
    pub(crate) fn new(buffer_size: usize, max_buffers: usize) -> BufferPool {
        let max_buffers = max_buffers.max(2 * META_RESERVE);
        BufferPool {
            large: Class::new(buffer_size, max_buffers),
            small: Class::new(SMALL_BUFFER_CAP, MAX_SMALL_BUFFERS),
            full: ArrayQueue::new(max_buffers + MAX_SMALL_BUFFERS),
            queued_bytes: CachePadded::new(AtomicUsize::new(0)),
            slot_large: CachePadded::new(AtomicUsize::new(0)),
            waits: CachePadded::new(AtomicUsize::new(0)),
            starved: AtomicBool::new(false),
        }
    }

    /// For [`Want::Refill`]: counts one more full-size buffer for the
    /// threads, false when they hold all they may.
    fn count_slot_large(&self) -> bool {
        let limit = self.large.max - META_RESERVE;
        self.slot_large
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok()
    }

    /// One round of a take: a buffer of the class `want` asks for, if one
    /// can be had now.
    fn try_take(&self, want: Want) -> Got {
        match want {
            Want::Small => self.small.get(),
            Want::Full => self.large.get(),
            Want::Refill => {
                if self.count_slot_large() {
                    match self.large.get() {
                        Got::Buffer(b) => {
                            // SAFETY: the buffer is ours alone.
                            unsafe { (*b.as_ptr()).slot_large = true };
                            return Got::Buffer(b);
                        }
                        other => {
                            self.slot_large.fetch_sub(1, Ordering::Relaxed);
                            if !self.full.is_empty() {
                                return other;
                            }
                        }
                    }
                } else if !self.full.is_empty() {
                    // The writer has batches to write: wait for it
                    // (back-pressure), one will come back.
                    return Got::Exhausted;
                }
                // The threads hold every full-size buffer they may and
                // nothing is queued: idle threads keep them. A small one.
                self.small.get()
            }
        }
    }

    /// Takes an empty buffer of the kind `want` asks for: from the free
    /// pool, else a newly mapped one while under the memory bound, else
    /// waits for the writer thread to return one.
    ///
    /// Lossless back-pressure: at the memory bound it waits as long as the
    /// writer takes (`None` only for a fatal-signal flush whose time is up,
    /// crash.rs). When the kernel refuses an mmap below the bound, it waits
    /// the same way for a buffer to come back, trying mmap again every
    /// round, for at most [`MAP_REFUSED_WAIT`]: a buffer written out by the
    /// writer ends the wait. If none comes and no mmap succeeds in that
    /// time, it returns `None` (the caller counts the event in
    /// `lost_events`) and the pool is *starved*: until a buffer comes back
    /// or an mmap succeeds, a take that finds no buffer at once returns
    /// `None` without waiting, so a process out of memory is not slowed by
    /// one wait per event. Every such event is counted lost.
    ///
    /// Must not allocate or lock: may run inside the host's malloc. Makes
    /// syscalls (mmap, sched_yield, nanosleep, the vDSO clock) only when no
    /// buffer is free.
    ///
    /// `wake_writer` wakes the writer thread (once, as a wait begins);
    /// `give_up` says, each round of a wait, whether the caller must stop
    /// waiting (crash.rs `past_deadline`: a fatal-signal flush whose time is
    /// up). Both are called only when no buffer is free at once.
    pub(crate) fn take(
        &self,
        want: Want,
        wake_writer: impl Fn(),
        give_up: impl Fn() -> bool,
    ) -> Option<NonNull<Buffer>> {
        let mut waited = false;
        // Set once an mmap below the bound was refused: the wait ends then.
        let mut refused_since: Option<std::time::Instant> = None;
        for round in 0u64.. {
            match self.try_take(want) {
                Got::Buffer(b) => {
                    if self.starved.load(Ordering::Relaxed) {
                        self.starved.store(false, Ordering::Relaxed);
                    }
                    return Some(b);
                }
                Got::Refused => {
                    if self.starved.load(Ordering::Relaxed) {
                        return None;
                    }
                    let since = *refused_since.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() >= MAP_REFUSED_WAIT {
                        self.starved.store(true, Ordering::Relaxed);
                        return None;
                    }
                }
                Got::Exhausted => {}
            }
            if give_up() {
                return None;
            }
            if !waited {
                waited = true;
                self.waits.fetch_add(1, Ordering::Relaxed);
                wake_writer();
            }
            if round < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        None
    }

    /// Maps (and faults in) empty small buffers until their free pool
    /// holds at least `n` or their bound is reached. Called off the event
    /// path (start, and before every generation change) so that threads
    /// moving to a new generation (whose first buffer is a small one) find
    /// buffers ready instead of each mapping one: an mmap takes the
    /// process's mmap lock, which another thread's page fault or mmap can
    /// hold, and that wait would block an event.
    pub(crate) fn reserve(&self, n: usize) {
        while self.small.free.len() < n {
            match self.small.map_one() {
                Got::Buffer(b) => self.recycle(b),
                Got::Exhausted | Got::Refused => return,
            }
        }
    }

    /// Hands a sealed batch to the writer thread. The full queue has room for
    /// every buffer that exists, so this cannot fail.
    ///
    /// Must not allocate: runs on the event path when a buffer is full.
    pub(crate) fn push_full(&self, buf: NonNull<Buffer>) {
        // SAFETY: the caller holds the buffer until the push.
        let len = unsafe { (*buf.as_ptr()).len };
        self.queued_bytes.fetch_add(len, Ordering::Relaxed);
        let mut item = BufferRef(buf);
        while let Err(back) = self.full.push(item) {
            // Unreachable while the classes' bounds bound the queue; spin
            // rather than lose the batch.
            item = back;
            std::thread::yield_now();
        }
    }

    /// Takes the oldest full batch, for the writer thread.
    pub(crate) fn pop_full(&self) -> Option<NonNull<Buffer>> {
        let b = self.full.pop()?.0;
        // SAFETY: the writer thread holds the popped buffer; its length is
        // the one it was pushed with.
        let len = unsafe { (*b.as_ptr()).len };
        self.queued_bytes.fetch_sub(len, Ordering::Relaxed);
        Some(b)
    }

    /// Whether no full batch is waiting.
    pub(crate) fn full_is_empty(&self) -> bool {
        self.full.is_empty()
    }

    /// Bytes of the batches waiting in the full queue, for the writer
    /// thread to see how far behind it is (buffers of both sizes: a count
    /// of whole full-size buffers would take 10,000 one-page batches of
    /// idle threads for 640 MiB).
    pub(crate) fn full_bytes(&self) -> usize {
        self.queued_bytes.load(Ordering::Relaxed)
    }

    /// Returns a written-out buffer to the free pool of its size.
    pub(crate) fn recycle(&self, buf: NonNull<Buffer>) {
        // SAFETY: the caller holds the buffer.
        let b = unsafe { &mut *buf.as_ptr() };
        b.len = 0;
        if core::mem::take(&mut b.slot_large) {
            self.slot_large.fetch_sub(1, Ordering::Relaxed);
        }
        let class = if b.cap == self.small.cap {
            &self.small
        } else {
            &self.large
        };
        self.starved.store(false, Ordering::Relaxed);
        let mut item = BufferRef(buf);
        while let Err(back) = class.free.push(item) {
            item = back;
            std::thread::yield_now();
        }
    }

    /// How often producers waited for a free buffer.
    pub(crate) fn waits(&self) -> usize {
        self.waits.load(Ordering::Relaxed)
    }

    /// Number of buffers mapped, of both sizes.
    pub(crate) fn mapped(&self) -> usize {
        self.large.mapped.load(Ordering::Relaxed) + self.small.mapped.load(Ordering::Relaxed)
    }
}

impl Drop for BufferPool {
    fn drop(&mut self) {
        // By the time a session drops its pool every buffer is back in a
        // queue (trace_stop collected them all and the writer drained them).
        while let Some(b) = self
            .full
            .pop()
            .or_else(|| self.large.free.pop())
            .or_else(|| self.small.free.pop())
        {
            // SAFETY: the queues held the only references.
            unsafe { Buffer::unmap(b.0) };
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::limits::MIN_BUFFER_SIZE;
    use alloctrace_format::MAX_BATCH_HEADER_LEN as MAX_HEADER_LEN;

    /// Held by unit tests that map buffers: the failure hook is global.
    pub(crate) static MAP_HOOK: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// A buffer's life through the pool, every unsafe access of this file
    /// on the way (Miri runs it: `make miri`): mapped, a batch begun,
    /// filled past its room (clamped), sealed, queued full, written out,
    /// recycled and taken again empty, unmapped when the pool drops.
    #[test]
    fn a_buffer_goes_round_the_pool_and_never_writes_past_its_room() {
        let _serial = MAP_HOOK.lock().unwrap_or_else(|p| p.into_inner());
        let pool = BufferPool::new(MIN_BUFFER_SIZE, 2);
        let mut b = pool
            .take(Want::Full, || (), || false)
            .expect("a fresh buffer");
        // SAFETY: the pool handed this buffer to us alone.
        let buf = unsafe { b.as_mut() };
        assert_eq!((buf.len, buf.cap), (0, MIN_BUFFER_SIZE));
        buf.begin(BatchKind::Events, 1, 7, 300);
        let header = buf.len;
        assert!(header > BATCH_PREFIX_LEN && header <= MAX_HEADER_LEN);
        buf.put_varint(u64::MAX);
        buf.put_word(0x0102_0304_0506_0708);
        let room = buf.room();
        buf.put_bytes(&vec![0xab; room + 100]);
        assert_eq!(buf.room(), 0, "put_bytes is clamped to the room");
        buf.put_word(1);
        buf.put_varint(1);
        assert_eq!(buf.len, buf.cap, "nothing written past the room");
        assert!(!buf.fits(1));
        buf.seal();
        let bytes = buf.bytes();
        assert_eq!(bytes[0], BatchKind::Events as u8);
        let payload = u32::from_le_bytes(bytes[1..BATCH_PREFIX_LEN].try_into().unwrap());
        assert_eq!(payload as usize, MIN_BUFFER_SIZE - BATCH_PREFIX_LEN);
        assert_eq!(
            bytes[header + 10..header + 18],
            0x0102_0304_0506_0708u64.to_le_bytes()
        );
        pool.push_full(b);
        assert!(!pool.full_is_empty());
        let b = pool.pop_full().expect("the queued buffer");
        pool.recycle(b);
        let mut again = pool
            .take(Want::Full, || (), || false)
            .expect("the recycled buffer");
        // SAFETY: ours alone again.
        assert_eq!(unsafe { again.as_mut() }.len, 0, "recycled empty");
        pool.recycle(again);
        assert_eq!(pool.mapped(), 1);
    }

    /// An mmap that never succeeds with no buffer in circulation: the take
    /// waits [`MAP_REFUSED_WAIT`], gives up (the caller counts the event
    /// lost), and later takes give up at once until a buffer comes back.
    #[test]
    fn refused_mmap_with_nothing_to_wait_for_gives_up_once_then_at_once() {
        let _serial = MAP_HOOK.lock().unwrap_or_else(|p| p.into_inner());
        let pool = BufferPool::new(4096, 4);
        inject_map_failures(u32::MAX);
        let t = std::time::Instant::now();
        assert!(pool.take(Want::Full, || (), || false).is_none());
        assert!(t.elapsed() >= MAP_REFUSED_WAIT, "gave up before the wait");
        let t = std::time::Instant::now();
        assert!(pool.take(Want::Full, || (), || false).is_none());
        assert!(
            t.elapsed() < MAP_REFUSED_WAIT,
            "a starved pool waited again"
        );
        inject_map_failures(0);
        // The kernel gives memory again: the next take maps a buffer.
        let b = pool
            .take(Want::Full, || (), || false)
            .expect("an mmap that succeeds ends the starvation");
        inject_map_failures(u32::MAX);
        pool.recycle(b);
        let b = pool
            .take(Want::Full, || (), || false)
            .expect("the recycled buffer");
        pool.recycle(b);
        inject_map_failures(0);
    }

    fn cap_of(b: NonNull<Buffer>) -> usize {
        // SAFETY: the test holds the buffer.
        unsafe { (*b.as_ptr()).cap }
    }

    /// Idle threads each holding a begun buffer (10,000 at a barrier) can
    /// neither make another thread wait forever nor starve the tracer's
    /// own batches: first buffers are small ones, beyond the full-size
    /// bound; refills take full-size ones up to the bound less the
    /// tracer's reserve, then small ones while the writer has nothing
    /// queued; the reserve stays for `Want::Full`.
    #[test]
    fn threads_holding_buffers_never_exhaust_the_pool() {
        let _serial = MAP_HOOK.lock().unwrap_or_else(|p| p.into_inner());
        let max = 2 * META_RESERVE;
        let pool = BufferPool::new(MIN_BUFFER_SIZE, max);
        let mut held = Vec::new();
        for _ in 0..3 * max {
            let b = pool
                .take(Want::Small, || (), || false)
                .expect("a small buffer");
            assert_eq!(cap_of(b), SMALL_BUFFER_CAP);
            held.push(b);
        }
        for _ in 0..max - META_RESERVE {
            let b = pool
                .take(Want::Refill, || (), || false)
                .expect("a full-size refill");
            assert_eq!(cap_of(b), MIN_BUFFER_SIZE);
            held.push(b);
        }
        // The threads hold all the full-size buffers they may, none queued.
        let b = pool
            .take(Want::Refill, || (), || false)
            .expect("a small refill");
        assert_eq!(cap_of(b), SMALL_BUFFER_CAP);
        held.push(b);
        let own = pool
            .take(Want::Full, || (), || false)
            .expect("the tracer's reserve");
        assert_eq!(cap_of(own), MIN_BUFFER_SIZE);
        pool.recycle(own);
        // A refill buffer back in the pool may be taken by a refill again.
        let large = held
            .iter()
            .position(|&b| cap_of(b) == MIN_BUFFER_SIZE)
            .expect("a full-size buffer held");
        pool.recycle(held.swap_remove(large));
        let b = pool
            .take(Want::Refill, || (), || false)
            .expect("a full-size refill");
        assert_eq!(cap_of(b), MIN_BUFFER_SIZE);
        held.push(b);
        for b in held {
            pool.recycle(b);
        }
        assert_eq!(pool.slot_large.load(Ordering::Relaxed), 0);
        assert_eq!(pool.full_bytes(), 0);
    }
}
