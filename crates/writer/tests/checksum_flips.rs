//! The writer's traces are format version 2 (FORMAT.md section 2): a
//! CRC32C after every batch, raw or compressed, so every single-bit flip of
//! a trace the writer made is reported, by an error or a cut.

use std::ffi::CString;

use alloctrace_reader::TraceReader;
use alloctrace_writer::events;

/// A small trace of a few hundred events in two generations.
fn record(path: &std::path::Path, compress: bool) -> Vec<u8> {
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    let config = alloctrace_writer::Config {
        compress,
        buffer_size: 4096,
        ..Default::default()
    };
    alloctrace_writer::start(
        &config,
        alloctrace_writer::Output::create(&cpath).unwrap(),
        None,
    )
    .unwrap();
    for i in 0..600usize {
        let a = 0x5555_0000_0000 + (i * 2654435761 % 256) * 32;
        events::heap_object_alloc(a, 16 + (i % 240) as u64, 0);
        events::heap_object_free(a);
        if i == 300 {
            alloctrace_writer::advance().unwrap();
        }
    }
    alloctrace_writer::stop().unwrap();
    std::fs::read(path).unwrap()
}

/// Whether reading `bytes` reports damage: an error, or a cut.
fn reports_damage(bytes: &[u8]) -> bool {
    let Ok(mut reader) = TraceReader::new(bytes) else {
        return true;
    };
    loop {
        match reader.next_event() {
            Ok(Some(_)) => {}
            Ok(None) => return reader.truncated().is_some(),
            Err(_) => return true,
        }
    }
}

#[test]
fn every_bit_flip_of_a_written_trace_is_reported() {
    let dir = std::env::temp_dir().join(format!("alloctrace-flips-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for compress in [false, true] {
        let trace = record(&dir.join("t.trace"), compress);
        assert_eq!(
            u16::from_le_bytes([trace[8], trace[9]]),
            alloctrace_format::VERSION
        );
        assert!(!reports_damage(&trace));
        let mut damaged = trace.clone();
        let mut missed = Vec::new();
        for bit in 0..trace.len() * 8 {
            damaged[bit / 8] ^= 1 << (bit % 8);
            if !reports_damage(&damaged) {
                missed.push(bit);
            }
            damaged[bit / 8] ^= 1 << (bit % 8);
        }
        println!(
            "compress={compress}: {} bytes, {} of {} single-bit flips reported",
            trace.len(),
            trace.len() * 8 - missed.len(),
            trace.len() * 8
        );
        assert!(
            missed.is_empty(),
            "compress={compress}: flips of bits {missed:?} read as a clean trace"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
