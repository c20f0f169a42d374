//! The C API: `include/alloctrace.h` is generated from this file by cbindgen.
//!
//! Conventions (after rustls-ffi):
//! - every export is `#[no_mangle] pub extern "C" fn trace_*`;
//! - lifecycle calls return a [`trace_result`] and run their body inside a
//!   panic guard, so a panic never unwinds into C;
//! - the other calls that run Rust code of some depth (`trace_writer_get`,
//!   `trace_thread_id`, `trace_thread_destroy`, `trace_type_register`) run
//!   it inside the same guard (`ffi_guard_or!`), returning NULL, 0 or
//!   nothing if it panicked;
//! - event calls (`trace_span_*`, `trace_heap_object_*`, `trace_stack_*`,
//!   `trace_page_*`) return nothing and cannot fail loudly: odd arguments
//!   are recorded faithfully (long form) and unrecordable events are
//!   counted in the trace. They hold no panic guard because they cannot
//!   panic, and a guard costs: `catch_unwind` around their body made the
//!   disabled and the enabled call measurably slower (bench/README.md,
//!   "The C API's panic guard", has the figures). The proof is written where
//!   the operations are (emit.rs `write_event_fast`, `append_event`,
//!   `write_page_event`; buffer.rs `Buffer::room`, `begin`, `put_bytes`,
//!   `seal`): the caller's values (addresses, sizes, npages, type IDs)
//!   meet only wrapping, bitwise and comparison operations; shifts come
//!   from the validated config; indexes are a generation's parity into
//!   arrays of two; buffer lengths stay within capacity by construction.
//!   (A panic there would abort the process rather than unwind into C:
//!   `extern "C"` functions abort on unwind.)
//! - `trace_config_init`, `trace_enabled`, `trace_result_str` and
//!   `trace_last_error_detail` hold no guard either: a struct write, a
//!   load, a search of a constant array, and a pointer into a
//!   const-initialised thread-local without a destructor (so its `with`
//!   cannot fail).

use core::ffi::{c_char, c_int, c_void, CStr};

use alloctrace_writer::capture::{self, StackMode};
use alloctrace_writer::{self as tracer, events, ClockKind, Config, Error, Output};

/// The result of a lifecycle call.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum trace_result {
    /// Success.
    TRACE_OK = 0,
    /// A required pointer argument was NULL.
    TRACE_ERR_NULL_ARGUMENT = 1,
    /// A field of `trace_config` is invalid; `trace_last_error_detail()`
    /// names it.
    TRACE_ERR_BAD_CONFIG = 2,
    /// `trace_start` while tracing is already on.
    TRACE_ERR_ALREADY_STARTED = 3,
    /// `trace_stop` or `trace_advance` while tracing is off.
    TRACE_ERR_NOT_STARTED = 4,
    /// The output could not be created or written; errno is in
    /// `trace_last_error_detail()`.
    TRACE_ERR_IO = 5,
    /// Memory or a thread could not be had.
    TRACE_ERR_OUT_OF_MEMORY = 6,
    /// An internal error (a bug in alloctrace): please report it.
    TRACE_ERR_PANIC = 7,
    /// A lifecycle call from inside the snapshot callback.
    TRACE_ERR_BUSY = 8,
}

/// Which clock stamps events (`trace_config.clock`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum trace_clock {
    /// Read the CPU's time-stamp counter at every event (default).
    TRACE_CLOCK_PRECISE = 0,
    /// Never read the clock on the event path: stamp events with a time the
    /// tracer publishes every 250 µs (and at every advance). Much cheaper per
    /// event; each thread's events keep their exact order (equal times stay
    /// in the order they were made), but times may lag by up to 250 µs, so
    /// events of different threads that close together may be misordered.
    TRACE_CLOCK_COARSE = 1,
}

/// Whether the writer thread compresses the trace
/// (`trace_config.compression`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum trace_compression {
    /// Batches as they are (default).
    TRACE_COMPRESSION_NONE = 0,
    /// Whole batches compressed with zstd by the writer thread, never by the
    /// threads that emit events; readers decompress transparently.
    TRACE_COMPRESSION_ZSTD = 1,
}

/// Which native call stacks the plain alloc calls capture by themselves
/// (`trace_config.stacks`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum trace_stacks {
    /// No capture (default): allocations carry the stack their caller
    /// passes to a `_stack` call, if any.
    TRACE_STACKS_NONE = 0,
    /// Deprecated: accepted and treated as `TRACE_STACKS_FULL`. (It was a
    /// frame-pointer walk, which stopped at the first frame of code built
    /// without frame pointers; the full walk now costs about as little.)
    TRACE_STACKS_FAST = 1,
    /// DWARF CFI (`.eh_frame`) for every frame, frame pointers where a
    /// module has no unwind table: right on any code.
    TRACE_STACKS_FULL = 2,
}

/// Configuration for `trace_start`. Fill it with `trace_config_init`, then
/// set the fields you need.
#[repr(C)]
pub struct trace_config {
    /// `sizeof(trace_config)` as the caller compiled it, for ABI evolution.
    pub struct_size: u32,
    /// Output file, created with mode 0600 (an existing file is truncated,
    /// a symlink is refused), or NULL to write to `fd`.
    pub path: *const c_char,
    /// Output descriptor when `path` is NULL; default -1. Not closed by
    /// `trace_stop`.
    pub fd: c_int,
    /// Base of compressed IDs (0 allowed); addresses below it are recorded
    /// in long form.
    pub min_heap_addr: u64,
    /// Span IDs are `(base - min_heap_addr) / page_size`, and the page
    /// tracer's pages are this size; a power of two from 16 to 2^40, default
    /// 4096.
    pub page_size: u64,
    /// Object IDs are `(addr - min_heap_addr) / min_heap_align`; a power of
    /// two, default 8.
    pub min_heap_align: u64,
    /// Thread-stack IDs are `(base - min_heap_addr) / min_stack_align`; a
    /// power of two, default 4096.
    pub min_stack_align: u64,
    /// Bytes per per-thread batch buffer; 0 for the default (64 KiB), else
    /// 4096 to 16 MiB.
    pub buffer_size: u32,
    /// Optional: called inside `trace_start`, on its thread, once tracing is
    /// on, to emit `*_exists` events for memory already live. It must not
    /// call `trace_start`, `trace_stop` or `trace_advance`.
    pub snapshot: Option<unsafe extern "C" fn(ctx: *mut c_void)>,
    /// Passed to `snapshot`.
    pub snapshot_ctx: *mut c_void,
    /// Which clock stamps events: a `trace_clock` value, default
    /// TRACE_CLOCK_PRECISE; any other value makes `trace_start` return
    /// TRACE_ERR_BAD_CONFIG. An int, not the enum, so that any value C
    /// stores is well defined on both sides. (Added after the first
    /// version: a caller whose `struct_size` ends before this field gets
    /// the default.)
    pub clock: c_int,
    /// Whether the writer compresses the trace: a `trace_compression`
    /// value, default TRACE_COMPRESSION_NONE; any other value makes
    /// `trace_start` return TRACE_ERR_BAD_CONFIG. (An int and added after
    /// the first version, like `clock`.)
    pub compression: c_int,
    /// A `trace_stacks` value: whether `trace_heap_object_alloc` and
    /// `trace_span_alloc` capture the caller's native stack themselves (as
    /// `trace_stack_capture` would), default TRACE_STACKS_NONE; any other
    /// value makes `trace_start` return TRACE_ERR_BAD_CONFIG. With stacks
    /// on, the header's inline event path (the plain calls in a program,
    /// the `trace_writer_*` calls) hands every event to the library, so
    /// they capture too. (An int and added after the first version, like
    /// `clock`.)
    pub stacks: c_int,
    /// The depth limit of captured stacks in native frames, 1 to 256; 0
    /// for the default, 64. (Added after the first version, like `clock`.)
    pub stack_depth: u32,
    /// Sampling mode: the mean bytes between sampled heap-object
    /// allocations (524288, 512 KiB, is the production setting), default 0:
    /// every allocation is recorded. In sampling mode `trace_heap_object_alloc`,
    /// `trace_heap_object_alloc_stack` and `trace_heap_object_exists`
    /// record only the allocations a per-thread countdown of bytes samples
    /// (exponentially distributed, so an allocation of `s` bytes is sampled
    /// with probability `1 - exp(-s / sample_bytes)`), with their call
    /// stack when `stacks` is on; `trace_heap_object_free` records only the
    /// frees of sampled addresses. Every allocation, its bytes and every
    /// free are still counted, exactly, in each generation's end. The
    /// reading commands show estimates. (Added after the first version,
    /// like `clock`.)
    pub sample_bytes: u64,
    /// For tests: the seed of the sampling countdowns, so that a
    /// deterministic program samples the same allocations every run;
    /// default 0, a seed from the clock. (Added after the first version,
    /// like `clock`.)
    pub sample_seed: u64,
    /// Flight-recorder mode when non-zero: the size in bytes, 1 MiB to
    /// 1 TiB, of the ring in which the writer keeps the last complete
    /// generations; nothing is written to `path`/`fd` until a dump
    /// (`trace_flight_recorder_write`, `dump_on_rss`, a fatal signal in the
    /// LD_PRELOAD shim). Default 0, off; `compression` is ignored in this
    /// mode (dumps are uncompressed). (Added after the first version, like
    /// `clock`.)
    pub flight_recorder: u64,
    /// With `flight_recorder`: the first time the process's resident set
    /// reaches this many bytes, the writer thread ends the generation and
    /// writes the ring to `path`/`fd` (once). Default 0, never; non-zero
    /// without `flight_recorder` makes `trace_start` return
    /// TRACE_ERR_BAD_CONFIG. (Added after the first version, like `clock`.)
    pub dump_on_rss: u64,
    /// With `flight_recorder`: keep only the generations that ended in the
    /// last this many milliseconds, 1000 (1 s) to 604800000 (7 days); a
    /// generation then ends every eighth of it, and the ring's size still
    /// bounds the memory. Default 0, as many as the ring holds; non-zero
    /// without `flight_recorder` makes `trace_start` return
    /// TRACE_ERR_BAD_CONFIG. (Added after the first version, like `clock`.)
    pub flight_recorder_age_ms: u64,
}

/// `struct_size` of the first version of trace_config, which ended at
/// `snapshot_ctx`; later fields are read only when `struct_size` covers
/// them.
const CONFIG_V1_SIZE: usize = core::mem::offset_of!(trace_config, clock);

/// Longest detail sentence kept, with its NUL.
const DETAIL_LEN: usize = 160;

thread_local! {
    /// Detail of the calling thread's last failed lifecycle call, a
    /// NUL-terminated sentence (empty if none). A fixed array: no
    /// allocation and no destructor on the thread.
    static LAST_ERROR: core::cell::UnsafeCell<[u8; DETAIL_LEN]> = const { core::cell::UnsafeCell::new([0; DETAIL_LEN]) };
}

/// Formats into a byte array, cutting what does not fit (keeping room for
/// the NUL).
struct DetailWriter<'a> {
    buf: &'a mut [u8; DETAIL_LEN],
    len: usize,
}

impl core::fmt::Write for DetailWriter<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        for &b in s.as_bytes() {
            if self.len + 1 < DETAIL_LEN && b != 0 {
                self.buf[self.len] = b;
                self.len += 1;
            }
        }
        Ok(())
    }
}

/// Sets the calling thread's detail sentence.
fn set_detail(detail: core::fmt::Arguments<'_>) {
    use core::fmt::Write;
    LAST_ERROR.with(|cell| {
        // SAFETY: the array is this thread's; the only other access is
        // trace_last_error_detail handing out a pointer to it, documented
        // as valid until this thread's next failed lifecycle call.
        let buf = unsafe { &mut *cell.get() };
        let mut w = DetailWriter { buf, len: 0 };
        let _ = w.write_fmt(detail);
        let len = w.len;
        buf[len] = 0;
    });
}

fn to_result(r: Result<(), Error>) -> trace_result {
    match r {
        Ok(()) => trace_result::TRACE_OK,
        Err(Error::BadConfig(what)) => {
            set_detail(format_args!("{what}"));
            trace_result::TRACE_ERR_BAD_CONFIG
        }
        Err(Error::AlreadyStarted) => {
            set_detail(format_args!(
                "tracing is already on (a trace is being written): call trace_stop first"
            ));
            trace_result::TRACE_ERR_ALREADY_STARTED
        }
        Err(Error::NotStarted) => trace_result::TRACE_ERR_NOT_STARTED,
        Err(Error::Io(errno)) => {
            set_detail(format_args!("{}", errno_detail(errno)));
            trace_result::TRACE_ERR_IO
        }
        Err(Error::OutOfMemory) => trace_result::TRACE_ERR_OUT_OF_MEMORY,
        Err(Error::Busy) => trace_result::TRACE_ERR_BUSY,
    }
}

/// A `trace_config` field that C passes as an int and Rust models as an
/// enum: the value if it is one of the field's constants, else
/// TRACE_ERR_BAD_CONFIG with a detail naming the field, its value and the
/// accepted constants.
fn config_enum<T: Copy>(
    field: &str,
    raw: c_int,
    known: &[(c_int, &str, T)],
) -> Result<T, trace_result> {
    if let Some(&(_, _, value)) = known.iter().find(|(v, _, _)| *v == raw) {
        return Ok(value);
    }
    struct Choices<'a, T>(&'a [(c_int, &'a str, T)]);
    impl<T> core::fmt::Display for Choices<'_, T> {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            for (i, (v, name, _)) in self.0.iter().enumerate() {
                let sep = match i {
                    0 => "",
                    _ if i + 1 == self.0.len() => " or ",
                    _ => ", ",
                };
                write!(f, "{sep}{name} ({v})")?;
            }
            Ok(())
        }
    }
    set_detail(format_args!(
        "{field} is {raw}: it must be {}",
        Choices(known)
    ));
    Err(trace_result::TRACE_ERR_BAD_CONFIG)
}

fn errno_detail(errno: i32) -> &'static str {
    match errno {
        libc::ENOENT => "the output's directory does not exist (ENOENT)",
        libc::EACCES | libc::EPERM => "permission denied creating the output (EACCES)",
        libc::ELOOP => "the output path is a symlink, which alloctrace refuses to follow (ELOOP)",
        libc::EISDIR => "the output path is a directory (EISDIR)",
        libc::ENOSPC => "no space left on the output device (ENOSPC)",
        libc::EBADF => "the output descriptor is not open for writing (EBADF)",
        libc::EPIPE => "the output pipe was closed by its reader (EPIPE)",
        _ => "an I/O error on the output",
    }
}

/// Runs a lifecycle body, turning a panic into TRACE_ERR_PANIC.
macro_rules! ffi_guard {
    ($body:expr) => {
        ffi_guard_or!(trace_result::TRACE_ERR_PANIC, $body)
    };
}

/// Runs the body of an export, returning `$on_panic` if it panics: a panic
/// never unwinds into C (where it would abort the process). Inside the
/// body, so cbindgen sees the function's real signature.
macro_rules! ffi_guard_or {
    ($on_panic:expr, $body:expr) => {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| $body)) {
            Ok(result) => result,
            Err(_) => $on_panic,
        }
    };
}

/// Fills `*cfg` with defaults: `struct_size` set, `path` NULL, `fd` -1,
/// `min_heap_addr` 0, `page_size` 4096, `min_heap_align` 8,
/// `min_stack_align` 4096, `buffer_size` 0, no snapshot, precise clock, no
/// compression, no stack capture, `stack_depth` 0 (64), no sampling
/// (`sample_bytes` 0, `sample_seed` 0), no flight recorder
/// (`flight_recorder` 0, `dump_on_rss` 0).
///
/// NULL does nothing. Any thread, at any time; it does not allocate.
///
/// # Safety
/// `cfg` is NULL or points to writable memory for one `trace_config`.
#[no_mangle]
pub unsafe extern "C" fn trace_config_init(cfg: *mut trace_config) {
    if cfg.is_null() {
        return;
    }
    let d = Config::default();
    // SAFETY: the caller passes a pointer to a writable trace_config.
    unsafe {
        cfg.write(trace_config {
            struct_size: core::mem::size_of::<trace_config>() as u32,
            path: core::ptr::null(),
            fd: -1,
            min_heap_addr: d.min_heap_addr,
            page_size: d.page_size,
            min_heap_align: d.min_heap_align,
            min_stack_align: d.min_stack_align,
            buffer_size: 0,
            snapshot: None,
            snapshot_ctx: core::ptr::null_mut(),
            clock: trace_clock::TRACE_CLOCK_PRECISE as c_int,
            compression: trace_compression::TRACE_COMPRESSION_NONE as c_int,
            stacks: trace_stacks::TRACE_STACKS_NONE as c_int,
            stack_depth: 0,
            sample_bytes: 0,
            sample_seed: 0,
            flight_recorder: 0,
            dump_on_rss: 0,
            flight_recorder_age_ms: 0,
        });
    }
}

/// Starts tracing. Writes the trace header, starts the writer thread, opens
/// generation 1 and runs the snapshot callback.
///
/// Returns TRACE_ERR_NULL_ARGUMENT for a NULL `cfg`, TRACE_ERR_BAD_CONFIG
/// for an invalid field, TRACE_ERR_ALREADY_STARTED when tracing is on,
/// TRACE_ERR_IO when the output cannot be created or written. `cfg` and
/// `path` are only read during the call. Any thread; allocates, so not from
/// inside a malloc that the process's own malloc calls would deadlock on.
///
/// # Safety
/// `cfg` is NULL or points to a readable `trace_config` of at least
/// `cfg->struct_size` bytes; a non-NULL `path` in it is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn trace_start(cfg: *const trace_config) -> trace_result {
    ffi_guard!({
        // SAFETY: a non-NULL cfg points to a readable trace_config.
        let Some(cfg) = (unsafe { cfg.as_ref() }) else {
            return trace_result::TRACE_ERR_NULL_ARGUMENT;
        };
        let size = cfg.struct_size as usize;
        if size < CONFIG_V1_SIZE {
            return to_result(Err(Error::BadConfig(
                "struct_size is smaller than sizeof(trace_config): call trace_config_init",
            )));
        }
        if cfg.path.is_null() && cfg.fd < 0 {
            return to_result(Err(Error::BadConfig(
                "path is NULL and fd is negative: set one of them",
            )));
        }
        let covers = |offset: usize| size >= offset + core::mem::size_of::<c_int>();
        let compress = if covers(core::mem::offset_of!(trace_config, compression)) {
            let known = [
                (
                    trace_compression::TRACE_COMPRESSION_NONE as c_int,
                    "TRACE_COMPRESSION_NONE",
                    false,
                ),
                (
                    trace_compression::TRACE_COMPRESSION_ZSTD as c_int,
                    "TRACE_COMPRESSION_ZSTD",
                    true,
                ),
            ];
            match config_enum("trace_config.compression", cfg.compression, &known) {
                Ok(v) => v,
                Err(r) => return r,
            }
        } else {
            false
        };
        let clock = if covers(core::mem::offset_of!(trace_config, clock)) {
            let known = [
                (
                    trace_clock::TRACE_CLOCK_PRECISE as c_int,
                    "TRACE_CLOCK_PRECISE",
                    ClockKind::Precise,
                ),
                (
                    trace_clock::TRACE_CLOCK_COARSE as c_int,
                    "TRACE_CLOCK_COARSE",
                    ClockKind::Coarse,
                ),
            ];
            match config_enum("trace_config.clock", cfg.clock, &known) {
                Ok(v) => v,
                Err(r) => return r,
            }
        } else {
            ClockKind::Precise
        };
        let stacks = if covers(core::mem::offset_of!(trace_config, stacks)) {
            let known = [
                (
                    trace_stacks::TRACE_STACKS_NONE as c_int,
                    "TRACE_STACKS_NONE",
                    StackMode::None,
                ),
                (
                    trace_stacks::TRACE_STACKS_FAST as c_int,
                    "TRACE_STACKS_FAST",
                    // Deprecated: the full mode.
                    StackMode::Full,
                ),
                (
                    trace_stacks::TRACE_STACKS_FULL as c_int,
                    "TRACE_STACKS_FULL",
                    StackMode::Full,
                ),
            ];
            match config_enum("trace_config.stacks", cfg.stacks, &known) {
                Ok(v) => v,
                Err(r) => return r,
            }
        } else {
            StackMode::None
        };
        let stack_depth = if size >= core::mem::offset_of!(trace_config, stack_depth) + 4 {
            cfg.stack_depth
        } else {
            0
        };
        let covers_u64 = |offset: usize| size >= offset + core::mem::size_of::<u64>();
        let sample_bytes = if covers_u64(core::mem::offset_of!(trace_config, sample_bytes)) {
            cfg.sample_bytes
        } else {
            0
        };
        let sample_seed = if covers_u64(core::mem::offset_of!(trace_config, sample_seed)) {
            cfg.sample_seed
        } else {
            0
        };
        let flight_recorder = if covers_u64(core::mem::offset_of!(trace_config, flight_recorder)) {
            cfg.flight_recorder
        } else {
            0
        };
        let dump_on_rss = if covers_u64(core::mem::offset_of!(trace_config, dump_on_rss)) {
            cfg.dump_on_rss
        } else {
            0
        };
        let flight_recorder_age_ms =
            if covers_u64(core::mem::offset_of!(trace_config, flight_recorder_age_ms)) {
                cfg.flight_recorder_age_ms
            } else {
                0
            };
        let config = Config {
            clock,
            compress,
            flight_recorder_age_ms,
            sample_bytes,
            sample_seed,
            flight_recorder,
            dump_on_rss,
            stacks,
            plain_calls_capture: true,
            stack_depth: if stack_depth == 0 {
                alloctrace_writer::capture::DEFAULT_DEPTH
            } else {
                stack_depth as usize
            },
            min_heap_addr: cfg.min_heap_addr,
            page_size: cfg.page_size,
            min_heap_align: cfg.min_heap_align,
            min_stack_align: cfg.min_stack_align,
            buffer_size: if cfg.buffer_size == 0 {
                tracer::DEFAULT_BUFFER_SIZE
            } else {
                cfg.buffer_size as usize
            },
            ..Config::default()
        };
        if let Err(e) = config.validate() {
            return to_result(Err(e));
        }
        let (path, fd) = (cfg.path, cfg.fd);
        let open_output = || {
            if path.is_null() {
                Ok(Output::borrowed_fd(fd))
            } else {
                // SAFETY: a non-NULL path is a NUL-terminated string.
                Output::create(unsafe { CStr::from_ptr(path) }).map_err(Error::Io)
            }
        };
        let (snapshot, ctx) = (cfg.snapshot, cfg.snapshot_ctx);
        let mut run_snapshot = || {
            if let Some(f) = snapshot {
                // SAFETY: the caller supplied the callback and its context.
                unsafe { f(ctx) };
            }
        };
        let snapshot: Option<&mut dyn FnMut()> = if snapshot.is_some() {
            Some(&mut run_snapshot)
        } else {
            None
        };
        let result = tracer::start_with(&config, open_output, snapshot);
        to_result(result)
    })
}

/// Stops tracing: flushes every thread's buffers, ends the trace and closes
/// the output if `trace_start` opened it. Nothing recorded before it returns
/// is missing from the output. TRACE_ERR_NOT_STARTED when tracing is off;
/// TRACE_ERR_IO if any write failed. Any thread; not from inside malloc.
#[no_mangle]
pub extern "C" fn trace_stop() -> trace_result {
    ffi_guard!(to_result(tracer::stop()))
}

/// Ends the current generation (flushing every thread's buffers of it) and
/// starts the next. TRACE_ERR_NOT_STARTED when tracing is off. Any thread;
/// waits for threads that are inside an event call.
#[no_mangle]
pub extern "C" fn trace_advance() -> trace_result {
    ffi_guard!(to_result(tracer::advance()))
}

/// Flight-recorder mode: writes the last complete generations the ring
/// holds, up to this call, as a trace of their own (a flight-recorder
/// window, docs/FORMAT.md section 1) to `path`, created with mode 0600 (an
/// existing file is truncated, a symlink refused), or, when `path` is
/// NULL, to the descriptor `fd`, at its current offset (not closed). The
/// current generation is ended first, as `trace_advance` would, so the
/// dump holds every event recorded before the call. Tracing goes on.
///
/// Returns TRACE_ERR_NULL_ARGUMENT when `path` is NULL and `fd` negative,
/// TRACE_ERR_NOT_STARTED when tracing is off, TRACE_ERR_BAD_CONFIG when the
/// session is not in flight-recorder mode (`trace_config.flight_recorder`
/// 0), TRACE_ERR_IO when the file cannot be created or written (the
/// detail says why), TRACE_ERR_BUSY from the snapshot callback. `path` is
/// only read during the call. Any thread, several at once (they take turns);
/// not from inside malloc: it waits for threads inside event calls and for
/// the writer thread, and allocates.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn trace_flight_recorder_write(
    path: *const c_char,
    fd: c_int,
) -> trace_result {
    ffi_guard!({
        if tracer::flight_stats().is_none() {
            // Refused before any file is created.
            return to_result(Err(if tracer::enabled() {
                Error::BadConfig(
                    "the session is not in flight-recorder mode (trace_config.flight_recorder is 0)",
                )
            } else {
                Error::NotStarted
            }));
        }
        let out = if !path.is_null() {
            // SAFETY: a non-NULL path is a NUL-terminated string.
            match Output::create(unsafe { CStr::from_ptr(path) }) {
                Ok(out) => out,
                Err(errno) => return to_result(Err(Error::Io(errno))),
            }
        } else if fd >= 0 {
            Output::borrowed_fd(fd)
        } else {
            return trace_result::TRACE_ERR_NULL_ARGUMENT;
        };
        to_result(tracer::flight_recorder_write(&out).map(|_| ()))
    })
}

/// Writes what is live now, and where it was allocated, as a snapshot
/// trace (docs/FORMAT.md; docs/C-API.md, "Snapshots"): one generation
/// holding an event per live allocation (heap objects, spans, stacks)
/// with its call stack, the stacks they use and the type table, which
/// every reading command accepts (`alloctrace leaks`, `top`, `export
/// --format pprof`). It comes from the live table the writer thread keeps
/// from the events it moves, not from the trace: its cost follows what is
/// live. In sampling mode the table is the sampled set, and the snapshot
/// carries `sample_bytes`, so readers show estimates.
///
/// Writes to `path`, created with mode 0600 (an existing file is
/// truncated, a symlink refused), or, when `path` is NULL, to the
/// descriptor `fd`, at its current offset (not closed). The current
/// generation is ended first, as `trace_advance` would, so the snapshot
/// holds every event recorded before the call. Tracing goes on.
///
/// Returns TRACE_ERR_NULL_ARGUMENT when `path` is NULL and `fd` negative,
/// TRACE_ERR_NOT_STARTED when tracing is off, TRACE_ERR_BAD_CONFIG in
/// flight-recorder mode (no live table: use
/// `trace_flight_recorder_write`) or with the table turned off
/// (`ALLOCTRACE_LIVE_TABLE=off`), TRACE_ERR_IO when the file cannot be
/// created or written (the detail says why), TRACE_ERR_BUSY from the
/// snapshot callback. `path` is only read during the call. Any thread,
/// several at once (they take turns); not from inside malloc nor a signal
/// handler: it waits for threads inside event calls and for the writer
/// thread, and allocates.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn trace_snapshot_write(path: *const c_char, fd: c_int) -> trace_result {
    ffi_guard!({
        if path.is_null() && fd < 0 {
            return trace_result::TRACE_ERR_NULL_ARGUMENT;
        }
        // The session's refusals come before any file is created.
        let bytes = match tracer::snapshot_bytes() {
            Ok(bytes) => bytes,
            Err(e) => return to_result(Err(e)),
        };
        let out = if !path.is_null() {
            // SAFETY: a non-NULL path is a NUL-terminated string.
            match Output::create(unsafe { CStr::from_ptr(path) }) {
                Ok(out) => out,
                Err(errno) => return to_result(Err(Error::Io(errno))),
            }
        } else {
            Output::borrowed_fd(fd)
        };
        to_result(tracer::snapshot_write_bytes(&out, &bytes))
    })
}

/// Flushes the calling thread's buffers now, as its exit would. Harmless
/// when tracing is off. May be called from inside malloc.
#[no_mangle]
pub extern "C" fn trace_thread_destroy() {
    ffi_guard_or!((), events::thread_destroy())
}

/// The state the header's inline event path reads (alloctrace_inline.h:
/// `struct alloctrace_shared_`). Private: not part of the API. The name
/// carries the version of the layouts the header mirrors: change it (and
/// ALLOCTRACE_INLINE_ABI) with them, so a program built against a layout
/// this library does not have fails to load instead of writing a bad
/// trace. Version 2 added the call-stack table's node array (the inline
/// allocation with a call stack).
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static alloctrace_inline_v2: &alloctrace_writer::shared::Shared =
    &alloctrace_writer::shared::SHARED;

/// [`alloctrace_inline_v2`] under version 1's name, for programs built
/// against the header of version 1: its layout is version 2's first part,
/// and version 1 wrote only events without a call stack inline.
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static alloctrace_inline_v1: &alloctrace_writer::shared::Shared =
    &alloctrace_writer::shared::SHARED;

/// A thread's writer: the handle of the inline event calls
/// (`trace_writer_heap_object_alloc` and the rest, defined in the header).
/// Its layout is private to the header.
pub struct trace_writer {
    _private: [u8; 0],
}

/// The calling thread's writer, registering the thread if needed: keep it in
/// your per-thread state (a runtime's M or P, an allocator's thread cache)
/// and pass it to the `trace_writer_*` event calls, which then record an
/// event inline, without a call or a thread-local lookup. NULL when every
/// thread slot is taken (the calls then count their events as lost).
///
/// The handle belongs to the calling thread until it exits or calls
/// `trace_thread_destroy`; it stays valid across `trace_stop` and a later
/// `trace_start`, and in a fork child for the thread that forked. Used on
/// any other thread, or after that, the calls notice it and record through
/// the out-of-line path instead, on the caller's own writer. Works before
/// `trace_start`. Any thread, also inside malloc (the first call on a thread
/// may call pthread_setspecific).
#[no_mangle]
pub extern "C" fn trace_writer_get() -> *mut trace_writer {
    ffi_guard_or!(core::ptr::null_mut(), events::writer().cast())
}

/// Whether tracing is on. One relaxed load; any thread, also inside malloc.
#[no_mangle]
pub extern "C" fn trace_enabled() -> bool {
    tracer::enabled()
}

/// The calling thread's trace thread ID (as in the trace), registering the
/// thread if needed; 0 when tracing is off.
#[no_mangle]
pub extern "C" fn trace_thread_id() -> u64 {
    ffi_guard_or!(0, events::thread_id())
}

/// A static, NUL-terminated name for a result code, such as "TRACE_OK".
/// Never NULL; any other int (a code from a newer version, a stray value)
/// gives "TRACE_ERR_UNKNOWN". Takes an int, not the enum, so that every
/// value C can pass is well defined.
#[no_mangle]
pub extern "C" fn trace_result_str(result: c_int) -> *const c_char {
    const NAMES: [(trace_result, &CStr); 9] = [
        (trace_result::TRACE_OK, c"TRACE_OK"),
        (
            trace_result::TRACE_ERR_NULL_ARGUMENT,
            c"TRACE_ERR_NULL_ARGUMENT",
        ),
        (trace_result::TRACE_ERR_BAD_CONFIG, c"TRACE_ERR_BAD_CONFIG"),
        (
            trace_result::TRACE_ERR_ALREADY_STARTED,
            c"TRACE_ERR_ALREADY_STARTED",
        ),
        (
            trace_result::TRACE_ERR_NOT_STARTED,
            c"TRACE_ERR_NOT_STARTED",
        ),
        (trace_result::TRACE_ERR_IO, c"TRACE_ERR_IO"),
        (
            trace_result::TRACE_ERR_OUT_OF_MEMORY,
            c"TRACE_ERR_OUT_OF_MEMORY",
        ),
        (trace_result::TRACE_ERR_PANIC, c"TRACE_ERR_PANIC"),
        (trace_result::TRACE_ERR_BUSY, c"TRACE_ERR_BUSY"),
    ];
    let name = NAMES
        .iter()
        .find(|(code, _)| *code as c_int == result)
        .map_or(c"TRACE_ERR_UNKNOWN", |&(_, name)| name);
    name.as_ptr()
}

/// A NUL-terminated sentence about the calling thread's last failed
/// lifecycle call (which field of the config was bad and its value, which
/// I/O error, that tracing was already on), or "" if none. Never NULL; the
/// text stays valid until the calling thread's next failed lifecycle call.
#[no_mangle]
pub extern "C" fn trace_last_error_detail() -> *const c_char {
    // The array lives as long as the thread; a pointer into it is handed
    // out without reading it.
    LAST_ERROR.with(|cell| cell.get().cast::<c_char>().cast_const())
}

/// Registers a type for heap object events and returns its ID (at least 1),
/// or 0 when the table is full. `name` need not be NUL-terminated; NULL is
/// allowed with `name_len` 0. Names over 1024 bytes are cut. Works before
/// `trace_start`; each call makes a new ID. Any thread, also inside malloc
/// (it never allocates or locks).
///
/// # Safety
/// `name` is NULL or points to `name_len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn trace_type_register(
    name: *const c_char,
    name_len: libc::size_t,
    size: u64,
    ptr_bytes: u64,
) -> u64 {
    ffi_guard_or!(0, {
        // SAFETY: the caller passes name_len readable bytes at name.
        let name = unsafe { bytes(name, name_len) };
        events::type_register(name, size, ptr_bytes)
    })
}

/// Registers a frame of the runtime's own code (a Lua or Python function, a
/// JIT stub) and returns its frame value for `trace_stack_register`: a
/// value that can never be mistaken for a native address (bit 63 set). 0
/// when the frame table is full. `func` and `file` need not be
/// NUL-terminated; NULL is allowed with length 0; names over 1024 bytes are
/// cut; `line` 0 means unknown. Works before `trace_start`; every call
/// makes a new frame. Any thread, also inside malloc (it never allocates or
/// locks).
///
/// # Safety
/// `func` is NULL or points to `func_len` readable bytes; so is `file` with
/// `file_len`.
#[no_mangle]
pub unsafe extern "C" fn trace_frame_register(
    func: *const c_char,
    func_len: libc::size_t,
    file: *const c_char,
    file_len: libc::size_t,
    line: u32,
) -> u64 {
    ffi_guard_or!(0, {
        // SAFETY: the caller's contract above.
        let (func, file) = unsafe { (bytes(func, func_len), bytes(file, file_len)) };
        events::frame_register(func, file, line)
    })
}

/// Interns a call stack and returns its stack ID for the `_stack` event
/// calls (stable for the process: register once, use it in every
/// generation); 0 means no stack. `frames` holds `n` frames, innermost
/// first: native return addresses and values from `trace_frame_register`,
/// freely mixed. Returns 0 for NULL or `n` 0, a frame of 0, or a value that
/// names no registered frame, or when the stack table is full (1 Mi frames
/// of distinct stacks, shared prefixes counted once). Stacks deeper than
/// 1024 frames keep their innermost 1023 under a truncation mark. Works
/// before `trace_start`. Any thread, also inside malloc (it never allocates
/// or locks).
///
/// # Safety
/// `frames` is NULL or points to `n` readable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn trace_stack_register(frames: *const u64, n: libc::size_t) -> u64 {
    ffi_guard_or!(0, {
        if frames.is_null() || n == 0 {
            return 0;
        }
        // SAFETY: the caller passes n readable u64 at frames.
        events::stack_register(unsafe { core::slice::from_raw_parts(frames, n) })
    })
}

/// Returns the stack ID of the call stack `parent_stack` with `frame` as its
/// innermost frame, interning it if new: one hash lookup however deep the
/// stack, for a runtime that keeps the ID of each of its frames' callers
/// (the same ID `trace_stack_register` returns for the same frames).
/// `parent_stack` is a stack ID from `trace_stack_register` or this
/// function, 0 for none (`frame` is then the outermost frame); `frame` a
/// native return address or a value from `trace_frame_register`. Returns
/// 0 for a `parent_stack` that names no stack, a `frame` that is 0 or
/// names no registered frame, when the stack table is full, and when the
/// stack would be deeper than 1024 frames (the format's limit): call
/// `trace_stack_register` with the whole stack then, which keeps its
/// innermost 1023 frames under a truncation mark. Works before
/// `trace_start`. Any thread, also inside malloc (it never allocates or
/// locks). No panic guard, as the event calls: it cannot panic (a frame
/// value meets a bit test and a shift; the parent ID is bounds-checked
/// before it indexes the table).
#[no_mangle]
pub extern "C" fn trace_stack_push(parent_stack: u64, frame: u64) -> u64 {
    events::stack_push(parent_stack, frame)
}

/// Unwinds the caller's native stack (as the LD_PRELOAD shim does: by
/// DWARF CFI unless `trace_config.stacks` chose TRACE_STACKS_FAST), drops
/// its `skip` innermost frames (0 keeps the caller's own frame), interns it
/// and returns its stack ID for the `_stack` event calls; 0 when tracing is
/// off, or when no stack could be taken (counted in the generation's
/// `lost_stacks`). The depth limit is `trace_config.stack_depth`. Any
/// thread, also inside malloc: no allocation and no lock; a thread's first
/// capture may make system calls (its stack's bounds).
#[no_mangle]
pub extern "C" fn trace_stack_capture(skip: u32) -> u64 {
    let id = capture::capture_stack(1 + skip as usize);
    // Keeps this frame from becoming a tail call, so that skip counts from
    // the caller whatever the optimiser does.
    core::hint::black_box(id)
}

/// Unwinds the caller's native stack as `trace_stack_capture` does (the
/// same walk, `skip` and depth limit) and writes its return addresses,
/// innermost first, to `frames` instead of interning them: for a runtime
/// that merges frames of its own into the native ones (replacing its
/// interpreter's frames by the functions they run) and then calls
/// `trace_stack_register`. `frames[0]` lies in the caller's own frame
/// (`skip` 0), or in its caller's (`skip` 1), and so on. Writes at most
/// `max` and at most `trace_config.stack_depth` addresses (a deeper stack
/// keeps its innermost ones, with no mark) and returns how many: 0 when
/// tracing is off, for NULL `frames` or `max` 0, or when no stack could be
/// taken. The caller owns `frames`. Any thread, also inside malloc: no
/// allocation and no lock; a thread's first walk may make system calls
/// (its stack's bounds).
///
/// # Safety
/// `frames` is NULL or points to `max` writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn trace_stack_walk(
    frames: *mut u64,
    max: libc::size_t,
    skip: u32,
) -> libc::size_t {
    // No panic guard, as trace_stack_capture: the guard's closure would be
    // a frame of its own between the caller and the walk, and the walk
    // never panics.
    if frames.is_null() || max == 0 {
        return 0;
    }
    // SAFETY: the caller passes max writable u64 at frames.
    let out = unsafe { core::slice::from_raw_parts_mut(frames, max) };
    let n = capture::walk_stack(1 + skip as usize, out);
    // Keeps this frame from becoming a tail call, so that skip counts from
    // the caller whatever the optimiser does.
    core::hint::black_box(n)
}

/// `len` bytes at `p` as a slice; empty for NULL or 0.
///
/// # Safety
/// `p` is NULL or points to `len` readable bytes that outlive the slice.
unsafe fn bytes<'a>(p: *const c_char, len: libc::size_t) -> &'a [u8] {
    if p.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: the caller's contract.
        unsafe { core::slice::from_raw_parts(p.cast(), len) }
    }
}

/// Records that a span of `npages` pages at `base` existed when tracing
/// started (call from the snapshot callback). `kind_class` is yours to
/// define. Any thread, also inside malloc.
#[no_mangle]
pub extern "C" fn trace_span_exists(base: usize, npages: usize, kind_class: u64) {
    events::span_exists(base, npages, kind_class);
}

/// Records that a span of `npages` pages was allocated at `base`. Any
/// thread, also inside malloc.
#[no_mangle]
pub extern "C" fn trace_span_alloc(base: usize, npages: usize, kind_class: u64) {
    if capture::mode() != StackMode::None {
        let stack = capture::capture_stack_or_lost(1);
        events::span_alloc_stack(base, npages, kind_class, stack);
        return;
    }
    events::span_alloc(base, npages, kind_class);
}

/// Records that the span at `base` is about to be freed. Any thread, also
/// inside malloc.
#[no_mangle]
pub extern "C" fn trace_span_free(base: usize) {
    events::span_free(base);
}

/// Records that a heap object of `size` bytes at `addr` existed when
/// tracing started. `type_id` from `trace_type_register`, or 0. Any thread,
/// also inside malloc.
#[no_mangle]
pub extern "C" fn trace_heap_object_exists(addr: usize, size: u64, type_id: u64) {
    events::heap_object_exists(addr, size, type_id);
}

/// Records that a heap object of `size` bytes was allocated at `addr`.
/// `type_id` from `trace_type_register`, or 0. In sampling mode
/// (`trace_config.sample_bytes`) counted, and recorded only when sampled.
/// Any thread, also inside malloc.
#[no_mangle]
pub extern "C" fn trace_heap_object_alloc(addr: usize, size: u64, type_id: u64) {
    // In sampling mode, an allocation not sampled costs no capture.
    if !events::sample_alloc(addr, size) {
        return;
    }
    if capture::mode() != StackMode::None {
        let stack = capture::capture_stack_or_lost(1);
        events::sampled::heap_object_alloc_stack(addr, size, type_id, stack);
        return;
    }
    events::sampled::heap_object_alloc(addr, size, type_id);
}

/// `trace_heap_object_alloc` with the call stack that allocated: `stack_id`
/// from `trace_stack_register` (or `trace_stack_capture`). 0 records the
/// allocation without a stack; so does an ID that names no stack, counted
/// in the generation's `lost_stacks` (`alloctrace check` reports it). Any
/// thread, also inside malloc (no allocation, no lock).
#[no_mangle]
pub extern "C" fn trace_heap_object_alloc_stack(
    addr: usize,
    size: u64,
    type_id: u64,
    stack_id: u64,
) {
    events::heap_object_alloc_stack(addr, size, type_id, stack_id);
}

/// `trace_span_alloc` with the call stack that allocated, as
/// `trace_heap_object_alloc_stack`.
#[no_mangle]
pub extern "C" fn trace_span_alloc_stack(
    base: usize,
    npages: usize,
    kind_class: u64,
    stack_id: u64,
) {
    events::span_alloc_stack(base, npages, kind_class, stack_id);
}

/// Records that the heap object at `addr` is about to be freed. In
/// sampling mode counted, and recorded only when its allocation was. Any
/// thread, also inside malloc.
#[no_mangle]
pub extern "C" fn trace_heap_object_free(addr: usize) {
    events::heap_object_free(addr);
}

/// Records that a thread stack (thread-stack memory, not a call stack) of
/// `size` bytes at `base` existed when tracing started. A size that is not a power of two is recorded exactly (long
/// form). Any thread, also inside malloc.
#[no_mangle]
pub extern "C" fn trace_stack_exists(base: usize, size: usize) {
    events::stack_exists(base, size);
}

/// Records that a thread stack of `size` bytes was allocated at `base`.
/// Any thread, also inside malloc.
#[no_mangle]
pub extern "C" fn trace_stack_alloc(base: usize, size: usize) {
    events::stack_alloc(base, size);
}

/// Records that the thread stack at `base` is about to be freed. Any
/// thread, also inside malloc.
#[no_mangle]
pub extern "C" fn trace_stack_free(base: usize) {
    events::stack_free(base);
}

/// Page tracer: records that `npages` pages at `base` were allocated. Pages
/// are `page_size` bytes (from `trace_config`). A base off the page grid or
/// above 2^48 is recorded exactly in long form. Any thread, also inside the
/// allocator; never allocates or locks.
#[no_mangle]
pub extern "C" fn trace_page_alloc(base: usize, npages: usize) {
    events::page_alloc(base, npages);
}

/// Page tracer: records that `npages` pages at `base` were freed. Any
/// thread, also inside the allocator.
#[no_mangle]
pub extern "C" fn trace_page_free(base: usize, npages: usize) {
    events::page_free(base, npages);
}

/// Page tracer: records that `npages` pages at `base` were scavenged
/// (returned to the OS, e.g. with madvise). Any thread, also inside the
/// allocator.
#[no_mangle]
pub extern "C" fn trace_page_scav(base: usize, npages: usize) {
    events::page_scav(base, npages);
}
