//! The fuzz target's checks (fuzz/fuzz_targets/reader.rs) as a plain test,
//! over the fuzzing seeds and every crash the fuzzer found: kept in
//! tests/fuzz-crashes/ once fixed, so they stay fixed without cargo-fuzz.

use std::path::Path;

use alloctrace_reader::testing::fuzz_check;

fn check_dir(dir: &Path) -> usize {
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        fuzz_check(&path.display().to_string(), &std::fs::read(&path).unwrap());
        n += 1;
    }
    n
}

#[test]
fn fuzz_crashes_stay_fixed() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-crashes");
    assert!(check_dir(&dir) > 0);
}

#[test]
fn fuzz_seeds_pass_the_fuzz_target() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds");
    assert!(check_dir(&dir) > 0);
}
