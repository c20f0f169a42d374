//! Any bytes through TraceReader: it must never panic, hang, or name an
//! offset outside the input. Run: `cargo fuzz run reader fuzz/seeds` (see
//! fuzz/README.md).
#![no_main]

use alloctrace_reader::testing::fuzz_check;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    fuzz_check("input", data);
});
