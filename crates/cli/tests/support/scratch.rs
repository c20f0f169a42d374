//! Scratch directories and the traces in them: the part of the tests'
//! support that needs no `alloctrace` binary of this package, shared by the
//! CLI's tests (support/mod.rs) and the shim's (crates/preload/tests/shim,
//! through a `#[path]` module).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The trace files in `dir`, in name order.
pub fn traces_in(dir: &Path) -> Vec<PathBuf> {
    let mut traces: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read the scratch directory")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "trace"))
        .collect();
    traces.sort();
    traces
}

/// A fresh directory for one test, named after the test file and `name`,
/// removed when the test passes.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "{}-{name}-{}-{n}",
            env!("CARGO_CRATE_NAME"),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        Scratch(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
