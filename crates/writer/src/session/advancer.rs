//! The advancer thread: ends a generation once the writer has written
//! `generation_bytes` of it (the writer asks, `WriterHost::count_written`
//! in session/mod.rs), so a reader never holds more than about two budgets in
//! memory; with the coarse clock it also publishes the time.
//!
//! It is not the writer thread: an advance waits for producers, which may
//! be waiting for the writer. Relies on invariant 5 of session/mod.rs: it
//! advances only its own session, and its `advance` is given by the
//! lifecycle (lifecycle.rs, which is above this file) as a function.

use core::sync::atomic::Ordering;
use std::sync::Arc;

use crate::clock;
use crate::session::Session;
use crate::thread::{self, InternalThread};

/// How often the advancer looks at its flags when nobody wakes it (with the
/// precise clock; with the coarse one, [`clock::COARSE_PERIOD`]).
const PERIOD: std::time::Duration = std::time::Duration::from_millis(100);

/// Starts the advancer thread of `session` and returns once it is ready
/// (`thread::spawn_ready`). `advance` ends the current generation of the
/// session it is given, and only of that session (invariant 5).
pub(crate) fn spawn(
    session: &Arc<Session>,
    advance: fn(&Session),
) -> std::io::Result<InternalThread> {
    thread::spawn_ready(
        c"alloctrace-advancer",
        session,
        |s| &s.advancer.thread,
        |_| (),
        move |s, ()| run(s, advance),
    )
}

/// The advancer's loop, until stop (or a fatal-signal flush) sets `exit`.
fn run(session: &Session, advance: fn(&Session)) {
    let signals = &session.advancer;
    // With the coarse clock this thread also publishes the time.
    let coarse = clock::COARSE.load(Ordering::Relaxed);
    let mut period = if coarse { clock::COARSE_PERIOD } else { PERIOD };
    let every = std::time::Duration::from_millis(signals.every_ms);
    if signals.every_ms > 0 {
        period = period.min(every);
    }
    let mut last = std::time::Instant::now();
    while !signals.exit.load(Ordering::Acquire) {
        std::thread::park_timeout(period);
        if coarse {
            clock::publish();
        }
        let due = signals.every_ms > 0 && last.elapsed() >= every;
        // Wanted: the generation is over its budget, or a module was
        // unloaded (lifecycle.rs `after_modules_refresh`); or due.
        if (signals.wanted.swap(false, Ordering::AcqRel) || due)
            && !signals.exit.load(Ordering::Acquire)
        {
            last = std::time::Instant::now();
            // This session's generation only: never one of a session
            // started after this one was stopped.
            advance(session);
        }
    }
}
