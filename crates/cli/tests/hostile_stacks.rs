//! Hostile call stacks (issue 20, item 3): a stack deeper than the format
//! allows (1,024 frames, FORMAT.md section 10) is refused by every command
//! at its node's byte offset, before any output; stacks at the limit are
//! shown whole. (Memory and time are measured by hand, never asserted
//! here: see the notes.)

use std::path::Path;
use std::process::{Command, Output};

mod support;

use alloctrace_format::stacks::{FrameWord, MAX_STACK_DEPTH};
use alloctrace_reader::testing::{info, node, stack_tree_trace, TraceBuilder};
use serde_json::Value;
use support::Scratch;

fn alloctrace(args: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .args(args)
        .output()
        .expect("run alloctrace")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn every_command_refuses_a_stack_deeper_than_the_format_allows() {
    let dir = Scratch::new("too-deep");
    let trace = dir.path("deep.trace");
    let depth = MAX_STACK_DEPTH as u64 + 1;
    std::fs::write(&trace, stack_tree_trace(depth, 0)).unwrap();
    // Where node 1025 starts: stack_tree_trace writes the info batch, then
    // one call-stacks batch (kind, length, then generation 1, thread 0,
    // base 0: a byte each) of the nodes `id, id - 1, 0x400000 + 16 * id`.
    let mut t = TraceBuilder::new();
    t.info(&info(1));
    let nodes: usize = (1..depth)
        .map(|id| node(id, id - 1, FrameWord::Native(0x40_0000 + 16 * id)).encoded_len())
        .sum();
    let offset = t.len() + 5 + 3 + nodes;
    let want = format!(
        "malformed trace at byte offset {offset}: call-stack node 1025 makes a stack of 1025 frames (at most 1024)"
    );
    let out = dir.path("out");
    let o = out.as_path();
    let t = trace.as_path();
    let commands: Vec<Vec<&Path>> = vec![
        vec!["check".as_ref(), t],
        vec!["dump".as_ref(), t, "--stacks".as_ref()],
        vec!["stats".as_ref(), t],
        vec!["top".as_ref(), t],
        vec!["leaks".as_ref(), t],
        vec!["flamegraph".as_ref(), t, "-o".as_ref(), o],
        vec!["flamegraph".as_ref(), t, "--collapsed".as_ref()],
        vec![
            "export".as_ref(),
            t,
            "--format".as_ref(),
            "pprof".as_ref(),
            "-o".as_ref(),
            o,
        ],
        vec![
            "export".as_ref(),
            t,
            "--format".as_ref(),
            "chrome".as_ref(),
            "-o".as_ref(),
            o,
        ],
        vec!["diff".as_ref(), t, t],
        vec!["report".as_ref(), t, "-o".as_ref(), o],
    ];
    for args in commands {
        let run = alloctrace(&args);
        let err = text(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(&want), "{args:?}: {err}");
        assert!(!out.exists(), "{args:?} wrote its output");
        if args[0] != Path::new("dump") {
            assert_eq!(text(&run.stdout), "", "{args:?}");
        }
    }
}

#[test]
fn reports_show_every_frame_of_stacks_at_the_limit() {
    let dir = Scratch::new("at-limit");
    // A trunk of 1,023 frames and three leaves under it: every node the
    // stack of one leaked 16-byte object; the leaves' stacks are 1,024
    // frames deep.
    let tree = dir.path("tree.trace");
    std::fs::write(&tree, stack_tree_trace(MAX_STACK_DEPTH as u64 - 1, 3)).unwrap();
    let trunk = dir.path("trunk.trace");
    std::fs::write(&trunk, stack_tree_trace(MAX_STACK_DEPTH as u64 - 1, 0)).unwrap();
    let json = |args: &[&Path]| -> Value {
        let run = alloctrace(args);
        assert_eq!(
            run.status.code(),
            Some(0),
            "{args:?}: {}",
            text(&run.stderr)
        );
        serde_json::from_slice(&run.stdout).unwrap()
    };
    let frames = |stack: &Value| -> Vec<String> {
        stack
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["function"].as_str().unwrap().to_string())
            .collect()
    };
    // Frame of node `id`: the address 0x400000 + 16 * id, no module.
    let name = |id: u64| format!("{:#x}", 0x40_0000 + 16 * id);
    let leaf = |id: u64| -> Vec<String> {
        std::iter::once(name(id))
            .chain((1..MAX_STACK_DEPTH as u64).rev().map(name))
            .collect()
    };

    let v = json(&["leaks".as_ref(), tree.as_path(), "--json".as_ref()]);
    let leaks = v["leaks"].as_array().unwrap();
    assert_eq!(leaks.len(), MAX_STACK_DEPTH + 2);
    let deepest: Vec<Vec<String>> = leaks
        .iter()
        .map(|l| frames(&l["stack"]))
        .filter(|f| f.len() == MAX_STACK_DEPTH)
        .collect();
    assert_eq!(deepest.len(), 3);
    for id in 1024..=1026 {
        assert!(deepest.contains(&leaf(id)), "{id}");
    }
    let run = alloctrace(&["leaks".as_ref(), tree.as_path()]);
    let out = text(&run.stdout);
    assert_eq!(
        out.matches(" object leaked at:\n").count(),
        MAX_STACK_DEPTH + 2
    );
    assert_eq!(out.matches("\n    0x").count(), 1023 * 1024 / 2 + 3 * 1024);

    // The three leaves are the sites the trunk's trace lacks.
    let v = json(&[
        "diff".as_ref(),
        trunk.as_path(),
        tree.as_path(),
        "--json".as_ref(),
    ]);
    let sites = v["sites"].as_array().unwrap();
    assert_eq!(sites.len(), 3, "{v}");
    for site in sites {
        let f = frames(&site["stack"]);
        assert_eq!(f.len(), MAX_STACK_DEPTH);
        assert_eq!(f[1..], leaf(1024)[1..]);
        assert_eq!(site["after"]["leaked_objects"], 1);
        assert_eq!(site["before"]["leaked_objects"], 0);
    }
    let run = alloctrace(&["diff".as_ref(), tree.as_path(), tree.as_path()]);
    assert!(text(&run.stdout).contains("No site changed."));

    // Folded stacks, outermost first: a line per node.
    let run = alloctrace(&[
        "flamegraph".as_ref(),
        tree.as_path(),
        "--collapsed".as_ref(),
    ]);
    let out = text(&run.stdout);
    assert_eq!(out.lines().count(), MAX_STACK_DEPTH + 2);
    for id in 1024..=1026 {
        let mut want: Vec<String> = leaf(id);
        want.reverse();
        assert!(out.contains(&format!("{} 16\n", want.join(";"))), "{id}");
    }
}
