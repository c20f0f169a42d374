//! The `alloctrace` crate's safe Rust API (issue 23) on
//! examples/rust_heap.rs, a program whose global allocator is
//! `TracingAlloc`: exact counts per allocating function with symbolized
//! Rust names, and `HeapStats` equal to what the trace holds.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The example's binary, built here (up to date: `cargo test -p
/// alloctrace-cli` alone would not rebuild it), in this test's profile.
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/PROFILE/deps/rust_api-HASH
    let profile_dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    let bin = profile_dir.join("examples/rust_heap");
    {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args([
            "build",
            "--quiet",
            "-p",
            "alloctrace",
            "--example",
            "rust_heap",
        ])
        .current_dir(&root);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("run cargo");
        assert!(
            status.success(),
            "cargo build --example rust_heap: {status}"
        );
    }
    bin
}

fn cli(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "alloctrace {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn tracing_alloc_counts_exactly_per_function_and_heap_stats_match_the_trace() {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("rust-api-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("run.trace");
    let out = Command::new(example()).arg(&trace).output().unwrap();
    assert!(
        out.status.success(),
        "rust_heap: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let heap: Value = serde_json::from_slice(&out.stdout).unwrap();
    let trace = trace.to_str().unwrap();

    // HeapStats after the stop: the trace's own counts.
    let stats = cli(&["stats", "--json", trace]);
    assert_eq!(stats["anomalies"], 0, "{stats}");
    assert_eq!(
        stats["events"]["heap_object_alloc"],
        heap["total_allocations"]
    );
    assert_eq!(stats["live_bytes"], heap["live_bytes"]);
    assert_eq!(stats["live_objects"], heap["live_blocks"]);
    assert_eq!(stats["peak_live_bytes"], heap["peak_bytes"]);
    assert_eq!(stats["peak_live_objects"], heap["peak_blocks"]);

    // Per allocating function, by its symbolized Rust name anywhere in the
    // stack: 1000 blocks of 64 bytes kept, 100 of 4096 freed.
    let top = cli(&["top", "--json", "-n", "0", trace]);
    let per = |name: &str| {
        let mut allocations = 0;
        let mut bytes = 0;
        let mut leaked = 0;
        for site in top["sites"].as_array().unwrap() {
            let hit = site["stack"].as_array().unwrap().iter().any(|f| {
                f["function"]
                    .as_str()
                    .is_some_and(|s| s.ends_with(&format!("rust_heap::{name}")))
            });
            if hit {
                allocations += site["allocations"].as_u64().unwrap();
                bytes += site["bytes"].as_u64().unwrap();
                leaked += site["leaked_objects"].as_u64().unwrap();
            }
        }
        (allocations, bytes, leaked)
    };
    // small_blocks: 1000 boxes of 64 bytes and the Vec they are
    // collected in (1000 pointers, freed once main moved them out), the
    // boxes kept; big_blocks: 100 buffers of
    // 4096 bytes and their Vec (100 Vecs of 24 bytes), all freed.
    assert_eq!(per("small_blocks"), (1001, 72_000, 1000));
    assert_eq!(per("big_blocks"), (101, 412_000, 0));
    std::fs::remove_dir_all(&dir).ok();
}
