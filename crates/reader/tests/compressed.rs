//! Compressed batches (FORMAT.md section 2.1): read as if their inner
//! batches stood in the file; every malformed case is an error with an
//! offset, never a panic or a large allocation.

use alloctrace_format::{FILE_HEADER_LEN, MAX_DECOMPRESSED_LEN};
use alloctrace_reader::testing::{sample_trace, varint};
use alloctrace_reader::{Event, ReadError, TraceReader};

fn read(bytes: &[u8]) -> Result<(Vec<Event>, Option<u64>), ReadError> {
    let mut reader = TraceReader::new(bytes)?;
    let mut events = Vec::new();
    while let Some(e) = reader.next_event()? {
        events.push(e);
    }
    Ok((events, reader.truncated()))
}

/// A compressed batch holding `raw_len` (declared) and `frame`.
fn compressed_batch(raw_len: u64, frame: &[u8]) -> Vec<u8> {
    let mut payload = Vec::new();
    varint(&mut payload, raw_len);
    payload.extend_from_slice(frame);
    let mut out = vec![8u8];
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// The sample trace with all its batches, or those in `range`, packed into
/// one compressed batch.
fn packed(split: Option<usize>) -> Vec<u8> {
    let plain = sample_trace();
    let (head, batches) = plain.split_at(FILE_HEADER_LEN);
    let (inside, after) = match split {
        Some(n) => batches.split_at(n),
        None => (batches, &[][..]),
    };
    let mut out = head.to_vec();
    out.extend(compressed_batch(inside.len() as u64, &zstd::bulk::compress(inside, 3).unwrap()));
    out.extend_from_slice(after);
    out
}

#[test]
fn compressed_batches_read_like_plain_ones() {
    let plain = read(&sample_trace()).unwrap();
    assert!(!plain.0.is_empty());
    assert_eq!(read(&packed(None)).unwrap(), plain);
}

#[test]
fn malformed_compressed_batches() {
    let plain = sample_trace();
    let head = &plain[..FILE_HEADER_LEN];
    let body = &plain[FILE_HEADER_LEN..];
    let frame = zstd::bulk::compress(body, 3).unwrap();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (compressed_batch(MAX_DECOMPRESSED_LEN + 1, &frame), "above the limit"),
        (compressed_batch(body.len() as u64, b"not a zstd frame"), "does not decompress"),
        (compressed_batch(body.len() as u64 + 10, &frame), "decompresses to"),
        (compressed_batch(body.len() as u64 - 1, &frame), "does not decompress"),
        (
            {
                let inner = compressed_batch(body.len() as u64, &frame);
                compressed_batch(inner.len() as u64, &zstd::bulk::compress(&inner, 3).unwrap())
            },
            "inside another",
        ),
        (
            {
                let cut = &body[..body.len() - 3];
                compressed_batch(cut.len() as u64, &zstd::bulk::compress(cut, 3).unwrap())
            },
            "cut short",
        ),
    ];
    for (batch, want) in cases {
        let mut bytes = head.to_vec();
        bytes.extend(batch);
        match read(&bytes) {
            Ok(r) => panic!("expected an error containing {want:?}, read {} events", r.0.len()),
            Err(e) => {
                assert!(e.is_malformed(), "{e}");
                // The error points into the compressed batch.
                assert!((FILE_HEADER_LEN as u64..bytes.len() as u64).contains(&e.offset()), "{e}");
                assert!(e.to_string().contains(want), "{e} (wanted {want:?})");
            }
        }
    }
}

#[test]
fn a_cut_inside_a_compressed_batch_is_a_truncation() {
    let bytes = packed(None);
    let cut = &bytes[..bytes.len() - 10];
    let (events, truncated) = read(cut).unwrap();
    assert!(events.is_empty());
    assert_eq!(truncated, Some(FILE_HEADER_LEN as u64));
}
