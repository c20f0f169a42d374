//! Valid traces read back exactly: every event kind, long form, time
//! conversion, ordering across threads and across interleaved generations.

use alloctrace_reader::testing::{info, sample_trace, EventsBody, TraceBuilder};
use alloctrace_reader::{Event, EventData, Record, TraceReader, TypeInfo};

fn read_all(bytes: &[u8]) -> (Vec<Event>, TraceReader<&[u8]>) {
    let mut reader = TraceReader::new(bytes).expect("header");
    let mut events = Vec::new();
    while let Some(event) = reader.next_event().expect("valid trace") {
        events.push(event);
    }
    (events, reader)
}

fn ev(
    time_ns: u64,
    ticks: u64,
    generation: u64,
    thread: u64,
    long_form: bool,
    addr: u64,
    data: EventData,
) -> Event {
    Event {
        time_ns,
        ticks,
        generation,
        thread,
        long_form,
        addr,
        data,
        entry: None,
        stack_id: 0,
    }
}

#[test]
fn every_event_kind_round_trips_in_short_and_long_form() {
    let g = info(1);
    let cases: Vec<(u64, EventData, bool)> = vec![
        (
            0x20000,
            EventData::SpanExists {
                npages: 2,
                kind_class: 7,
            },
            false,
        ),
        (
            0x21000,
            EventData::SpanAlloc {
                npages: 1,
                kind_class: 0,
            },
            false,
        ),
        (0x21000, EventData::SpanFree, false),
        (
            0x10040,
            EventData::HeapObjectExists {
                size: 48,
                type_id: 1,
            },
            false,
        ),
        (
            0x10050,
            EventData::HeapObjectAlloc {
                size: 16,
                type_id: 0,
            },
            false,
        ),
        (0x10050, EventData::HeapObjectFree, false),
        (0x40000, EventData::StackExists { size: 8192 }, false),
        (0x41000, EventData::StackAlloc { size: 1 << 63 }, false),
        (0x41000, EventData::StackFree, false),
        // Long form: below min_heap_addr, off alignment, odd stack size.
        (
            0x800,
            EventData::SpanExists {
                npages: 3,
                kind_class: 9,
            },
            true,
        ),
        (
            0x20001,
            EventData::SpanAlloc {
                npages: 4,
                kind_class: 1,
            },
            true,
        ),
        (0x20001, EventData::SpanFree, true),
        (
            0x10041,
            EventData::HeapObjectExists {
                size: 5,
                type_id: 2,
            },
            true,
        ),
        (
            0x10,
            EventData::HeapObjectAlloc {
                size: u64::MAX,
                type_id: u64::MAX,
            },
            true,
        ),
        (0x10, EventData::HeapObjectFree, true),
        (0x40000, EventData::StackExists { size: 3000 }, true),
        (0x40008, EventData::StackAlloc { size: 8192 }, true),
        (0x40008, EventData::StackFree, true),
        (u64::MAX, EventData::StackFree, true),
    ];
    let mut body = EventsBody::new(1000);
    let mut expected = Vec::new();
    for (i, (addr, data, long)) in cases.iter().enumerate() {
        let ticks = 1000 + 10 * i as u64;
        body.event(&g, ticks, *addr, data);
        // 2 ns per tick from the generation-end clock pair below.
        expected.push(ev(
            2 * (ticks - 1000),
            ticks,
            1,
            7,
            *long,
            *addr,
            data.clone(),
        ));
    }
    // An aligned address written in long form anyway still reads back.
    body.long_event(
        2000,
        0x10060,
        &EventData::HeapObjectAlloc {
            size: 8,
            type_id: 0,
        },
    );
    expected.push(ev(
        2000,
        2000,
        1,
        7,
        true,
        0x10060,
        EventData::HeapObjectAlloc {
            size: 8,
            type_id: 0,
        },
    ));

    let mut t = TraceBuilder::new();
    t.info(&g)
        .events(1, 7, &body)
        .generation_end(1, 1000 + 1_000_000, 5_000_000 + 2_000_000, 0)
        .trace_end(1);
    let (events, reader) = read_all(t.bytes());
    assert_eq!(events, expected);
    assert_eq!(reader.truncated(), None);
    assert_eq!(reader.generations(), 1);
    assert_eq!(reader.bytes_read(), t.len() as u64);
    let names: Vec<&str> = events.iter().take(9).map(|e| e.data.name()).collect();
    assert_eq!(
        names,
        [
            "span_exists",
            "span_alloc",
            "span_free",
            "heap_object_exists",
            "heap_object_alloc",
            "heap_object_free",
            "stack_exists",
            "stack_alloc",
            "stack_free"
        ]
    );
}

#[test]
fn events_of_all_threads_come_out_in_time_order() {
    let g = info(1);
    let free = EventData::HeapObjectFree;
    let mut t = TraceBuilder::new();
    t.info(&g);
    // Thread 3's batch comes first in the file but ties go to thread 1.
    let mut b3 = EventsBody::new(1000);
    b3.event(&g, 1010, 0x10010, &free)
        .event(&g, 1030, 0x10030, &free)
        .event(&g, 1030, 0x10031 & !15, &free);
    t.events(1, 3, &b3);
    let mut b1 = EventsBody::new(1000);
    b1.event(&g, 1005, 0x10100, &free)
        .event(&g, 1030, 0x10130, &free)
        .event(&g, 1040, 0x10140, &free);
    t.events(1, 1, &b1);
    // A second batch of thread 1 with a tick equal to its first batch's
    // last: file order decides.
    let mut b1b = EventsBody::new(1040);
    b1b.event(&g, 1040, 0x10150, &free)
        .event(&g, 1100, 0x10160, &free);
    t.events(1, 1, &b1b);
    let mut b2 = EventsBody::new(1000);
    b2.event(&g, 1000, 0x10200, &free)
        .event(&g, 1030, 0x10230, &free);
    t.events(1, 2, &b2);
    t.generation_end(1, 2000, 6_000_000, 0).trace_end(1);

    let (events, _) = read_all(t.bytes());
    let got: Vec<(u64, u64, u64)> = events.iter().map(|e| (e.ticks, e.thread, e.addr)).collect();
    assert_eq!(
        got,
        [
            (1000, 2, 0x10200),
            (1005, 1, 0x10100),
            (1010, 3, 0x10010),
            (1030, 1, 0x10130),
            (1030, 2, 0x10230),
            (1030, 3, 0x10030),
            (1030, 3, 0x10030),
            (1040, 1, 0x10140),
            (1040, 1, 0x10150),
            (1100, 1, 0x10160),
        ]
    );
}

#[test]
fn interleaved_generations_come_out_whole_and_in_order() {
    let bytes = sample_trace();
    let (events, reader) = read_all(&bytes);
    let gens: Vec<u64> = events.iter().map(|e| e.generation).collect();
    assert_eq!(gens, [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2]);
    assert!(events.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
    assert_eq!(reader.generations(), 2);
    assert_eq!(reader.lost_events(), 3);
    assert_eq!(reader.truncated(), None);
    assert_eq!(reader.info().map(|i| i.generation), Some(2));
    assert_eq!(reader.generation_end().map(|e| e.lost_events), Some(3));
    assert_eq!(reader.time_origin_ns(), Some(5_000_000));
    // Generation 2 starts 4000 ns after generation 1.
    assert_eq!(events[10].time_ns, 4100);
    assert_eq!(events[10].addr, 0x10080);
}

#[test]
fn records_mark_each_generation_and_types_follow_it() {
    let mut t = TraceBuilder::new();
    let g1 = info(1);
    let mut g2 = info(2);
    g2.start_ticks = 3000;
    t.info(&g1);
    t.info(&g2);
    let mut b = EventsBody::new(1000);
    b.event(
        &g1,
        1001,
        0x10010,
        &EventData::HeapObjectAlloc {
            size: 16,
            type_id: 5,
        },
    );
    t.events(1, 1, &b);
    let a = TypeInfo {
        id: 5,
        size: 16,
        ptr_bytes: 8,
        name: "a".into(),
    };
    let bt = TypeInfo {
        id: 6,
        size: 32,
        ptr_bytes: 0,
        name: "b \u{fffd}".into(),
    };
    t.types(1, std::slice::from_ref(&a))
        .generation_end(1, 3000, 5_002_000, 1);
    // Generation 2 has no events; a name with invalid UTF-8.
    let mut body = Vec::new();
    for v in [6u64, 32, 0, 3] {
        alloctrace_reader::testing::varint(&mut body, v);
    }
    body.extend_from_slice(b"b \xff");
    t.batch(3, 2, 0, 0, &body)
        .types(2, std::slice::from_ref(&a))
        .generation_end(2, 4000, 5_003_000, 2);
    t.trace_end(2);

    let bytes = t.finish();
    let mut reader = TraceReader::new(bytes.as_slice()).unwrap();
    assert!(reader.types().is_empty());
    assert_eq!(
        reader.next_record().unwrap(),
        Some(Record::GenerationStart { generation: 1 })
    );
    assert_eq!(
        reader.types().values().cloned().collect::<Vec<_>>(),
        std::slice::from_ref(&a)
    );
    assert_eq!(reader.info(), Some(&g1));
    let Some(Record::Event(e)) = reader.next_record().unwrap() else {
        panic!("event expected")
    };
    assert_eq!(
        e.data,
        EventData::HeapObjectAlloc {
            size: 16,
            type_id: 5
        }
    );
    assert_eq!(
        reader.next_record().unwrap(),
        Some(Record::GenerationStart { generation: 2 })
    );
    assert_eq!(
        reader.types().values().cloned().collect::<Vec<_>>(),
        [a, bt]
    );
    assert_eq!(reader.info(), Some(&g2));
    assert_eq!(reader.next_record().unwrap(), None);
    assert_eq!(reader.next_record().unwrap(), None, "stays at the end");
    assert_eq!((reader.generations(), reader.lost_events()), (2, 3));
}

#[test]
fn times_use_the_rate_without_a_clock_pair_and_clamp_before_the_origin() {
    let mut g = info(1);
    g.ticks_per_sec = 3_000_000_000; // 3 ticks per ns
    let mut b = EventsBody::new(0);
    b.event(&g, 10, 0x10000, &EventData::HeapObjectFree) // before start_ticks 1000
        .event(
            &g,
            1000 + 3_000_000_000,
            0x10000,
            &EventData::HeapObjectFree,
        );
    let mut t = TraceBuilder::new();
    // end_ticks == start_ticks: the pair is useless, so the rate is used.
    t.info(&g)
        .events(1, 1, &b)
        .generation_end(1, 1000, 5_000_000, 0)
        .trace_end(1);
    let (events, _) = read_all(t.bytes());
    assert_eq!(events[0].time_ns, 0);
    assert_eq!(events[1].time_ns, 1_000_000_000);
}

#[test]
fn an_empty_trace_and_a_trace_without_end() {
    let mut t = TraceBuilder::new();
    t.trace_end(1);
    let (events, reader) = read_all(t.bytes());
    assert!(events.is_empty());
    assert_eq!((reader.truncated(), reader.generations()), (None, 0));

    let header_only = TraceBuilder::new().finish();
    let (events, reader) = read_all(&header_only);
    assert!(events.is_empty());
    assert_eq!(reader.truncated(), Some(16));
}

#[test]
fn a_generation_cut_off_still_yields_its_events() {
    let g = info(1);
    let mut b = EventsBody::new(1000);
    b.event(
        &g,
        1500,
        0x10010,
        &EventData::HeapObjectAlloc {
            size: 16,
            type_id: 0,
        },
    );
    let mut t = TraceBuilder::new();
    t.info(&g).events(1, 1, &b);
    let end = t.len() as u64;
    t.raw(&[1, 200, 0, 0, 0, 1, 1]); // an events batch cut short
    let (events, reader) = read_all(t.bytes());
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].time_ns, 500, "1 GHz from ticks_per_sec");
    assert_eq!(reader.truncated(), Some(end));
    assert_eq!(reader.generations(), 1);
    assert_eq!(reader.generation_end(), None);
}

#[test]
fn reads_from_an_unbuffered_reader_that_returns_one_byte_at_a_time() {
    struct OneByte<'a>(&'a [u8]);
    impl std::io::Read for OneByte<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            match (self.0.split_first(), buf.first_mut()) {
                (Some((b, rest)), Some(out)) => {
                    *out = *b;
                    self.0 = rest;
                    Ok(1)
                }
                _ => Ok(0),
            }
        }
    }
    let bytes = sample_trace();
    let (expected, _) = read_all(&bytes);
    let mut reader = TraceReader::new(OneByte(&bytes)).unwrap();
    let mut got = Vec::new();
    while let Some(e) = reader.next_event().unwrap() {
        got.push(e);
    }
    assert_eq!(got, expected);
    assert_eq!(reader.truncated(), None);
}
