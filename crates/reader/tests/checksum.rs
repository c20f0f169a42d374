//! Version 2's checksums (FORMAT.md section 2): every single-bit flip of a
//! trace is detected, a damaged batch is named by its offset and kind, a
//! trailer cut off is a truncation, and version-1 traces read as before.

use alloctrace_format::compression_model::Encoder;
use alloctrace_format::{BatchKind, FILE_HEADER_LEN};
use alloctrace_reader::testing::{
    checksummed, sample_trace, sample_trace_v1, varint, TraceBuilder,
};
use alloctrace_reader::{Event, ReadError, TraceReader};

/// Reads everything; `Ok` carries the events and where the trace was cut.
fn read(bytes: &[u8]) -> Result<(Vec<Event>, Option<u64>), ReadError> {
    let mut reader = TraceReader::new(bytes)?;
    let mut events = Vec::new();
    while let Some(e) = reader.next_event()? {
        events.push(e);
    }
    Ok((events, reader.truncated()))
}

/// `trace` (version 1) with every batch after the header packed into one
/// compressed, modeled batch (kind 9), as the writer does with compression
/// on.
fn modeled_v1(trace: &[u8]) -> Vec<u8> {
    let (head, batches) = trace.split_at(FILE_HEADER_LEN);
    let mut modeled = Vec::new();
    assert!(Encoder::with_capacity(batches.len()).encode(batches, &mut modeled));
    let frame = zstd::bulk::compress(&modeled, 1).unwrap();
    let mut payload = Vec::new();
    varint(&mut payload, batches.len() as u64);
    payload.extend_from_slice(&frame);
    let mut out = head.to_vec();
    out.push(BatchKind::CompressedModeled as u8);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// Flips every bit of `trace` in turn; returns how many flips were
/// detected (reading fails, or reports the trace cut) and how many were
/// tried. `trace` itself must read cleanly.
fn flips_detected(trace: &[u8]) -> (usize, usize) {
    assert_eq!(
        read(trace).unwrap().1,
        None,
        "the undamaged trace reads to its end"
    );
    let mut detected = 0;
    let mut damaged = trace.to_vec();
    for bit in 0..trace.len() * 8 {
        damaged[bit / 8] ^= 1 << (bit % 8);
        if !matches!(read(&damaged), Ok((_, None))) {
            detected += 1;
        }
        damaged[bit / 8] ^= 1 << (bit % 8);
    }
    (detected, trace.len() * 8)
}

#[test]
fn every_single_bit_flip_of_a_version_2_trace_is_detected() {
    let plain_v1 = sample_trace_v1();
    let zstd_v1 = modeled_v1(&plain_v1);
    let shim_v1 = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fuzz/seeds/v1-shim-modeled.bin"
    ))
    .unwrap();
    for (name, v1) in [
        ("plain", plain_v1),
        ("zstd", zstd_v1),
        ("shim zstd", shim_v1),
    ] {
        let v2 = checksummed(&v1);
        assert_eq!(
            read(&v2).unwrap(),
            read(&v1).unwrap(),
            "{name}: both versions read the same"
        );
        let (before, n1) = flips_detected(&v1);
        let (after, n2) = flips_detected(&v2);
        println!(
            "{name}: version 1 detects {before} of {n1} flips ({:.1}%), version 2 {after} of {n2} ({:.1}%)",
            100.0 * before as f64 / n1 as f64,
            100.0 * after as f64 / n2 as f64
        );
        assert_eq!(
            after, n2,
            "{name}: every flip of the version-2 trace is detected"
        );
        assert!(
            before < n1,
            "{name}: the version-1 trace lets some through (the test can fail)"
        );
    }
}

#[test]
fn a_damaged_batch_is_named_by_offset_and_kind() {
    let trace = sample_trace();
    // The first batch, an info batch, right after the header: damage a byte
    // of its payload.
    let len = u32::from_le_bytes(trace[17..21].try_into().unwrap()) as usize;
    let mut damaged = trace.clone();
    damaged[FILE_HEADER_LEN + 7] ^= 0x10;
    let e = read(&damaged).unwrap_err();
    assert!(e.is_malformed());
    assert_eq!(e.offset(), FILE_HEADER_LEN as u64);
    assert_eq!(
        e.to_string(),
        format!(
            "malformed trace at byte offset 16: checksum mismatch in the batch at byte offset 16 (kind 2, {} bytes): the file is damaged",
            5 + len
        )
    );
    // Damage in the trailer itself reads the same way.
    let mut damaged = trace.clone();
    damaged[FILE_HEADER_LEN + 5 + len] ^= 1;
    assert_eq!(read(&damaged).unwrap_err().offset(), FILE_HEADER_LEN as u64);
    // A damaged compressed batch is refused before it is decompressed.
    let mut zstd = checksummed(&modeled_v1(&sample_trace_v1()));
    let last = zstd.len() - 5;
    zstd[last] ^= 0x80;
    let e = read(&zstd).unwrap_err();
    assert_eq!(e.offset(), FILE_HEADER_LEN as u64, "{e}");
    assert!(
        e.what()
            .contains("checksum mismatch in the batch at byte offset 16 (kind 9,"),
        "{e}"
    );
}

#[test]
fn a_cut_trailer_is_a_truncation() {
    let mut t = TraceBuilder::new();
    t.info(&alloctrace_reader::testing::info(1))
        .generation_end(1, 2000, 5_001_000, 0);
    let info_end = t.len();
    t.trace_end(1);
    let whole = t.finish();
    // The trace-end batch, its trailer cut after 0 to 3 of its 4 bytes.
    for keep in 0..4 {
        let cut = &whole[..whole.len() - 4 + keep];
        let (events, truncated) = read(cut).unwrap();
        assert!(events.is_empty());
        assert_eq!(
            truncated,
            Some(info_end as u64),
            "trailer cut after {keep} bytes"
        );
    }
    assert_eq!(read(&whole).unwrap().1, None, "the whole trace is not cut");
}

#[test]
fn version_1_traces_read_as_before() {
    let v1 = sample_trace_v1();
    assert_eq!(u16::from_le_bytes([v1[8], v1[9]]), 1);
    assert_eq!(&v1[12..16], &[0; 4]);
    let (events, cut) = read(&v1).unwrap();
    assert_eq!(cut, None);
    assert_eq!(events.len(), 13);
    assert_eq!(read(&sample_trace()).unwrap(), (events, None));
    // Every v1 seed of the fuzzer still reads as it did.
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/seeds");
    for name in [
        "v1-sample.bin",
        "v1-one-pair.bin",
        "v1-shim-modeled.bin",
        "v1-empty.bin",
    ] {
        let bytes = std::fs::read(format!("{dir}/{name}")).unwrap();
        let (_, cut) = read(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(cut, None, "{name}");
        let v2 = name.trim_start_matches("v1-");
        let v2 = std::fs::read(format!("{dir}/{v2}")).unwrap();
        assert_eq!(read(&v2).unwrap(), read(&bytes).unwrap(), "{name}");
    }
}
