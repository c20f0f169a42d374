//! The shim's modules form no cycle: each module's `crate::` uses (paths
//! and `use crate::{...}` lists, outside comments) name only modules below
//! it. lib.rs, the root that declares them all, is left out.
//!
//! `cargo test -p alloctrace-preload --test module_graph -- --nocapture`
//! prints the graph.

use std::collections::BTreeMap;
use std::path::Path;

/// The modules `source` names after `crate::` (first path segment).
fn uses(source: &str) -> Vec<String> {
    let code: String = source
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut found = Vec::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // alloctrace_writer::..., not this crate
        }
        if let Some(group) = rest.strip_prefix('{') {
            // use crate::{a, b::{c, d}, e}: the top-level items.
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.push(first_segment(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            found.push(first_segment(&item));
        } else {
            found.push(first_segment(rest));
        }
    }
    found.retain(|m| !m.is_empty());
    found.sort();
    found.dedup();
    found
}

fn first_segment(path: &str) -> String {
    path.trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The graph of the modules in `src`: module -> modules it uses.
fn graph(src: &Path) -> BTreeMap<String, Vec<String>> {
    let mut g = BTreeMap::new();
    for entry in std::fs::read_dir(src).expect("src directory") {
        let path = entry.expect("directory entry").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "lib" {
            continue;
        }
        let source = std::fs::read_to_string(&path).expect("module source");
        let mut deps = uses(&source);
        deps.retain(|d| *d != name);
        g.insert(name, deps);
    }
    g
}

/// A cycle of `g`, if it has one (as a path that starts and ends at the
/// same module).
fn find_cycle(g: &BTreeMap<String, Vec<String>>) -> Option<Vec<String>> {
    // 0 unvisited, 1 on the current path, 2 done.
    fn visit(
        m: &str,
        g: &BTreeMap<String, Vec<String>>,
        mark: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match mark.get(m).copied().unwrap_or(0) {
            1 => {
                let start = path.iter().position(|p| p == m).unwrap();
                let mut cycle = path[start..].to_vec();
                cycle.push(m.to_string());
                return Some(cycle);
            }
            2 => return None,
            _ => {}
        }
        mark.insert(m.to_string(), 1);
        path.push(m.to_string());
        for d in g.get(m).into_iter().flatten() {
            if g.contains_key(d) {
                if let Some(c) = visit(d, g, mark, path) {
                    return Some(c);
                }
            }
        }
        path.pop();
        mark.insert(m.to_string(), 2);
        None
    }
    let mut mark = BTreeMap::new();
    for m in g.keys() {
        if let Some(c) = visit(m, g, &mut mark, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

#[test]
fn the_modules_form_no_cycle() {
    let g = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    for (m, deps) in &g {
        println!("{m}: {}", deps.join(" "));
    }
    if let Some(cycle) = find_cycle(&g) {
        panic!("module cycle: {}", cycle.join(" -> "));
    }
    assert!(g.contains_key("state") && g.contains_key("session"));
}

#[test]
fn the_shared_state_is_a_leaf() {
    let g = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert_eq!(g["state"], Vec::<String>::new());
}

#[test]
fn the_parser_sees_use_lists_paths_and_cycles() {
    let source = "use crate::{a, b::{c, d}, e};\n// crate::commented\nfn f() { crate::g::h(); alloctrace_writer::x(); }\n";
    assert_eq!(uses(source), ["a", "b", "e", "g"]);
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), vec!["b".to_string()]);
    g.insert("b".to_string(), vec!["c".to_string()]);
    g.insert("c".to_string(), vec![]);
    assert_eq!(find_cycle(&g), None);
    g.insert("c".to_string(), vec!["a".to_string()]);
    assert_eq!(
        find_cycle(&g).unwrap(),
        ["a", "b", "c", "a"].map(String::from)
    );
}
