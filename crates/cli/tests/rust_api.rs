//! The `alloctrace` crate's safe Rust API (issue 23) on
//! examples/rust_heap.rs, a program whose global allocator is
//! `TracingAlloc`: exact counts per allocating function with symbolized
//! Rust names, `HeapStats` equal to what the trace holds, and the trace's
//! DHAT export, loaded by DHAT's viewer (Valgrind's dh_view.html) in
//! headless Chromium where both are installed (skipped, saying so,
//! otherwise; `.ci/run` installs them).

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

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("rust-api-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn tracing_alloc_counts_exactly_per_function_and_heap_stats_match_the_trace() {
    let dir = scratch("counts");
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

/// The site of `name` in a DHAT document: its program point whose frames
/// name `rust_heap::NAME`.
fn dhat_site<'a>(doc: &'a Value, name: &str) -> Vec<&'a Value> {
    let ftbl = doc["ftbl"].as_array().unwrap();
    doc["pps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|pp| {
            pp["fs"].as_array().unwrap().iter().any(|i| {
                ftbl[i.as_u64().unwrap() as usize]
                    .as_str()
                    .unwrap()
                    .contains(&format!("rust_heap::{name} "))
            })
        })
        .collect()
}

#[test]
fn the_dhat_export_is_dhat_json_that_dhat_viewer_loads() {
    let dir = scratch("dhat");
    let trace = dir.join("run.trace");
    let out = Command::new(example()).arg(&trace).output().unwrap();
    assert!(out.status.success());
    let json = dir.join("run.dhat.json");
    let status = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .args(["export", "--format", "dhat", "-o"])
        .arg(&json)
        .arg(&trace)
        .status()
        .unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(&json).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["dhatFileVersion"], 2);
    assert_eq!(doc["ftbl"][0], "[root]");
    for field in [
        "mode", "verb", "bklt", "bkacc", "tu", "Mtu", "cmd", "pid", "te", "tg", "tuth",
    ] {
        assert!(!doc[field].is_null(), "{field} missing");
    }
    // The 1000 boxes of small_blocks: one program point, all live at the
    // end; big_blocks' 100 buffers of 4096 bytes, none.
    let small: Vec<_> = dhat_site(&doc, "small_blocks")
        .into_iter()
        .filter(|pp| pp["tbk"] == 1000)
        .collect();
    assert_eq!(small.len(), 1, "{:?}", dhat_site(&doc, "small_blocks"));
    assert_eq!(
        (&small[0]["tb"], &small[0]["ebk"], &small[0]["eb"]),
        (
            &Value::from(64_000),
            &Value::from(1000),
            &Value::from(64_000)
        )
    );
    let big: Vec<_> = dhat_site(&doc, "big_blocks")
        .into_iter()
        .filter(|pp| pp["tbk"] == 100)
        .collect();
    assert_eq!(big.len(), 1);
    assert_eq!(
        (&big[0]["tb"], &big[0]["ebk"], &big[0]["mb"]),
        (
            &Value::from(409_600),
            &Value::from(0),
            &Value::from(409_600)
        )
    );

    // DHAT's viewer: its own script, fed the file as its loader would.
    let viewer = Path::new("/usr/libexec/valgrind/dh_view.js");
    let chromium = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("chromium"))
            .find(|p| p.is_file())
    });
    let (Some(chromium), true) = (chromium, viewer.exists()) else {
        println!(
            "skipped: DHAT's viewer needs chromium and valgrind's {}",
            viewer.display()
        );
        return;
    };
    std::fs::copy(viewer, dir.join("dh_view.js")).unwrap();
    let page = dir.join("view.html");
    std::fs::write(
        &page,
        format!(
            r#"<!DOCTYPE html><html><head><meta charset="UTF-8"><script src="dh_view.js"></script>
<script>
window.addEventListener("load", () => {{
  onLoad();
  gFilename = "run.dhat.json";
  try {{
    tryFunc(() => {{
      gData = JSON.parse(document.getElementById("data").textContent);
      buildTree();
      displayTree();
    }});
    document.title = "loaded";
  }} catch (e) {{ document.title = "failed: " + e; }}
}});
</script></head><body><script type="application/json" id="data">{}</script></body></html>"#,
            text.replace("</", "<\\/")
        ),
    )
    .unwrap();
    let out = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains("<title>loaded</title>"),
        "the viewer did not load it: {}",
        &dom[..dom.len().min(2000)]
    );
    assert!(
        dom.contains("rust_heap::small_blocks"),
        "the tree names the sites"
    );
    assert!(!dom.contains("class=\"error\""));
    std::fs::remove_dir_all(&dir).ok();
}
