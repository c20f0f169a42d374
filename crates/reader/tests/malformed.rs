//! Broken traces: each is reported with the offset of the bad item and what
//! was wrong; cut-off traces yield what is complete; random damage never
//! panics or hangs.

use alloctrace_reader::testing::{
    info, sample_trace, sample_trace_v1, varint, EventsBody, Rng, TraceBuilder,
};
use alloctrace_reader::{Event, EventData, ReadError, TraceReader};

/// Reads everything; `Ok` carries the events and where the trace was cut.
fn read(bytes: &[u8]) -> Result<(Vec<Event>, Option<u64>), ReadError> {
    let mut reader = TraceReader::new(bytes)?;
    let mut events = Vec::new();
    while let Some(e) = reader.next_event()? {
        events.push(e);
        // Never hangs: each event takes at least three bytes of input.
        assert!(events.len() <= bytes.len(), "more events than bytes");
    }
    Ok((events, reader.truncated()))
}

fn error(bytes: &[u8]) -> ReadError {
    match read(bytes) {
        Ok(r) => panic!("expected an error, read {r:?}"),
        Err(e) => {
            assert!(e.is_malformed(), "{e}");
            e
        }
    }
}

/// A trace with generation 1's info batch; returns it and an events body
/// at base tick 1000.
fn start() -> TraceBuilder {
    let mut t = TraceBuilder::new();
    t.info(&info(1));
    t
}

#[test]
fn unknown_event_kind_names_the_event_and_its_batch() {
    let mut t = start();
    let batch_at = t.len();
    let mut b = EventsBody::new(1000);
    b.event(&info(1), 1001, 0x10010, &EventData::HeapObjectFree)
        .raw_event(13, 1002, &[1]);
    t.events(1, 1, &b);
    // kind(1) + len(4) + header varints: 1, 1, 1000 (2 bytes) + first event (3 bytes)
    let event_at = batch_at + 5 + 4 + 3;
    let e = error(t.bytes());
    assert_eq!(e.offset(), event_at as u64);
    assert_eq!(
        e.to_string(),
        format!(
            "malformed trace at byte offset {event_at}: unknown event kind 13 in events batch starting at offset {batch_at}"
        )
    );
}

#[test]
fn file_header_errors() {
    let e = TraceReader::new(&b"NOTATRACE-------"[..]).err().unwrap();
    assert_eq!((e.offset(), e.is_malformed()), (0, true));
    assert!(e.to_string().contains("not an alloctrace trace"), "{e}");
    let e = TraceReader::new(&b""[..]).err().unwrap();
    assert!(e.to_string().contains("not an alloctrace trace"), "{e}");
    let e = TraceReader::new(&b"ALCTRA"[..]).err().unwrap();
    assert!(e.to_string().contains("ends after 6 bytes"), "{e}");
    let mut v7 = TraceBuilder::new().finish();
    v7[8] = 7;
    let e = TraceReader::new(v7.as_slice()).err().unwrap();
    assert_eq!(e.offset(), 8);
    assert_eq!(
        e.to_string(),
        "malformed trace at byte offset 8: unsupported format version 7: this reader reads versions 1, 2, 3, 4, 5 and 6 (a newer alloctrace wrote this trace?)"
    );
    // Version 1: flags are ignored; the reserved bytes must be zero, so
    // that a bit flip turning version 3 (or 4... 5) into 1 is caught.
    let mut flagged = TraceBuilder::v1().finish();
    flagged[10] = 0xff;
    assert!(TraceReader::new(flagged.as_slice()).is_ok());
    flagged[15] = 1;
    let e = TraceReader::new(flagged.as_slice()).err().unwrap();
    assert!(
        e.to_string()
            .contains("checksum mismatch in the file header"),
        "{e}"
    );
    let mut flipped = TraceBuilder::v3().finish();
    flipped[8] ^= 2;
    assert!(
        TraceReader::new(flipped.as_slice()).is_err(),
        "version 3 flipped to 1"
    );
    let mut flipped = TraceBuilder::new().finish();
    flipped[8] ^= 4;
    assert!(
        TraceReader::new(flipped.as_slice()).is_err(),
        "version 6 flipped to 2"
    );
    // Version 2: the header's checksum covers them.
    let mut flagged = TraceBuilder::new().finish();
    flagged[10] = 0xff;
    let e = TraceReader::new(flagged.as_slice()).err().unwrap();
    assert_eq!(e.to_string(), "malformed trace at byte offset 0: checksum mismatch in the file header: the file is damaged");
}

#[test]
fn unknown_batch_kind() {
    let mut t = start();
    let at = t.len() as u64;
    t.batch(14, 1, 0, 0, &[]);
    let e = error(t.bytes());
    assert_eq!(e.offset(), at);
    assert!(e.what().contains("unknown batch kind 14"), "{e}");
}

/// A process body (kind 13) after generation 1's info batch, and the
/// file offset of its body's first byte.
fn with_process_body(body: &[u8]) -> (Vec<u8>, u64) {
    let mut t = start();
    // kind(1) + len(4) + header varints 1, 0, 0.
    let body_at = t.len() as u64 + 5 + 3;
    t.batch(13, 1, 0, 0, body);
    t.generation_end(1, 2000, 5_001_000, 0).trace_end(1);
    (t.finish(), body_at)
}

#[test]
fn every_malformed_process_case_names_its_field() {
    let max = alloctrace_format::MAX_COMMAND_LINE;
    let vint = |v: u64| {
        let mut b = Vec::new();
        varint(&mut b, v);
        b
    };
    let over_count = [vint(0), vint(max + 1)].concat();
    // Two arguments of 40,000 bytes: the second crosses the limit at its
    // length (offset 2 + 3 + 40,000).
    let big = vec![b'a'; 40_000];
    let over_bytes = [
        vint(0),
        vint(2),
        vint(40_000),
        big.clone(),
        vint(40_000),
        big,
    ]
    .concat();
    // (body, offset of the bad field in the body, message)
    let cases: Vec<(Vec<u8>, u64, String)> = vec![
        (
            vec![],
            0,
            "the process flags runs past the end of the payload (truncated varint)".into(),
        ),
        (
            vec![0],
            1,
            "the argument count runs past the end of the payload (truncated varint)".into(),
        ),
        (
            over_count,
            1,
            format!("argument count {} is above the limit of {max}", max + 1),
        ),
        (
            vec![0, 2, 1, b'x'],
            4,
            "an argument's length runs past the end of the payload (truncated varint)".into(),
        ),
        (
            vec![0, 1, 5, b'a', b'b'],
            2,
            "argument 0's length 5 runs past the end of the payload (2 bytes left)".into(),
        ),
        (
            vec![
                0, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
            ],
            2,
            "an argument's length is a varint that overflows 64 bits".into(),
        ),
        (
            over_bytes,
            2 + 3 + 40_000,
            format!("argument 1 makes the command line longer than the limit of {max} bytes"),
        ),
    ];
    for (body, at, what) in cases {
        let (trace, body_at) = with_process_body(&body);
        let e = error(&trace);
        assert_eq!(e.offset(), body_at + at, "{what}: {e}");
        assert_eq!(
            e.what(),
            format!("{what} in process batch starting at offset {}", body_at - 8),
            "{e}"
        );
    }
    // A second process batch in one generation.
    let mut t = start();
    t.process(1, 0, &[b"a"]);
    let at = t.len() as u64;
    t.process(1, 0, &[b"b"]);
    let e = error(t.bytes());
    assert_eq!(e.offset(), at);
    assert_eq!(e.what(), "second process batch for generation 1");
    // At the limits exactly: read, and bytes after the arguments (fields
    // of a later version) are ignored.
    let exact = [
        vint(3),
        vint(2),
        vint(max - 1),
        vec![b'a'; max as usize - 1],
        vint(1),
        vec![b'b'],
        vec![7, 7],
    ]
    .concat();
    let (trace, _) = with_process_body(&exact);
    let mut reader = TraceReader::new(trace.as_slice()).unwrap();
    assert!(reader.next_record().unwrap().is_some());
    let p = reader.process().expect("the process batch");
    assert!(p.truncated, "flag bit 0; bit 1 is ignored");
    assert_eq!(p.command_line.len(), 2);
    assert_eq!(p.command_line[0].len(), max as usize - 1);
    assert_eq!(p.command_line[1], "b");
}

fn words(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

#[test]
fn every_malformed_pages_case_names_its_word() {
    use alloctrace_format::pages::{
        sync_word, Layout, KIND_ALLOC, KIND_FREE, SYNC_LONG_EVENT, SYNC_THREAD, SYNC_TIME,
    };
    let layout = Layout {
        page_shift: 12,
        lost_bits: 7,
    };
    let short = layout.event_word(KIND_ALLOC, 0x7000_0000, 3, 5);
    let large = layout.event_word(KIND_FREE, 0x7000_0000, 1 << 20, 6);
    let long = sync_word(SYNC_LONG_EVENT, KIND_ALLOC | 7 << 2);
    let thread = sync_word(SYNC_THREAD, 1);
    let time = |units: u64| sync_word(SYNC_TIME, units);
    let huge_lost = Layout {
        page_shift: 12,
        lost_bits: 32,
    };
    // (body, offset of the bad word in the body, message)
    let cases: Vec<(Vec<u8>, u64, &str)> = vec![
        (
            vec![0; 12],
            0,
            "pages body of 12 bytes is not a multiple of 8",
        ),
        (words(&[short]), 0, "page event word before the layout word"),
        (
            words(&[thread, time(8), short]),
            16,
            "page event word before the layout word",
        ),
        (
            words(&[long, 1, 1]),
            0,
            "long page event before the layout word",
        ),
        (
            words(&[layout.word(), sync_word(SYNC_LONG_EVENT, 0), 1, 1]),
            8,
            "long page event of kind 0",
        ),
        (
            words(&[layout.word(), thread, time(8), short, long, 1]),
            32,
            "page event runs past the end of the payload",
        ),
        (
            words(&[layout.word(), long]),
            8,
            "page event runs past the end of the payload",
        ),
        (
            words(&[layout.word(), thread, large]),
            16,
            "page event runs past the end of the payload",
        ),
        (
            words(&[layout.word(), sync_word(SYNC_THREAD, 2), time(8), short]),
            8,
            "page thread word names thread 2, but the batch header names thread 1",
        ),
        (
            words(&[layout.word(), time(8), short, time(7), short]),
            32,
            "page event time goes backwards (tick 1536 after tick 1664)",
        ),
        (
            words(&[
                layout.word(),
                time(8),
                layout.event_word(KIND_ALLOC, 0x7000_0000, 3, 9),
                short,
            ]),
            24,
            "page event time goes backwards (tick 1664 after tick 2176)",
        ),
        (
            words(&[huge_lost.word(), time(1 << 32), short]),
            16,
            "page event timestamp overflows 64 bits",
        ),
        (
            words(&[layout.word(), sync_word(2, 3)]),
            8,
            "page layout payload 0x3 out of range",
        ),
        (
            words(&[layout.word(), sync_word(2, 12 | 33 << 6)]),
            8,
            "page layout payload 0x84c out of range",
        ),
        (
            words(&[sync_word(2, 41)]),
            0,
            "page layout payload 0x29 out of range",
        ),
        (
            words(&[sync_word(2, 12 | 7 << 6 | 1 << 12)]),
            0,
            "page layout payload 0x11cc out of range",
        ),
    ];
    for (body, word_at, what) in cases {
        let mut t = start();
        let at = t.len() as u64;
        t.batch(6, 1, 1, 1000, &body);
        let e = error(t.bytes());
        // kind, length, then the header varints 1, 1, 1000 (2 bytes).
        assert_eq!(e.offset(), at + 5 + 4 + word_at, "{e}");
        assert_eq!(
            e.what(),
            format!("{what} in pages batch starting at offset {at}")
        );
    }
}

#[test]
fn pages_batches_without_thread_or_time_words_still_read() {
    use alloctrace_format::pages::{Layout, KIND_SCAV};
    let layout = Layout {
        page_shift: 12,
        lost_bits: 7,
    };
    // Only a layout word: the time base comes from the header's base_ticks
    // (1000 ticks = 7 units), and the thread from the header.
    let body = words(&[layout.word(), layout.event_word(KIND_SCAV, 0x5000, 2, 1)]);
    let mut t = start();
    t.batch(6, 1, 4, 1000, &body)
        .batch(6, 1, 4, 1000, &words(&[layout.word()]))
        .generation_end(1, 2000, 5_001_000, 0)
        .trace_end(1);
    let (events, cut) = read(t.bytes()).unwrap();
    assert_eq!(cut, None);
    assert_eq!(events.len(), 1);
    let e = &events[0];
    assert_eq!(
        (e.ticks, e.thread, e.addr, &e.data, e.long_form),
        (8 << 7, 4, 0x5000, &EventData::PageScav { npages: 2 }, false)
    );
}

#[test]
fn huge_declared_lengths_are_rejected() {
    for len in [alloctrace_format::MAX_BATCH_PAYLOAD + 1, u32::MAX] {
        let mut t = start();
        let at = t.len() as u64;
        t.raw(&[1]).raw(&len.to_le_bytes()).raw(&[1, 1, 0]);
        let e = error(t.bytes());
        assert_eq!(e.offset(), at);
        assert!(e.what().contains(&format!("payload of {len} bytes")), "{e}");
    }
    // At the limit the length is fine; the file just ends early.
    let mut t = start();
    let at = t.len() as u64;
    t.raw(&[1])
        .raw(&alloctrace_format::MAX_BATCH_PAYLOAD.to_le_bytes())
        .raw(&[1, 1, 0]);
    let (events, cut) = read(t.bytes()).unwrap();
    assert!(events.is_empty());
    assert_eq!(cut, Some(at));
}

#[test]
fn varint_overflow_and_zero_generation() {
    // Batch header: 11 bytes of 0xff for the generation.
    let mut t = start();
    let at = t.len() as u64;
    let mut payload = vec![0xffu8; 11];
    payload.extend_from_slice(&[0, 0]);
    let mut batch = vec![1];
    batch.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    batch.extend_from_slice(&payload);
    t.raw_batch(&batch);
    let e = error(t.bytes());
    assert_eq!(e.offset(), at + 5);
    assert!(e.what().contains("overflows 64 bits"), "{e}");

    // A tenth byte above 1 in an event argument.
    let mut t = start();
    let at = t.len() as u64;
    let mut body = vec![6u8 /* heap object free */, 0];
    body.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02]);
    t.batch(1, 1, 1, 1000, &body);
    let e = error(t.bytes());
    assert_eq!(e.offset(), at + 5 + 4 + 2);
    assert!(
        e.what()
            .contains("argument 1 of a heap_object_free event overflows 64 bits"),
        "{e}"
    );

    let mut t = start();
    let at = t.len() as u64;
    t.batch(1, 0, 1, 1000, &[]);
    let e = error(t.bytes());
    assert_eq!(e.offset(), at + 5);
    assert!(e.what().contains("generation 0"), "{e}");
}

#[test]
fn info_fields_out_of_range() {
    let fields = ["page_size", "min_heap_align", "min_stack_align"];
    for (i, field) in fields.iter().enumerate() {
        for bad in [0u64, 3, 4097] {
            let mut g = info(1);
            match i {
                0 => g.page_size = bad,
                1 => g.min_heap_align = bad,
                _ => g.min_stack_align = bad,
            }
            let mut t = TraceBuilder::new();
            t.info(&g);
            let e = error(t.bytes());
            assert!(
                e.what()
                    .contains(&format!("{field} {bad} is not a power of two")),
                "{e}"
            );
            assert!(e.offset() > 16 + 5 && e.offset() < t.len() as u64);
        }
    }
    let mut g = info(1);
    g.ticks_per_sec = 0;
    let mut t = TraceBuilder::new();
    t.info(&g);
    assert!(error(t.bytes()).what().contains("ticks_per_sec is 0"));
    // An info body cut before its last field.
    let mut t = TraceBuilder::new();
    t.batch(2, 1, 0, 0, &[0, 1, 1]);
    assert!(error(t.bytes())
        .what()
        .contains("runs past the end of the payload"));
    // Fields appended by a later version are ignored.
    let mut body = Vec::new();
    for v in [
        0x10000u64,
        4096,
        16,
        4096,
        1000,
        5,
        6,
        1_000_000_000,
        1,
        77,
        78,
    ] {
        varint(&mut body, v);
    }
    let mut t = TraceBuilder::new();
    t.batch(2, 1, 0, 1000, &body)
        .generation_end(1, 2000, 1005, 0)
        .trace_end(1);
    assert!(read(t.bytes()).is_ok());
}

#[test]
fn a_third_open_generation_is_an_error() {
    let mut t = start();
    t.info(&info(2));
    let at = t.len() as u64;
    t.info(&info(3));
    let e = error(t.bytes());
    assert_eq!(e.offset(), at);
    assert_eq!(
        e.what(),
        "batch of generation 3 before generation 1 ended (at most two consecutive generations may be open)"
    );

    // Generation g+2 while g is open, with g+1 never seen.
    let mut t = start();
    t.info(&info(3));
    assert!(error(t.bytes())
        .what()
        .contains("batch of generation 3 before generation 1 ended"));

    // Generation 3 right after generation 1 ended: 2 is missing.
    let mut t = start();
    t.generation_end(1, 2000, 1, 0).info(&info(3));
    assert!(error(t.bytes()).what().contains("generation 2 is missing"));
}

#[test]
fn batches_of_ended_generations_are_errors() {
    let mut t = start();
    t.generation_end(1, 2000, 1, 0);
    let at = t.len() as u64;
    t.batch(1, 1, 1, 2000, &[]);
    let e = error(t.bytes());
    assert_eq!(e.offset(), at);
    assert!(
        e.what()
            .contains("batch of generation 1, which already ended"),
        "{e}"
    );

    // Generation 2 ends before generation 1: allowed, but nothing of 2 may follow.
    let mut t = start();
    t.info(&info(2)).generation_end(2, 2000, 1, 0);
    t.batch(1, 2, 1, 2000, &[]);
    assert!(error(t.bytes())
        .what()
        .contains("after its generation-end batch"));

    // A generation after the first one seen starts out of order.
    let mut t = TraceBuilder::new();
    t.info(&info(2)).info(&info(1));
    assert!(error(t.bytes())
        .what()
        .contains("generations must start in order"));
}

#[test]
fn generation_two_ending_first_is_handed_out_after_one() {
    let g1 = info(1);
    let g2 = info(2);
    let mut b1 = EventsBody::new(1000);
    b1.event(&g1, 1100, 0x10010, &EventData::HeapObjectFree);
    let mut b2 = EventsBody::new(1000);
    b2.event(&g2, 1050, 0x10020, &EventData::HeapObjectFree);
    let mut t = start();
    t.info(&g2)
        .events(2, 1, &b2)
        .generation_end(2, 2000, 5_001_000, 0);
    t.events(1, 1, &b1)
        .generation_end(1, 2000, 5_001_000, 0)
        .trace_end(2);
    let (events, cut) = read(t.bytes()).unwrap();
    assert_eq!(
        events.iter().map(|e| e.generation).collect::<Vec<_>>(),
        [1, 2]
    );
    assert_eq!(cut, None);
}

#[test]
fn duplicate_info_and_end_without_info() {
    let mut t = start();
    let at = t.len() as u64;
    t.info(&info(1));
    let e = error(t.bytes());
    assert_eq!(
        (e.offset(), e.what()),
        (at, "second info batch for generation 1".to_string())
    );

    let mut t = TraceBuilder::new();
    t.generation_end(1, 1, 1, 0);
    assert!(error(t.bytes()).what().contains("which has no info batch"));
}

#[test]
fn bad_events() {
    let cases: [(Vec<u8>, &str); 5] = [
        (vec![0x46, 0, 1, 99], "unknown entry point 99"),
        (vec![0, 0, 1], "unknown event kind 0"),
        (
            vec![8, 0, 1, 64],
            "stack_alloc event with stack order 64 (at most 63)",
        ),
        (
            vec![5, 0, 1, 16],
            "heap_object_alloc event runs past the end of the payload",
        ),
        (
            vec![6, 0x80],
            "heap_object_free event runs past the end of the payload",
        ),
    ];
    for (body, what) in cases {
        let mut t = start();
        let at = t.len() as u64;
        t.batch(1, 1, 1, 1000, &body);
        let e = error(t.bytes());
        assert!(e.what().contains(what), "{e} (expected {what})");
        assert!(
            e.what()
                .ends_with(&format!("in events batch starting at offset {at}")),
            "{e}"
        );
        assert_eq!(
            e.offset(),
            at + 5 + 4,
            "the event starts right after the header"
        );
    }
    // Long-form stack sizes are not orders: any value is fine.
    let mut t = start();
    let mut b = EventsBody::new(1000);
    b.long_event(1000, 3, &EventData::StackAlloc { size: u64::MAX });
    t.events(1, 1, &b)
        .generation_end(1, 2000, 5_000_100, 0)
        .trace_end(1);
    let (events, _) = read(t.bytes()).unwrap();
    assert_eq!(events[0].data, EventData::StackAlloc { size: u64::MAX });
    // Timestamps past 2^64.
    let mut t = start();
    let mut body = vec![6u8];
    varint(&mut body, u64::MAX);
    body.push(1);
    t.batch(1, 1, 1, 1000, &body);
    assert!(error(t.bytes())
        .what()
        .contains("timestamp overflows 64 bits"));
}

#[test]
fn bad_types() {
    let mut t = start();
    let mut body = Vec::new();
    for v in [1u64, 8, 8, 100] {
        varint(&mut body, v);
    }
    body.extend_from_slice(b"short");
    t.batch(3, 1, 0, 0, &body);
    assert!(error(t.bytes())
        .what()
        .contains("type name length 100 runs past the end of the payload (5 bytes left)"));

    let mut t = start();
    t.batch(3, 1, 0, 0, &[0, 1, 1, 0]);
    assert!(error(t.bytes()).what().contains("type ID 0"));

    let mut t = start();
    t.batch(3, 1, 0, 0, &[1, 1, 1]);
    assert!(error(t.bytes())
        .what()
        .contains("runs past the end of the payload"));
}

#[test]
fn trace_end_rules() {
    let mut t = start();
    let at = t.len() as u64;
    t.trace_end(1);
    let e = error(t.bytes());
    assert_eq!(e.offset(), at);
    assert!(e
        .what()
        .contains("trace-end batch while generation 1 has no generation-end batch"));

    let mut t = TraceBuilder::new();
    t.trace_end(1);
    let end = t.len() as u64;
    t.raw(&[0]);
    let e = error(t.bytes());
    assert_eq!(
        (e.offset(), e.what()),
        (end, "data after the trace-end batch".to_string())
    );

    let mut t = TraceBuilder::new();
    t.batch(5, 1, 0, 0, &[9]);
    assert!(error(t.bytes())
        .what()
        .contains("1 bytes of body, expected none"));
}

#[test]
fn generation_memory_is_capped() {
    let g = info(1);
    let mut t = start();
    let mut b = EventsBody::new(1000);
    for i in 0..100 {
        b.event(&g, 1000 + i, 0x10000 + 16 * i, &EventData::HeapObjectFree);
    }
    t.events(1, 1, &b);
    let at = t.len() as u64;
    t.events(1, 1, &b);
    let mut reader = TraceReader::new(t.bytes()).unwrap();
    reader.set_max_generation_bytes(500);
    let e = reader.next_event().unwrap_err();
    assert_eq!(e.offset(), at);
    assert!(e.what().contains("needs more than 500 bytes"), "{e}");
    // Every later call repeats the error.
    assert_eq!(reader.next_event().unwrap_err().to_string(), e.to_string());
}

/// Start offsets of the batches of a valid trace (with their trailers
/// in version 2).
fn batch_offsets(bytes: &[u8]) -> Vec<usize> {
    let trailer = if bytes[8] >= 2 { 4 } else { 0 };
    let mut offsets = Vec::new();
    let mut at = 16;
    while at < bytes.len() {
        offsets.push(at);
        let len = u32::from_le_bytes(bytes[at + 1..at + 5].try_into().unwrap()) as usize;
        at += 5 + len + trailer;
    }
    offsets
}

/// True when `sub` is `full` with some elements left out.
fn is_subsequence(sub: &[Event], full: &[Event]) -> bool {
    let mut rest = full.iter();
    sub.iter().all(|e| rest.any(|f| f == e))
}

#[test]
fn truncation_at_every_byte_yields_complete_batches_and_the_cut() {
    // Version 2: a batch whose trailer is cut off is cut too.
    truncation_at_every_byte(&sample_trace());
    truncation_at_every_byte(&sample_trace_v1());
}

fn truncation_at_every_byte(bytes: &[u8]) {
    let (all, cut) = read(bytes).unwrap();
    assert_eq!(cut, None);
    let batches = batch_offsets(bytes);
    let trace_end_at = *batches.last().unwrap();
    let mut previous = 0;
    for len in 0..bytes.len() {
        let prefix = &bytes[..len];
        if len < 16 {
            let e = TraceReader::new(prefix)
                .err()
                .expect("short header is an error");
            assert_eq!(e.offset(), 0);
            continue;
        }
        let (events, cut) = read(prefix).unwrap_or_else(|e| panic!("cut at {len}: {e}"));
        let expected_cut = if batches.contains(&len) || len == 16 {
            len
        } else {
            *batches.iter().rfind(|&&b| b < len).unwrap()
        };
        assert_eq!(cut, Some(expected_cut as u64), "cut at {len}");
        assert!(is_subsequence(&events, &all), "cut at {len}: {events:?}");
        assert!(
            events.len() >= previous,
            "more input never yields fewer events"
        );
        previous = events.len();
        if len >= trace_end_at {
            assert_eq!(events, all, "only the trace-end batch is missing");
        }
    }
}

/// Traces to damage: the sample and one with many small batches.
fn corpus() -> Vec<Vec<u8>> {
    let g = info(1);
    let mut t = start();
    for thread in 1..4u64 {
        let mut b = EventsBody::new(1000);
        for i in 0..20u64 {
            let addr = 0x10000 + 16 * (i + 32 * thread);
            let data = match i % 4 {
                0 => EventData::HeapObjectAlloc {
                    size: 16 * i,
                    type_id: i % 3,
                },
                1 => EventData::SpanAlloc {
                    npages: i,
                    kind_class: thread,
                },
                2 => EventData::StackAlloc { size: 4096 + i },
                _ => EventData::HeapObjectFree,
            };
            b.event(&g, 1000 + 7 * i + thread, addr, &data);
        }
        t.events(1, thread, &b);
    }
    // A pages batch: layout, thread, time base, a short and a large event.
    use alloctrace_format::pages::{sync_word, Layout, KIND_ALLOC, SYNC_THREAD, SYNC_TIME};
    let layout = Layout {
        page_shift: 12,
        lost_bits: 7,
    };
    let body = words(&[
        layout.word(),
        sync_word(SYNC_THREAD, 2),
        sync_word(SYNC_TIME, 8),
        layout.event_word(KIND_ALLOC, 0x7000_0000, 3, 5),
        layout.event_word(KIND_ALLOC, 0x7000_0000, 1 << 20, 6),
        1 << 20,
    ]);
    t.batch(6, 1, 2, 1000, &body);
    t.generation_end(1, 3000, 5_002_000, 0).trace_end(1);
    // Version 1, without checksums: damage reaches the process batch's
    // parser.
    let mut p = TraceBuilder::v1();
    let mut b = EventsBody::new(1000);
    b.event(&g, 1001, 0x10010, &EventData::HeapObjectFree);
    p.info(&g)
        .process(1, 0, &[b"/bin/app", b"--flag", b"value"])
        .events(1, 1, &b)
        .generation_end(1, 3000, 5_002_000, 0)
        .trace_end(1);
    vec![sample_trace(), t.finish(), p.finish()]
}

#[test]
fn random_damage_never_panics_and_errors_point_inside_the_file() {
    let mut rng = Rng::new(0x5eed_0001);
    let corpus = corpus();
    let (mut ok, mut malformed) = (0, 0);
    for iteration in 0..6000 {
        let mut bytes = corpus[iteration % corpus.len()].clone();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(bytes.len() as u64 + 1) as usize;
            match rng.below(6) {
                0 if at < bytes.len() => bytes[at] ^= 1 << rng.below(8),
                1 if at < bytes.len() => bytes[at] = rng.next_u64() as u8,
                2 => bytes.insert(at, rng.next_u64() as u8),
                3 if at < bytes.len() => {
                    bytes.remove(at);
                }
                4 => bytes.truncate(at),
                _ if at < bytes.len() => bytes[at] = [0, 0x7f, 0x80, 0xff][rng.below(4) as usize],
                _ => {}
            }
        }
        match read(&bytes) {
            Ok((_, cut)) => {
                ok += 1;
                assert!(cut.is_none_or(|c| c <= bytes.len() as u64));
            }
            Err(e) => {
                malformed += 1;
                assert!(
                    e.offset() <= bytes.len() as u64,
                    "iteration {iteration}: {e} (len {})",
                    bytes.len()
                );
            }
        }
    }
    // Both outcomes are exercised.
    assert!(
        ok > 100 && malformed > 100,
        "ok {ok}, malformed {malformed}"
    );
}
