//! Any bytes through TraceReader: it must never panic, hang, or name an
//! offset outside the input. Run: `cargo fuzz run reader fuzz/seeds` (see
//! fuzz/README.md).
#![no_main]

use alloctrace_reader::{Record, TraceReader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;
    let mut reader = match TraceReader::new(data) {
        Ok(reader) => reader,
        Err(err) => {
            assert!(err.offset() <= len, "{err}");
            return;
        }
    };
    let mut records = 0u64;
    loop {
        match reader.next_record() {
            Ok(Some(Record::GenerationStart { .. })) => {
                // The accessors must hold up on whatever was read.
                let _ = (reader.types().len(), reader.info(), reader.generation_end());
            }
            Ok(Some(Record::Event(event))) => {
                let _ = event.data.name();
            }
            Ok(None) => {
                assert!(reader.truncated().map_or(true, |cut| cut <= len));
                break;
            }
            Err(err) => {
                assert!(err.offset() <= len, "{err}");
                // A failed reader keeps failing the same way.
                assert_eq!(reader.next_event().err().map(|e| e.offset()), Some(err.offset()));
                break;
            }
        }
        records += 1;
        // Every event takes at least 3 bytes and every generation a batch.
        assert!(records <= len, "more records than input bytes");
    }
    assert!(reader.bytes_read() <= len);
});
