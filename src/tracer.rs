//! [`Tracer`]: the safe way for a Rust program to start a trace, a
//! builder over the session's [`Config`] (the C API's `trace_config`), and
//! [`TracerGuard`], which stops it when dropped.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use alloctrace_writer::capture::StackMode;
use alloctrace_writer::{ClockKind, Config, Error, Output};

use crate::heap_stats;

/// Where the trace goes.
#[derive(Clone, Debug)]
enum Destination {
    Path(PathBuf),
    Fd(i32),
}

/// A trace's settings, then [`start`](Tracer::start). The defaults are
/// those of `alloctrace record`: every allocation, with its full call
/// stack, the precise clock, no compression, the file
/// `alloctrace-PID.trace` in the working directory.
///
/// ```
/// # fn main() -> Result<(), alloctrace::Error> {
/// # let path = std::env::temp_dir().join(format!("tracer-doc-{}.trace", std::process::id()));
/// let guard = alloctrace::Tracer::new()
///     .path(&path)
///     .compression(true)
///     .sample_bytes(512 * 1024)
///     .start()?;
/// // ... the work to trace ...
/// guard.stop()?; // or drop it
/// # std::fs::remove_file(&path).ok();
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Tracer {
    destination: Destination,
    config: Config,
}

impl Default for Tracer {
    fn default() -> Tracer {
        Tracer::new()
    }
}

impl Tracer {
    /// The defaults (type docs).
    pub fn new() -> Tracer {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let page_size = if page > 0 { page as u64 } else { 4096 };
        Tracer {
            destination: Destination::Path(PathBuf::from(format!(
                "alloctrace-{}.trace",
                std::process::id()
            ))),
            config: Config {
                page_size,
                // Rust's System allocator (glibc, musl) aligns every block
                // to 16 bytes on 64-bit targets; other allocators at least
                // to the word.
                min_heap_align: core::mem::size_of::<usize>() as u64,
                min_stack_align: page_size,
                stacks: StackMode::Full,
                plain_calls_capture: true,
                ..Config::default()
            },
        }
    }

    /// Writes the trace to the file `path` (created mode 0600, replaced if
    /// it exists).
    ///
    /// ```
    /// let tracer = alloctrace::Tracer::new().path("run.trace");
    /// ```
    pub fn path(mut self, path: impl AsRef<Path>) -> Tracer {
        self.destination = Destination::Path(path.as_ref().to_path_buf());
        self
    }

    /// Writes the trace to the open descriptor `fd` (a pipe, a socket, a
    /// file at its offset), which stays open after the stop.
    ///
    /// ```
    /// let tracer = alloctrace::Tracer::new().fd(3);
    /// ```
    pub fn fd(mut self, fd: i32) -> Tracer {
        self.destination = Destination::Fd(fd);
        self
    }

    /// The coarse clock (true): cheaper events, stamped with a time the
    /// tracer publishes every millisecond; the precise one (false, the
    /// default) reads the clock at every event.
    ///
    /// ```
    /// let tracer = alloctrace::Tracer::new().coarse_clock(true);
    /// ```
    pub fn coarse_clock(mut self, coarse: bool) -> Tracer {
        self.config.clock = if coarse {
            ClockKind::Coarse
        } else {
            ClockKind::Precise
        };
        self
    }

    /// Whether each allocation carries its full call stack (the default)
    /// or none (cheaper).
    ///
    /// ```
    /// let tracer = alloctrace::Tracer::new().stacks(false);
    /// ```
    pub fn stacks(mut self, full: bool) -> Tracer {
        self.config.stacks = if full {
            StackMode::Full
        } else {
            StackMode::None
        };
        self
    }

    /// The call stacks' depth limit in frames, 1 to 256 (default 128).
    ///
    /// ```
    /// let tracer = alloctrace::Tracer::new().stack_depth(64);
    /// ```
    pub fn stack_depth(mut self, frames: usize) -> Tracer {
        self.config.stack_depth = frames;
        self
    }

    /// Compresses the trace's batches with zstd on the writer thread.
    ///
    /// ```
    /// let tracer = alloctrace::Tracer::new().compression(true);
    /// ```
    pub fn compression(mut self, zstd: bool) -> Tracer {
        self.config.compress = zstd;
        self
    }

    /// Bytes per thread buffer, 4096 to 16 MiB (default 64 KiB).
    ///
    /// ```
    /// let tracer = alloctrace::Tracer::new().buffer_size(1 << 20);
    /// ```
    pub fn buffer_size(mut self, bytes: usize) -> Tracer {
        self.config.buffer_size = bytes;
        self
    }

    /// Sampling mode: records about one allocation per `bytes` allocated
    /// (and the frees of those), while counting every one exactly; 0 (the
    /// default) records every allocation. 512 KiB is the production
    /// setting.
    ///
    /// ```
    /// let tracer = alloctrace::Tracer::new().sample_bytes(512 * 1024);
    /// ```
    pub fn sample_bytes(mut self, bytes: u64) -> Tracer {
        self.config.sample_bytes = bytes;
        self
    }

    /// Flight-recorder mode: keeps the last generations in a ring of
    /// `bytes` (1 MiB to 1 TiB) and writes them only when asked
    /// ([`flight_recorder_write`](crate::flight_recorder_write), a crash
    /// under the shim, [`dump_on_rss`](Tracer::dump_on_rss)); 0 (the
    /// default): off.
    ///
    /// ```
    /// let tracer = alloctrace::Tracer::new().flight_recorder(64 << 20);
    /// ```
    pub fn flight_recorder(mut self, bytes: u64) -> Tracer {
        self.config.flight_recorder = bytes;
        self
    }

    /// With the flight recorder: keep only the generations of the last
    /// `ms` milliseconds (1000 to a week).
    ///
    /// ```
    /// let tracer = alloctrace::Tracer::new().flight_recorder(64 << 20).flight_recorder_age_ms(30_000);
    /// ```
    pub fn flight_recorder_age_ms(mut self, ms: u64) -> Tracer {
        self.config.flight_recorder_age_ms = ms;
        self
    }

    /// With the flight recorder: write the ring to the trace once, the
    /// first time the process's resident memory reaches `bytes`.
    ///
    /// ```
    /// let tracer = alloctrace::Tracer::new().flight_recorder(64 << 20).dump_on_rss(2 << 30);
    /// ```
    pub fn dump_on_rss(mut self, bytes: u64) -> Tracer {
        self.config.dump_on_rss = bytes;
        self
    }

    /// The bytes after which the tracer ends a generation (default 16
    /// MiB; 0: only at [`advance`](crate::advance)).
    ///
    /// ```
    /// let tracer = alloctrace::Tracer::new().generation_bytes(4 << 20);
    /// ```
    pub fn generation_bytes(mut self, bytes: u64) -> Tracer {
        self.config.generation_bytes = bytes;
        self
    }

    /// The session's configuration as it stands, for what has no method.
    ///
    /// ```
    /// let tracer = alloctrace::Tracer::new().sample_bytes(4096);
    /// assert_eq!(tracer.config().sample_bytes, 4096);
    /// ```
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Starts tracing; tracing stops when the guard drops (or at
    /// [`TracerGuard::stop`], which says whether the trace was written
    /// whole). Refused (before any file is created) when a setting is out
    /// of range ([`Error::BadConfig`] names it) or tracing is already on
    /// ([`Error::AlreadyStarted`]).
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("start-doc-{}.trace", std::process::id()));
    /// let guard = alloctrace::Tracer::new().path(&path).start().unwrap();
    /// assert!(alloctrace::Tracer::new().path(&path).start().is_err(), "one session at a time");
    /// drop(guard);
    /// # std::fs::remove_file(&path).ok();
    /// ```
    pub fn start(self) -> Result<TracerGuard, Error> {
        // Everything of `self` is dropped inside start_with, before tracing
        // is on: a free once it is on would be of a block the trace never
        // saw allocated.
        let Tracer {
            destination,
            config,
        } = self;
        heap_stats::reset();
        alloctrace_writer::start_with(
            &config,
            move || match destination {
                Destination::Path(path) => {
                    let c = CString::new(path.as_os_str().as_bytes())
                        .map_err(|_| Error::BadConfig("path contains a NUL byte"))?;
                    Output::create(&c).map_err(Error::Io)
                }
                Destination::Fd(fd) if fd >= 0 => Ok(Output::borrowed_fd(fd)),
                Destination::Fd(_) => Err(Error::BadConfig("fd must not be negative")),
            },
            None,
        )?;
        Ok(TracerGuard { stopped: false })
    }
}

/// A running trace, from [`Tracer::start`]: dropping it stops tracing and
/// flushes the trace (errors then go unreported: call
/// [`stop`](TracerGuard::stop) to see them).
#[must_use = "dropping the guard stops tracing at once"]
#[derive(Debug)]
pub struct TracerGuard {
    stopped: bool,
}

impl TracerGuard {
    /// Stops tracing, writes what is left and closes the trace; the first
    /// write error, if any (the trace is then cut short).
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("stop-doc-{}.trace", std::process::id()));
    /// let guard = alloctrace::Tracer::new().path(&path).start().unwrap();
    /// guard.stop().expect("the trace is complete");
    /// # std::fs::remove_file(&path).ok();
    /// ```
    pub fn stop(mut self) -> Result<(), Error> {
        self.stopped = true;
        alloctrace_writer::stop()
    }
}

impl Drop for TracerGuard {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = alloctrace_writer::stop();
        }
    }
}
