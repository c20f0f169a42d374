//! Every crate's modules form no cycle, and the writer's layers hold.
//!
//! The graph is read from the source files (crates/*/src and the root
//! src/): a file's module uses another when its code names it by a
//! `crate::`, `super::` or `self::` path (`use` lists expanded), outside
//! comments and strings. A use is an edge between the two modules'
//! branches under their closest common ancestor, so each folder's (and
//! the crate root's) children are checked as one graph: a child may use
//! its parent and the parent its children, but siblings form no cycle.
//! The crate roots (lib.rs, main.rs) are left out; paths to their own
//! items (re-exports) are not edges.
//!
//! The layer rules ([`LAYERS`]) are those stated in the header of
//! crates/writer/src/lib.rs.
//!
//! `cargo test --test module_graph -- --nocapture` prints the graphs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A layer: its name and its top-level modules.
type Layer = (&'static str, &'static [&'static str]);

/// Per crate (its directory under crates/, or `alloctrace` for the root
/// package), its top-level modules in layers, top first: a module never
/// imports a module of a layer above its own. Every top-level module of
/// the crate must be in one layer (`*`: every module no other layer
/// names).
const LAYERS: &[(&str, &[Layer])] = &[
    (
        "writer",
        &[
            // The event calls and the event path under them.
            ("event", &["event"]),
            // A session's state, start, advance and stop, its own batches,
            // the fatal-signal flush.
            ("session", &["session"]),
            // The writer thread, its output, the end batch: what it needs
            // of a session is passed down (WriterHost).
            ("writer thread", &["writer"]),
            // Call stacks: the capture and the tables that intern them.
            ("stacks", &["stacks"]),
            // The machinery: buffers, thread slots, the seqlock, the clock.
            (
                "machinery",
                &[
                    "address_set",
                    "buffer",
                    "clock",
                    "handshake",
                    "limits",
                    "lost",
                    "reserved",
                    "sampling",
                    "shared",
                    "sync",
                    "thread",
                    "thread_counts",
                    "tls",
                    "type_table",
                ],
            ),
        ],
    ),
    // The shim's shared state is a leaf.
    ("preload", &[("the shim", &["*"]), ("state", &["state"])]),
];

/// One crate's source tree: its module paths and their source files.
struct Crate {
    name: String,
    /// Module path (`a::b`) -> file.
    files: BTreeMap<Vec<String>, PathBuf>,
}

fn crates() -> Vec<Crate> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut dirs = vec![("alloctrace".to_string(), root.join("src"))];
    let mut members: Vec<_> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.join("src").is_dir())
        .collect();
    members.sort();
    for m in members {
        let name = m.file_name().unwrap().to_string_lossy().into_owned();
        dirs.push((name, m.join("src")));
    }
    dirs.into_iter()
        .map(|(name, src)| {
            let mut files = BTreeMap::new();
            collect(&src, &mut Vec::new(), &mut files);
            Crate { name, files }
        })
        .collect()
}

/// The module files under `dir` (module path `prefix`), without the crate
/// roots and src/bin.
fn collect(dir: &Path, prefix: &mut Vec<String>, files: &mut BTreeMap<Vec<String>, PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("source directory")
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if prefix.is_empty() && name == "bin" {
                continue;
            }
            prefix.push(name);
            collect(&path, prefix, files);
            prefix.pop();
        } else if let Some(stem) = name.strip_suffix(".rs") {
            let mut module = prefix.clone();
            match stem {
                "lib" | "main" if prefix.is_empty() => continue,
                "mod" => {}
                _ => module.push(stem.to_string()),
            }
            files.insert(module, path);
        }
    }
}

/// The tokens of `source` that paths are made of: identifiers, `::`
/// and the punctuation of `use` lists and blocks. Comments, strings and
/// character literals are dropped.
fn tokens(source: &str) -> Vec<String> {
    let s: Vec<char> = source.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        let next = s.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < s.len() {
                if s[i] == '/' && s.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if s[i] == '*' && s.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '"' {
            i += 1;
            while i < s.len() && s[i] != '"' {
                i += if s[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !prev_ident(&s, i) {
            // A raw string r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while s.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if s.get(j) != Some(&'"') {
                out.push("r".to_string());
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= s.len() {
                    break;
                }
                if s[j] == '"' && (1..=hashes).all(|k| s.get(j + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}'), else a lifetime.
            if next == Some('\\') {
                i += 2;
                while i < s.len() && s[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if s.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < s.len() && (s[i].is_alphanumeric() || s[i] == '_') {
                i += 1;
            }
            out.push(s[start..i].iter().collect());
        } else if c == ':' && next == Some(':') {
            out.push("::".to_string());
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(c.to_string());
            }
            i += 1;
        }
    }
    out
}

fn prev_ident(s: &[char], i: usize) -> bool {
    i > 0 && (s[i - 1].is_alphanumeric() || s[i - 1] == '_')
}

fn is_ident(t: &str) -> bool {
    t.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// The absolute paths (segments from the crate root) that the file of
/// module `module` names.
fn paths(source: &str, module: &[String]) -> Vec<Vec<String>> {
    let t = tokens(source);
    let mut found = Vec::new();
    // Inline modules (`mod tests { ... }`) open at brace depths.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < t.len() {
        match t[i].as_str() {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            "mod" if t.get(i + 2).is_some_and(|b| b == "{") => {
                inline.push((t[i + 1].clone(), depth));
            }
            "crate" | "super" | "self"
                if t.get(i + 1).is_some_and(|c| c == "::") && (i == 0 || t[i - 1] != "::") =>
            {
                let mut base: Vec<String> = match t[i].as_str() {
                    "crate" => Vec::new(),
                    _ => module
                        .iter()
                        .cloned()
                        .chain(inline.iter().map(|(n, _)| n.clone()))
                        .collect(),
                };
                let mut j = i;
                while j < t.len() && (t[j] == "super" || t[j] == "self" || t[j] == "crate") {
                    if t[j] == "super" {
                        base.pop();
                    }
                    if t.get(j + 1).is_some_and(|c| c == "::") {
                        j += 2;
                    } else {
                        break;
                    }
                }
                i = tree(&t, j, base, &mut found);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// Reads the path (or `use` tree) at `t[i]` under `prefix` into `out`;
/// returns the index after it.
fn tree(t: &[String], mut i: usize, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    loop {
        match t.get(i).map(String::as_str) {
            Some("{") => {
                i += 1;
                loop {
                    match t.get(i).map(String::as_str) {
                        None => return i,
                        Some("}") => return i + 1,
                        Some(",") => i += 1,
                        Some("as") => i += 2,
                        Some("self") => {
                            out.push(prefix.clone());
                            i += 1;
                        }
                        _ => i = tree(t, i, prefix.clone(), out).max(i + 1),
                    }
                }
            }
            Some(s) if is_ident(s) && s != "as" => {
                prefix.push(s.to_string());
                i += 1;
                if t.get(i).is_some_and(|c| c == "::") {
                    i += 1;
                    continue;
                }
                out.push(prefix);
                return i;
            }
            _ => {
                // `*`, or the end of the path.
                out.push(prefix);
                return i;
            }
        }
    }
}

/// Per parent module, the graph of its children: child -> children of the
/// same parent it uses.
type Graphs = BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>>;

fn graphs(c: &Crate) -> Graphs {
    let mut g: Graphs = BTreeMap::new();
    for (module, file) in &c.files {
        if let Some((last, parent)) = module.split_last() {
            g.entry(parent.to_vec())
                .or_default()
                .entry(last.clone())
                .or_default();
        }
        let source = std::fs::read_to_string(file).expect("module source");
        for path in paths(&source, module) {
            // The module the path names: its longest prefix with a file.
            let Some(target) = (1..=path.len())
                .rev()
                .map(|n| &path[..n])
                .find(|p| c.files.contains_key(*p))
            else {
                continue;
            };
            let common = module
                .iter()
                .zip(target)
                .take_while(|(a, b)| a == b)
                .count();
            if common == module.len() || common == target.len() {
                continue; // itself, an ancestor or a descendant
            }
            g.entry(module[..common].to_vec())
                .or_default()
                .entry(module[common].clone())
                .or_default()
                .insert(target[common].clone());
        }
    }
    g
}

/// The cycles of `g`: its strongly connected components of more than one
/// node, each sorted.
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(m) = todo.pop() {
            for d in g.get(&m).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    todo.push(d.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> = g.keys().map(|m| (m, reach(m))).collect();
    let mut found: Vec<Vec<String>> = Vec::new();
    for (m, r) in &reached {
        if !r.contains(*m) || found.iter().any(|c| c.contains(m)) {
            continue;
        }
        let component = r
            .iter()
            .filter(|d| reached.get(d).is_some_and(|back| back.contains(*m)))
            .cloned()
            .collect();
        found.push(component);
    }
    found
}

fn name(crate_name: &str, parent: &[String], child: &str) -> String {
    let mut s = crate_name.to_string();
    for p in parent {
        s.push_str("::");
        s.push_str(p);
    }
    format!("{s}::{child}")
}

#[test]
fn no_crate_has_a_module_cycle() {
    let mut found = Vec::new();
    for c in crates() {
        for (parent, g) in graphs(&c) {
            for (m, deps) in &g {
                let deps: Vec<_> = deps.iter().map(String::as_str).collect();
                println!("{}: {}", name(&c.name, &parent, m), deps.join(" "));
            }
            for cycle in cycles(&g) {
                let parent = name(&c.name, &parent, "");
                found.push(format!("{parent}{{{}}}", cycle.join(", ")));
            }
        }
    }
    assert!(
        found.is_empty(),
        "module cycles (modules that use each other, under their parent):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_layers_hold() {
    let all = crates();
    let mut broken = Vec::new();
    for (crate_name, layers) in LAYERS {
        let c = all
            .iter()
            .find(|c| c.name == *crate_name)
            .unwrap_or_else(|| panic!("LAYERS names a crate without sources: {crate_name}"));
        let layer_of = |m: &str| {
            let named = layers.iter().position(|(_, ms)| ms.contains(&m));
            named.or_else(|| layers.iter().position(|(_, ms)| ms.contains(&"*")))
        };
        let g = graphs(c).remove(&Vec::new()).unwrap_or_default();
        for (_, modules) in layers.iter() {
            for m in modules.iter().filter(|m| **m != "*") {
                if !g.contains_key(*m) {
                    broken.push(format!("LAYERS names {crate_name}::{m}, which has no file"));
                }
            }
        }
        for (m, deps) in &g {
            let Some(from) = layer_of(m) else {
                broken.push(format!("{crate_name}::{m} is in no layer"));
                continue;
            };
            for d in deps {
                if layer_of(d).is_some_and(|to| to < from) {
                    broken.push(format!(
                        "{crate_name}::{m} ({}) imports {d} ({})",
                        layers[from].0,
                        layers[layer_of(d).unwrap()].0
                    ));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "layer rules broken:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_parser_sees_use_lists_paths_and_cycles() {
    let here = ["a".to_string(), "b".to_string()];
    let source = "use crate::{x, y::{z, self}, w as v};\n\
        // crate::commented\n\
        /* crate::block /* nested */ crate::still */\n\
        fn f() { crate::g::h(); alloctrace_writer::x(); let s = \"crate::s\"; let c = '\"'; }\n\
        use super::k::*;\n\
        mod tests { use super::q; use self::r::t; }\n";
    let p = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    assert_eq!(
        paths(source, &here),
        [
            p("x"),
            p("y::z"),
            p("y"),
            p("w"),
            p("g::h"),
            p("a::k"),
            p("a::b::q"),
            p("a::b::tests::r::t"),
        ]
    );
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    g.insert("c".to_string(), BTreeSet::new());
    assert!(cycles(&g).is_empty());
    g.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(cycles(&g), [["a", "b", "c"].map(String::from)]);
}
