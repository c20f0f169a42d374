//! The shim's configuration: environment variables, read once by the
//! constructor (README.md, "Tracing any program: LD_PRELOAD").
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
//! | `ALLOCTRACE_INDEX` | unset | a file to append `pid<TAB>name<TAB>trace path` lines to (`alloctrace record` sets it) |

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;

pub const OUTPUT: &str = "ALLOCTRACE_OUTPUT";
pub const BUFFER_SIZE: &str = "ALLOCTRACE_BUFFER_SIZE";
pub const RECORD: &str = "ALLOCTRACE_RECORD";
pub const CLOCK: &str = "ALLOCTRACE_CLOCK";
pub const COMPRESSION: &str = "ALLOCTRACE_COMPRESSION";
pub const OVERWRITE: &str = "ALLOCTRACE_OVERWRITE";
pub const DISABLE: &str = "ALLOCTRACE_DISABLE";
pub const INDEX: &str = "ALLOCTRACE_INDEX";

/// Variables an exec'd program must see to be traced like this one, in
/// the order they are added to an environment that lacks them.
pub const CARRIED: [&str; 8] = ["LD_PRELOAD", OUTPUT, BUFFER_SIZE, RECORD, CLOCK, COMPRESSION, INDEX, DISABLE];

pub const DEFAULT_PATTERN: &str = "alloctrace.%p.trace";

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
    pub overwrite: bool,
    pub index: Option<CString>,
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
pub fn parse(get: impl Fn(&str) -> Option<OsString>) -> Parsed {
    let value = |name: &str| get(name).map(|v| v.as_bytes().to_vec());
    if let Some(v) = value(DISABLE) {
        if !v.is_empty() && v != b"0" {
            return Parsed::Disabled;
        }
    }
    let pattern = match value(OUTPUT) {
        None => DEFAULT_PATTERN.as_bytes().to_vec(),
        Some(p) => match check_pattern(&p) {
            Ok(()) => p,
            Err(why) => return bad(OUTPUT, &p, why),
        },
    };
    let buffer_size = match value(BUFFER_SIZE) {
        None => alloctrace_core::DEFAULT_BUFFER_SIZE,
        Some(v) => match parse_size(&v) {
            Some(n) if (alloctrace_core::MIN_BUFFER_SIZE..=alloctrace_core::MAX_BUFFER_SIZE).contains(&n) => n,
            _ => {
                return bad(
                    BUFFER_SIZE,
                    &v,
                    "not a buffer size: use bytes from 4096 to 16777216, with an optional k (KiB) or m (MiB) suffix",
                )
            }
        },
    };
    let (mut heap, mut mmap, mut stacks) = (true, true, true);
    if let Some(v) = value(RECORD) {
        (heap, mmap, stacks) = (false, false, false);
        let list = String::from_utf8_lossy(&v).to_string();
        if list.trim().is_empty() {
            return bad(RECORD, &v, "empty: name one or more of heap, mmap, stacks, all (comma-separated)");
        }
        for family in list.split(',').map(str::trim) {
            match family {
                "heap" => heap = true,
                "mmap" => mmap = true,
                "stacks" => stacks = true,
                "all" => (heap, mmap, stacks) = (true, true, true),
                _ => {
                    return bad(
                        RECORD,
                        &v,
                        "unknown family: name one or more of heap, mmap, stacks, all (comma-separated)",
                    )
                }
            }
        }
    }
    let coarse_clock = match value(CLOCK).as_deref() {
        None | Some(b"precise") => false,
        Some(b"coarse") => true,
        Some(v) => return bad(CLOCK, v, "use precise (a clock read per event) or coarse"),
    };
    let compress = match value(COMPRESSION).as_deref() {
        None | Some(b"none") => false,
        Some(b"zstd") => true,
        Some(v) => return bad(COMPRESSION, v, "use none or zstd"),
    };
    let overwrite = match value(OVERWRITE).as_deref() {
        None | Some(b"") | Some(b"0") => false,
        Some(b"1") => true,
        Some(v) => return bad(OVERWRITE, v, "use 1 (replace an existing trace file) or 0"),
    };
    let index = value(INDEX).filter(|v| !v.is_empty()).and_then(|v| CString::new(v).ok());
    Parsed::Ok(Settings { pattern, buffer_size, heap, mmap, stacks, coarse_clock, compress, overwrite, index })
}

fn bad(name: &str, value: &[u8], why: &str) -> Parsed {
    Parsed::Bad(format!("{name}=\"{}\": {why}", String::from_utf8_lossy(value).escape_debug()))
}

fn check_pattern(p: &[u8]) -> Result<(), &'static str> {
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
    let dot = name[file_start..].iter().rposition(|&c| c == b'.').filter(|&d| d > 0).map(|d| file_start + d);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse_map(vars: &[(&str, &str)]) -> Parsed {
        let map: HashMap<String, OsString> = vars.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
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
        assert_eq!(ok(&[(RECORD, "mmap")]).heap, false);
        assert!(ok(&[(RECORD, "all")]).stacks);
        assert!(!ok(&[(OVERWRITE, "0")]).overwrite);
        assert!(ok(&[(CLOCK, "coarse")]).coarse_clock);
        assert!(!ok(&[(CLOCK, "precise")]).coarse_clock);
        assert!(ok(&[(COMPRESSION, "zstd")]).compress);
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
            (vec![(CLOCK, "fast")], "ALLOCTRACE_CLOCK=\"fast\": use precise"),
            (vec![(COMPRESSION, "gzip")], "ALLOCTRACE_COMPRESSION"),
        ] {
            let msg = bad_message(&vars);
            assert!(msg.contains(needle), "{vars:?}: {msg}");
        }
    }

    #[test]
    fn disable() {
        assert_eq!(parse_map(&[(DISABLE, "1"), (BUFFER_SIZE, "bad")]), Parsed::Disabled);
        assert!(matches!(parse_map(&[(DISABLE, "0")]), Parsed::Ok(_)));
        assert!(matches!(parse_map(&[(DISABLE, "")]), Parsed::Ok(_)));
    }

    #[test]
    fn suffixes() {
        assert_eq!(with_suffix(b"out.trace", 1), b"out.1.trace");
        assert_eq!(with_suffix(b"/a.b/alloctrace.12.trace", 2), b"/a.b/alloctrace.12.2.trace");
        assert_eq!(with_suffix(b"/a.b/out", 3), b"/a.b/out.3");
        assert_eq!(with_suffix(b".hidden", 1), b".hidden.1");
        assert_eq!(expand(b"%%p%p", 7), b"%p7");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size(b"64k"), Some(65536));
        assert_eq!(parse_size(b"k"), None);
        assert_eq!(parse_size(b"-1"), None);
        assert_eq!(parse_size(b"99999999999999999999m"), None);
    }
}
