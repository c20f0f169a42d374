//! The symbols file (`TRACE.symbols`, docs/SYMBOLS.md): the frames of
//! every native address a trace uses, so that reports read on another
//! machine, without the binaries, still name functions.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::demangle::bounded;
use crate::{ModuleKey, SymbolFrame};

/// The `"format"` value that marks a symbols file.
pub const FORMAT: &str = "alloctrace-symbols";
/// The version this code writes and reads.
pub const VERSION: u64 = 1;

/// The symbols file of trace `trace`: `TRACE.symbols` beside it.
pub fn sidecar_path(trace: &Path) -> PathBuf {
    let mut name = trace.as_os_str().to_os_string();
    name.push(".symbols");
    PathBuf::from(name)
}

#[derive(Serialize, Deserialize)]
struct FileJson {
    format: String,
    version: u64,
    modules: Vec<ModuleJson>,
}

#[derive(Serialize, Deserialize)]
struct ModuleJson {
    path: String,
    /// Lowercase hex, empty when the module has none.
    build_id: String,
    addresses: Vec<AddressJson>,
}

#[derive(Serialize, Deserialize)]
struct AddressJson {
    /// `0x` and lowercase hex: the module-relative return address, as
    /// [`crate::Symbolizer::symbolize`] takes it.
    offset: String,
    frames: Vec<FrameJson>,
}

#[derive(Serialize, Deserialize)]
struct FrameJson {
    function: String,
    #[serde(default)]
    file: Option<String>,
    #[serde(default)]
    line: Option<u32>,
}

/// The frames of a set of addresses, by module and offset.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sidecar {
    modules: BTreeMap<ModuleKey, BTreeMap<u64, Vec<SymbolFrame>>>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// The byte offset of 1-based `line` and `column` in `text`.
fn byte_offset(text: &str, line: usize, column: usize) -> usize {
    let start: usize = text
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(str::len)
        .sum();
    (start + column.saturating_sub(1)).min(text.len())
}

impl Sidecar {
    pub fn new() -> Sidecar {
        Sidecar::default()
    }

    /// Records the frames of `offset` in `module` (a later insert of the
    /// same address replaces the earlier).
    pub fn insert(&mut self, module: &ModuleKey, offset: u64, frames: &[SymbolFrame]) {
        self.modules
            .entry(module.clone())
            .or_default()
            .insert(offset, frames.to_vec());
    }

    /// The frames recorded for `offset` in `module`.
    pub fn get(&self, module: &ModuleKey, offset: u64) -> Option<&[SymbolFrame]> {
        self.modules.get(module)?.get(&offset).map(Vec::as_slice)
    }

    /// Number of addresses.
    pub fn len(&self) -> usize {
        self.modules.values().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every (module, offset, frames), modules and offsets in order.
    pub fn entries(&self) -> impl Iterator<Item = (&ModuleKey, u64, &[SymbolFrame])> + '_ {
        self.modules.iter().flat_map(|(m, addrs)| {
            addrs
                .iter()
                .map(move |(offset, frames)| (m, *offset, frames.as_slice()))
        })
    }

    /// The file's JSON text.
    pub fn to_json(&self) -> String {
        let file = FileJson {
            format: FORMAT.to_string(),
            version: VERSION,
            modules: self
                .modules
                .iter()
                .map(|(m, addrs)| ModuleJson {
                    path: m.path.clone(),
                    build_id: hex(&m.build_id),
                    addresses: addrs
                        .iter()
                        .map(|(offset, frames)| AddressJson {
                            offset: format!("{offset:#x}"),
                            frames: frames
                                .iter()
                                .map(|f| FrameJson {
                                    function: f.function.clone(),
                                    file: f.file.clone(),
                                    line: f.line,
                                })
                                .collect(),
                        })
                        .collect(),
                })
                .collect(),
        };
        let mut text = serde_json::to_string(&file).unwrap_or_default();
        text.push('\n');
        text
    }

    /// Writes the file: to `PATH.tmp`, then renamed over `path`, so that a
    /// reader never sees half a file.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut tmp = path.as_os_str().to_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let result = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(self.to_json().as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    /// Parses a symbols file's text; the error names what is wrong and
    /// where (a byte offset for broken JSON).
    pub fn parse(text: &str) -> Result<Sidecar, String> {
        let file: FileJson = serde_json::from_str(text).map_err(|e| {
            format!(
                "not a symbols file: {e} (byte offset {})",
                byte_offset(text, e.line(), e.column())
            )
        })?;
        if file.format != FORMAT {
            return Err(format!(
                "not a symbols file: \"format\" is {:?}, not {FORMAT:?}",
                bounded(&file.format)
            ));
        }
        if file.version != VERSION {
            return Err(format!(
                "symbols file version {} (this alloctrace reads version {VERSION})",
                file.version
            ));
        }
        let mut out = Sidecar::new();
        for (i, m) in file.modules.into_iter().enumerate() {
            let build_id = unhex(&m.build_id).ok_or_else(|| {
                format!(
                    "module {i} ({}): build_id {:?} is not hex",
                    bounded(&m.path),
                    bounded(&m.build_id)
                )
            })?;
            let key = ModuleKey {
                path: bounded(&m.path),
                build_id,
            };
            let addrs = out.modules.entry(key.clone()).or_default();
            for a in m.addresses {
                let offset = a
                    .offset
                    .strip_prefix("0x")
                    .and_then(|h| u64::from_str_radix(h, 16).ok())
                    .ok_or_else(|| {
                        format!(
                            "module {i} ({}): offset {:?} is not 0x and hex digits",
                            key.path,
                            bounded(&a.offset)
                        )
                    })?;
                if a.frames.is_empty() {
                    return Err(format!(
                        "module {i} ({}): offset {offset:#x} has no frames",
                        key.path
                    ));
                }
                let frames = a
                    .frames
                    .into_iter()
                    .map(|f| SymbolFrame {
                        function: bounded(&f.function),
                        file: f.file.as_deref().map(bounded),
                        line: f.line,
                    })
                    .collect();
                addrs.insert(offset, frames);
            }
        }
        Ok(out)
    }

    /// Reads the symbols file at `path`: `Ok(None)` when there is none.
    pub fn read(path: &Path) -> Result<Option<Sidecar>, String> {
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            // Reading a FIFO could block, a device never end.
            Ok(m) if !m.is_file() => return Err(format!("{}: not a regular file", path.display())),
            _ => {}
        }
        let text = match std::fs::read(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        let text = String::from_utf8(text).map_err(|e| {
            format!(
                "{}: not a symbols file: invalid UTF-8 at byte offset {}",
                path.display(),
                e.utf8_error().valid_up_to()
            )
        })?;
        Sidecar::parse(&text)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ModuleKey {
        ModuleKey {
            path: "/usr/lib/libfoo.so".to_string(),
            build_id: vec![0xab, 0x01],
        }
    }

    #[test]
    fn round_trip() {
        let mut s = Sidecar::new();
        let frames = vec![
            SymbolFrame {
                function: "inner".to_string(),
                file: Some("a.c".to_string()),
                line: Some(3),
            },
            SymbolFrame {
                function: "outer".to_string(),
                file: None,
                line: None,
            },
        ];
        s.insert(&key(), 0x1234, &frames);
        s.insert(&key(), 0x10, &frames[1..]);
        let text = s.to_json();
        assert!(text.contains("\"build_id\":\"ab01\""), "{text}");
        assert!(text.contains("\"offset\":\"0x1234\""), "{text}");
        let back = Sidecar::parse(&text).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.get(&key(), 0x1234), Some(&frames[..]));
        assert_eq!(back.get(&key(), 0x1235), None);
        assert_eq!(back.len(), 2);
        let offsets: Vec<u64> = back.entries().map(|e| e.1).collect();
        assert_eq!(offsets, [0x10, 0x1234]);
    }

    #[test]
    fn sidecar_path_appends() {
        assert_eq!(
            sidecar_path(Path::new("/tmp/t.1.trace")),
            PathBuf::from("/tmp/t.1.trace.symbols")
        );
    }

    #[test]
    fn malformed_files_are_refused_with_a_reason() {
        let cases: &[(&str, &str)] = &[
            ("", "byte offset 0"),
            ("{\"format\": \"alloctrace-symbols\",\n \"version\": 1, \"modules\": [}", "byte offset 60"),
            ("{\"format\": \"x\", \"version\": 1, \"modules\": []}", "\"format\" is"),
            ("{\"format\": \"alloctrace-symbols\", \"version\": 9, \"modules\": []}", "version 9"),
            (
                "{\"format\": \"alloctrace-symbols\", \"version\": 1, \"modules\": [{\"path\": \"p\", \"build_id\": \"zz\", \"addresses\": []}]}",
                "not hex",
            ),
            (
                "{\"format\": \"alloctrace-symbols\", \"version\": 1, \"modules\": [{\"path\": \"p\", \"build_id\": \"\", \"addresses\": [{\"offset\": \"12\", \"frames\": []}]}]}",
                "not 0x",
            ),
            (
                "{\"format\": \"alloctrace-symbols\", \"version\": 1, \"modules\": [{\"path\": \"p\", \"build_id\": \"\", \"addresses\": [{\"offset\": \"0x12\", \"frames\": []}]}]}",
                "no frames",
            ),
            ("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", "not a symbols file"),
        ];
        for (text, want) in cases {
            let err = Sidecar::parse(text).unwrap_err();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn huge_names_are_cut_when_read() {
        let text = format!(
            "{{\"format\": \"alloctrace-symbols\", \"version\": 1, \"modules\": [{{\"path\": \"p\", \"build_id\": \"\", \"addresses\": [{{\"offset\": \"0x12\", \"frames\": [{{\"function\": \"{}\"}}]}}]}}]}}",
            "f".repeat(100_000)
        );
        let s = Sidecar::parse(&text).unwrap();
        let (_, _, frames) = s.entries().next().unwrap();
        assert!(frames[0].function.len() <= crate::demangle::MAX_NAME);
    }
}
