//! Compressed batches (FORMAT.md sections 2.1 and 2.2): read as if their
//! inner batches stood in the file; every malformed case is an error with
//! an offset, never a panic or a large allocation.

use alloctrace_format::compression_model::Encoder;
use alloctrace_format::{
    zigzag, BatchKind, ENTRY_TAG, FILE_HEADER_LEN, LONG_FORM, MAX_DECOMPRESSED_LEN,
};
use alloctrace_reader::testing::{
    info, sample_trace_v1, varint, EventsBody, PagesBody, Rng, TraceBuilder,
};
use alloctrace_reader::{Event, EventData, ReadError, TraceReader};

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
    batch_of_kind(BatchKind::Compressed, raw_len, frame)
}

/// A compressed-modeled batch holding `raw_len` (declared) and `frame`.
fn modeled_batch(raw_len: u64, frame: &[u8]) -> Vec<u8> {
    batch_of_kind(BatchKind::CompressedModeled, raw_len, frame)
}

fn batch_of_kind(kind: BatchKind, raw_len: u64, frame: &[u8]) -> Vec<u8> {
    let mut payload = Vec::new();
    varint(&mut payload, raw_len);
    payload.extend_from_slice(frame);
    let mut out = vec![kind as u8];
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// The sample trace with all its batches, or those in `range`, packed into
/// one compressed batch.
fn packed(split: Option<usize>) -> Vec<u8> {
    let plain = sample_trace_v1();
    let (head, batches) = plain.split_at(FILE_HEADER_LEN);
    let (inside, after) = match split {
        Some(n) => batches.split_at(n),
        None => (batches, &[][..]),
    };
    let mut out = head.to_vec();
    out.extend(compressed_batch(
        inside.len() as u64,
        &zstd::bulk::compress(inside, 3).unwrap(),
    ));
    out.extend_from_slice(after);
    out
}

#[test]
fn compressed_batches_read_like_plain_ones() {
    let plain = read(&sample_trace_v1()).unwrap();
    assert!(!plain.0.is_empty());
    assert_eq!(read(&packed(None)).unwrap(), plain);
}

#[test]
fn malformed_compressed_batches() {
    let plain = sample_trace_v1();
    let head = &plain[..FILE_HEADER_LEN];
    let body = &plain[FILE_HEADER_LEN..];
    let frame = zstd::bulk::compress(body, 3).unwrap();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            compressed_batch(MAX_DECOMPRESSED_LEN + 1, &frame),
            "above the limit",
        ),
        (
            compressed_batch(body.len() as u64, b"not a zstd frame"),
            "does not decompress",
        ),
        (
            compressed_batch(body.len() as u64 + 10, &frame),
            "decompresses to",
        ),
        (
            compressed_batch(body.len() as u64 - 1, &frame),
            "does not decompress",
        ),
        (
            {
                let inner = compressed_batch(body.len() as u64, &frame);
                compressed_batch(
                    inner.len() as u64,
                    &zstd::bulk::compress(&inner, 3).unwrap(),
                )
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
    each_is_malformed(head, cases);
}

/// `head` followed by each batch of `cases` is malformed, with an error
/// that points into the batch and says what the case names.
fn each_is_malformed(head: &[u8], cases: Vec<(Vec<u8>, &str)>) {
    for (batch, want) in cases {
        let mut bytes = head.to_vec();
        bytes.extend(batch);
        match read(&bytes) {
            Ok(r) => panic!(
                "expected an error containing {want:?}, read {} events",
                r.0.len()
            ),
            Err(e) => {
                assert!(e.is_malformed(), "{e}");
                assert!(
                    (FILE_HEADER_LEN as u64..bytes.len() as u64).contains(&e.offset()),
                    "{e}"
                );
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

/// The modeled stream of `raw`, compressed at zstd level 1 as the writer
/// does.
fn modeled_frame(raw: &[u8]) -> Vec<u8> {
    let mut modeled = Vec::new();
    assert!(Encoder::with_capacity(raw.len()).encode(raw, &mut modeled));
    zstd::bulk::compress(&modeled, 1).unwrap()
}

/// A trace as the writer makes it: compact events batches of two threads
/// (a ring of heap objects freed in allocation order and refilled, with
/// entry tags, realloc-style untagged frees, calls, spans, stacks and
/// long-form events), a pages batch, types, two generations.
fn compact_trace() -> Vec<u8> {
    let g1 = info(1);
    let mut g2 = info(2);
    g2.start_ticks = 900_000;
    g2.start_mono_ns = 5_900_000;
    let mut rng = Rng::new(5);
    let mut t = TraceBuilder::v1();
    t.info(&g1);
    let mut ticks = [1000u64, 1000];
    let mut rings = [vec![0u64; 64], vec![0u64; 64]];
    for (b, g) in [(0usize, 1u64), (1, 1), (2, 1), (3, 1), (4, 2), (5, 2)] {
        if b == 4 {
            t.info(&g2);
            ticks = [g2.start_ticks, g2.start_ticks];
        }
        let thread = b % 2;
        let base = ticks[thread];
        let mut body = Vec::new();
        let mut previous = [0u64; 3];
        let mut event = |body: &mut Vec<u8>,
                         kind_byte: u8,
                         ticks: &mut u64,
                         args: &[u64],
                         class: Option<usize>| {
            body.push(kind_byte);
            let delta = 1 + rng.below(300);
            *ticks += delta;
            varint(body, delta);
            for (i, &a) in args.iter().enumerate() {
                let a = match class {
                    Some(c) if i == 0 && kind_byte & LONG_FORM == 0 => {
                        let d = zigzag(a.wrapping_sub(previous[c]) as i64);
                        previous[c] = a;
                        d
                    }
                    _ => a,
                };
                varint(body, a);
            }
        };
        for i in 0..3000 {
            let ticks = &mut ticks[thread];
            let slot = i % 64;
            let old = rings[thread][slot];
            if old != 0 {
                let tagged = i % 7 != 0;
                let kind = if tagged { 6 | ENTRY_TAG } else { 6 };
                let args = if tagged { vec![old, 4] } else { vec![old] };
                event(&mut body, kind, ticks, &args, Some(1));
            }
            let id = if old != 0 && i % 3 != 0 {
                old
            } else {
                0x1000 + (thread as u64) * 0x100_0000 + i as u64 * 8
            };
            event(
                &mut body,
                5 | ENTRY_TAG,
                ticks,
                &[id, 16 + (i as u64 % 240), 0, 1],
                Some(1),
            );
            rings[thread][slot] = id;
            match i % 500 {
                1 => event(&mut body, 10 | ENTRY_TAG, ticks, &[0, 4], None),
                2 => event(
                    &mut body,
                    2 | ENTRY_TAG,
                    ticks,
                    &[0x40 + i as u64, 3, 5, 11],
                    Some(0),
                ),
                3 => event(
                    &mut body,
                    3 | ENTRY_TAG,
                    ticks,
                    &[0x40 + i as u64 - 1, 12],
                    Some(0),
                ),
                4 => event(&mut body, 8, ticks, &[0x90 + i as u64, 13], Some(2)),
                5 => event(&mut body, 9, ticks, &[0x90 + i as u64 - 1], Some(2)),
                6 => event(
                    &mut body,
                    5 | LONG_FORM | ENTRY_TAG,
                    ticks,
                    &[0x10008, 24, 0, 1],
                    None,
                ),
                7 => event(
                    &mut body,
                    6 | LONG_FORM | ENTRY_TAG,
                    ticks,
                    &[0x10008, 4],
                    None,
                ),
                8 => event(&mut body, 4, ticks, &[0x7000 + i as u64, 48, 1], Some(1)),
                _ => {}
            }
        }
        t.batch(
            BatchKind::CompactEvents as u8,
            g,
            1 + thread as u64,
            base,
            &body,
        );
    }
    let mut pages = PagesBody::new(12, 1, 1000);
    pages.event(1100, 0x7f00_0000_0000, &EventData::PageAlloc { npages: 3 });
    t.pages(1, 1, &pages);
    t.generation_end(1, 800_000, 5_800_000, 0);
    t.generation_end(2, 2_000_000, 7_000_000, 0);
    t.trace_end(2);
    t.finish()
}

#[test]
fn modeled_batches_read_like_plain_ones() {
    for plain in [sample_trace_v1(), compact_trace()] {
        let want = read(&plain).unwrap();
        assert!(!want.0.is_empty());
        let (head, batches) = plain.split_at(FILE_HEADER_LEN);
        // All in one modeled batch, or split in two with a plain batch
        // after (each modeled batch decodes alone).
        let split = batches.len() / 2;
        let split = (0..).map(|i| FILE_HEADER_LEN + split + i).find(|&at| {
            // The first batch boundary at or after the middle.
            let mut pos = FILE_HEADER_LEN;
            while pos < at {
                pos += 5 + u32::from_le_bytes(plain[pos + 1..pos + 5].try_into().unwrap()) as usize;
            }
            pos == at
        });
        let split = split.unwrap() - FILE_HEADER_LEN;
        let mut one = head.to_vec();
        one.extend(modeled_batch(batches.len() as u64, &modeled_frame(batches)));
        let mut two = head.to_vec();
        let (first, second) = batches.split_at(split);
        two.extend(modeled_batch(first.len() as u64, &modeled_frame(first)));
        two.extend(modeled_batch(second.len() as u64, &modeled_frame(second)));
        assert_eq!(read(&one).unwrap(), want);
        assert_eq!(read(&two).unwrap(), want);
    }
    // The compact trace is what the model is for: much smaller than kind 8.
    let plain = compact_trace();
    let batches = &plain[FILE_HEADER_LEN..];
    let modeled = modeled_frame(batches).len();
    let zstd3 = zstd::bulk::compress(batches, 3).unwrap().len();
    assert!(
        modeled * 4 < zstd3 * 3,
        "modeled {modeled} bytes, zstd level 3 {zstd3}"
    );
}

#[test]
fn malformed_modeled_batches() {
    let plain = compact_trace();
    let head = &plain[..FILE_HEADER_LEN];
    let body = &plain[FILE_HEADER_LEN..];
    let mut modeled = Vec::new();
    assert!(Encoder::with_capacity(0).encode(body, &mut modeled));
    let frame = zstd::bulk::compress(&modeled, 1).unwrap();
    let len = body.len() as u64;
    let frame_of = |stream: &[u8]| zstd::bulk::compress(stream, 1).unwrap();
    let mut damaged = modeled.clone();
    // The first free's code in the IDs column: its column starts after
    // the nine lengths and the first four columns.
    let mut pos = 0;
    let lens: Vec<usize> = (0..9)
        .map(|_| alloctrace_format::get_uvarint(&modeled, &mut pos).unwrap() as usize)
        .collect();
    let ids_at = pos + lens[..4].iter().sum::<usize>();
    // Codes past the ring's first round (a free's or an allocation's):
    // each names nothing the model holds.
    damaged[ids_at + 64] = 0x7f;
    damaged[ids_at + 65] = 0x7f;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            modeled_batch(MAX_DECOMPRESSED_LEN + 1, &frame),
            "above the limit",
        ),
        (
            modeled_batch(len, b"not a zstd frame"),
            "does not decompress",
        ),
        (modeled_batch(len + 10, &frame), "modeled stream"),
        (modeled_batch(len - 1, &frame), "modeled stream"),
        (
            modeled_batch(len, &frame_of(&modeled[..modeled.len() - 3])),
            "modeled stream",
        ),
        (modeled_batch(len, &frame_of(&damaged)), "code names no"),
        // A modeled stream longer than any of raw_len bytes may be.
        (
            modeled_batch(3, &frame_of(&[0u8; 5000])),
            "does not decompress",
        ),
        (
            {
                let inner = modeled_batch(len, &frame);
                let mut stream = Vec::new();
                assert!(Encoder::with_capacity(0).encode(&inner, &mut stream));
                modeled_batch(inner.len() as u64, &frame_of(&stream))
            },
            "inside another",
        ),
        (
            {
                let cut = &body[..body.len() - 3];
                modeled_batch(cut.len() as u64, &modeled_frame(cut))
            },
            "cut short",
        ),
    ];
    each_is_malformed(head, cases);
}

#[test]
fn a_cut_inside_a_modeled_batch_is_a_truncation() {
    let plain = compact_trace();
    let body = &plain[FILE_HEADER_LEN..];
    let mut bytes = plain[..FILE_HEADER_LEN].to_vec();
    bytes.extend(modeled_batch(body.len() as u64, &modeled_frame(body)));
    let (events, truncated) = read(&bytes[..bytes.len() - 10]).unwrap();
    assert!(events.is_empty());
    assert_eq!(truncated, Some(FILE_HEADER_LEN as u64));
}

/// A trace whose generation holds 20,000 events of thread 1 (they
/// compress to little), then a batch of thread 2 made of a good event (if
/// `lead`) and `tail`, raw bytes that break it; and where the bad bytes
/// start in the file.
fn trace_with_a_bad_event_late(lead: bool, tail: &[u8]) -> (Vec<u8>, u64) {
    let g = info(1);
    let mut t = TraceBuilder::v1();
    t.info(&g);
    let mut many = EventsBody::new(1000);
    for i in 0..20_000u64 {
        many.event(
            &g,
            1001 + i,
            0x10000 + 16 * (i % 64),
            &EventData::HeapObjectFree,
        );
    }
    t.events(1, 1, &many);
    let mut bad = EventsBody::new(1000);
    if lead {
        bad.event(&g, 1500, 0x10010, &EventData::HeapObjectFree);
    }
    let mut body = bad.bytes().to_vec();
    // After the batch prefix and header (generation 1, thread 2, base
    // 1000: 4 bytes of varints).
    let bad_at = t.len() + 5 + 4 + body.len();
    body.extend_from_slice(tail);
    t.batch(BatchKind::Events as u8, 1, 2, 1000, &body);
    t.generation_end(1, 30_000, 5_030_000, 0).trace_end(1);
    (t.finish(), bad_at as u64)
}

/// An error in an events body inside a compressed batch, found only when
/// the merge reaches it, is reported at the compressed batch (whose offset
/// is in the file) and names the byte of the decompressed data, whatever
/// the kind of compressed batch, and even when that byte's offset is past
/// the end of the file.
#[test]
fn an_error_found_in_the_merge_names_the_compressed_batch() {
    let cases: [(bool, &[u8], &str); 4] = [
        // An unknown kind byte after a good event: found in a run.
        (true, &[0x3f, 1, 1], "unknown event kind 63"),
        // A varint cut by the end of the payload.
        (
            true,
            &[6, 0x80],
            "heap_object_free event runs past the end of the payload",
        ),
        // The batch's only event, cut: found as the generation starts.
        (
            false,
            &[6, 0x80],
            "heap_object_free event runs past the end of the payload",
        ),
        // A delta that takes the time past 2^64.
        (
            true,
            &[
                6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x02,
            ],
            "timestamp overflows",
        ),
    ];
    for (lead, tail, want) in cases {
        let (plain, bad_at) = trace_with_a_bad_event_late(lead, tail);
        let plain_error = read(&plain).expect_err("the plain trace is malformed");
        assert_eq!(plain_error.offset(), bad_at, "{plain_error}");
        assert!(
            plain_error.what().contains(want),
            "{plain_error} (wanted {want:?})"
        );
        let inner = &plain[FILE_HEADER_LEN..];
        let inner_at = bad_at - FILE_HEADER_LEN as u64;
        for kind in [BatchKind::Compressed, BatchKind::CompressedModeled] {
            let mut bytes = plain[..FILE_HEADER_LEN].to_vec();
            let frame = match kind {
                BatchKind::Compressed => zstd::bulk::compress(inner, 3).unwrap(),
                _ => modeled_frame(inner),
            };
            bytes.extend(batch_of_kind(kind, inner.len() as u64, &frame));
            assert!(
                inner_at > bytes.len() as u64,
                "the bad byte must lie past the end of the file"
            );
            let mut reader = TraceReader::new(&bytes[..]).unwrap();
            let mut events = 0;
            let err = loop {
                match reader.next_event() {
                    Ok(Some(_)) => events += 1,
                    Ok(None) => panic!("{kind:?}: read {events} events and no error"),
                    Err(err) => break err,
                }
            };
            // The events before the bad one came out, as in the file.
            assert_eq!(read_until_error(&plain), events, "{kind:?}");
            assert!(err.is_malformed(), "{err}");
            assert_eq!(err.offset(), FILE_HEADER_LEN as u64, "{kind:?}: {err}");
            let msg = err.to_string();
            let what = plain_error.what().replace(
                &format!("starting at offset {}", bad_at - 5 - 4 - lead_len(lead)),
                &format!("starting at offset {}", inner_at - 5 - 4 - lead_len(lead)),
            );
            assert_eq!(
                msg,
                format!(
                    "malformed trace at byte offset {FILE_HEADER_LEN}: inside the compressed batch, at byte {inner_at} of its decompressed data: {what}"
                ),
                "{kind:?}"
            );
            // Every later call returns the same error.
            assert_eq!(reader.next_event().unwrap_err().to_string(), msg);
        }
    }
}

/// Bytes of the good event `trace_with_a_bad_event_late` puts first.
fn lead_len(lead: bool) -> u64 {
    if lead {
        let mut b = EventsBody::new(1000);
        b.event(&info(1), 1500, 0x10010, &EventData::HeapObjectFree);
        b.bytes().len() as u64
    } else {
        0
    }
}

/// How many events come out before the error.
fn read_until_error(bytes: &[u8]) -> usize {
    let mut reader = TraceReader::new(bytes).unwrap();
    let mut events = 0;
    while let Ok(Some(_)) = reader.next_event() {
        events += 1;
    }
    events
}

/// The batches of a trace, as they stand after its file header.
fn split_batches(trace: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut pos = FILE_HEADER_LEN;
    while pos < trace.len() {
        let len = u32::from_le_bytes(trace[pos + 1..pos + 5].try_into().unwrap()) as usize;
        out.push(&trace[pos..pos + 5 + len]);
        pos += 5 + len;
    }
    out
}

/// Each batch in a compressed batch of its own, kinds 8 and 9 in turn;
/// with the offset of each compressed batch. Batch `broken`, if any, gets
/// a frame that does not decompress.
fn packed_one_by_one(batches: &[&[u8]], broken: Option<usize>) -> (Vec<u8>, Vec<usize>) {
    let mut out = TraceBuilder::v1().finish();
    let mut offsets = Vec::new();
    for (i, batch) in batches.iter().enumerate() {
        offsets.push(out.len());
        let kind = if i % 2 == 0 {
            BatchKind::CompressedModeled
        } else {
            BatchKind::Compressed
        };
        let frame = match kind {
            _ if broken == Some(i) => b"not a zstd frame".to_vec(),
            BatchKind::Compressed => zstd::bulk::compress(batch, 3).unwrap(),
            _ => modeled_frame(batch),
        };
        out.extend(batch_of_kind(kind, batch.len() as u64, &frame));
    }
    (out, offsets)
}

/// Every event before the first error, and the error (or the cut).
fn read_to_the_end(bytes: &[u8]) -> (Vec<Event>, Result<Option<u64>, ReadError>) {
    let mut reader = TraceReader::new(bytes).unwrap();
    let mut events = Vec::new();
    loop {
        match reader.next_event() {
            Ok(Some(e)) => events.push(e),
            Ok(None) => return (events, Ok(reader.truncated())),
            Err(err) => {
                // Once failed, always the same error.
                assert_eq!(
                    reader.next_event().unwrap_err().to_string(),
                    err.to_string()
                );
                return (events, Err(err));
            }
        }
    }
}

/// Compressed batches are decompressed ahead of the reader, on another
/// thread: what comes out, and when an error or a cut is reported, is as
/// if each were decompressed in its turn. The reference is the plain
/// trace, where a batch of unknown kind (reported when read, as a
/// compressed batch's error is) stands for the broken compressed batch.
#[test]
fn batches_decompressed_ahead_come_out_in_their_turn() {
    for plain in [sample_trace_v1(), compact_trace()] {
        let batches = split_batches(&plain);
        assert!(batches.len() >= 8, "{} batches", batches.len());
        let (packed, offsets) = packed_one_by_one(&batches, None);
        assert_eq!(read_to_the_end(&packed).0, read_to_the_end(&plain).0);
        assert_eq!(read_to_the_end(&packed).1.unwrap(), None);
        for k in 0..batches.len() {
            let mut reference = TraceBuilder::v1().finish();
            for b in &batches[..k] {
                reference.extend_from_slice(b);
            }
            let plain_at = reference.len();
            reference.extend_from_slice(&[0xee, 0, 0, 0, 0]);
            let (want_events, want_err) = read_to_the_end(&reference);
            let want_err = want_err.unwrap_err();
            assert_eq!(want_err.offset(), plain_at as u64, "{want_err}");

            // Batch k does not decompress.
            let (broken, _) = packed_one_by_one(&batches, Some(k));
            let (events, err) = read_to_the_end(&broken);
            let err = err.unwrap_err();
            assert_eq!(events, want_events, "batch {k}");
            // At the frame, after the kind, length and raw_len.
            assert!(
                (offsets[k] as u64 + 6..offsets[k] as u64 + 10).contains(&err.offset()),
                "batch {k}: {err}"
            );
            assert!(err.to_string().contains("does not decompress"), "{err}");

            // The file ends inside batch k's prefix or payload.
            for cut in [offsets[k] + 3, offsets[k] + 9] {
                let (events, truncated) = read_to_the_end(&packed[..cut]);
                let plain_cut = read_to_the_end(&plain[..plain_at + 3]);
                assert_eq!(events, plain_cut.0, "batch {k} cut at {cut}");
                assert_eq!(truncated.unwrap(), Some(offsets[k] as u64));
                assert_eq!(plain_cut.1.unwrap(), Some(plain_at as u64));
            }
        }
    }
}

/// A trace-end batch inside a compressed batch: nothing may follow it in
/// the file, batches read ahead or not.
#[test]
fn data_after_a_compressed_trace_end_is_reported_at_its_offset() {
    let plain = sample_trace_v1();
    let batches = split_batches(&plain);
    let (packed, _) = packed_one_by_one(&batches, None);
    // Reported where the data after the compressed batch holding the trace
    // end starts, as after a plain trace end.
    let after = packed.len() as u64;
    let (_, end) = read_to_the_end(&packed);
    assert_eq!(end.unwrap(), None);
    let extra_compressed = batch_of_kind(
        BatchKind::Compressed,
        3,
        &zstd::bulk::compress(b"abc", 3).unwrap(),
    );
    let tails: [&[u8]; 5] = [
        &[0],
        &[5, 0],
        &[0xee, 1, 2, 3, 4, 5],
        &extra_compressed,
        batches[0],
    ];
    for tail in tails {
        let mut bytes = packed.clone();
        bytes.extend_from_slice(tail);
        let (events, err) = read_to_the_end(&bytes);
        let err = err.unwrap_err();
        assert_eq!(err.offset(), after, "{err}");
        assert!(
            err.to_string().contains("data after the trace-end batch"),
            "{err}"
        );
        assert_eq!(events, read_to_the_end(&packed).0);
    }
}

/// The sample trace's batches in one zstd frame whose header declares a
/// window of `2^window_log` bytes (streamed, so zstd does not shrink it to
/// the content's size).
fn frame_with_window(window_log: u32) -> (Vec<u8>, usize) {
    use std::io::Write;
    let plain = sample_trace_v1();
    let inside = &plain[FILE_HEADER_LEN..];
    let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    encoder.window_log(window_log).unwrap();
    encoder.include_contentsize(false).unwrap();
    encoder.write_all(inside).unwrap();
    (encoder.finish().unwrap(), inside.len())
}

/// A frame may declare a window far larger than its data: a decoder
/// allocates it first, so readers refuse a window above 8 MiB
/// (MAX_WINDOW_LOG) instead of allocating what a few bytes ask for.
#[test]
fn a_frame_that_declares_a_huge_window_is_refused() {
    let plain = read(&sample_trace_v1()).unwrap();
    let head = &sample_trace_v1()[..FILE_HEADER_LEN];
    let (frame, raw_len) = frame_with_window(alloctrace_format::MAX_WINDOW_LOG);
    let mut ok = head.to_vec();
    ok.extend(compressed_batch(raw_len as u64, &frame));
    assert_eq!(read(&ok).unwrap(), plain);

    let (frame, raw_len) = frame_with_window(26);
    for batch in [
        compressed_batch(raw_len as u64, &frame),
        modeled_batch(raw_len as u64, &frame),
    ] {
        let mut bytes = head.to_vec();
        bytes.extend(batch);
        let e = read(&bytes).expect_err("a 64 MiB window");
        assert!(e.is_malformed(), "{e}");
        // At the frame: after the batch prefix and the raw_len varint.
        let mut raw_len_varint = Vec::new();
        varint(&mut raw_len_varint, raw_len as u64);
        assert_eq!(
            e.offset(),
            (FILE_HEADER_LEN + 5 + raw_len_varint.len()) as u64,
            "{e}"
        );
        assert!(e.to_string().contains("does not decompress"), "{e}");
    }
}

/// A batch after the trace end inside the same compressed batch is data
/// after the trace end too (it was silently ignored).
#[test]
fn a_batch_after_the_trace_end_inside_a_compressed_batch_is_reported() {
    let plain = sample_trace_v1();
    let (head, inside) = plain.split_at(FILE_HEADER_LEN);
    let batches = split_batches(&plain);
    let mut raw = inside.to_vec();
    raw.extend_from_slice(batches[0]);
    let mut bytes = head.to_vec();
    bytes.extend(compressed_batch(
        raw.len() as u64,
        &zstd::bulk::compress(&raw, 3).unwrap(),
    ));
    let (events, err) = read_to_the_end(&bytes);
    let err = err.unwrap_err();
    assert_eq!(err.offset(), FILE_HEADER_LEN as u64, "{err}");
    let want = format!(
        "at byte {} of its decompressed data: data after the trace-end batch",
        inside.len()
    );
    assert!(err.to_string().contains(&want), "{err} (wanted {want:?})");
    assert_eq!(events, read(&plain).unwrap().0);
}
