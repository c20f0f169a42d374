//! The symbolizer on real binaries built here with gcc/g++ (a test is
//! skipped, saying so, when its compiler is missing): DWARF lines and
//! inlined frames at -O0 and -O2, split debug files found by
//! `.gnu_debuglink` and by build ID, a build-ID mismatch, C++ names,
//! hostile files. Addresses come from the binaries' own symbol tables
//! (the `object` crate), so no address is hard-coded.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use alloctrace_symbolize::{ModuleKey, Options, Quality, SymbolFrame, Symbolizer, MAX_NAME};
use object::{Object, ObjectSymbol};

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("symbolize-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn have(tool: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipped: {tool} is not installed");
    }
    ok
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The C program: `outer_fn` (not inlined) calls `inner_alloc` (always
/// inlined), which calls malloc. Marker comments name the lines.
const PROGRAM: &str = r#"#include <stdlib.h>

static inline __attribute__((always_inline)) void *inner_alloc(size_t n) {
    void *p = malloc(n + 1); /* LINE_MALLOC */
    return p;
}

__attribute__((noinline)) void *outer_fn(size_t n) {
    void *p = inner_alloc(n * 2); /* LINE_CALL_INNER */
    if (p == NULL)
        abort();
    return p;
}

int main(int argc, char **argv) {
    (void)argv;
    free(outer_fn((size_t)argc));
    return 0;
}
"#;

fn line_of(source: &str, marker: &str) -> u32 {
    source
        .lines()
        .position(|l| l.contains(marker))
        .map(|i| i as u32 + 1)
        .unwrap_or_else(|| panic!("no {marker}"))
}

/// Writes `prog.c` into `dir` and builds it with `flags`; returns the binary.
fn build(dir: &Path, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let out = dir.join(name);
    let mut args = vec!["-Wall", "-Wextra", "-Werror"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&[s(&src), "-o", s(&out)]);
    run("gcc", &args);
    out
}

/// The (address, size) of function symbol `name` in `binary`.
fn symbol(binary: &Path, name: &str) -> (u64, u64) {
    let data = std::fs::read(binary).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.symbols()
        .find(|sym| sym.name() == Ok(name))
        .map(|sym| (sym.address(), sym.size()))
        .unwrap_or_else(|| panic!("no symbol {name} in {}", binary.display()))
}

fn build_id(binary: &Path) -> Vec<u8> {
    let data = std::fs::read(binary).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.build_id().unwrap().expect("a build ID").to_vec()
}

fn key(binary: &Path) -> ModuleKey {
    ModuleKey {
        path: s(binary).to_string(),
        build_id: build_id(binary),
    }
}

/// Every answer for return addresses inside function `name` (offsets
/// start+1 ..= end, so that `offset - 1` covers the function).
fn answers(
    sym: &mut Symbolizer,
    module: &ModuleKey,
    binary: &Path,
    name: &str,
) -> Vec<(Quality, Vec<SymbolFrame>)> {
    let (start, size) = symbol(binary, name);
    assert!(size > 0);
    (start + 1..=start + size)
        .map(|offset| {
            let (q, frames) = sym.resolve(module, offset);
            (q, frames.to_vec())
        })
        .collect()
}

fn frame(function: &str, file: &str, line: u32) -> SymbolFrame {
    SymbolFrame {
        function: function.to_string(),
        file: Some(file.to_string()),
        line: Some(line),
    }
}

/// The inlined call is reported innermost first, with file:line, and
/// every address of `outer_fn` resolves to it (outermost frame).
fn assert_inlined(opt: &str) {
    if !have("gcc") {
        return;
    }
    let dir = scratch(&format!("inline{opt}"));
    let bin = build(&dir, "prog", PROGRAM, &["-g", opt]);
    let src = s(&dir.join("prog.c")).to_string();
    let mut sym = Symbolizer::new(Options::default());
    let all = answers(&mut sym, &key(&bin), &bin, "outer_fn");
    for (q, frames) in &all {
        assert_eq!(*q, Quality::Source, "{frames:?}");
        let last = frames.last().unwrap();
        assert_eq!(last.function, "outer_fn", "{frames:?}");
        assert_eq!(last.file.as_deref(), Some(src.as_str()), "{frames:?}");
    }
    let want = vec![
        frame("inner_alloc", &src, line_of(PROGRAM, "LINE_MALLOC")),
        frame("outer_fn", &src, line_of(PROGRAM, "LINE_CALL_INNER")),
    ];
    assert!(
        all.iter().any(|(_, f)| *f == want),
        "no address of outer_fn gives {want:?}: {all:?}"
    );
    assert!(sym.warnings().is_empty(), "{:?}", sym.warnings());
}

#[test]
fn inlined_frames_innermost_first_at_o0() {
    assert_inlined("-O0");
}

#[test]
fn inlined_frames_innermost_first_at_o2() {
    assert_inlined("-O2");
}

/// Whether any address of `outer_fn` has DWARF frames (quality Source).
fn has_source(sym: &mut Symbolizer, module: &ModuleKey, bin: &Path) -> bool {
    answers(sym, module, bin, "outer_fn")
        .iter()
        .any(|(q, f)| *q == Quality::Source && f[0].function == "inner_alloc")
}

#[test]
fn split_debug_info_found_by_debuglink() {
    if !have("gcc") || !have("objcopy") {
        return;
    }
    let dir = scratch("debuglink");
    let full = build(&dir, "prog", PROGRAM, &["-g", "-O2"]);
    let lib = dir.join("lib");
    std::fs::create_dir_all(lib.join(".debug")).unwrap();
    let debug = lib.join(".debug/prog.debug");
    let stripped = lib.join("prog");
    run("objcopy", &["--only-keep-debug", s(&full), s(&debug)]);
    run(
        "objcopy",
        &[
            "--strip-debug",
            &format!("--add-gnu-debuglink={}", s(&debug)),
            s(&full),
            s(&stripped),
        ],
    );
    let module = key(&stripped);
    // Without the debug file: symbols only (the symbol table was kept).
    let moved = dir.join("prog.debug.away");
    std::fs::rename(&debug, &moved).unwrap();
    let mut sym = Symbolizer::new(Options::default());
    let all = answers(&mut sym, &module, &stripped, "outer_fn");
    assert!(
        all.iter().all(|(q, f)| *q == Quality::Symbol
            && f.len() == 1
            && f[0].function == "outer_fn"
            && f[0].file.is_none()),
        "{all:?}"
    );
    // With it, in .debug/ beside the file: DWARF frames.
    std::fs::rename(&moved, &debug).unwrap();
    let mut sym = Symbolizer::new(Options::default());
    assert!(has_source(&mut sym, &module, &stripped));
    // Beside the file.
    std::fs::rename(&debug, lib.join("prog.debug")).unwrap();
    let mut sym = Symbolizer::new(Options::default());
    assert!(has_source(&mut sym, &module, &stripped));
    // In a user's debug directory, by name.
    let user = dir.join("user-debug");
    std::fs::create_dir_all(&user).unwrap();
    std::fs::rename(lib.join("prog.debug"), user.join("prog.debug")).unwrap();
    let mut sym = Symbolizer::new(Options::default());
    assert!(!has_source(&mut sym, &module, &stripped));
    let mut sym = Symbolizer::new(Options {
        debug_dirs: vec![user.clone()],
    });
    assert!(has_source(&mut sym, &module, &stripped));
    // A debug file of another build under the link's name is refused.
    let other = build(
        &dir,
        "other",
        &PROGRAM.replace("n + 1", "n + 2"),
        &["-g", "-O2"],
    );
    run(
        "objcopy",
        &["--only-keep-debug", s(&other), s(&user.join("prog.debug"))],
    );
    let mut sym = Symbolizer::new(Options {
        debug_dirs: vec![user],
    });
    assert!(!has_source(&mut sym, &module, &stripped));
}

#[test]
fn split_debug_info_found_by_build_id_in_a_user_dir() {
    if !have("gcc") || !have("objcopy") {
        return;
    }
    let dir = scratch("buildid");
    let full = build(&dir, "prog", PROGRAM, &["-g", "-O2"]);
    let stripped = dir.join("prog.stripped");
    // Everything stripped, no link: only the build ID leads to the debug file.
    run("objcopy", &["--strip-all", s(&full), s(&stripped)]);
    let id = build_id(&full);
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let user = dir.join("debug");
    let sub = user.join(".build-id").join(&hex[..2]);
    std::fs::create_dir_all(&sub).unwrap();
    run(
        "objcopy",
        &[
            "--only-keep-debug",
            s(&full),
            s(&sub.join(format!("{}.debug", &hex[2..]))),
        ],
    );
    let module = key(&stripped);
    assert_eq!(module.build_id, id);
    // `answers` reads outer_fn's address from the full binary: the
    // stripped one has no symbol table left.
    let mut plain = Symbolizer::new(Options::default());
    let all = answers(&mut plain, &module, &full, "outer_fn");
    assert!(all.iter().all(|(q, _)| *q == Quality::Module), "{all:?}");
    let mut sym = Symbolizer::new(Options {
        debug_dirs: vec![user.clone()],
    });
    assert!(has_source(&mut sym, &module, &full));
    // The module's file is missing altogether: the debug file alone,
    // which a warning names.
    std::fs::remove_file(&stripped).unwrap();
    let mut sym = Symbolizer::new(Options {
        debug_dirs: vec![user],
    });
    assert!(has_source(&mut sym, &module, &full));
    let w = sym.warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("cannot open") && w[0].contains("debug file"),
        "{w:?}"
    );
}

#[test]
fn a_build_id_mismatch_is_not_symbolized_and_says_so() {
    if !have("gcc") {
        return;
    }
    let dir = scratch("mismatch");
    let bin = build(
        &dir,
        "prog",
        PROGRAM,
        &["-g", "-O0", "-Wl,--build-id=0x11111111111111111111"],
    );
    let (start, _) = symbol(&bin, "outer_fn");
    let right = key(&bin);
    assert_eq!(right.build_id, [0x11; 10]);
    let wrong = ModuleKey {
        path: right.path.clone(),
        build_id: vec![0x22; 10],
    };
    let mut sym = Symbolizer::new(Options::default());
    assert_eq!(sym.resolve(&right, start + 4).0, Quality::Source);
    for _ in 0..2 {
        let (q, frames) = sym.resolve(&wrong, start + 4);
        assert_eq!(q, Quality::Module);
        assert_eq!(frames[0].function, format!("prog+{:#x}", start + 4));
        let (q, _) = sym.resolve(&wrong, start + 5);
        assert_eq!(q, Quality::Module);
    }
    let w = sym.warnings();
    assert_eq!(w.len(), 1, "one warning per module: {w:?}");
    assert!(
        w[0].contains(&right.path) && w[0].contains("another build") && w[0].contains("2222"),
        "{w:?}"
    );
}

const CXX_PROGRAM: &str = r#"#include <cstdlib>
namespace ns {
struct Klass {
    __attribute__((noinline)) void *method(int n);
};
void *Klass::method(int n) {
    return std::malloc(static_cast<std::size_t>(n) + 1);
}
}

int main(int argc, char **) {
    ns::Klass k;
    std::free(k.method(argc));
    return 0;
}
"#;

#[test]
fn cpp_names_are_demangled_from_dwarf_and_from_symbols() {
    if !have("g++") {
        return;
    }
    let dir = scratch("cxx");
    let src = dir.join("prog.cpp");
    std::fs::write(&src, CXX_PROGRAM).unwrap();
    let bin = dir.join("prog");
    run("g++", &["-g", "-O2", s(&src), "-o", s(&bin)]);
    let stripped = dir.join("prog.nodebug");
    run("objcopy", &["--strip-debug", s(&bin), s(&stripped)]);
    for (path, quality) in [(&bin, Quality::Source), (&stripped, Quality::Symbol)] {
        let mut sym = Symbolizer::new(Options::default());
        let all = answers(&mut sym, &key(path), path, "_ZN2ns5Klass6methodEi");
        for (q, frames) in &all {
            assert_eq!(*q, quality, "{frames:?}");
            assert_eq!(frames.last().unwrap().function, "ns::Klass::method(int)");
        }
    }
}

#[test]
fn hostile_files_give_module_and_offset_without_panicking() {
    let dir = scratch("garbage");
    // Not an ELF file.
    let garbage = dir.join("libgarbage.so");
    let bytes: Vec<u8> = (0..100_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&garbage, &bytes).unwrap();
    // A directory where a file should be.
    let module_dir = dir.join("libdir.so");
    std::fs::create_dir_all(&module_dir).unwrap();
    // A FIFO: opening it would block until a writer came.
    let fifo = dir.join("libfifo.so");
    let have_fifo = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success());
    let mut sym = Symbolizer::new(Options::default());
    let mut paths = vec![&garbage, &module_dir];
    if have_fifo {
        paths.push(&fifo);
    }
    for path in paths.iter().copied() {
        let module = ModuleKey {
            path: s(path).to_string(),
            build_id: vec![],
        };
        for offset in [0, 1, 0x10, u64::MAX] {
            let (q, frames) = sym.resolve(&module, offset);
            assert_eq!(q, Quality::Module);
            assert_eq!(
                frames[0].function,
                format!("{}+{offset:#x}", module.file_name())
            );
        }
    }
    assert_eq!(sym.warnings().len(), paths.len(), "{:?}", sym.warnings());

    if !have("gcc") {
        return;
    }
    // A real binary cut short, and one with its DWARF overwritten.
    let bin = build(&dir, "prog", PROGRAM, &["-g", "-O2"]);
    let data = std::fs::read(&bin).unwrap();
    let cut = dir.join("cut");
    std::fs::write(&cut, &data[..data.len() / 3]).unwrap();
    let mut scrambled = data.clone();
    {
        use object::ObjectSection;
        let file = object::File::parse(&*data).unwrap();
        for section in file.sections() {
            if section.name().is_ok_and(|n| n.starts_with(".debug_")) {
                if let Some((off, len)) = section.file_range() {
                    for i in off..off + len {
                        let i = i as usize;
                        scrambled[i] = (i.wrapping_mul(40_503) >> 7) as u8;
                    }
                }
            }
        }
    }
    let scrambled_path = dir.join("scrambled");
    std::fs::write(&scrambled_path, &scrambled).unwrap();
    let (start, size) = symbol(&bin, "outer_fn");
    for path in [&cut, &scrambled_path] {
        let module = ModuleKey {
            path: s(path).to_string(),
            build_id: vec![],
        };
        for offset in start..start + size + 2 {
            assert!(!sym.symbolize(&module, offset).is_empty());
        }
    }
}

#[test]
fn huge_symbol_names_are_cut() {
    if !have("gcc") {
        return;
    }
    let dir = scratch("hugename");
    let name = format!("f{}", "x".repeat(20_000));
    let source = format!(
        "#include <stdlib.h>\n__attribute__((noinline)) void *{name}(size_t n) {{ return malloc(n + 1); }}\nint main(int c, char **v) {{ (void)v; free({name}((size_t)c)); return 0; }}\n"
    );
    for flags in [&["-g", "-O0"][..], &["-O0"][..]] {
        let bin = build(&dir, "prog", &source, flags);
        let mut sym = Symbolizer::new(Options::default());
        let all = answers(&mut sym, &key(&bin), &bin, &name);
        for (q, frames) in &all {
            assert_ne!(*q, Quality::Module);
            for f in frames {
                assert!(f.function.len() <= MAX_NAME, "{}", f.function.len());
                assert!(f.function.starts_with("fxxx") && f.function.ends_with("..."));
            }
        }
    }
}

#[test]
fn a_symbols_file_answers_first_and_spares_the_disk() {
    if !have("gcc") {
        return;
    }
    let dir = scratch("sidecar");
    let bin = build(&dir, "prog", PROGRAM, &["-g", "-O2"]);
    let module = key(&bin);
    let (start, size) = symbol(&bin, "outer_fn");
    let mut sym = Symbolizer::new(Options::default());
    let mut sidecar = alloctrace_symbolize::Sidecar::new();
    let mut want = Vec::new();
    for offset in start + 1..=start + size {
        let frames = sym.symbolize(&module, offset).to_vec();
        sidecar.insert(&module, offset, &frames);
        want.push(frames);
    }
    let trace = dir.join("t.trace");
    let path = alloctrace_symbolize::sidecar_path(&trace);
    sidecar.write(&path).unwrap();
    // The binary is gone: answers come from the symbols file alone.
    std::fs::remove_file(&bin).unwrap();
    let mut fresh = Symbolizer::new(Options::default());
    assert_eq!(fresh.load_symbols(&dir.join("none.symbols")), Ok(false));
    assert_eq!(fresh.load_symbols(&path), Ok(true));
    for (i, offset) in (start + 1..=start + size).enumerate() {
        assert_eq!(fresh.symbolize(&module, offset), want[i].as_slice());
    }
    assert!(fresh.warnings().is_empty(), "{:?}", fresh.warnings());
    // An address it lacks falls back to the disk (here: missing).
    assert_eq!(
        fresh.resolve(&module, start + size + 100).0,
        Quality::Module
    );
    assert_eq!(fresh.warnings().len(), 1);
    // A broken symbols file is an error, not a panic.
    std::fs::write(
        &path,
        b"{\"format\": \"alloctrace-symbols\", \"version\": 1, \"modules\": [",
    )
    .unwrap();
    let err = fresh.load_symbols(&path).unwrap_err();
    assert!(
        err.contains(s(&path)) && err.contains("byte offset"),
        "{err}"
    );
}

const SHARED_HEADER: &str = r#"#include <stdlib.h>
struct big { int a, b, c, d; double e[4]; };
static inline __attribute__((always_inline)) void *shared_inline(size_t n) {
    struct big *b = malloc(n + sizeof(struct big)); /* LINE_SHARED */
    return b;
}
"#;

#[test]
fn dwz_supplementary_file_found_by_altlink() {
    if !have("gcc") || !have("dwz") {
        return;
    }
    let dir = scratch("dwz");
    std::fs::write(dir.join("common.h"), SHARED_HEADER).unwrap();
    let mut bins = Vec::new();
    for i in 1..=2 {
        let source = format!(
            "#include \"common.h\"\n__attribute__((noinline)) void *outer{i}(size_t n) {{ return shared_inline(n); }}\nint main(int c, char **v) {{ (void)v; free(outer{i}((size_t)c)); return 0; }}\n"
        );
        bins.push(build(&dir, &format!("p{i}"), &source, &["-g", "-O2"]));
    }
    let sup = dir.join("sup.debug");
    run(
        "dwz",
        &["-m", s(&sup), "-M", s(&sup), s(&bins[0]), s(&bins[1])],
    );
    let header = s(&dir.join("common.h")).to_string();
    let want_inner = frame(
        "shared_inline",
        &header,
        line_of(SHARED_HEADER, "LINE_SHARED"),
    );
    let inlined = |sym: &mut Symbolizer| {
        answers(sym, &key(&bins[0]), &bins[0], "outer1")
            .iter()
            .any(|(_, f)| f.len() == 2 && f[0] == want_inner && f[1].function == "outer1")
    };
    let mut with = Symbolizer::new(Options::default());
    assert!(inlined(&mut with));
    // Without the supplement, the DWARF that refers to it cannot be read.
    std::fs::rename(&sup, dir.join("sup.away")).unwrap();
    let mut without = Symbolizer::new(Options::default());
    assert!(!inlined(&mut without));
}
