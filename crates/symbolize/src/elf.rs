//! One module's symbol sources, loaded once: its file (checked against the
//! trace's build ID), a separate debug file (by build ID, then by
//! `.gnu_debuglink`), a `.gnu_debugaltlink` supplementary file (dwz), the
//! merged ELF symbol tables, and a DWARF context (addr2line).
//!
//! Every section the context reads is copied out of the file mapping
//! (into `Arc<[u8]>`), so nothing outlives the mapping and no lifetime
//! tricks are needed; the mappings are dropped once the module is loaded.

use std::borrow::Cow;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use object::{Object, ObjectSection, ObjectSymbol, SectionKind, SymbolKind};

use crate::demangle::{bounded, demangle, MAX_NAME};
use crate::SymbolFrame;

/// The system's debug directory (Debian's and Fedora's `-dbg`/`-dbgsym`/
/// `-debuginfo` packages install there).
pub const SYSTEM_DEBUG_DIR: &str = "/usr/lib/debug";

/// Most inlined frames kept for one address (hostile DWARF can nest more).
const MAX_INLINE_DEPTH: usize = 256;

/// A decompressed DWARF section bigger than this many times its compressed
/// size (plus 1 MiB) is refused: a hostile header must not make us
/// allocate gigabytes.
const MAX_COMPRESSION_RATIO: u64 = 64;

type Reader = gimli::EndianArcSlice<gimli::RunTimeEndian>;

/// A function symbol: `[start, end)` in ELF virtual addresses.
struct Symbol {
    start: u64,
    end: u64,
    name: String,
}

/// A loaded module.
pub struct Loaded {
    symbols: Vec<Symbol>,
    dwarf: Option<addr2line::Context<Reader>>,
}

/// What loading a module found.
pub struct LoadResult {
    /// `None`: nothing usable (the warning says why).
    pub module: Option<Loaded>,
    /// Why the module's own file was not used, and what was instead.
    pub warning: Option<String>,
}

/// A file mapped read-only.
struct Mapped {
    path: PathBuf,
    map: memmap2::Mmap,
}

impl Mapped {
    fn open(path: &Path) -> std::io::Result<Mapped> {
        // Checked before opening too: opening a FIFO would block.
        if !std::fs::metadata(path)?.is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        let file = File::open(path)?;
        if !file.metadata()?.is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        // SAFETY: the mapping is read-only and private. A file truncated
        // or rewritten by someone else while mapped could fault or change
        // under us; debug files and installed libraries are not rewritten
        // in place (package managers and linkers write a new file and
        // rename it), which is the same assumption addr2line's own loader,
        // gdb and perf make.
        let map = unsafe { memmap2::Mmap::map(&file)? };
        Ok(Mapped {
            path: path.to_path_buf(),
            map,
        })
    }

    fn parse(&self) -> Option<object::File<'_>> {
        object::File::parse(&*self.map).ok()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `DIR/.build-id/xx/rest.debug` for build ID `id`.
fn build_id_path(dir: &Path, id: &[u8]) -> Option<PathBuf> {
    if id.len() < 2 {
        return None;
    }
    Some(
        dir.join(".build-id")
            .join(hex(&id[..1]))
            .join(format!("{}.debug", hex(&id[1..]))),
    )
}

fn build_id_of(file: &object::File<'_>) -> Option<Vec<u8>> {
    file.build_id().ok().flatten().map(<[u8]>::to_vec)
}

/// The directories searched for separate debug files: the user's first.
fn search_dirs(user: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs = user.to_vec();
    dirs.push(PathBuf::from(SYSTEM_DEBUG_DIR));
    dirs
}

/// The debug file of build ID `id` in the `.build-id` trees, checked.
fn find_by_build_id(dirs: &[PathBuf], id: &[u8]) -> Option<Mapped> {
    for dir in dirs {
        let Some(path) = build_id_path(dir, id) else {
            continue;
        };
        let Ok(m) = Mapped::open(&path) else {
            continue;
        };
        if m.parse().and_then(|f| build_id_of(&f)).as_deref() == Some(id) {
            return Some(m);
        }
    }
    None
}

/// `path` without its leading `/`, to append to a directory.
fn relative(path: &Path) -> PathBuf {
    path.components()
        .filter(|c| matches!(c, std::path::Component::Normal(_)))
        .collect()
}

/// The debug file `.gnu_debuglink` names, in GDB's places: the user's
/// debug directories (`DIR/NAME` and `DIR/<file's dir>/NAME`), next to the
/// file, in `.debug/` beside it, and in `/usr/lib/debug/<file's dir>/`.
/// A candidate must match the build ID when both files have one, else the
/// link's CRC32.
fn find_by_debuglink(
    user: &[PathBuf],
    file_path: &Path,
    name: &[u8],
    crc: u32,
    build_id: Option<&[u8]>,
) -> Option<Mapped> {
    let name = std::str::from_utf8(name).ok()?;
    // A bare file name: a link with `/` or `..` must not escape the dirs.
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return None;
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(parent) = file_path.parent() {
        dirs.push(parent.to_path_buf());
        // Merged /usr: /lib/x86_64-linux-gnu is /usr/lib/x86_64-linux-gnu,
        // and debug packages use the latter.
        if let Ok(real) = parent.canonicalize() {
            if real != parent {
                dirs.push(real);
            }
        }
    }
    let mut candidates = Vec::new();
    for u in user {
        candidates.push(u.join(name));
        for d in &dirs {
            candidates.push(u.join(relative(d)).join(name));
        }
    }
    for d in &dirs {
        candidates.push(d.join(name));
        candidates.push(d.join(".debug").join(name));
        candidates.push(Path::new(SYSTEM_DEBUG_DIR).join(relative(d)).join(name));
    }
    let own = file_path.canonicalize().ok();
    for c in candidates {
        if own.is_some() && c.canonicalize().ok() == own {
            continue;
        }
        let Ok(m) = Mapped::open(&c) else {
            continue;
        };
        let Some(f) = m.parse() else {
            continue;
        };
        let matches = match (build_id, build_id_of(&f)) {
            (Some(want), Some(have)) => want == have.as_slice(),
            _ => crc32fast::hash(&m.map) == crc,
        };
        if matches {
            return Some(m);
        }
    }
    None
}

/// The supplementary (dwz) file `.gnu_debugaltlink` names: by build ID in
/// the `.build-id` trees, then the path it gives (relative to the debug
/// file's directory when relative).
fn find_altlink(dirs: &[PathBuf], debug_path: &Path, file: &object::File<'_>) -> Option<Mapped> {
    let (name, id) = file.gnu_debugaltlink().ok().flatten()?;
    if let Some(m) = find_by_build_id(dirs, id) {
        return Some(m);
    }
    let name = Path::new(std::str::from_utf8(name).ok()?);
    let path = match debug_path.parent() {
        Some(parent) if name.is_relative() => parent.join(name),
        _ => name.to_path_buf(),
    };
    let m = Mapped::open(&path).ok()?;
    (m.parse().and_then(|f| build_id_of(&f)).as_deref() == Some(id)).then_some(m)
}

/// A section's bytes, decompressed, or empty when absent or refused.
fn section_data(file: &object::File<'_>, name: &str) -> Arc<[u8]> {
    let Some(section) = file.section_by_name(name) else {
        return Arc::from(&[][..]);
    };
    if section.kind() == SectionKind::UninitializedData {
        return Arc::from(&[][..]);
    }
    let Ok(compressed) = section.compressed_data() else {
        return Arc::from(&[][..]);
    };
    let limit = (compressed.data.len() as u64)
        .saturating_mul(MAX_COMPRESSION_RATIO)
        .saturating_add(1 << 20);
    if compressed.uncompressed_size > limit {
        return Arc::from(&[][..]);
    }
    match compressed.decompress() {
        Ok(Cow::Borrowed(b)) => Arc::from(b),
        Ok(Cow::Owned(v)) => Arc::from(v),
        Err(_) => Arc::from(&[][..]),
    }
}

fn has_dwarf(file: &object::File<'_>) -> bool {
    file.section_by_name(".debug_info")
        .is_some_and(|s| s.kind() != SectionKind::UninitializedData && s.size() > 0)
}

/// A DWARF context over `file` (with `sup` as its dwz supplement).
fn dwarf_context(
    file: &object::File<'_>,
    sup: Option<&object::File<'_>>,
) -> Option<addr2line::Context<Reader>> {
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let load = |f: &object::File<'_>, id: gimli::SectionId| -> Result<Reader, gimli::Error> {
        Ok(Reader::new(section_data(f, id.name()), endian))
    };
    let mut dwarf = gimli::Dwarf::load(|id| load(file, id)).ok()?;
    if let Some(sup) = sup {
        dwarf.load_sup(|id| load(sup, id)).ok()?;
    }
    addr2line::Context::from_dwarf(dwarf).ok()
}

/// Adds the function symbols of `file` (`.symtab` and `.dynsym`).
fn add_symbols(file: &object::File<'_>, out: &mut Vec<Symbol>) {
    for s in file.symbols().chain(file.dynamic_symbols()) {
        if !matches!(s.kind(), SymbolKind::Text) || !s.is_definition() || s.address() == 0 {
            continue;
        }
        let Ok(name) = s.name_bytes() else { continue };
        if name.is_empty() {
            continue;
        }
        // A size-0 symbol (hand-written assembly) reaches at most to its
        // section's end; the next symbol bounds it further (below).
        let end = if s.size() > 0 {
            s.address().saturating_add(s.size())
        } else {
            match s
                .section_index()
                .and_then(|i| file.section_by_index(i).ok())
            {
                Some(sec) => sec.address().saturating_add(sec.size()),
                None => continue,
            }
        };
        let cut = &name[..name.len().min(MAX_NAME + 1)];
        out.push(Symbol {
            start: s.address(),
            end,
            // Demangled when looked up: most symbols never are.
            name: String::from_utf8_lossy(cut).into_owned(),
        });
    }
}

/// Sorts the symbols by address; of several at one address the sized one
/// is kept; a size-0 symbol ends where the next begins.
fn finish_symbols(symbols: &mut Vec<Symbol>) {
    symbols.sort_by(|a, b| {
        a.start
            .cmp(&b.start)
            .then_with(|| (b.end > b.start).cmp(&(a.end > a.start)))
            .then_with(|| a.name.cmp(&b.name))
    });
    symbols.dedup_by_key(|s| s.start);
    // Lookups take the last symbol starting at or before an address, so
    // each ends where the next begins (size-0 ones were given their
    // section's end).
    let starts: Vec<u64> = symbols.iter().map(|s| s.start).collect();
    for (i, s) in symbols.iter_mut().enumerate() {
        if let Some(&next) = starts.get(i + 1) {
            if s.end > next {
                s.end = next;
            }
        }
    }
}

/// Loads module `path` whose trace gives `build_id` (empty: unknown).
pub fn load(path: &str, build_id: &[u8], debug_dirs: &[PathBuf]) -> LoadResult {
    // Why the module's own file is not used.
    let mut problem = None;
    let dirs = search_dirs(debug_dirs);
    let want = (!build_id.is_empty()).then_some(build_id);

    // The module's own file, unless it is missing or another build.
    let main = match Mapped::open(Path::new(path)) {
        Err(e) => {
            problem = Some(format!("{path}: cannot open ({e})"));
            None
        }
        Ok(m) => match m.parse() {
            None => {
                problem = Some(format!("{path}: not an ELF file this symbolizer reads"));
                None
            }
            Some(f) => match (want, build_id_of(&f)) {
                (Some(want), have) if have.as_deref() != Some(want) => {
                    problem = Some(format!(
                        "{path}: the file on disk is another build (build ID {}, the trace's {}); not symbolized from it",
                        have.map_or_else(|| "none".to_string(), |h| hex(&h)),
                        hex(want)
                    ));
                    None
                }
                _ => Some(m),
            },
        },
    };
    let main_file = main.as_ref().and_then(Mapped::parse);

    // A separate debug file: by build ID, then by debuglink.
    let debug = want.and_then(|id| find_by_build_id(&dirs, id)).or_else(|| {
        let f = main_file.as_ref()?;
        let (name, crc) = f.gnu_debuglink().ok().flatten()?;
        let id = want.map(<[u8]>::to_vec).or_else(|| build_id_of(f));
        find_by_debuglink(debug_dirs, Path::new(path), name, crc, id.as_deref())
    });
    let debug_file = debug.as_ref().and_then(Mapped::parse);

    if main_file.is_none() && debug_file.is_none() {
        return LoadResult {
            module: None,
            warning: problem.map(|p| format!("{p}; its frames show as module+offset")),
        };
    }
    // The debug file found in place of a missing or other-build file is
    // named.
    let warning = match (problem, &debug) {
        (Some(p), Some(d)) => Some(format!(
            "{p}; symbolized from its debug file {} alone",
            d.path.display()
        )),
        (p, _) => p,
    };

    let mut symbols = Vec::new();
    if let Some(f) = &main_file {
        add_symbols(f, &mut symbols);
    }
    if let Some(f) = &debug_file {
        add_symbols(f, &mut symbols);
    }
    finish_symbols(&mut symbols);

    let dwarf_source = match (&debug_file, &debug) {
        (Some(f), Some(m)) if has_dwarf(f) => Some((f, m)),
        _ => main_file
            .as_ref()
            .filter(|f| has_dwarf(f))
            .zip(main.as_ref()),
    };
    let dwarf = dwarf_source.and_then(|(f, m)| {
        let alt = find_altlink(&dirs, &m.path, f);
        let alt_file = alt.as_ref().and_then(Mapped::parse);
        dwarf_context(f, alt_file.as_ref())
    });
    LoadResult {
        module: Some(Loaded { symbols, dwarf }),
        warning,
    }
}

impl Loaded {
    /// The symbol holding `addr`.
    fn symbol(&self, addr: u64) -> Option<&str> {
        let i = self.symbols.partition_point(|s| s.start <= addr);
        let s = self.symbols.get(i.checked_sub(1)?)?;
        (addr < s.end).then_some(s.name.as_str())
    }

    /// The frames of `probe` (the call instruction's address): from DWARF,
    /// innermost inlined frame first, else the symbol; `None` when neither
    /// knows it.
    pub fn frames(&self, probe: u64) -> Option<Vec<SymbolFrame>> {
        let symbol = self.symbol(probe);
        self.dwarf_frames(probe, symbol).or_else(|| {
            symbol.map(|name| {
                vec![SymbolFrame {
                    function: demangle(name, None),
                    file: None,
                    line: None,
                }]
            })
        })
    }

    fn dwarf_frames(&self, probe: u64, symbol: Option<&str>) -> Option<Vec<SymbolFrame>> {
        let ctx = self.dwarf.as_ref()?;
        let mut iter = ctx.find_frames(probe).skip_all_loads().ok()?;
        let mut out: Vec<SymbolFrame> = Vec::new();
        let mut named = false;
        // An error part-way ends the walk with what was read.
        while let Ok(Some(frame)) = iter.next() {
            let function = frame
                .function
                .as_ref()
                .and_then(|f| Some(demangle(&f.raw_name().ok()?, f.language)));
            named |= function.is_some();
            let (file, line) = match &frame.location {
                Some(l) => (l.file.map(bounded), l.line),
                None => (None, None),
            };
            out.push(SymbolFrame {
                function: function.unwrap_or_default(),
                file,
                line,
            });
            if out.len() >= MAX_INLINE_DEPTH {
                break;
            }
        }
        let located = out.iter().any(|f| f.file.is_some());
        if out.is_empty() || !(named || located) {
            return None;
        }
        // A frame DWARF left unnamed: the outermost is the symbol's
        // function; an inlined one is unknown.
        let last = out.len() - 1;
        for (i, f) in out.iter_mut().enumerate() {
            if f.function.is_empty() {
                f.function = match symbol {
                    Some(s) if i == last => demangle(s, None),
                    _ => "??".to_string(),
                };
            }
        }
        Some(out)
    }
}
