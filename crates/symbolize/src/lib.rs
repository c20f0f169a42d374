//! Offline symbolization of the native frames of alloctrace call stacks.
//!
//! A native frame is a return address in a module of the trace's module
//! table; [`Symbolizer::symbolize`] turns it into source frames (function,
//! file, line), the innermost inlined frame first. Missing debug info
//! degrades to the name of the symbol holding the address, then to
//! module+offset (`libfoo.so+0x1234`), never to an error.
//!
//! ## Design
//! - Sources, per module, loaded on its first address and kept: the
//!   module's file (only if its build ID is the trace's), a separate debug
//!   file found by build ID (`DIR/.build-id/xx/rest.debug` under each
//!   user-given debug directory, then `/usr/lib/debug`) or by
//!   `.gnu_debuglink` (CRC- or build-ID-checked), its dwz supplement
//!   (`.gnu_debugaltlink`), the `.symtab` and `.dynsym` function symbols
//!   of both, and DWARF line and inline info (addr2line over gimli).
//! - Answers, per (module, offset), cached: DWARF frames (function,
//!   file, line; inlined frames innermost first), else the demangled name
//!   of the symbol holding the address, else `libfoo.so+0x1234`.
//! - A symbols file ([`Sidecar`], docs/SYMBOLS.md) loaded with
//!   [`Symbolizer::load_symbols`] pre-fills the answers: an address it
//!   holds never touches the disk.
//!
//! ## Invariants
//! 1. `symbolize` never fails, never panics on any file's content and
//!    never returns an empty slice. Otherwise a hostile or odd binary
//!    would break every report that shows stacks.
//! 2. A module's file whose build ID differs from the trace's is never
//!    read for symbols (a warning says so). Otherwise a rebuilt library
//!    would give confidently wrong names.
//! 3. Every name, file and path handed out is at most 4 KiB. Otherwise a
//!    hostile symbol table could blow up every report's size.
//!
//! ## Corner cases
//! - The vDSO (`linux-vdso.so.1`), an empty path and `[...]` pseudo
//!   paths have no file: module+offset, without a warning.
//! - Offset 0 (no call instruction before it) is looked up at 0.

mod demangle;
mod elf;
mod sidecar;

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

pub use demangle::MAX_NAME;
pub use sidecar::{sidecar_path, Sidecar};

/// A module (executable or shared library) as the trace names it. Two
/// modules with the same path and build ID are the same file, whatever
/// their load address.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModuleKey {
    /// The path the loader used (may be empty for the vDSO or unknown).
    pub path: String,
    /// The GNU build ID note, empty when the module has none.
    pub build_id: Vec<u8>,
}

impl ModuleKey {
    /// The file name part of the path (`libc.so.6`), or the path.
    pub fn file_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }

    /// Whether the path names no file: empty, `[vdso]`-like, or the
    /// vDSO's loader name.
    pub fn is_pseudo(&self) -> bool {
        let name = self.file_name();
        self.path.is_empty()
            || self.path.starts_with('[')
            || name.starts_with("linux-vdso.so")
            || name.starts_with("linux-gate.so")
    }
}

/// One source-level frame of an address. An address inside inlined code
/// gives several: the inlined function first, its callers after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymbolFrame {
    /// The demangled function name; `module+0xOFFSET` when nothing better
    /// is known.
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
}

/// Where to look for debug info besides the module's own file.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// User-given debug directories, searched first (by build ID as
    /// `.build-id/xx/yyyy.debug`, and by `.gnu_debuglink` name).
    pub debug_dirs: Vec<PathBuf>,
}

/// How much an answer knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Quality {
    /// Only the module and offset (`libfoo.so+0x1234`).
    Module,
    /// The function, from a symbol table (no file or line).
    Symbol,
    /// DWARF frames: functions with file and line.
    Source,
}

impl Quality {
    /// How much `frames` (an answer of the symbol tables or DWARF, or one
    /// read back from a symbols file) knows.
    pub fn of(frames: &[SymbolFrame]) -> Quality {
        if frames.iter().any(|f| f.file.is_some()) {
            Quality::Source
        } else {
            Quality::Symbol
        }
    }
}

/// A module's state: not yet looked at, loaded, or without sources.
enum Sources {
    Unloaded,
    Loaded(Box<elf::Loaded>),
    None,
}

struct ModuleSlot {
    key: ModuleKey,
    sources: Sources,
}

struct Answer {
    quality: Quality,
    frames: Vec<SymbolFrame>,
}

/// Resolves addresses, caching per module and per address.
pub struct Symbolizer {
    options: Options,
    index: HashMap<ModuleKey, usize>,
    modules: Vec<ModuleSlot>,
    cache: HashMap<(usize, u64), Answer>,
    warnings: Vec<String>,
}

impl Symbolizer {
    pub fn new(options: Options) -> Symbolizer {
        Symbolizer {
            options,
            index: HashMap::new(),
            modules: Vec::new(),
            cache: HashMap::new(),
            warnings: Vec::new(),
        }
    }

    /// The source frames of the return address at `offset` in `module`
    /// (`offset` is the module-relative address, as the file's ELF virtual
    /// addresses count: runtime address minus load bias). The frame looked
    /// up is the call instruction, `offset - 1`. Never empty.
    pub fn symbolize(&mut self, module: &ModuleKey, offset: u64) -> &[SymbolFrame] {
        self.resolve(module, offset).1
    }

    /// [`Symbolizer::symbolize`], with how much the answer knows.
    pub fn resolve(&mut self, module: &ModuleKey, offset: u64) -> (Quality, &[SymbolFrame]) {
        let m = self.module_index(module);
        if !self.cache.contains_key(&(m, offset)) {
            let answer = self.compute(m, offset);
            self.cache.insert((m, offset), answer);
        }
        let answer = &self.cache[&(m, offset)];
        (answer.quality, &answer.frames)
    }

    /// Notes for the user gathered while symbolizing (a module whose file
    /// is missing or whose build ID does not match), one per module.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }

    /// Pre-fills the answers from the symbols file at `path` (see
    /// [`sidecar_path`]): its addresses are answered from it and never
    /// touch the disk. `Ok(false)` when there is no such file; an error
    /// (naming what is wrong and where) when it is not a symbols file.
    pub fn load_symbols(&mut self, path: &Path) -> Result<bool, String> {
        let Some(sidecar) = Sidecar::read(path)? else {
            return Ok(false);
        };
        for (module, offset, frames) in sidecar.entries() {
            let m = self.module_index(module);
            let quality = Quality::of(frames);
            self.cache.insert(
                (m, offset),
                Answer {
                    quality,
                    frames: frames.to_vec(),
                },
            );
        }
        Ok(true)
    }

    fn module_index(&mut self, module: &ModuleKey) -> usize {
        if let Some(&m) = self.index.get(module) {
            return m;
        }
        let m = self.modules.len();
        self.modules.push(ModuleSlot {
            key: module.clone(),
            sources: Sources::Unloaded,
        });
        self.index.insert(module.clone(), m);
        m
    }

    fn compute(&mut self, m: usize, offset: u64) -> Answer {
        if let Sources::Unloaded = self.modules[m].sources {
            self.modules[m].sources = self.load(m);
        }
        let probe = offset.saturating_sub(1);
        let found = match &self.modules[m].sources {
            Sources::Loaded(loaded) => {
                match catch_unwind(AssertUnwindSafe(|| loaded.frames(probe))) {
                    Ok(found) => found,
                    Err(_) => {
                        let path = self.modules[m].key.path.clone();
                        self.warnings.push(demangle::bounded(&format!(
                            "{path}: its debug info broke the symbolizer; its frames show as module+offset"
                        )));
                        self.modules[m].sources = Sources::None;
                        None
                    }
                }
            }
            _ => None,
        };
        match found {
            // DWARF that names a function but no file counts as a symbol.
            Some(frames) => Answer {
                quality: Quality::of(&frames),
                frames,
            },
            None => Answer {
                quality: Quality::Module,
                frames: vec![SymbolFrame {
                    function: demangle::bounded(&format!(
                        "{}+{:#x}",
                        self.modules[m].key.file_name(),
                        offset
                    )),
                    file: None,
                    line: None,
                }],
            },
        }
    }

    fn load(&mut self, m: usize) -> Sources {
        let key = &self.modules[m].key;
        if key.is_pseudo() {
            return Sources::None;
        }
        let dirs = &self.options.debug_dirs;
        match catch_unwind(AssertUnwindSafe(|| {
            elf::load(&key.path, &key.build_id, dirs)
        })) {
            Ok(result) => {
                self.warnings
                    .extend(result.warning.as_deref().map(demangle::bounded));
                match result.module {
                    Some(loaded) => Sources::Loaded(Box::new(loaded)),
                    None => Sources::None,
                }
            }
            Err(_) => {
                self.warnings.push(demangle::bounded(&format!(
                    "{}: the file broke the symbolizer; its frames show as module+offset",
                    key.path
                )));
                Sources::None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbolizer_is_send() {
        fn send<T: Send>() {}
        send::<Symbolizer>();
    }

    #[test]
    fn pseudo_modules_answer_module_and_offset_without_warning() {
        let mut s = Symbolizer::new(Options::default());
        for path in ["linux-vdso.so.1", "", "[vdso]", "[anon:foo]"] {
            let key = ModuleKey {
                path: path.to_string(),
                build_id: vec![1, 2, 3],
            };
            let (q, frames) = s.resolve(&key, 0x1234);
            assert_eq!(q, Quality::Module);
            assert_eq!(frames.len(), 1);
            assert_eq!(frames[0].function, format!("{}+0x1234", key.file_name()));
        }
        assert!(s.warnings().is_empty(), "{:?}", s.warnings());
    }

    #[test]
    fn a_huge_module_path_is_cut() {
        let mut s = Symbolizer::new(Options::default());
        let key = ModuleKey {
            path: format!("/{}", "d".repeat(100_000)),
            build_id: vec![],
        };
        assert!(s.symbolize(&key, 1)[0].function.len() <= MAX_NAME);
        assert!(s.warnings().iter().all(|w| w.len() <= MAX_NAME));
    }

    #[test]
    fn a_missing_file_warns_once() {
        let mut s = Symbolizer::new(Options::default());
        let key = ModuleKey {
            path: "/nonexistent/libgone.so".to_string(),
            build_id: vec![],
        };
        assert_eq!(s.symbolize(&key, 0x10)[0].function, "libgone.so+0x10");
        assert_eq!(s.symbolize(&key, 0x20)[0].function, "libgone.so+0x20");
        let w = s.warnings();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("/nonexistent/libgone.so"), "{w:?}");
    }
}
