//! The two threads of `alloctrace stats`: the reading thread decodes the
//! trace and hands the events, in order and in chunks, to a counting
//! thread (through analysis's [`Feed`], as `Pass` does). The results are those of counting every event in
//! order on one thread.

use alloctrace_analysis::{Feed, Shape, Work};
use alloctrace_reader::{Clock, Step};

use super::count::{Op, Reading, Tally};
use super::Stats;
use crate::failure::Failure;
use crate::input::{open, Input};
use crate::progress::Progress;

/// How the reading thread hands events to the counting thread: chunks of
/// 2,048 events (40 bytes each), and no queue: a chunk is handed straight
/// to the counting thread, which is faster than the reading one and waits
/// for it (a queue gained no time and cost a chunk of memory; fewer events
/// per chunk cost more hand-overs: bench/README.md).
const SHAPE: Shape = Shape {
    chunk: 2048,
    queue: 0,
};

/// The header of the counting thread's chunks: their events' generation
/// and its clock, for the times the counting thread needs.
type Generation = (u64, Option<Clock>);

impl Work<Op, Generation> for Tally {
    fn chunk(&mut self, &(generation, clock): &Generation, ops: &[Op]) {
        self.count(ops, generation, clock.as_ref());
    }
}

/// Reads the whole trace into a [`Stats`]. Fails on a malformed trace or an
/// I/O error.
pub fn collect(input: &Input) -> Result<Stats, Failure> {
    let mut reader = open(input)?;
    let size = input.size();
    let mut stats = Stats::new(size);
    let mut reading = Reading::default();
    let mut progress = Progress::new(size);
    let (result, tally) = std::thread::scope(|scope| {
        let mut feed = Feed::start(
            scope,
            "alloctrace-count",
            SHAPE,
            (0, None),
            Tally::default(),
        )
        .map_err(|e| Failure::Io(format!("cannot start a thread: {e}")))?;
        // The clock of the generation being read: events come only after
        // their generation's start, which sets it.
        let mut clock = None;
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
                    // Times grow with ticks within a generation, so the
                    // last event handed out is its latest so far.
                    if let Some(clock) = clock {
                        stats.duration_ns =
                            stats.duration_ns.max(clock.time_ns(reading.last_ticks));
                    }
                    progress.update(reader.bytes_read());
                }
                Ok(Step::GenerationStart { generation }) => {
                    reading.generation_start(&mut stats, &reader);
                    clock = reader.clock();
                    if clock.is_some() {
                        feed.open((generation, clock));
                    }
                }
                Ok(Step::End) => break Ok(()),
                Err(err) => break Err(err),
            }
        };
        progress.finish();
        // Waited for even after an error: no thread outlives the result.
        let tally = feed
            .finish()
            .map_err(|_| Failure::Io("internal error: the counting thread failed".into()));
        Ok::<_, Failure>((result, tally))
    })?;
    result?;
    tally?.finish(&mut stats);
    reading.finish(&mut stats);
    stats.total_events = stats.counts.iter().sum();
    stats.generations = reader.generations();
    stats.lost_events = reader.lost_events();
    stats.lost_stacks = reader.lost_stacks();
    stats.truncated_at = reader.truncated();
    if stats.bytes == 0 {
        stats.bytes = reader.bytes_read();
    }
    Ok(stats)
}
