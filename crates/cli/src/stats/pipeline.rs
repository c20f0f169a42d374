//! The two threads of `alloctrace stats`: the reading thread decodes the
//! trace and hands the events, in order and in chunks, to a counting
//! thread (see [`Feed`]). The results are those of counting every event in
//! order on one thread.

use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::{self, JoinHandle};

use alloctrace_reader::{Clock, Step};

use super::count::{Op, Reading, Tally};
use super::Stats;
use crate::failure::Failure;
use crate::input::{open, Input};
use crate::progress::Progress;

/// Events of one generation, handed to the counting thread in order, and
/// handed back to be filled again.
struct Chunk {
    ops: Vec<Op>,
    generation: u64,
    /// The generation's clock, for the times the counting thread needs.
    clock: Option<Clock>,
}

/// Events per chunk: each chunk costs the threads a hand-over (a wake-up
/// of the counting thread, when it waits: half as many per chunk cost
/// measurably more time; bench/README.md), and memory: 40 bytes an event,
/// [`CHUNKS`] chunks.
const CHUNK: usize = 2048;

/// Full chunks waiting for the counting thread, at most. None: a chunk is
/// handed straight to the counting thread, which is faster than the
/// reading one and waits for it (a queue gained no time and cost a chunk
/// of memory).
const QUEUE: usize = 0;

/// Chunks in all: one being filled, the waiting ones, one being counted.
const CHUNKS: usize = QUEUE + 2;

impl Chunk {
    fn new() -> Chunk {
        Chunk {
            ops: Vec::with_capacity(CHUNK),
            generation: 0,
            clock: None,
        }
    }
}

/// The counting thread and the chunks on their way to it: the reading
/// thread decodes events and hands them over; the counting thread counts
/// them, in the same order, into a [`Tally`].
pub(super) struct Feed {
    chunk: Chunk,
    /// Chunks made so far, at most [`CHUNKS`].
    chunks: usize,
    to_counter: SyncSender<Chunk>,
    returned: Receiver<Chunk>,
    counter: JoinHandle<Tally>,
}

impl Feed {
    pub(super) fn start() -> Result<Feed, Failure> {
        let (to_counter, work) = mpsc::sync_channel::<Chunk>(QUEUE);
        let (give_back, returned) = mpsc::channel::<Chunk>();
        let counter = thread::Builder::new()
            .name("alloctrace-count".into())
            .spawn(move || {
                let mut tally = Tally::default();
                for chunk in work {
                    tally.count(&chunk.ops, chunk.generation, chunk.clock.as_ref());
                    // The reading thread may have stopped (an error).
                    let _ = give_back.send(chunk);
                }
                tally
            })
            .map_err(|e| Failure::Io(format!("cannot start a thread: {e}")))?;
        Ok(Feed {
            chunk: Chunk::new(),
            chunks: 1,
            to_counter,
            returned,
            counter,
        })
    }

    #[inline(always)]
    pub(super) fn push(&mut self, op: Op) {
        self.chunk.ops.push(op);
        if self.chunk.ops.len() >= CHUNK {
            self.send();
        }
    }

    /// Readies the chunk for the events of `generation` to come, sending
    /// the one being filled if it holds another generation's.
    pub(super) fn open(&mut self, generation: u64, clock: Clock) {
        if self.chunk.generation != generation && !self.chunk.ops.is_empty() {
            self.send();
        }
        if self.chunk.ops.is_empty() {
            self.chunk.generation = generation;
            self.chunk.clock = Some(clock);
        }
    }

    /// Hands the chunk over and starts another of the same generation: one
    /// handed back, or a new one while fewer than [`CHUNKS`] exist.
    #[inline(never)]
    fn send(&mut self) {
        let next = match self.returned.try_recv() {
            Ok(chunk) => Some(chunk),
            Err(_) if self.chunks < CHUNKS => {
                self.chunks += 1;
                Some(Chunk::new())
            }
            // Every chunk is out: wait for one.
            Err(_) => self.returned.recv().ok(),
        };
        // None, or a failed send: the counting thread is gone (it
        // panicked; `finish` says so). The chunk is emptied and refilled.
        let Some(mut next) = next else {
            self.chunk.ops.clear();
            return;
        };
        next.ops.clear();
        next.generation = self.chunk.generation;
        next.clock = self.chunk.clock;
        let full = std::mem::replace(&mut self.chunk, next);
        if let Err(mpsc::SendError(mut full)) = self.to_counter.send(full) {
            full.ops.clear();
            self.chunk = full;
        }
    }

    /// Waits for the counting thread to count every event.
    pub(super) fn finish(self) -> Result<Tally, Failure> {
        let Feed {
            chunk,
            to_counter,
            returned,
            counter,
            ..
        } = self;
        if !chunk.ops.is_empty() {
            let _ = to_counter.send(chunk);
        }
        drop((to_counter, returned));
        counter
            .join()
            .map_err(|_| Failure::Io("internal error: the counting thread failed".into()))
    }
}

/// Reads the whole trace into a [`Stats`]. Fails on a malformed trace or an
/// I/O error.
pub fn collect(input: &Input) -> Result<Stats, Failure> {
    let mut reader = open(input)?;
    let size = input.size();
    let mut stats = Stats::new(size);
    let mut reading = Reading::default();
    let mut feed = Feed::start()?;
    // The clock of the generation being read: events come only after
    // their generation's start, which sets it.
    let mut clock = None;
    let mut progress = Progress::new(size);
    let result = loop {
        let step = match clock {
            Some(clock) => reader.next_step(
                1 << 16,
                #[inline(always)]
                |e| {
                    if let Some(op) = reading.event(&mut stats, e, &clock) {
                        feed.push(op);
                    }
                },
            ),
            None => reader.next_step(1, |_| {}),
        };
        match step {
            Ok(Step::Events(_)) => {
                // Times grow with ticks within a generation, so the last
                // event handed out is its latest so far.
                if let Some(clock) = clock {
                    stats.duration_ns = stats.duration_ns.max(clock.time_ns(reading.last_ticks));
                }
                progress.update(reader.bytes_read());
            }
            Ok(Step::GenerationStart { generation }) => {
                reading.generation_start(&mut stats, &reader);
                clock = reader.clock();
                if let Some(clock) = clock {
                    feed.open(generation, clock);
                }
            }
            Ok(Step::End) => break Ok(()),
            Err(err) => break Err(err),
        }
    };
    progress.finish();
    // Waited for even after an error: no thread outlives the result.
    let tally = feed.finish();
    result?;
    tally?.finish(&mut stats);
    reading.finish(&mut stats);
    stats.total_events = stats.counts.iter().sum();
    stats.generations = reader.generations();
    stats.lost_events = reader.lost_events();
    stats.lost_stacks = reader.lost_stacks();
    stats.truncated_at = reader.truncated();
    if reader.flight_window() {
        // A window of the run: memory allocated before it may be freed in
        // it, which is no anomaly.
        stats.flight_window = true;
        stats.frees_before_window = std::mem::take(&mut stats.maps.unknown_free);
        if stats
            .first_anomaly
            .as_ref()
            .is_some_and(|a| a.ends_with(super::count::WHAT_UNKNOWN_FREE))
        {
            stats.first_anomaly = None;
        }
    }
    if stats.bytes == 0 {
        stats.bytes = reader.bytes_read();
    }
    Ok(stats)
}
