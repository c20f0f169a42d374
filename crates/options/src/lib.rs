//! The grammar of alloctrace's tracing options, defined once for the two
//! places that read them: `alloctrace record` (command-line options,
//! checked by clap before the program starts) and the LD_PRELOAD shim
//! (`ALLOCTRACE_*` environment variables, read by its constructor).
//! `record` turns each checked option into the variable's value with the
//! `*_value`/`name` functions here, so whatever `record` accepts, the shim
//! accepts too.
//!
//! Each parse function takes the raw bytes of a value and returns the typed
//! value or a short reason in words ("use precise or coarse"), which the
//! caller prefixes with the option's or the variable's name.
//!
//! No dependency but the format crate (for the largest batch); with the
//! `clap` feature, the enums derive `clap::ValueEnum` (the CLI turns it on;
//! the shim, a small cdylib, does not). Nothing here is meant for the
//! shim's event path: parsing allocates.

/// The environment variables the shim reads (docs/PRELOAD.md,
/// "Configuration").
pub mod env {
    pub const OUTPUT: &str = "ALLOCTRACE_OUTPUT";
    pub const BUFFER_SIZE: &str = "ALLOCTRACE_BUFFER_SIZE";
    pub const RECORD: &str = "ALLOCTRACE_RECORD";
    pub const CLOCK: &str = "ALLOCTRACE_CLOCK";
    pub const COMPRESSION: &str = "ALLOCTRACE_COMPRESSION";
    pub const OVERWRITE: &str = "ALLOCTRACE_OVERWRITE";
    pub const DISABLE: &str = "ALLOCTRACE_DISABLE";
    pub const INDEX: &str = "ALLOCTRACE_INDEX";
    /// Comma-separated program names: only these are traced.
    pub const ONLY: &str = "ALLOCTRACE_ONLY";
    /// `0`: trace only the first process (and what it execs), no children.
    pub const FOLLOW: &str = "ALLOCTRACE_FOLLOW";
    /// Set by the shim of the first process when ALLOCTRACE_FOLLOW=0: the
    /// pid whose images are traced.
    pub const ROOT_PID: &str = "ALLOCTRACE_ROOT_PID";
    /// `none` or `full`: which native call stacks allocations carry
    /// (`fast` was removed and is refused).
    pub const STACKS: &str = "ALLOCTRACE_STACKS";
    /// The call stacks' depth limit in frames, 1 to 256.
    pub const STACK_DEPTH: &str = "ALLOCTRACE_STACK_DEPTH";
    /// Sampling mode: the mean bytes between sampled allocations
    /// ([`parse_sample_bytes`](crate::parse_sample_bytes)); unset or 0:
    /// every allocation.
    pub const SAMPLE_BYTES: &str = "ALLOCTRACE_SAMPLE_BYTES";
    /// Flight-recorder mode: the ring's size in bytes (KiB, MiB, GiB
    /// suffixes); nothing is written until a dump.
    pub const FLIGHT_RECORDER: &str = "ALLOCTRACE_FLIGHT_RECORDER";
    /// With the flight recorder: dump once when the RSS reaches this size.
    pub const DUMP_ON_RSS: &str = "ALLOCTRACE_DUMP_ON_RSS";
    /// Every variable above, for a caller that must clear them all.
    pub const ALL: [&str; 16] = [
        OUTPUT,
        BUFFER_SIZE,
        RECORD,
        CLOCK,
        COMPRESSION,
        OVERWRITE,
        DISABLE,
        INDEX,
        ONLY,
        FOLLOW,
        ROOT_PID,
        STACKS,
        STACK_DEPTH,
        SAMPLE_BYTES,
        FLIGHT_RECORDER,
        DUMP_ON_RSS,
    ];
    /// The signal that asks a traced process for a snapshot of its live
    /// heap (the shim only, where the program's disposition is SIG_DFL):
    /// `USR2` (the default), `USR1`, or `off`. Not an option of `record`
    /// (so not in [`ALL`]): `record` passes it through.
    pub const SNAPSHOT_SIGNAL: &str = "ALLOCTRACE_SNAPSHOT_SIGNAL";
    /// A testing aid, not an option of `record` (so not in [`ALL`]): the
    /// seed of the sampling countdowns, a number; a fixed seed samples the
    /// same allocations of a deterministic program every run.
    pub const SAMPLE_SEED: &str = "ALLOCTRACE_SAMPLE_SEED";
    /// `1`: a testing aid, not an option of `record` (so not in [`ALL`]):
    /// every stack walk of the shim is checked against two reference walks,
    /// and the counts go to stderr when the session ends.
    pub const CHECK_STACKS: &str = "ALLOCTRACE_CHECK_STACKS";
}

/// The smallest thread buffer.
pub const MIN_BUFFER_SIZE: usize = 4096;
/// The largest thread buffer: one batch's largest payload.
pub const MAX_BUFFER_SIZE: usize = alloctrace_format::MAX_BATCH_PAYLOAD as usize;
/// The shim's default thread buffer.
pub const DEFAULT_BUFFER_SIZE: usize = 64 << 10;
/// The shim's default output pattern.
pub const DEFAULT_PATTERN: &str = "alloctrace.%p.trace";

/// Checks a trace file name pattern: not empty, no NUL or line break, only
/// the escapes `%p` (the process ID) and `%%` (a `%`), not ending in `/`.
pub fn check_pattern(p: &[u8]) -> Result<(), &'static str> {
    if p.is_empty() {
        return Err("empty: give a file name; %p stands for the process ID");
    }
    if p.contains(&0) || p.contains(&b'\n') {
        return Err("contains a NUL or a line break");
    }
    let mut i = 0;
    while i < p.len() {
        if p[i] == b'%' {
            match p.get(i + 1) {
                Some(b'p') | Some(b'%') => i += 1,
                _ => return Err("unknown % escape: use %p for the process ID and %% for a %"),
            }
        }
        i += 1;
    }
    if p.ends_with(b"/") {
        return Err("names a directory: give a file name; %p stands for the process ID");
    }
    Ok(())
}

/// The pattern with `%p` replaced by `pid` and `%%` by `%`.
pub fn expand(pattern: &[u8], pid: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(pattern.len() + 10);
    let mut i = 0;
    while i < pattern.len() {
        match (pattern[i], pattern.get(i + 1)) {
            (b'%', Some(b'p')) => {
                out.extend_from_slice(pid.to_string().as_bytes());
                i += 2;
            }
            (b'%', Some(b'%')) => {
                out.push(b'%');
                i += 2;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// The `k`-th alternative to `name` when it exists already: `.k` before the
/// extension of the last path component (`out.trace` -> `out.1.trace`), or
/// at the end when it has none.
pub fn with_suffix(name: &[u8], k: u32) -> Vec<u8> {
    let file_start = name.iter().rposition(|&c| c == b'/').map_or(0, |i| i + 1);
    let dot = name[file_start..]
        .iter()
        .rposition(|&c| c == b'.')
        .filter(|&d| d > 0)
        .map(|d| file_start + d);
    let suffix = format!(".{k}");
    let mut out = Vec::with_capacity(name.len() + suffix.len());
    match dot {
        Some(d) => {
            out.extend_from_slice(&name[..d]);
            out.extend_from_slice(suffix.as_bytes());
            out.extend_from_slice(&name[d..]);
        }
        None => {
            out.extend_from_slice(name);
            out.extend_from_slice(suffix.as_bytes());
        }
    }
    out
}

/// Bytes, with an optional k (KiB) or m (MiB) suffix.
pub fn parse_size(v: &[u8]) -> Option<usize> {
    let s = std::str::from_utf8(v).ok()?.trim();
    let (digits, unit) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1 << 10),
        b'm' | b'M' => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<usize>().ok()?.checked_mul(unit)
}

/// A thread buffer size: [`parse_size`] within
/// [`MIN_BUFFER_SIZE`]..=[`MAX_BUFFER_SIZE`].
pub fn parse_buffer_size(v: &[u8]) -> Result<usize, &'static str> {
    match parse_size(v) {
        Some(n) if (MIN_BUFFER_SIZE..=MAX_BUFFER_SIZE).contains(&n) => Ok(n),
        _ => Err("not a buffer size: use bytes from 4096 to 16777216, with an optional k (KiB) or m (MiB) suffix"),
    }
}

/// The largest sampling mean accepted: 1 TiB.
pub const MAX_SAMPLE_BYTES: u64 = 1 << 40;

/// A sampling mean (`record --sample-bytes`, `ALLOCTRACE_SAMPLE_BYTES`):
/// a size as [`parse_bytes`] reads it, up to 1 TiB; 0 turns sampling off.
pub fn parse_sample_bytes(v: &[u8]) -> Result<u64, &'static str> {
    const WHY: &str = "not a sampling size: use bytes, with an optional KiB or MiB suffix (512KiB is the production setting), up to 1 TiB, or 0 to record every allocation";
    parse_bytes(v).filter(|&n| n <= MAX_SAMPLE_BYTES).ok_or(WHY)
}

/// Which families of calls to record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Families {
    pub heap: bool,
    pub mmap: bool,
    pub stacks: bool,
}

impl Families {
    pub const ALL: Families = Families {
        heap: true,
        mmap: true,
        stacks: true,
    };

    /// A comma-separated list of `heap`, `mmap`, `stacks`, `all` (spaces
    /// around names allowed).
    pub fn parse(v: &[u8]) -> Result<Families, &'static str> {
        let list = std::str::from_utf8(v).map_err(|_| {
            "not UTF-8: name one or more of heap, mmap, stacks, all (comma-separated)"
        })?;
        if list.trim().is_empty() {
            return Err("empty: name one or more of heap, mmap, stacks, all (comma-separated)");
        }
        let mut f = Families {
            heap: false,
            mmap: false,
            stacks: false,
        };
        for family in list.split(',').map(str::trim) {
            match family {
                "heap" => f.heap = true,
                "mmap" => f.mmap = true,
                "stacks" => f.stacks = true,
                "all" => f = Families::ALL,
                _ => return Err(
                    "unknown family: name one or more of heap, mmap, stacks, all (comma-separated)",
                ),
            }
        }
        Ok(f)
    }

    /// The list [`Families::parse`] reads back as `self`.
    pub fn value(&self) -> String {
        let names = [
            (self.heap, "heap"),
            (self.mmap, "mmap"),
            (self.stacks, "stacks"),
        ];
        names
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, n)| *n)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Which clock stamps events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Clock {
    /// A clock read per event.
    Precise,
    /// A time the tracer publishes every few microseconds: cheaper, coarser.
    Coarse,
}

impl Clock {
    pub const ALL: [Clock; 2] = [Clock::Precise, Clock::Coarse];

    pub fn name(self) -> &'static str {
        match self {
            Clock::Precise => "precise",
            Clock::Coarse => "coarse",
        }
    }

    pub fn parse(v: &[u8]) -> Result<Clock, &'static str> {
        Clock::ALL
            .into_iter()
            .find(|c| c.name().as_bytes() == v)
            .ok_or("use precise (a clock read per event) or coarse")
    }
}

/// How batches are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Compression {
    /// As the writer builds them.
    None,
    /// Compressed with zstd by the writer thread.
    Zstd,
}

impl Compression {
    pub const ALL: [Compression; 2] = [Compression::None, Compression::Zstd];

    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Zstd => "zstd",
        }
    }

    pub fn parse(v: &[u8]) -> Result<Compression, &'static str> {
        Compression::ALL
            .into_iter()
            .find(|c| c.name().as_bytes() == v)
            .ok_or("use none or zstd")
    }
}

/// Which native call stacks allocations carry (`record --stacks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Stacks {
    /// No call stacks.
    None,
    /// DWARF CFI (.eh_frame) for every frame: right on any code.
    Full,
}

impl Stacks {
    pub const ALL: [Stacks; 2] = [Stacks::None, Stacks::Full];
    /// What `record` and the shim use when not told.
    pub const DEFAULT: Stacks = Stacks::Full;

    pub fn name(self) -> &'static str {
        match self {
            Stacks::None => "none",
            Stacks::Full => "full",
        }
    }

    /// Why `fast` is refused: the mode (a frame-pointer walk, one frame
    /// per allocation on a distribution's binaries) was removed.
    pub const FAST_REMOVED: &'static str =
        "fast was removed: full now costs about as little; use full or none";

    pub fn parse(v: &[u8]) -> Result<Stacks, &'static str> {
        if v == b"fast" {
            return Err(Stacks::FAST_REMOVED);
        }
        Stacks::ALL
            .into_iter()
            .find(|c| c.name().as_bytes() == v)
            .ok_or("use none or full (DWARF unwind tables)")
    }
}

/// The default depth limit of call stacks, in frames.
pub const DEFAULT_STACK_DEPTH: usize = 64;
/// The largest depth limit.
pub const MAX_STACK_DEPTH: usize = 256;

/// A call-stack depth limit: 1 to [`MAX_STACK_DEPTH`] frames.
pub fn parse_stack_depth(v: &[u8]) -> Result<usize, &'static str> {
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|n| (1..=MAX_STACK_DEPTH).contains(n))
        .ok_or("not a depth: use a number of frames from 1 to 256")
}

/// The smallest flight-recorder ring (the writer's
/// `MIN_FLIGHT_RECORDER_BYTES`).
pub const MIN_FLIGHT_RECORDER: u64 = 1 << 20;
/// The largest flight-recorder ring (the writer's
/// `MAX_FLIGHT_RECORDER_BYTES`).
pub const MAX_FLIGHT_RECORDER: u64 = 1 << 40;

/// A size in bytes: digits, then optionally a unit, any case: `B`; `k`,
/// `KB`, `KiB` (1024); `m`, `MB`, `MiB` (2^20); `g`, `GB`, `GiB` (2^30);
/// `t`, `TB`, `TiB` (2^40). Every unit is a power of 1024.
pub fn parse_bytes(v: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(v).ok()?.trim();
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(digits_end);
    if digits.is_empty() {
        return None;
    }
    let shift = match unit.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    digits.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// The ring's size when `--flight-recorder` gives a duration alone.
pub const DEFAULT_FLIGHT_RECORDER_FOR_AGE: u64 = 256 << 20;
/// The shortest duration the flight recorder keeps (a generation ends
/// every eighth of it).
pub const MIN_FLIGHT_RECORDER_AGE_MS: u64 = 1000;
/// The longest: a week.
pub const MAX_FLIGHT_RECORDER_AGE_MS: u64 = 7 * 24 * 3600 * 1000;

/// What `--flight-recorder` / `ALLOCTRACE_FLIGHT_RECORDER` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlightRecorder {
    /// The ring's size in bytes.
    pub bytes: u64,
    /// Keep only the generations of this many last milliseconds; 0: as
    /// many as the ring holds.
    pub age_ms: u64,
}

/// A duration in milliseconds: digits and a unit, `ms`, `s` (`sec`),
/// `min` or `h`.
fn parse_duration_ms(s: &str) -> Option<u64> {
    let digits_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(digits_end);
    if digits.is_empty() {
        return None;
    }
    let ms: u64 = match unit.trim_start().to_ascii_lowercase().as_str() {
        "ms" => 1,
        "s" | "sec" => 1000,
        "min" => 60_000,
        "h" => 3_600_000,
        _ => return None,
    };
    digits.parse::<u64>().ok()?.checked_mul(ms)
}

/// The flight recorder's ring: a size from 1 MiB to 1 TiB
/// ([`parse_bytes`]), a duration from 1s to 7 days (`30s`, `5min`, `2h`:
/// the last that long, in a ring of [`DEFAULT_FLIGHT_RECORDER_FOR_AGE`]),
/// or both, comma-separated (`30s,1GiB`).
pub fn parse_flight_recorder(v: &[u8]) -> Result<FlightRecorder, &'static str> {
    const BAD: &str = "not a ring size or duration: use bytes from 1MiB to 1TiB with an optional KiB, MiB or GiB suffix (64MiB), a duration from 1s to 7 days (30s, 5min, 2h), or both (30s,1GiB)";
    let s = std::str::from_utf8(v).map_err(|_| BAD)?.trim();
    let mut bytes = None;
    let mut age_ms = None;
    for part in s.split(',') {
        let part = part.trim();
        if let Some(ms) = parse_duration_ms(part) {
            if age_ms.replace(ms).is_some() {
                return Err(BAD);
            }
            if !(MIN_FLIGHT_RECORDER_AGE_MS..=MAX_FLIGHT_RECORDER_AGE_MS).contains(&ms) {
                return Err("a duration from 1s to 7 days (e.g. 30s)");
            }
        } else {
            match parse_bytes(part.as_bytes()) {
                Some(n) if bytes.is_none() => bytes = Some(n),
                _ => return Err(BAD),
            }
        }
    }
    let bytes = bytes.unwrap_or(DEFAULT_FLIGHT_RECORDER_FOR_AGE);
    if !(MIN_FLIGHT_RECORDER..=MAX_FLIGHT_RECORDER).contains(&bytes) {
        return Err(BAD);
    }
    Ok(FlightRecorder {
        bytes,
        age_ms: age_ms.unwrap_or(0),
    })
}

/// The RSS threshold of `--dump-on-rss`: a size of at least 1 byte
/// ([`parse_bytes`]).
pub fn parse_dump_on_rss(v: &[u8]) -> Result<u64, &'static str> {
    match parse_bytes(v) {
        Some(n) if n > 0 => Ok(n),
        _ => Err("not a size: use bytes with an optional KiB, MiB or GiB suffix (e.g. 2GiB)"),
    }
}

/// A yes/no variable: `1` or `0` (or empty, for no).
pub fn parse_flag(v: &[u8]) -> Result<bool, &'static str> {
    match v {
        b"" | b"0" => Ok(false),
        b"1" => Ok(true),
        _ => Err("use 1 or 0"),
    }
}

/// One name of `--only` / ALLOCTRACE_ONLY: a program's file name, without
/// a directory.
pub fn check_program_name(name: &[u8]) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("empty program name: give names such as python3 (comma-separated)");
    }
    if name.contains(&b'/') {
        return Err(
            "a program name has no '/': give the file name (python3, not /usr/bin/python3)",
        );
    }
    if name.iter().any(|&c| c == 0 || c == b'\n' || c == b'\t') {
        return Err("contains a NUL, a tab or a line break");
    }
    Ok(())
}

/// A comma-separated list of program names (spaces around names allowed).
pub fn parse_only(v: &[u8]) -> Result<Vec<Vec<u8>>, &'static str> {
    let mut names = Vec::new();
    for name in v.split(|&c| c == b',') {
        let name = name.trim_ascii();
        check_program_name(name)?;
        names.push(name.to_vec());
    }
    Ok(names)
}

/// Whether a process is traced under `only` (empty: every process): one of
/// its `names` (the name it was started as, its executable's file name) is
/// in the list.
pub fn only_matches(only: &[Vec<u8>], names: &[&[u8]]) -> bool {
    only.is_empty()
        || names
            .iter()
            .any(|n| !n.is_empty() && only.iter().any(|o| o == n))
}

/// The last component of a path.
pub fn file_name(path: &[u8]) -> &[u8] {
    path.rsplit(|&c| c == b'/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    #[test]
    fn sample_bytes() {
        for (v, want) in [
            ("512KiB", 512 << 10),
            ("512k", 512 << 10),
            ("512 KiB", 512 << 10),
            ("524288", 524_288),
            ("1MiB", 1 << 20),
            ("2M", 2 << 20),
            ("0", 0),
            ("1TiB", 1 << 40),
        ] {
            assert_eq!(super::parse_sample_bytes(v.as_bytes()), Ok(want), "{v}");
        }
        for v in [
            "", "KiB", "-1", "1.5MiB", "512kb2", "12x", "2048GiB", "2TiB",
        ] {
            let e = super::parse_sample_bytes(v.as_bytes()).unwrap_err();
            assert!(e.contains("512KiB"), "{v}: {e}");
        }
    }

    use super::*;

    #[test]
    fn sizes_and_the_flight_recorder() {
        assert_eq!(parse_bytes(b"4096"), Some(4096));
        assert_eq!(parse_bytes(b"64MiB"), Some(64 << 20));
        assert_eq!(parse_bytes(b"64m"), Some(64 << 20));
        assert_eq!(parse_bytes(b"2GiB"), Some(2 << 30));
        assert_eq!(parse_bytes(b"512kb"), Some(512 << 10));
        assert_eq!(parse_bytes(b"1TiB"), Some(1 << 40));
        for bad in [
            &b""[..],
            b"MiB",
            b"12x",
            b"-1",
            b"1.5GiB",
            b"99999999999999999999",
        ] {
            assert_eq!(parse_bytes(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        let ring = |bytes, age_ms| Ok(FlightRecorder { bytes, age_ms });
        assert_eq!(parse_flight_recorder(b"64MiB"), ring(64 << 20, 0));
        assert!(parse_flight_recorder(b"512KiB").is_err());
        assert!(parse_flight_recorder(b"2TiB").is_err());
        assert_eq!(parse_flight_recorder(b"30s"), ring(256 << 20, 30_000));
        assert_eq!(parse_flight_recorder(b"5min"), ring(256 << 20, 300_000));
        assert_eq!(parse_flight_recorder(b"30s,1GiB"), ring(1 << 30, 30_000));
        assert_eq!(parse_flight_recorder(b"1GiB, 2h"), ring(1 << 30, 7_200_000));
        for bad in [
            &b"500ms"[..],
            b"8d",
            b"30s,40s",
            b"1GiB,2GiB",
            b"30s,",
            b"soon",
            b"1GiB,512KiB",
        ] {
            assert!(
                parse_flight_recorder(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(parse_flight_recorder(b"500ms")
            .unwrap_err()
            .contains("1s to 7 days"));
        assert_eq!(parse_dump_on_rss(b"2GiB"), Ok(2 << 30));
        assert!(parse_dump_on_rss(b"0").is_err());
    }

    #[test]
    fn stack_modes_and_depths() {
        for mode in Stacks::ALL {
            assert_eq!(Stacks::parse(mode.name().as_bytes()), Ok(mode));
        }
        assert!(Stacks::parse(b"dwarf").is_err());
        assert_eq!(Stacks::parse(b"fast"), Err(Stacks::FAST_REMOVED));
        assert!(Stacks::parse(b"").is_err());
        assert_eq!(parse_stack_depth(b"1"), Ok(1));
        assert_eq!(parse_stack_depth(b"256"), Ok(256));
        for bad in [&b"0"[..], b"257", b"", b"-1", b"64k", b" 64"] {
            assert!(parse_stack_depth(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn patterns() {
        assert_eq!(check_pattern(b"/tmp/x.%p.%%.trace"), Ok(()));
        for bad in [&b""[..], b"x.%d", b"x%", b"dir/", b"a\nb"] {
            assert!(check_pattern(bad).is_err(), "{bad:?}");
        }
        assert_eq!(expand(b"/tmp/x.%p.%%.trace", 42), b"/tmp/x.42.%.trace");
        assert_eq!(expand(b"%%p%p", 7), b"%p7");
    }

    #[test]
    fn suffixes() {
        assert_eq!(with_suffix(b"out.trace", 1), b"out.1.trace");
        assert_eq!(
            with_suffix(b"/a.b/alloctrace.12.trace", 2),
            b"/a.b/alloctrace.12.2.trace"
        );
        assert_eq!(with_suffix(b"/a.b/out", 3), b"/a.b/out.3");
        assert_eq!(with_suffix(b".hidden", 1), b".hidden.1");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size(b"64k"), Some(65536));
        assert_eq!(parse_size(b"k"), None);
        assert_eq!(parse_size(b"-1"), None);
        assert_eq!(parse_size(b"99999999999999999999m"), None);
        assert_eq!(parse_buffer_size(b"4096"), Ok(4096));
        assert_eq!(parse_buffer_size(b"16M"), Ok(16 << 20));
        for bad in [&b"1"[..], b"4095", b"17m", b"", b"12x"] {
            assert!(parse_buffer_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn families() {
        assert_eq!(
            Families::parse(b"heap, stacks"),
            Ok(Families {
                heap: true,
                mmap: false,
                stacks: true
            })
        );
        assert_eq!(Families::parse(b"mmap,all"), Ok(Families::ALL));
        assert!(Families::parse(b"heap,pages").is_err());
        assert!(Families::parse(b" ").is_err());
        for f in [
            Families::ALL,
            Families {
                heap: false,
                mmap: true,
                stacks: false,
            },
        ] {
            assert_eq!(Families::parse(f.value().as_bytes()), Ok(f));
        }
    }

    #[test]
    fn enums_read_back_their_names() {
        for c in Clock::ALL {
            assert_eq!(Clock::parse(c.name().as_bytes()), Ok(c));
        }
        for c in Compression::ALL {
            assert_eq!(Compression::parse(c.name().as_bytes()), Ok(c));
        }
        assert!(Clock::parse(b"fast").is_err());
        assert!(Compression::parse(b"lz4").is_err());
    }

    /// The CLI's spelling (clap's ValueEnum) is the shim's.
    #[cfg(feature = "clap")]
    #[test]
    fn value_enum_names_are_the_shims() {
        use clap::ValueEnum;
        for c in Clock::value_variants() {
            assert_eq!(c.to_possible_value().unwrap().get_name(), c.name());
        }
        for c in Compression::value_variants() {
            assert_eq!(c.to_possible_value().unwrap().get_name(), c.name());
        }
    }

    #[test]
    fn only() {
        assert_eq!(
            parse_only(b"python3, sh"),
            Ok(vec![b"python3".to_vec(), b"sh".to_vec()])
        );
        assert!(parse_only(b"").is_err());
        assert!(parse_only(b"a,,b").is_err());
        assert!(parse_only(b"/usr/bin/python3").is_err());
        let only = parse_only(b"python3").unwrap();
        assert!(only_matches(&only, &[b"bash", b"python3"]));
        assert!(!only_matches(&only, &[b"bash", b"bash"]));
        assert!(only_matches(&[], &[b"x"]));
        assert_eq!(file_name(b"/usr/bin/python3.11"), b"python3.11");
        assert_eq!(file_name(b"sh"), b"sh");
    }
}
