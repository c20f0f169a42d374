//! Offline symbolization of the native frames of alloctrace call stacks.
//!
//! A native frame is a return address in a module of the trace's module
//! table; [`Symbolizer::symbolize`] turns it into source frames (function,
//! file, line), the innermost inlined frame first. Missing debug info
//! degrades to symbol+offset, then to module+offset, never to an error.
//!
//! (Interface first: this version resolves nothing yet and answers
//! module+offset for every address.)

use std::path::PathBuf;

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

/// Resolves addresses, caching per module and per address.
pub struct Symbolizer {
    #[allow(dead_code)]
    options: Options,
    cache: std::collections::HashMap<(ModuleKey, u64), Vec<SymbolFrame>>,
}

impl Symbolizer {
    pub fn new(options: Options) -> Symbolizer {
        Symbolizer {
            options,
            cache: Default::default(),
        }
    }

    /// The source frames of the return address at `offset` in `module`
    /// (`offset` is the module-relative address, as the file's ELF virtual
    /// addresses count: runtime address minus load bias). The frame looked
    /// up is the call instruction, `offset - 1`. Never empty.
    pub fn symbolize(&mut self, module: &ModuleKey, offset: u64) -> &[SymbolFrame] {
        self.cache
            .entry((module.clone(), offset))
            .or_insert_with(|| {
                vec![SymbolFrame {
                    function: format!("{}+{:#x}", module.file_name(), offset),
                    file: None,
                    line: None,
                }]
            })
    }

    /// Notes for the user gathered while symbolizing (a module whose file
    /// is missing or whose build ID does not match), one per module.
    pub fn warnings(&self) -> Vec<String> {
        Vec::new()
    }
}
