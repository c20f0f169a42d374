//! The merge against a plain sort, and `next_events` against `next_event`,
//! on random traces: many batches per thread, threads interleaved in the
//! file, equal ticks across threads and batches, a thread's batches out of
//! time order, pages batches beside events batches.

use alloctrace_format::pages::TIME_LOST_BITS;
use alloctrace_reader::testing::{info, EventsBody, PagesBody, Rng, TraceBuilder};
use alloctrace_reader::{Event, EventData, ReadError, Record, TraceReader};

/// What identifies an event in these traces: its generation, ticks, thread
/// and address (every address is used once).
type Key = (u64, u64, u64, u64);

/// A random trace of `generations` generations and, per generation, its
/// events as "sort by ticks; ties by thread ID, then file order" wants
/// them.
fn random_trace(rng: &mut Rng, generations: u64) -> (Vec<u8>, Vec<Key>) {
    let mut t = TraceBuilder::new();
    let mut expected = Vec::new();
    let mut next_addr = 0x10000u64;
    for g in 1..=generations {
        let mut gi = info(g);
        gi.start_ticks = 1000 * g;
        gi.start_mono_ns = 5_000_000 + 1000 * g;
        t.info(&gi);
        // (ticks, thread, file order, addr)
        let mut generation = Vec::new();
        let mut file_order = 0u64;
        for _ in 0..rng.below(12) {
            let thread = 1 + rng.below(4);
            // Few distinct base times: ties across batches and threads.
            let base = gi.start_ticks + 128 * rng.below(4);
            let mut ticks = base;
            if rng.below(4) == 0 {
                // Page times count in units of 2^TIME_LOST_BITS ticks.
                let base = base >> TIME_LOST_BITS << TIME_LOST_BITS;
                ticks = base;
                let mut body = PagesBody::new(12, thread, base);
                for _ in 0..rng.below(20) {
                    ticks += (1 << TIME_LOST_BITS) * rng.below(3);
                    next_addr += 0x1000;
                    body.event(ticks, next_addr << 8, &EventData::PageAlloc { npages: 1 });
                    generation.push((ticks, thread, file_order, next_addr << 8));
                    file_order += 1;
                }
                t.pages(g, thread, &body);
            } else {
                let mut body = EventsBody::new(base);
                for _ in 0..rng.below(40) {
                    ticks += rng.below(3);
                    next_addr += 16;
                    let data = if rng.below(2) == 0 {
                        EventData::HeapObjectFree
                    } else {
                        EventData::HeapObjectAlloc {
                            size: 16,
                            type_id: 0,
                        }
                    };
                    body.event(&gi, ticks, next_addr, &data);
                    generation.push((ticks, thread, file_order, next_addr));
                    file_order += 1;
                }
                t.events(g, thread, &body);
            }
        }
        generation.sort_by_key(|&(ticks, thread, order, _)| (ticks, thread, order));
        expected.extend(
            generation
                .iter()
                .map(|&(ticks, thread, _, addr)| (g, ticks, thread, addr)),
        );
        t.generation_end(g, gi.start_ticks + 1000, gi.start_mono_ns + 1000, 0);
    }
    t.trace_end(generations);
    (t.finish(), expected)
}

fn key(e: &Event) -> Key {
    (e.generation, e.ticks, e.thread, e.addr)
}

/// Every event with `next_event`, and the error that ended the read.
fn one_by_one(bytes: &[u8]) -> (Vec<Event>, Option<ReadError>) {
    let mut reader = TraceReader::new(bytes).expect("header");
    let mut events = Vec::new();
    loop {
        match reader.next_event() {
            Ok(Some(e)) => events.push(e),
            Ok(None) => return (events, None),
            Err(err) => return (events, Some(err)),
        }
    }
}

/// Every event with `next_events` in calls of at most `max` (and
/// `next_record` between generations), and the error that ended the read.
fn in_bulk(bytes: &[u8], max: usize) -> (Vec<Event>, Option<ReadError>) {
    let mut reader = TraceReader::new(bytes).expect("header");
    let mut events = Vec::new();
    loop {
        loop {
            match reader.next_events(max, |e| events.push(e.clone())) {
                Ok(0) => break,
                Ok(n) => assert!(n <= max, "{n} events for at most {max}"),
                Err(err) => return (events, Some(err)),
            }
        }
        match reader.next_record() {
            Ok(Some(Record::GenerationStart { generation })) => {
                assert_eq!(reader.info().map(|i| i.generation), Some(generation));
            }
            Ok(Some(Record::Event(e))) => events.push(e),
            Ok(None) => return (events, None),
            Err(err) => return (events, Some(err)),
        }
    }
}

#[test]
fn merge_orders_as_a_sort_by_ticks_thread_and_file_order() {
    let mut rng = Rng::new(0x5eed_0001);
    for _ in 0..300 {
        let generations = 1 + rng.below(3);
        let (bytes, expected) = random_trace(&mut rng, generations);
        let (events, err) = one_by_one(&bytes);
        assert!(err.is_none(), "{err:?}");
        let got: Vec<Key> = events.iter().map(key).collect();
        assert_eq!(got, expected);
    }
}

#[test]
fn next_events_hands_out_what_next_event_does() {
    let mut rng = Rng::new(0x5eed_0002);
    for round in 0..300 {
        let generations = 1 + rng.below(3);
        let (bytes, _) = random_trace(&mut rng, generations);
        let want = one_by_one(&bytes);
        for max in [1, 2, 7, 1 << 16] {
            let got = in_bulk(&bytes, max);
            assert_eq!(got.0, want.0, "round {round}, max {max}");
            assert!(got.1.is_none(), "{:?}", got.1);
        }
        // Damaged: the same events before the same error.
        let mut damaged = bytes.clone();
        for _ in 0..1 + rng.below(3) {
            let at = 16 + rng.below(damaged.len() as u64 - 16) as usize;
            damaged[at] ^= 1 << rng.below(8);
        }
        let Ok(_) = TraceReader::new(damaged.as_slice()) else {
            continue;
        };
        let want = one_by_one(&damaged);
        for max in [1, 3, 1 << 16] {
            let got = in_bulk(&damaged, max);
            assert_eq!(got.0, want.0, "damaged round {round}, max {max}");
            assert_eq!(
                got.1.as_ref().map(|e| (e.offset(), e.to_string())),
                want.1.as_ref().map(|e| (e.offset(), e.to_string())),
                "damaged round {round}, max {max}"
            );
        }
    }
}

#[test]
fn next_events_after_an_error_returns_it_again() {
    let mut t = TraceBuilder::new();
    t.info(&info(1));
    let mut b = EventsBody::new(1000);
    b.event(&info(1), 1001, 0x10010, &EventData::HeapObjectFree)
        .raw_event(12, 1002, &[1]);
    t.events(1, 1, &b);
    let bytes = t.finish();
    let mut reader = TraceReader::new(bytes.as_slice()).unwrap();
    // The events before the bad one come out first (in time order).
    let mut events = 0;
    let first = loop {
        match reader.next_events(10, |_| events += 1) {
            Ok(0) => {}
            Ok(_) => continue,
            Err(err) => break err,
        }
        match reader.next_record() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("no error"),
            Err(err) => break err,
        }
    };
    assert_eq!(events, 1);
    assert!(first.what().contains("unknown event kind 12"), "{first}");
    let mut calls = 0;
    let again = reader.next_events(10, |_| calls += 1).unwrap_err();
    assert_eq!(
        (again.offset(), again.to_string()),
        (first.offset(), first.to_string())
    );
    assert_eq!(calls, 0);
}
