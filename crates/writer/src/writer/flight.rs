//! The flight recorder's ring: in flight-recorder mode the writer thread
//! keeps the batches it would write in memory instead, and a dump writes
//! the last complete generations out as a trace of their own (FORMAT.md
//! section 1, the flight-recorder window).
//!
//! ## Design
//!
//! The ring is one anonymous mapping of the configured size, the tracer's
//! own (never the program's heap), used as a circular log of *records*.
//! A record is what the writer thread would have written for one full
//! buffer: the stack-table batches listed before it (tables.rs) and the
//! buffer's batch, all of one generation, each batch followed by its
//! trailer, exactly the bytes a trace file holds. So a dump is the file
//! header, the records of the generations it keeps, in ring order, and a
//! trace-end batch; generations are self-contained (each has its info,
//! process and type batches and its stack tables), so any run of
//! consecutive complete generations is a trace.
//!
//! Record layout: a 16-byte head, then the bytes, padded to 8:
//! u32 length of the bytes, u32 flags ([`WRAP`], [`DEAD`], [`END`]), u64
//! generation. A record never wraps: where the end of the mapping has no
//! room, a [`WRAP`] head (or fewer than 16 bytes left) sends the log back
//! to offset 0.
//!
//! Generations of an advance overlap in queue order (the next
//! generation's info batch is queued before the old one's end, and threads
//! fill buffers of the new one meanwhile: FORMAT.md section 6), so the
//! records of one generation are not contiguous. Evicting a generation
//! marks its records [`DEAD`]; the head moves over dead records only, so a
//! live record of the next generation among them keeps its place, and the
//! dead ones behind it are reclaimed once it goes too.
//!
//! With an age (`--flight-recorder 30s`), the ring also drops every
//! generation that ended longer ago than the age, oldest first, as each
//! generation ends and before a dump, keeping the newest complete one
//! whatever its age; the advancer ends a generation every eighth of the
//! age (session/advancer.rs), so the window holds the last age to nine
//! eighths of it.
//!
//! ## Invariants
//!
//! 1. The bytes in use (live and dead records, wrap waste) MUST stay within
//!    the mapping: room is found before a record is written, by evicting
//!    the oldest generations; a record that cannot fit even in an empty
//!    ring is dropped and its generation evicted. Otherwise the ring would
//!    grow past the size the user gave.
//! 2. Generations MUST be evicted oldest first, whole: every generation
//!    from `evicted + 1` on has all of its records in the ring. Otherwise
//!    a dump would hold a generation with batches missing.
//! 3. Only the writer thread appends; a dump reads under the same lock.
//!    The lock is never taken on the event path nor in a signal handler
//!    (a fatal-signal dump is written by the writer thread: crash.rs).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use alloctrace_format::{
    batch_checksum, encode_batch_header, get_uvarint, BatchKind, FileHeader, BATCH_PREFIX_LEN,
    FLAG_FLIGHT_WINDOW, TRAILER_LEN, VERSION,
};

use crate::writer::output::Output;

/// The smallest ring a session accepts: a few generations of a few
/// default-size buffers.
pub const MIN_FLIGHT_RECORDER_BYTES: u64 = 1 << 20;

/// The largest ring: the record offsets are u32-friendly and a mapping
/// this large is already more than a dump should write from a signal.
pub const MAX_FLIGHT_RECORDER_BYTES: u64 = 1 << 40;

/// In flight-recorder mode, the generation budget is at most this
/// fraction of the ring, so the ring holds several generations.
pub const GENERATIONS_PER_RING: u64 = 8;

const HEAD_LEN: usize = 16;
/// A head that sends the log back to offset 0.
const WRAP: u32 = 1;
/// Generations whose end time the ring remembers (by generation modulo
/// this): a generation whose time was overwritten is kept, not dropped for
/// its age.
const ENDS: usize = 256;
/// A record of an evicted generation: skipped, reclaimed when the head
/// passes it.
const DEAD: u32 = 2;
/// The record holds its generation's generation-end batch.
const END: u32 = 4;

/// What a caller may learn of the ring (tests, benchmarks, stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlightStats {
    /// The ring's size, mapped once at start.
    pub capacity: u64,
    /// Bytes in use now (live and dead records, wrap waste).
    pub used: u64,
    /// The most bytes ever in use: never above `capacity`.
    pub high_water: u64,
    /// The oldest generation whose records are all kept (0: none yet).
    pub first: u64,
    /// The newest complete generation kept (0: none yet).
    pub last: u64,
    /// Generations evicted so far.
    pub evicted: u64,
    /// Batches dropped because their record could not fit at all.
    pub dropped: u64,
    /// Dumps written so far.
    pub dumps: u64,
}

/// The circular log (module docs). Only behind [`FlightRecorder::ring`].
struct Ring {
    base: *mut u8,
    cap: usize,
    head: usize,
    tail: usize,
    records: usize,
    used: usize,
    high_water: usize,
    /// Every generation up to this one is evicted (invariant 2).
    evicted: u64,
    evictions: u64,
    /// The newest generation whose end batch is in the ring.
    complete: u64,
    /// The newest generation with a record in the ring.
    newest: u64,
    dropped: u64,
    /// Drop generations that ended longer ago than this (ns); 0: never.
    age_ns: u64,
    /// `(generation, CLOCK_MONOTONIC ns)` of each generation's end, at
    /// `generation % ENDS`.
    ends: [(u64, u64); ENDS],
}

// SAFETY: the mapping is owned by the ring and only touched under the
// FlightRecorder's lock.
unsafe impl Send for Ring {}

/// The flight recorder of a session: its ring and its triggers' state.
pub(crate) struct FlightRecorder {
    ring: Mutex<Ring>,
    /// Set by a fatal-signal flush before the writer stops: the writer
    /// thread writes the ring to the output before it returns.
    pub(crate) dump_at_stop: AtomicBool,
    /// Non-zero: once the writer has passed the end of this generation, it
    /// writes the ring to the output (the RSS trigger).
    pub(crate) dump_after: AtomicU64,
    /// The RSS threshold in bytes, 0 for none.
    pub(crate) rss_threshold: u64,
    /// The RSS threshold has fired (it fires once).
    pub(crate) rss_fired: AtomicBool,
    /// When the writer thread last read the RSS (CLOCK_MONOTONIC ns).
    pub(crate) rss_checked_ns: AtomicU64,
    dumps: AtomicU64,
    /// Dumps to the session's output so far: a later one rewrites it.
    pub(crate) output_dumps: AtomicU64,
}

impl FlightRecorder {
    /// Maps the ring (tracing is off: the caller is start). `None` when
    /// the kernel refuses the mapping.
    /// `age_ms`: drop generations that ended longer ago (0: never).
    pub(crate) fn new(capacity: u64, rss_threshold: u64, age_ms: u64) -> Option<FlightRecorder> {
        let cap = (capacity as usize).next_multiple_of(4096);
        // A raw syscall, like the buffers' (buffer.rs): an interposer of
        // mmap must not see the tracer's own memory. Not populated: pages
        // are faulted in as the ring fills.
        // SAFETY: an anonymous private mapping without a hint has no
        // preconditions; failure (-1) is checked.
        let p = unsafe {
            libc::syscall(
                libc::SYS_mmap,
                core::ptr::null_mut::<libc::c_void>(),
                cap,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1 as libc::c_int,
                0 as libc::off_t,
            )
        };
        if p == -1 {
            return None;
        }
        // A forked child forgets its parent's session (session/mod.rs,
        // corner cases) and never touches its ring: it need not inherit it.
        // SAFETY: advice on a mapping of our own; failure changes nothing.
        unsafe { libc::madvise(p as *mut libc::c_void, cap, libc::MADV_DONTFORK) };
        Some(FlightRecorder {
            ring: Mutex::new(Ring {
                base: core::ptr::with_exposed_provenance_mut::<u8>(p as usize),
                cap,
                head: 0,
                tail: 0,
                records: 0,
                used: 0,
                high_water: 0,
                evicted: 0,
                evictions: 0,
                complete: 0,
                newest: 0,
                dropped: 0,
                age_ns: age_ms.saturating_mul(1_000_000),
                ends: [(0, 0); ENDS],
            }),
            dump_at_stop: AtomicBool::new(false),
            dump_after: AtomicU64::new(0),
            rss_threshold,
            rss_fired: AtomicBool::new(false),
            rss_checked_ns: AtomicU64::new(0),
            dumps: AtomicU64::new(0),
            output_dumps: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writer thread: keeps `tables` (stack-table batches, possibly none)
    /// and `batch`, one full buffer's batch, as one record. Batches of no
    /// generation (the trace end) are not kept: a dump writes its own.
    pub(crate) fn append(&self, tables: &[u8], batch: &[u8]) {
        let Some((generation, end)) = batch_generation(batch) else {
            return;
        };
        let mut r = self.lock();
        r.append(generation, end, &[tables, batch]);
        if end {
            let now = crate::clock::mono_ns();
            r.ends[generation as usize % ENDS] = (generation, now);
            r.expire(now);
        }
    }

    pub(crate) fn stats(&self) -> FlightStats {
        let r = self.lock();
        let (first, last) = r.window();
        FlightStats {
            capacity: r.cap as u64,
            used: r.used as u64,
            high_water: r.high_water as u64,
            first,
            last,
            evicted: r.evictions,
            dropped: r.dropped,
            dumps: self.dumps.load(Ordering::Relaxed),
        }
    }

    /// Writes the kept complete generations to `out` as a trace: the file
    /// header with [`FLAG_FLIGHT_WINDOW`], their records in ring order, a
    /// trace-end batch. Returns the generations written, `(first, last)`,
    /// `(0, 0)` for none (the dump is then a header and a trace end).
    /// Allocates nothing; holds the ring's lock while it writes.
    pub(crate) fn dump(&self, out: &Output) -> Result<(u64, u64), i32> {
        let mut r = self.lock();
        r.expire(crate::clock::mono_ns());
        let (first, last) = r.window();
        out.write_all(
            &FileHeader {
                version: VERSION,
                flags: FLAG_FLIGHT_WINDOW,
            }
            .encode(),
        )?;
        let mut result = Ok(());
        r.each(|flags, generation, bytes| {
            if result.is_ok() && flags & DEAD == 0 && (first..=last).contains(&generation) {
                result = out.write_all(bytes);
            }
        });
        result?;
        // The trace end, of the last generation (FORMAT.md section 2).
        let (end, n) = encode_batch_header(BatchKind::TraceEnd, last.max(first).max(1), 0, 0, 0);
        out.write_batch(&[&end[..n]])?;
        self.dumps.fetch_add(1, Ordering::Relaxed);
        Ok((first, last))
    }
}

impl Drop for FlightRecorder {
    fn drop(&mut self) {
        let r = self.ring.get_mut().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the mapping is ours and nothing points into it any more.
        unsafe { libc::syscall(libc::SYS_munmap, r.base.cast::<libc::c_void>(), r.cap) };
    }
}

/// The generation a batch (kind byte first) belongs to, and whether it is
/// a generation end; `None` for the trace end and anything without a
/// batch header.
fn batch_generation(batch: &[u8]) -> Option<(u64, bool)> {
    let kind = BatchKind::from_u8(*batch.first()?)?;
    if matches!(
        kind,
        BatchKind::TraceEnd | BatchKind::Compressed | BatchKind::CompressedModeled
    ) {
        return None;
    }
    let mut pos = BATCH_PREFIX_LEN;
    let generation = get_uvarint(batch, &mut pos).ok()?;
    (generation > 0).then_some((generation, kind == BatchKind::GenerationEnd))
}

/// The bytes a record of these batches takes in the ring: its head, each
/// batch with its trailer, padded to 8.
fn record_len(parts: &[&[u8]]) -> usize {
    let mut n = HEAD_LEN;
    for part in parts {
        n += part.len() + batches_in(part) * TRAILER_LEN;
    }
    n.next_multiple_of(8)
}

/// The number of whole batches laid back to back in `bytes`.
fn batches_in(mut bytes: &[u8]) -> usize {
    let mut n = 0;
    while let Some(l) = bytes.get(1..BATCH_PREFIX_LEN) {
        let len = BATCH_PREFIX_LEN + u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize;
        bytes = &bytes[len.min(bytes.len())..];
        n += 1;
    }
    n + usize::from(!bytes.is_empty())
}

impl Ring {
    /// The generations a dump holds: from the oldest kept to the newest
    /// complete, `(0, 0)` when none is complete.
    fn window(&self) -> (u64, u64) {
        let first = self.evicted + 1;
        if self.complete < first {
            (0, 0)
        } else {
            (first, self.complete)
        }
    }

    fn at(&self, pos: usize) -> *mut u8 {
        // SAFETY (for callers): pos is within the mapping.
        self.base.wrapping_add(pos)
    }

    /// The head at `pos`: (length, flags, generation).
    fn head_at(&self, pos: usize) -> (usize, u32, u64) {
        let mut h = [0u8; HEAD_LEN];
        // SAFETY: a head is written before it is read, inside the mapping
        // (pos + HEAD_LEN <= cap, checked by every caller).
        unsafe { core::ptr::copy_nonoverlapping(self.at(pos), h.as_mut_ptr(), HEAD_LEN) };
        (
            u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize,
            u32::from_le_bytes([h[4], h[5], h[6], h[7]]),
            u64::from_le_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]),
        )
    }

    fn set_head(&mut self, pos: usize, len: usize, flags: u32, generation: u64) {
        let mut h = [0u8; HEAD_LEN];
        h[..4].copy_from_slice(&(len as u32).to_le_bytes());
        h[4..8].copy_from_slice(&flags.to_le_bytes());
        h[8..].copy_from_slice(&generation.to_le_bytes());
        // SAFETY: pos + HEAD_LEN <= cap (checked by every caller).
        unsafe { core::ptr::copy_nonoverlapping(h.as_ptr(), self.at(pos), HEAD_LEN) };
    }

    /// Where the record at `pos` really starts: offset 0 when the end of
    /// the mapping has no room for a head or holds a wrap head.
    fn normalize(&self, pos: usize) -> usize {
        if self.cap - pos < HEAD_LEN || self.head_at(pos).1 & WRAP != 0 {
            0
        } else {
            pos
        }
    }

    /// Calls `f(flags, generation, bytes)` for every record, oldest first.
    fn each(&self, mut f: impl FnMut(u32, u64, &[u8])) {
        let mut pos = self.head;
        for _ in 0..self.records {
            pos = self.normalize(pos);
            let (len, flags, generation) = self.head_at(pos);
            // SAFETY: the record's bytes were written inside the mapping.
            let bytes = unsafe { core::slice::from_raw_parts(self.at(pos + HEAD_LEN), len) };
            f(flags, generation, bytes);
            pos += (HEAD_LEN + len).next_multiple_of(8);
        }
    }

    /// Where a record of `n` bytes can go now, if anywhere, and whether
    /// the log wraps to get there.
    fn room(&self, n: usize) -> Option<(usize, bool)> {
        if self.records == 0 {
            return (n <= self.cap).then_some((0, self.tail != 0));
        }
        if self.tail > self.head {
            if self.cap - self.tail >= n {
                return Some((self.tail, false));
            }
            return (n <= self.head).then_some((0, true));
        }
        // tail <= head with records: the free space is [tail, head).
        (self.head - self.tail >= n).then_some((self.tail, false))
    }

    fn append(&mut self, generation: u64, end: bool, parts: &[&[u8]]) {
        if generation <= self.evicted {
            // Its generation was evicted while still open (invariant 2).
            self.dropped += 1;
            return;
        }
        let n = record_len(parts);
        let (pos, wrap) = loop {
            if let Some(room) = self.room(n) {
                break room;
            }
            // Evict the oldest kept generation (invariant 2); when it is
            // this record's own, the record goes too.
            let oldest = self.evicted + 1;
            self.evict(oldest);
            if oldest >= generation {
                self.dropped += 1;
                return;
            }
        };
        if wrap {
            if self.records == 0 {
                self.head = 0;
            } else {
                if self.cap - self.tail >= HEAD_LEN {
                    self.set_head(self.tail, 0, WRAP, 0);
                }
                self.used += self.cap - self.tail;
            }
        } else if self.records == 0 {
            self.head = pos;
        }
        let mut at = pos + HEAD_LEN;
        for part in parts {
            let mut bytes = *part;
            while !bytes.is_empty() {
                let len = match bytes.get(1..BATCH_PREFIX_LEN) {
                    Some(l) => {
                        BATCH_PREFIX_LEN + u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize
                    }
                    None => bytes.len(),
                };
                let (batch, rest) = bytes.split_at(len.min(bytes.len()));
                let crc = batch_checksum(&[batch]).to_le_bytes();
                // SAFETY: room() found n bytes free from pos; record_len
                // counted every batch and trailer.
                unsafe {
                    core::ptr::copy_nonoverlapping(batch.as_ptr(), self.at(at), batch.len());
                    core::ptr::copy_nonoverlapping(
                        crc.as_ptr(),
                        self.at(at + batch.len()),
                        TRAILER_LEN,
                    );
                }
                at += batch.len() + TRAILER_LEN;
                bytes = rest;
            }
        }
        self.set_head(
            pos,
            at - pos - HEAD_LEN,
            if end { END } else { 0 },
            generation,
        );
        self.tail = pos + n;
        self.records += 1;
        self.used += n;
        self.high_water = self.high_water.max(self.used);
        self.newest = self.newest.max(generation);
        if end {
            self.complete = self.complete.max(generation);
        }
    }

    /// With an age: evicts the oldest generations that ended longer than
    /// the age before `now`, keeping the newest complete one.
    fn expire(&mut self, now: u64) {
        if self.age_ns == 0 {
            return;
        }
        loop {
            let oldest = self.evicted + 1;
            let (g, ended) = self.ends[oldest as usize % ENDS];
            if oldest >= self.complete || g != oldest || now.saturating_sub(ended) <= self.age_ns {
                return;
            }
            self.evict(oldest);
        }
    }

    /// Evicts generation `g` (the oldest kept): marks its records dead and
    /// reclaims the dead records at the head.
    fn evict(&mut self, g: u64) {
        self.evicted = self.evicted.max(g);
        self.evictions += 1;
        let mut pos = self.head;
        for _ in 0..self.records {
            pos = self.normalize(pos);
            let (len, flags, generation) = self.head_at(pos);
            if generation <= g && flags & DEAD == 0 {
                self.set_head(pos, len, flags | DEAD, generation);
            }
            if generation == g && flags & END != 0 {
                break;
            }
            pos += (HEAD_LEN + len).next_multiple_of(8);
        }
        // Reclaim the dead records at the head.
        while self.records > 0 {
            let pos = self.normalize(self.head);
            if pos != self.head {
                self.used -= self.cap - self.head;
                self.head = 0;
            }
            let (len, flags, _) = self.head_at(pos);
            if flags & DEAD == 0 {
                break;
            }
            let n = (HEAD_LEN + len).next_multiple_of(8);
            self.used -= n;
            self.head = pos + n;
            self.records -= 1;
        }
        if self.records == 0 {
            self.head = 0;
            self.tail = 0;
            self.used = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch of `kind` in `generation` with `body` bytes of payload
    /// after its header.
    fn batch(kind: BatchKind, generation: u64, body: usize) -> Vec<u8> {
        let (head, n) = encode_batch_header(kind, generation, 0, 0, body);
        let mut b = head[..n].to_vec();
        b.resize(n + body, 0);
        b
    }

    #[test]
    fn the_ring_keeps_the_newest_generations_within_its_size() {
        let f = FlightRecorder::new(MIN_FLIGHT_RECORDER_BYTES, 0, 0).unwrap();
        // 40 generations of 10 records of ~20 KiB: 8 MiB through a 1 MiB
        // ring, the next generation's info before each end, as an advance
        // queues them.
        for g in 1..=40u64 {
            for _ in 0..10 {
                f.append(&[], &batch(BatchKind::CompactEvents, g, 20_000));
            }
            f.append(&[], &batch(BatchKind::Info, g + 1, 10));
            f.append(&[], &batch(BatchKind::GenerationEnd, g, 4));
        }
        let s = f.stats();
        assert!(s.high_water <= s.capacity, "{s:?}");
        assert_eq!(s.last, 40);
        assert!(s.first > 1 && s.first < 40, "{s:?}");
        assert_eq!(s.evicted, s.first - 1);
        assert_eq!(s.dropped, 0);
        // Every kept generation is whole: ten events records and its end.
        let r = f.lock();
        let mut counts = std::collections::BTreeMap::new();
        r.each(|flags, g, _| {
            if flags & DEAD == 0 {
                *counts.entry(g).or_insert(0) += 1;
            }
        });
        for g in s.first..=s.last {
            assert_eq!(counts.get(&g), Some(&12), "generation {g}: {counts:?}");
        }
    }

    #[test]
    fn an_age_drops_the_generations_that_ended_before_it_but_the_newest() {
        let f = FlightRecorder::new(MIN_FLIGHT_RECORDER_BYTES, 0, 1000).unwrap();
        for g in 1..=4u64 {
            f.append(&[], &batch(BatchKind::CompactEvents, g, 100));
            f.append(&[], &batch(BatchKind::GenerationEnd, g, 4));
        }
        assert_eq!((f.stats().first, f.stats().last), (1, 4), "all recent");
        let now = crate::clock::mono_ns() + 10_000_000_000;
        {
            let mut r = f.lock();
            // Generations 1 and 2 ended 3 s before `now`, 3 half a second.
            r.ends[1] = (1, now - 3_000_000_000);
            r.ends[2] = (2, now - 3_000_000_000);
            r.ends[3] = (3, now - 500_000_000);
            r.ends[4] = (4, now - 5_000_000_000);
            r.expire(now);
        }
        let s = f.stats();
        assert_eq!((s.first, s.last), (3, 4), "{s:?}");
        {
            // The newest complete generation stays, however old.
            let mut r = f.lock();
            r.expire(now + 60_000_000_000);
        }
        let s = f.stats();
        assert_eq!((s.first, s.last), (4, 4), "{s:?}");
        // Without an age nothing is dropped for it.
        let f = FlightRecorder::new(MIN_FLIGHT_RECORDER_BYTES, 0, 0).unwrap();
        f.append(&[], &batch(BatchKind::GenerationEnd, 1, 4));
        f.append(&[], &batch(BatchKind::GenerationEnd, 2, 4));
        f.lock().expire(u64::MAX);
        assert_eq!((f.stats().first, f.stats().last), (1, 2));
    }

    #[test]
    fn a_record_larger_than_the_ring_is_dropped_with_its_generation() {
        let f = FlightRecorder::new(MIN_FLIGHT_RECORDER_BYTES, 0, 0).unwrap();
        f.append(&[], &batch(BatchKind::CompactEvents, 1, 100));
        f.append(&[], &batch(BatchKind::GenerationEnd, 1, 4));
        f.append(&[], &batch(BatchKind::CompactEvents, 2, 2 << 20));
        f.append(&[], &batch(BatchKind::GenerationEnd, 2, 4));
        let s = f.stats();
        assert_eq!((s.first, s.last), (0, 0), "{s:?}");
        assert!(s.dropped >= 2);
        f.append(&[], &batch(BatchKind::GenerationEnd, 3, 4));
        assert_eq!((f.stats().first, f.stats().last), (3, 3));
    }
}
