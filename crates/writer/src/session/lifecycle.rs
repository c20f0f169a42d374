//! The session's lifecycle: start (and start_with), advance and stop, each
//! whole under `CONTROL` (invariant 4 of session/mod.rs), and
//! `end_generation`, the handshake that completes a generation (invariants
//! 2 and 3). Stop runs in two phases around the advancer's exit
//! (invariant 5).

use core::sync::atomic::Ordering;
use std::sync::Arc;

use alloctrace_format::{BatchKind, FileHeader, FILE_HEADER_LEN, VERSION};

use crate::buffer::BufferPool;
use crate::clock;
use crate::lost::LOST_WITHOUT_SLOT;
use crate::session::advancer;
use crate::session::fork::install_fork_handlers;
use crate::session::meta::{finish_generation, write_info, MetaWriter};
use crate::session::{
    AdvancerSignals, ByteCount, Config, Control, Error, Session, SessionInfo, CONTROL, IN_CONTROL,
    SESSION,
};
use crate::shared::{inline_mode, FAST_MODE, SHARED};
use crate::thread::{self, Stream, STREAMS};
use crate::writer::flight::{FlightRecorder, FlightStats, GENERATIONS_PER_RING};
use crate::writer::output::Output;
use crate::writer::snapshot::SnapshotBytes;
use crate::writer::{self, Writer};

/// Runs `f` as a lifecycle call: refuses re-entry from the snapshot callback
/// and holds [`CONTROL`].
fn with_control<T>(f: impl FnOnce(&mut Control) -> Result<T, Error>) -> Result<T, Error> {
    if IN_CONTROL.with(|c| c.get()) {
        return Err(Error::Busy);
    }
    let mut control = CONTROL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    IN_CONTROL.with(|c| c.set(true));
    let result = f(&mut control);
    IN_CONTROL.with(|c| c.set(false));
    result
}

/// Starts tracing into `output`. `snapshot`, if any, runs once tracing is on,
/// to emit the *_exists events of memory that is already live.
pub fn start(
    config: &Config,
    output: Output,
    snapshot: Option<&mut dyn FnMut()>,
) -> Result<(), Error> {
    start_with(config, || Ok(output), snapshot)
}

/// Like [`start`], but opens the output only once the configuration and the
/// state allow the start, so a refused start never creates or truncates a
/// file.
pub fn start_with(
    config: &Config,
    open_output: impl FnOnce() -> Result<Output, Error>,
    snapshot: Option<&mut dyn FnMut()>,
) -> Result<(), Error> {
    config.validate()?;
    with_control(|control| {
        if control.session.is_some() {
            return Err(Error::AlreadyStarted);
        }
        let output = open_output()?;
        let flight = match config.flight_recorder {
            0 => None,
            size => Some(
                FlightRecorder::new(size, config.dump_on_rss, config.flight_recorder_age_ms)
                    .ok_or(Error::OutOfMemory)?,
            ),
        };
        if flight.is_none() {
            // In flight-recorder mode each dump writes its own header.
            output
                .write_all(
                    &FileHeader {
                        version: VERSION,
                        flags: 0,
                    }
                    .encode(),
                )
                .map_err(Error::Io)?;
        }
        // In flight-recorder mode generations end often enough that the
        // ring holds several (flight.rs).
        let generation_bytes = match config.flight_recorder {
            0 => config.generation_bytes,
            size => {
                let most = size / GENERATIONS_PER_RING;
                match config.generation_bytes {
                    0 => most,
                    g => g.min(most),
                }
            }
        };
        debug_assert_eq!(FILE_HEADER_LEN, 16);
        thread::set_exit_flush(crate::session::flush_exiting_thread);
        thread::ensure_exit_key();
        thread::note_process();
        install_fork_handlers();
        let asymmetric = crate::handshake::enable_asymmetric_fences();

        // Sampling's set and countdowns, before any thread can record.
        let seed = match config.sample_seed {
            // SAFETY: getpid has no preconditions.
            0 => clock::ticks() ^ (unsafe { libc::getpid() } as u64).rotate_left(32),
            seed => seed,
        };
        if !crate::sampling::start_session(config.sample_bytes, seed) {
            return Err(Error::OutOfMemory);
        }
        let max_buffers = (config.max_buffer_memory / config.buffer_size).max(64);
        let session = Arc::new(Session {
            pool: BufferPool::new(config.buffer_size, max_buffers),
            writer: match flight {
                Some(flight) => Writer::flight_recorder(output, flight),
                None => Writer::new(output, config.compress),
            },
            // An age for the flight recorder: a generation ends every
            // eighth of it, so the ring drops the old ones in steps.
            advancer: AdvancerSignals::new(config.flight_recorder_age_ms / GENERATIONS_PER_RING),
            channel: crate::session::channel::ChannelSignals::new(),
            bytes: ByteCount::new(generation_bytes),
            info: SessionInfo {
                min_heap_addr: config.min_heap_addr,
                page_size: config.page_size,
                min_heap_align: config.min_heap_align,
                min_stack_align: config.min_stack_align,
                ticks_per_sec: clock::ticks_per_sec(),
                // SAFETY: getpid has no preconditions.
                pid: unsafe { libc::getpid() } as u64,
                sample_bytes: config.sample_bytes,
            },
            command_line: crate::session::process::CommandLine::read(),
        });
        // A few small buffers ready for the first threads (BufferPool::reserve).
        session.pool.reserve(4);
        let writer = writer::spawn_writer(&session).map_err(|_| Error::OutOfMemory)?;
        let coarse = config.clock == clock::ClockKind::Coarse;
        clock::COARSE.store(coarse, Ordering::Relaxed);
        clock::publish();
        let advancer = if generation_bytes > 0 || coarse || config.flight_recorder_age_ms > 0 {
            match advancer::spawn(&session, advance_own) {
                Ok(a) => Some(a),
                Err(_) => {
                    session.writer.stop();
                    writer.join();
                    return Err(Error::OutOfMemory);
                }
            }
        } else {
            None
        };
        // No socket is no reason to refuse tracing.
        let channel = if crate::session::channel::disabled() {
            None
        } else {
            crate::session::channel::spawn(
                &session,
                crate::session::channel::Hooks {
                    flight_dump: flight_recorder_write,
                    snapshot: snapshot_bytes,
                    snapshot_write: snapshot_write_bytes,
                },
            )
            .ok()
        };

        SHARED
            .min_heap_addr
            .store(config.min_heap_addr, Ordering::Relaxed);
        SHARED
            .page_shift
            .store(config.page_size.trailing_zeros(), Ordering::Relaxed);
        SHARED
            .heap_shift
            .store(config.min_heap_align.trailing_zeros(), Ordering::Relaxed);
        SHARED
            .stack_shift
            .store(config.min_stack_align.trailing_zeros(), Ordering::Relaxed);
        // The header's inline path stamps events with rdtsc and uses only a
        // compiler fence on its side of the handshake.
        let capturing =
            config.plain_calls_capture && config.stacks != crate::stacks::capture::StackMode::None;
        // Sampling decides in the library, for every heap-object event.
        let sampling = config.sample_bytes != 0;
        let fast = match (asymmetric && cfg!(target_arch = "x86_64"), coarse) {
            (false, _) => inline_mode::OUT_OF_LINE,
            (true, false) => inline_mode::PRECISE,
            (true, true) => inline_mode::COARSE,
        };
        let mode = if capturing || sampling {
            inline_mode::OUT_OF_LINE
        } else {
            fast
        };
        SHARED.inline_mode.store(mode, Ordering::Relaxed);
        // The library's own fast path captures and samples in its callers:
        // only the clock and the fences decide it.
        FAST_MODE.store(fast, Ordering::Relaxed);
        for lost in &LOST_WITHOUT_SLOT {
            lost.store(0, Ordering::Relaxed);
        }
        // Counts left from a signal handler after the last session ended
        // belong to no generation of this trace.
        for slot in thread::used_slots() {
            for lost in &slot.lost {
                lost.store(0, Ordering::Relaxed);
            }
        }
        SESSION.store(Arc::as_ptr(&session).cast_mut(), Ordering::SeqCst);
        crate::stacks::capture::set_up(config.stacks, config.stack_depth, after_modules_refresh);

        write_info(&session, 1);
        crate::stacks::capture::first_generation_started();
        SHARED.generation.store(1, Ordering::SeqCst);
        control.session = Some(session);
        control.writer = Some(writer);
        control.advancer = advancer;
        control.channel = channel;
        Ok(())
    })?;
    if let Some(snapshot) = snapshot {
        IN_CONTROL.with(|c| c.set(true));
        snapshot();
        IN_CONTROL.with(|c| c.set(false));
    }
    Ok(())
}

/// Ends the current generation and starts the next.
pub fn advance() -> Result<(), Error> {
    advance_session(None)
}

/// The advancer thread's advance (advancer.rs): of its own session only.
fn advance_own(session: &Session) {
    let _ = advance_session(Some(session));
}

/// [`advance`], of `only` if given: `NotStarted` when the running session
/// is another one (the advancer thread of a session that has stopped).
fn advance_session(only: Option<&Session>) -> Result<(), Error> {
    with_control(|control| {
        let session = control.session.as_ref().ok_or(Error::NotStarted)?;
        if only.is_some_and(|only| !core::ptr::eq(only, Arc::as_ptr(session))) {
            return Err(Error::NotStarted);
        }
        let old = SHARED.generation.load(Ordering::Relaxed);
        let new = old + 1;
        wait_for_parity(session, new);
        write_info(session, new);
        if clock::COARSE.load(Ordering::Relaxed) {
            // After the new generation's start time was read, before any
            // event can be in it: its coarse times are never before its start.
            clock::publish();
        }
        end_generation(session, old, new);
        Ok(())
    })
}

/// Flight-recorder mode: writes the last complete generations the ring
/// holds to `out`, as a trace of its own (the flight-recorder window,
/// FORMAT.md section 1). The current generation is ended first (as an
/// advance), and the dump waits until the writer has put it in the ring,
/// so the dump runs up to this call. Returns the first and last
/// generations written. The writer thread waits while the dump holds the
/// ring; producers wait only if the buffers run out meanwhile.
///
/// Errors: `NotStarted` without a session, `BadConfig` when the session is
/// not in flight-recorder mode, `Busy` from the snapshot callback, `Io`
/// when writing fails.
pub fn flight_recorder_write(out: &Output) -> Result<(u64, u64), Error> {
    let (session, ended) = with_control(|control| {
        let session = control.session.clone().ok_or(Error::NotStarted)?;
        if session.writer.flight.is_none() {
            return Err(Error::BadConfig(
                "the session is not in flight-recorder mode (flight_recorder is 0)",
            ));
        }
        let old = SHARED.generation.load(Ordering::Relaxed);
        let new = old + 1;
        wait_for_parity(&session, new);
        write_info(&session, new);
        if clock::COARSE.load(Ordering::Relaxed) {
            clock::publish();
        }
        end_generation(&session, old, new);
        Ok((session, old))
    })?;
    while session.writer.ended.load(Ordering::Acquire) < ended && !session.writer.thread.is_done() {
        session.writer.wake();
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    let flight = session.writer.flight.as_ref().ok_or(Error::NotStarted)?;
    flight.dump(out).map_err(Error::Io)
}

/// What the running program has live now, and where it was allocated:
/// the writer thread's live table (writer/live.rs) written as a snapshot
/// trace (writer/snapshot.rs) to `out`. The current generation is ended
/// first (as an advance), so the snapshot holds every event up to this
/// call. In sampling mode the table is the sampled set: the snapshot's
/// info batch carries `sample_bytes`, and readers show estimates.
///
/// Callable from any thread but the writer's and a snapshot callback,
/// the control thread included; never from a signal handler (it waits
/// and allocates). The program's threads never wait for it.
///
/// Errors: `NotStarted` without a session, `BadConfig` in flight-recorder
/// mode or with the live table off (`ALLOCTRACE_LIVE_TABLE=off`), `Busy`
/// from the snapshot callback, `Io` when writing fails (`EIO` when the
/// writer thread could not make the snapshot).
pub fn snapshot_write(out: &Output) -> Result<(), Error> {
    snapshot_write_bytes(out, &snapshot_bytes()?)
}

/// Writes a snapshot trace [`snapshot_bytes`] made to `out`.
pub fn snapshot_write_bytes(out: &Output, bytes: &SnapshotBytes) -> Result<(), Error> {
    out.write_all(bytes.as_slice()).map_err(Error::Io)
}

/// [`snapshot_write`]'s snapshot trace, in memory of the tracer's own,
/// for a caller that checks the session before it opens its output.
pub fn snapshot_bytes() -> Result<SnapshotBytes, Error> {
    // The writer thread answers: it must not be the one waiting.
    if IN_CONTROL.with(|c| c.get()) || writer::on_writer_thread() {
        return Err(Error::Busy);
    }
    let session = {
        let control = CONTROL.lock().unwrap_or_else(|p| p.into_inner());
        control.session.clone().ok_or(Error::NotStarted)?
    };
    if session.writer.flight.is_some() {
        return Err(Error::BadConfig(
            "flight-recorder mode keeps no live table: use trace_flight_recorder_write",
        ));
    }
    if !session.writer.snapshot.enabled {
        return Err(Error::BadConfig(
            "no live table: full mode keeps one only with ALLOCTRACE_LIVE_TABLE=on, sampling mode unless ALLOCTRACE_LIVE_TABLE=off",
        ));
    }
    let wanted = SHARED.generation.load(Ordering::Acquire);
    advance_session(Some(&session))?;
    crate::writer::snapshot::ask(
        &session.writer.snapshot,
        wanted,
        || session.writer.thread.is_done(),
        || session.writer.wake(),
    )
    .map_err(|_| Error::Io(libc::EIO))
}

/// The flight recorder's accounting, when the running session has one.
pub fn flight_stats() -> Option<FlightStats> {
    let control = CONTROL.lock().unwrap_or_else(|p| p.into_inner());
    control
        .session
        .as_ref()?
        .writer
        .flight
        .as_ref()
        .map(|f| f.stats())
}

/// Waits until the writer thread has passed the end of generation
/// `new - 2`, whose parity `new` takes over: until then it may still be
/// listing that generation's stack-table entries, by their marks of that
/// parity (call_stack_table.rs invariant 4). The writer never waits for
/// CONTROL, so this ends; it is immediate unless advances come faster
/// than the writer writes.
fn wait_for_parity(session: &Session, new: u64) {
    let Some(previous) = new.checked_sub(2).filter(|&g| g > 0) else {
        return;
    };
    while session.writer.ended.load(Ordering::Acquire) < previous {
        session.writer.wake();
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// After a refresh of the module table (stacks/capture `modules_changed`):
/// when a module was found unloaded, starts a new generation, so that the
/// loader reusing the module's range for another object never has two
/// modules at one range in a generation, nor one stack ID name both
/// (docs/FORMAT.md section 10). A generation's own end (which refreshes
/// first) needs none; the writer thread, which must not wait for an
/// advance, asks the advancer thread for one.
pub(crate) fn after_modules_refresh() {
    if !crate::stacks::module_table::take_unloaded() || IN_CONTROL.with(|c| c.get()) {
        return;
    }
    if writer::on_writer_thread() {
        let session = SESSION.load(Ordering::Acquire);
        if !session.is_null() {
            // SAFETY: the writer thread runs inside its session, which
            // stop frees only after joining it.
            let advancer = unsafe { &(*session).advancer };
            advancer.wanted.store(true, Ordering::Release);
            advancer.thread.wake();
        }
        return;
    }
    let _ = advance();
}

/// Flushes everything, ends the trace and closes the output (a path it
/// opened; a descriptor the caller passed stays open). Returns the first
/// write error, if any: EBADF when the program closed or replaced the
/// output's descriptor (output.rs), which is then not closed.
pub fn stop() -> Result<(), Error> {
    stop_as(false)
}

/// [`stop`] for a process that is exiting: events that come after it
/// (threads still running, exit handlers that run later), passed to
/// [`late_event`](crate::late_event), are counted as lost events of the
/// trace's last generation, rewritten in place in the file (late.rs).
pub fn stop_at_exit() -> Result<(), Error> {
    stop_as(true)
}

fn stop_as(at_exit: bool) -> Result<(), Error> {
    // The advancer may be waiting for CONTROL inside advance(): ask it to
    // stop and wait for it without holding CONTROL. Wait on a flag, not by
    // joining: a join frees memory on this thread, which must not happen
    // while tracing is on (a traced allocator would see it).
    let session = with_control(|control| {
        let session = control.session.clone().ok_or(Error::NotStarted)?;
        session.advancer.exit.store(true, Ordering::Release);
        session.advancer.thread.wake();
        Ok(session)
    })?;
    if session.advancer.thread.started() {
        while !session.advancer.thread.is_done() {
            std::thread::yield_now();
        }
    }
    // The control thread too: it may be inside an advance (a snapshot).
    crate::session::channel::tell_exit(&session);
    with_control(|control| {
        // Between the two phases another thread may have stopped this
        // session and started a new one: that one is not ours to end (its
        // advancer was never told to exit, so joining it would never
        // return), and ours is already stopped.
        if !control
            .session
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, &session))
        {
            return Err(Error::NotStarted);
        }
        drop(session);
        let session = control.session.take().ok_or(Error::NotStarted)?;
        let last = SHARED.generation.load(Ordering::Relaxed);
        if at_exit {
            crate::writer::late::reset();
            session.writer.raw_end.store(true, Ordering::Release);
        }
        end_generation(&session, last, 0);
        crate::sampling::stop_session();
        crate::stacks::capture::tear_down();
        let mut end = MetaWriter::new(&session, BatchKind::TraceEnd, last);
        end.finish();
        SESSION.store(core::ptr::null_mut(), Ordering::SeqCst);
        session.writer.stop();
        if let Some(writer) = control.writer.take() {
            writer.join();
        }
        if let Some(advancer) = control.advancer.take() {
            advancer.join();
        }
        if let Some(channel) = control.channel.take() {
            channel.join();
        }
        let errno = session.writer.io_error.load(Ordering::Relaxed);
        if at_exit && errno == 0 {
            let end = session
                .writer
                .end_batch
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .take();
            if let Some(end) = end {
                crate::writer::late::arm(&session.writer.output, &end);
            }
        }
        // Leaves a descriptor the program closed or replaced alone.
        let close_result = session.writer.output.close();
        drop(session);
        match (errno, close_result) {
            (0, Ok(())) => Ok(()),
            (0, Err(e)) | (e, _) => Err(Error::Io(e)),
        }
    })
}

/// Stores `new` as the generation (0 to stop), waits for every thread to
/// leave the old one, and completes the old generation in the trace.
fn end_generation(session: &Session, old: u64, new: u64) {
    if new != 0 {
        // Every thread that writes now needs a fresh (small) buffer in the
        // new generation: have them ready (BufferPool::reserve).
        let writing = thread::used_slots()
            .iter()
            .filter(|s| {
                !s.bufs[(old & 1) as usize][Stream::Events as usize]
                    .load(Ordering::Relaxed)
                    .is_null()
            })
            .count();
        session.pool.reserve(writing + 2);
    }
    SHARED.generation.store(new, Ordering::SeqCst);
    crate::handshake::heavy_barrier();
    session.bytes.generation_start.store(
        session.bytes.written.load(Ordering::Relaxed),
        Ordering::Relaxed,
    );
    session.advancer.wanted.store(false, Ordering::Relaxed);
    let slots = thread::used_slots();
    for slot in slots {
        slot.seq.wait_quiescent();
    }
    let parity = (old & 1) as usize;
    let mut lost = LOST_WITHOUT_SLOT[parity].swap(0, Ordering::Relaxed);
    for slot in slots {
        for stream in 0..STREAMS {
            if let Some(buf) = slot.take_buffer(parity, stream) {
                session.hand_over(buf);
            }
        }
        lost += slot.lost[parity].swap(0, Ordering::Relaxed);
    }
    finish_generation(
        session,
        old,
        lost,
        new == 0 && session.writer.raw_end.load(Ordering::Relaxed),
    );
}
