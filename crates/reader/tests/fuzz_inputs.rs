//! The fuzz target's checks (fuzz/fuzz_targets/reader.rs) as a plain test,
//! over the fuzzing seeds and every crash the fuzzer found: kept in
//! tests/fuzz-crashes/ once fixed, so they stay fixed without cargo-fuzz.

use std::path::Path;

use alloctrace_reader::{Record, TraceReader};

/// The body of the fuzz target: never a panic, never an offset outside the
/// input, never more records than bytes.
fn check(name: &str, data: &[u8]) {
    let len = data.len() as u64;
    let mut reader = match TraceReader::new(data) {
        Ok(reader) => reader,
        Err(err) => {
            assert!(err.offset() <= len, "{name}: {err}");
            return;
        }
    };
    let mut records = 0u64;
    loop {
        match reader.next_record() {
            Ok(Some(Record::GenerationStart { .. })) => {
                let _ = (reader.types().len(), reader.info(), reader.generation_end());
            }
            Ok(Some(Record::Event(event))) => {
                let _ = event.data.name();
            }
            Ok(None) => {
                assert!(reader.truncated().is_none_or(|cut| cut <= len), "{name}");
                break;
            }
            Err(err) => {
                assert!(err.offset() <= len, "{name}: {err}");
                assert_eq!(reader.next_event().err().map(|e| e.offset()), Some(err.offset()), "{name}");
                break;
            }
        }
        records += 1;
        assert!(records <= len, "{name}: more records than input bytes");
    }
    assert!(reader.bytes_read() <= len, "{name}");
}

fn check_dir(dir: &Path) -> usize {
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        check(&path.display().to_string(), &std::fs::read(&path).unwrap());
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
