//! The shim's configuration: environment variables, read once by the
//! constructor (docs/PRELOAD.md, "Configuration").
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `ALLOCTRACE_OUTPUT` | `alloctrace.%p.trace` | trace file name pattern: `%p` the pid, `%%` a `%` |
//! | `ALLOCTRACE_BUFFER_SIZE` | `64k` | bytes per thread buffer, 4096 to 16 MiB, `k`/`m` suffixes |
//! | `ALLOCTRACE_RECORD` | `heap,mmap,stacks` | which families of calls to record |
//! | `ALLOCTRACE_CLOCK` | `precise` | `precise` (a clock read per event) or `coarse` (cheaper; see the core's ClockKind) |
//! | `ALLOCTRACE_COMPRESSION` | `none` | `none` or `zstd` (batches compressed by the writer thread) |
//! | `ALLOCTRACE_OVERWRITE` | `0` | `1`: the first process may replace an existing file |
//! | `ALLOCTRACE_DISABLE` | unset | set (not `0`): the shim does nothing |
//! | `ALLOCTRACE_INDEX` | unset | a file to append a line to per process (traced, untraced and why, session totals; session.rs, `write_index`); `alloctrace record` sets it |
//! | `ALLOCTRACE_ONLY` | unset | comma-separated program names: only processes started as one of them (or whose executable has that file name) are traced; the others run untraced, their children are still followed |
//! | `ALLOCTRACE_FOLLOW` | `1` | `0`: trace only the first process and the programs it execs (same pid), not its children |
//! | `ALLOCTRACE_ROOT_PID` | unset | with FOLLOW=0, set by the first process's shim to its pid (leave it unset) |
//! | `ALLOCTRACE_SAMPLE_BYTES` | `0` | sampling mode: the mean bytes between sampled allocations (`512KiB`; bytes with an optional KiB or MiB suffix); 0 records every allocation |
//! | `ALLOCTRACE_SAMPLE_SEED` | unset | a testing aid: the sampling countdowns' seed (a number), so a deterministic program samples the same allocations every run |
//! | `ALLOCTRACE_FLIGHT_RECORDER` | unset | flight-recorder mode: the ring's size, 1MiB to 1TiB (`KiB`/`MiB`/`GiB` suffixes), or a duration, 1s to 7 days (`30s`, `5min`, `2h`: the last that long, in a 256 MiB ring), or both (`30s,1GiB`); the trace file gets a dump on a fatal signal or `ALLOCTRACE_DUMP_ON_RSS`, nothing at a normal exit |
//! | `ALLOCTRACE_DUMP_ON_RSS` | unset | with the flight recorder: dump once when the process's RSS reaches this size |
//! | `ALLOCTRACE_SNAPSHOT_SIGNAL` | `USR2` | `USR2`, `USR1` or `off`: the signal that asks for a snapshot of the live heap (a file beside the trace; the flight recorder's dump in that mode), where the program's disposition of it is SIG_DFL; the program's own handler or SIG_IGN always wins |
//! | `ALLOCTRACE_LIVE_TABLE` | sampling mode | `on` (or `1`): the writer thread keeps a live table in full mode too (for `alloctrace snapshot` and SIGUSR2; about 30 ns of writer time per event); `off` (or `0`): never (read by the writer core, crates/writer/src/writer/live.rs) |
//! | `ALLOCTRACE_CHECK_STACKS` | `0` | `1`: a testing aid: every stack walk is checked against two reference walks (alloctrace-writer's capture check mode), with a `check-stacks:` summary on stderr when the session ends |
//!
//! The grammar of every value is the alloctrace-options crate's, which
//! `alloctrace record` checks its options with.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;

pub use alloctrace_options::env::{
    BUFFER_SIZE, CHECK_STACKS, CLOCK, COMPRESSION, DISABLE, DUMP_ON_RSS, FLIGHT_RECORDER, FOLLOW,
    INDEX, ONLY, OUTPUT, OVERWRITE, RECORD, ROOT_PID, SAMPLE_BYTES, SAMPLE_SEED, SNAPSHOT_SIGNAL,
    STACKS, STACK_DEPTH,
};
// session.rs names them through this module (not built in unit tests).
#[cfg_attr(test, allow(unused_imports))]
pub use alloctrace_options::{expand, with_suffix, DEFAULT_PATTERN};
use alloctrace_options::{Clock, Compression, Families, Stacks};

// The options crate states the core's limits for the CLI, which does not
// link the core: they must be the core's.
const _: () = assert!(alloctrace_options::MIN_BUFFER_SIZE == alloctrace_writer::MIN_BUFFER_SIZE);
const _: () = assert!(alloctrace_options::MAX_BUFFER_SIZE == alloctrace_writer::MAX_BUFFER_SIZE);
const _: () =
    assert!(alloctrace_options::DEFAULT_BUFFER_SIZE == alloctrace_writer::DEFAULT_BUFFER_SIZE);
const _: () = assert!(alloctrace_options::MAX_STACK_DEPTH == alloctrace_writer::capture::MAX_DEPTH);
const _: () =
    assert!(alloctrace_options::DEFAULT_STACK_DEPTH == alloctrace_writer::capture::DEFAULT_DEPTH);

const _: () = assert!(
    alloctrace_options::MIN_FLIGHT_RECORDER == alloctrace_writer::MIN_FLIGHT_RECORDER_BYTES
);
const _: () = assert!(
    alloctrace_options::MAX_FLIGHT_RECORDER == alloctrace_writer::MAX_FLIGHT_RECORDER_BYTES
);

/// Variables an exec'd program must see to be traced like this one, in
/// the order they are added to an environment that lacks them.
pub const CARRIED: [&str; 19] = [
    "LD_PRELOAD",
    OUTPUT,
    BUFFER_SIZE,
    RECORD,
    CLOCK,
    COMPRESSION,
    INDEX,
    DISABLE,
    ONLY,
    FOLLOW,
    ROOT_PID,
    STACKS,
    STACK_DEPTH,
    CHECK_STACKS,
    SAMPLE_BYTES,
    SAMPLE_SEED,
    FLIGHT_RECORDER,
    DUMP_ON_RSS,
    SNAPSHOT_SIGNAL,
];

/// What the environment asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The output pattern, checked: only `%p` and `%%` escapes.
    pub pattern: Vec<u8>,
    pub buffer_size: usize,
    pub heap: bool,
    pub mmap: bool,
    pub stacks: bool,
    /// The coarse clock instead of a clock read per event.
    pub coarse_clock: bool,
    /// zstd compression of batches.
    pub compress: bool,
    /// Which native call stacks allocations carry.
    pub call_stacks: Stacks,
    /// Their depth limit, in frames.
    pub stack_depth: usize,
    /// Check every stack walk against the reference walks (a testing aid).
    pub check_stacks: bool,
    /// Sampling mode's mean bytes between sampled allocations; 0: off.
    pub sample_bytes: u64,
    /// The sampling countdowns' seed; 0: from the clock.
    pub sample_seed: u64,
    pub overwrite: bool,
    pub index: Option<CString>,
    /// Trace only programs of these names (empty: all).
    pub only: Vec<Vec<u8>>,
    /// Trace forked children (ALLOCTRACE_FOLLOW unset or 1).
    pub follow: bool,
    /// With `follow` off: the process whose images are traced (unset: this
    /// one, the first).
    pub root_pid: Option<i32>,
    /// Flight-recorder mode: the ring's size in bytes, 0 for off.
    pub flight_recorder: u64,
    /// With the flight recorder: the RSS that triggers a dump, 0 for none.
    pub dump_on_rss: u64,
    /// The snapshot signal (ALLOCTRACE_SNAPSHOT_SIGNAL), 0 for none.
    pub snapshot_signal: i32,
    /// With the flight recorder: keep the generations of this many last
    /// milliseconds only (a duration in ALLOCTRACE_FLIGHT_RECORDER); 0: all.
    pub flight_recorder_age_ms: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// ALLOCTRACE_DISABLE is set: do nothing, say nothing.
    Disabled,
    Ok(Settings),
    /// A bad value: the message names the variable, the value and what is
    /// allowed.
    Bad(String),
}

/// Reads the configuration from the process environment.
pub fn from_env() -> Parsed {
    parse(|name| std::env::var_os(name))
}

/// Parses the configuration from `get` (the environment, or a test's map).
/// The grammar of each value is alloctrace-options' (the CLI's too).
pub fn parse(get: impl Fn(&str) -> Option<OsString>) -> Parsed {
    let value = |name: &str| get(name).map(|v| v.as_bytes().to_vec());
    if let Some(v) = value(DISABLE) {
        if !v.is_empty() && v != b"0" {
            return Parsed::Disabled;
        }
    }
    macro_rules! field {
        ($name:expr, $default:expr, $parse:expr) => {
            match value($name) {
                None => $default,
                Some(v) => match $parse(&v) {
                    Ok(x) => x,
                    Err(why) => return bad($name, &v, why),
                },
            }
        };
    }
    let pattern = field!(OUTPUT, DEFAULT_PATTERN.as_bytes().to_vec(), |p: &Vec<
        u8,
    >| {
        alloctrace_options::check_pattern(p).map(|()| p.clone())
    });
    let buffer_size = field!(
        BUFFER_SIZE,
        alloctrace_writer::DEFAULT_BUFFER_SIZE,
        |v: &Vec<u8>| { alloctrace_options::parse_buffer_size(v) }
    );
    let families = field!(RECORD, Families::ALL, |v: &Vec<u8>| Families::parse(v));
    let clock = field!(CLOCK, Clock::Precise, |v: &Vec<u8>| Clock::parse(v));
    let compression = field!(COMPRESSION, Compression::None, |v: &Vec<u8>| {
        Compression::parse(v)
    });
    let call_stacks = field!(STACKS, Stacks::DEFAULT, |v: &Vec<u8>| Stacks::parse(v));
    let stack_depth = field!(
        STACK_DEPTH,
        alloctrace_options::DEFAULT_STACK_DEPTH,
        |v: &Vec<u8>| alloctrace_options::parse_stack_depth(v)
    );
    let check_stacks = field!(CHECK_STACKS, false, |v: &Vec<u8>| {
        alloctrace_options::parse_flag(v).map_err(|_| "use 1 (check every stack walk) or 0")
    });
    let sample_bytes = field!(SAMPLE_BYTES, 0, |v: &Vec<u8>| {
        alloctrace_options::parse_sample_bytes(v)
    });
    let sample_seed = field!(SAMPLE_SEED, 0, |v: &Vec<u8>| std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .ok_or("not a seed: use a number (a testing aid)"));
    let overwrite = field!(OVERWRITE, false, |v: &Vec<u8>| {
        alloctrace_options::parse_flag(v).map_err(|_| "use 1 (replace an existing trace file) or 0")
    });
    let only = match value(ONLY) {
        None => Vec::new(),
        Some(v) if v.is_empty() => Vec::new(),
        Some(v) => match alloctrace_options::parse_only(&v) {
            Ok(names) => names,
            Err(why) => return bad(ONLY, &v, why),
        },
    };
    let follow = field!(FOLLOW, true, |v: &Vec<u8>| match &v[..] {
        b"" => Ok(true),
        _ => alloctrace_options::parse_flag(v)
            .map_err(|_| "use 0 (trace only the first process, not its children) or 1"),
    });
    let root_pid = field!(ROOT_PID, None, |v: &Vec<u8>| std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.parse::<i32>().ok())
        .filter(|&p| p > 0)
        .map(Some)
        .ok_or("not a process ID (the shim sets it; leave it unset)"));
    let flight = field!(
        FLIGHT_RECORDER,
        alloctrace_options::FlightRecorder {
            bytes: 0,
            age_ms: 0
        },
        |v: &Vec<u8>| { alloctrace_options::parse_flight_recorder(v) }
    );
    let (flight_recorder, flight_recorder_age_ms) = (flight.bytes, flight.age_ms);
    let dump_on_rss = field!(DUMP_ON_RSS, 0, |v: &Vec<u8>| {
        alloctrace_options::parse_dump_on_rss(v)
    });
    if dump_on_rss != 0 && flight_recorder == 0 {
        return bad(
            DUMP_ON_RSS,
            &value(DUMP_ON_RSS).unwrap_or_default(),
            "needs ALLOCTRACE_FLIGHT_RECORDER (the ring to dump)",
        );
    }
    let snapshot_signal = field!(SNAPSHOT_SIGNAL, libc::SIGUSR2, |v: &Vec<u8>| {
        parse_snapshot_signal(v)
    });
    let index = value(INDEX)
        .filter(|v| !v.is_empty())
        .and_then(|v| CString::new(v).ok());
    Parsed::Ok(Settings {
        pattern,
        buffer_size,
        heap: families.heap,
        mmap: families.mmap,
        stacks: families.stacks,
        coarse_clock: clock == Clock::Coarse,
        compress: compression == Compression::Zstd,
        call_stacks,
        stack_depth,
        check_stacks,
        sample_bytes,
        sample_seed,
        overwrite,
        index,
        only,
        follow,
        root_pid,
        flight_recorder,
        dump_on_rss,
        snapshot_signal,
        flight_recorder_age_ms,
    })
}

/// `USR2` or `SIGUSR2` (the default), `USR1` or `SIGUSR1`, `off` or `0`.
fn parse_snapshot_signal(v: &[u8]) -> Result<i32, &'static str> {
    let name = v.strip_prefix(b"SIG").unwrap_or(v);
    match name {
        b"USR2" => Ok(libc::SIGUSR2),
        b"USR1" => Ok(libc::SIGUSR1),
        b"off" | b"0" => Ok(0),
        _ => Err("use USR2, USR1 or off"),
    }
}

fn bad(name: &str, value: &[u8], why: &str) -> Parsed {
    Parsed::Bad(format!(
        "{name}=\"{}\": {why}",
        String::from_utf8_lossy(value).escape_debug()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse_map(vars: &[(&str, &str)]) -> Parsed {
        let map: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        parse(|name| map.get(name).cloned())
    }

    fn ok(vars: &[(&str, &str)]) -> Settings {
        match parse_map(vars) {
            Parsed::Ok(s) => s,
            other => panic!("{vars:?}: {other:?}"),
        }
    }

    fn bad_message(vars: &[(&str, &str)]) -> String {
        match parse_map(vars) {
            Parsed::Bad(m) => m,
            other => panic!("{vars:?} accepted: {other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let s = ok(&[]);
        assert_eq!(s.pattern, b"alloctrace.%p.trace");
        assert_eq!(s.buffer_size, 64 << 10);
        assert!(s.heap && s.mmap && s.stacks && !s.overwrite && !s.coarse_clock && !s.compress);
        assert_eq!(s.index, None);
    }

    #[test]
    fn values() {
        let s = ok(&[
            (OUTPUT, "/tmp/x.%p.%%.trace"),
            (BUFFER_SIZE, "1m"),
            (RECORD, "heap, stacks"),
            (OVERWRITE, "1"),
            (INDEX, "/tmp/idx"),
        ]);
        assert_eq!(s.buffer_size, 1 << 20);
        assert!(s.heap && !s.mmap && s.stacks && s.overwrite);
        assert_eq!(s.index, Some(CString::new("/tmp/idx").unwrap()));
        assert_eq!(expand(&s.pattern, 42), b"/tmp/x.42.%.trace");
        assert_eq!(ok(&[(BUFFER_SIZE, "4096")]).buffer_size, 4096);
        assert_eq!(ok(&[(BUFFER_SIZE, "16M")]).buffer_size, 16 << 20);
        assert!(!ok(&[(RECORD, "mmap")]).heap);
        assert!(ok(&[(RECORD, "all")]).stacks);
        assert!(!ok(&[(OVERWRITE, "0")]).overwrite);
        assert!(ok(&[(CLOCK, "coarse")]).coarse_clock);
        assert!(!ok(&[(CLOCK, "precise")]).coarse_clock);
        assert!(ok(&[(COMPRESSION, "zstd")]).compress);
        assert_eq!(ok(&[]).call_stacks, Stacks::Full);
        assert_eq!(ok(&[]).stack_depth, 64);
        assert_eq!(ok(&[(STACKS, "full")]).call_stacks, Stacks::Full);
        assert_eq!(ok(&[(STACKS, "none")]).call_stacks, Stacks::None);
        assert_eq!(ok(&[(STACK_DEPTH, "200")]).stack_depth, 200);
        assert!(!ok(&[]).check_stacks);
        assert!(ok(&[(CHECK_STACKS, "1")]).check_stacks);
        assert!(!ok(&[(CHECK_STACKS, "0")]).check_stacks);
        assert_eq!(ok(&[]).sample_bytes, 0);
        assert_eq!(ok(&[(SAMPLE_BYTES, "512KiB")]).sample_bytes, 512 << 10);
        assert_eq!(ok(&[(SAMPLE_BYTES, "4096")]).sample_bytes, 4096);
        assert_eq!(ok(&[(SAMPLE_SEED, "42")]).sample_seed, 42);
        assert_eq!(ok(&[]).flight_recorder, 0);
        let s = ok(&[(FLIGHT_RECORDER, "64MiB"), (DUMP_ON_RSS, "2GiB")]);
        assert_eq!((s.flight_recorder, s.dump_on_rss), (64 << 20, 2 << 30));
        assert_eq!(ok(&[]).snapshot_signal, libc::SIGUSR2);
        assert_eq!(
            ok(&[(SNAPSHOT_SIGNAL, "SIGUSR1")]).snapshot_signal,
            libc::SIGUSR1
        );
        assert_eq!(
            ok(&[(SNAPSHOT_SIGNAL, "USR2")]).snapshot_signal,
            libc::SIGUSR2
        );
        assert_eq!(ok(&[(SNAPSHOT_SIGNAL, "off")]).snapshot_signal, 0);
        assert_eq!(s.flight_recorder_age_ms, 0);
        let s = ok(&[(FLIGHT_RECORDER, "30s")]);
        assert_eq!(
            (s.flight_recorder, s.flight_recorder_age_ms),
            (256 << 20, 30_000)
        );
        let s = ok(&[(FLIGHT_RECORDER, "2min,1GiB")]);
        assert_eq!(
            (s.flight_recorder, s.flight_recorder_age_ms),
            (1 << 30, 120_000)
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (vars, needle) in [
            (vec![(BUFFER_SIZE, "12x")], "ALLOCTRACE_BUFFER_SIZE=\"12x\""),
            (vec![(BUFFER_SIZE, "100")], "4096 to 16777216"),
            (vec![(BUFFER_SIZE, "17m")], "ALLOCTRACE_BUFFER_SIZE"),
            (vec![(BUFFER_SIZE, "")], "ALLOCTRACE_BUFFER_SIZE"),
            (vec![(RECORD, "heap,pages")], "unknown family"),
            (vec![(RECORD, "")], "ALLOCTRACE_RECORD"),
            (vec![(OUTPUT, "")], "ALLOCTRACE_OUTPUT"),
            (vec![(OUTPUT, "x.%d")], "unknown % escape"),
            (vec![(OUTPUT, "x%")], "unknown % escape"),
            (vec![(OUTPUT, "dir/")], "directory"),
            (vec![(OVERWRITE, "yes")], "ALLOCTRACE_OVERWRITE"),
            (
                vec![(CLOCK, "fast")],
                "ALLOCTRACE_CLOCK=\"fast\": use precise",
            ),
            (vec![(COMPRESSION, "gzip")], "ALLOCTRACE_COMPRESSION"),
            (
                vec![(ONLY, "/usr/bin/python3")],
                "ALLOCTRACE_ONLY=\"/usr/bin/python3\": a program name has no '/'",
            ),
            (vec![(ONLY, "a,,b")], "ALLOCTRACE_ONLY"),
            (vec![(FOLLOW, "no")], "ALLOCTRACE_FOLLOW"),
            (vec![(ROOT_PID, "x")], "ALLOCTRACE_ROOT_PID"),
            (
                vec![(STACKS, "dwarf")],
                "ALLOCTRACE_STACKS=\"dwarf\": use none or full",
            ),
            (
                vec![(STACKS, "fast")],
                "ALLOCTRACE_STACKS=\"fast\": fast was removed: full now costs about as little",
            ),
            (
                vec![(STACK_DEPTH, "0")],
                "ALLOCTRACE_STACK_DEPTH=\"0\": not a depth",
            ),
            (vec![(STACK_DEPTH, "1000")], "ALLOCTRACE_STACK_DEPTH"),
            (
                vec![(SAMPLE_BYTES, "lots")],
                "ALLOCTRACE_SAMPLE_BYTES=\"lots\": not a sampling size",
            ),
            (vec![(SAMPLE_SEED, "x")], "ALLOCTRACE_SAMPLE_SEED"),
            (
                vec![(SNAPSHOT_SIGNAL, "TERM")],
                "ALLOCTRACE_SNAPSHOT_SIGNAL=\"TERM\": use USR2, USR1 or off",
            ),
            (
                vec![(CHECK_STACKS, "yes")],
                "ALLOCTRACE_CHECK_STACKS=\"yes\": use 1",
            ),
            (
                vec![(FLIGHT_RECORDER, "100")],
                "ALLOCTRACE_FLIGHT_RECORDER=\"100\": not a ring size",
            ),
            (
                vec![(FLIGHT_RECORDER, "500ms")],
                "ALLOCTRACE_FLIGHT_RECORDER=\"500ms\": a duration from 1s",
            ),
            (
                vec![(FLIGHT_RECORDER, "64MiB"), (DUMP_ON_RSS, "x")],
                "ALLOCTRACE_DUMP_ON_RSS=\"x\": not a size",
            ),
            (
                vec![(DUMP_ON_RSS, "1GiB")],
                "ALLOCTRACE_DUMP_ON_RSS=\"1GiB\": needs ALLOCTRACE_FLIGHT_RECORDER",
            ),
        ] {
            let msg = bad_message(&vars);
            assert!(msg.contains(needle), "{vars:?}: {msg}");
        }
    }

    #[test]
    fn only_and_follow() {
        let s = ok(&[]);
        assert!(s.only.is_empty() && s.follow && s.root_pid.is_none());
        let s = ok(&[(ONLY, "python3,sh"), (FOLLOW, "0"), (ROOT_PID, "42")]);
        assert_eq!(s.only, vec![b"python3".to_vec(), b"sh".to_vec()]);
        assert!(!s.follow);
        assert_eq!(s.root_pid, Some(42));
        assert!(ok(&[(FOLLOW, "1"), (ONLY, "")]).follow);
    }

    #[test]
    fn disable() {
        assert_eq!(
            parse_map(&[(DISABLE, "1"), (BUFFER_SIZE, "bad")]),
            Parsed::Disabled
        );
        assert!(matches!(parse_map(&[(DISABLE, "0")]), Parsed::Ok(_)));
        assert!(matches!(parse_map(&[(DISABLE, "")]), Parsed::Ok(_)));
    }
}
