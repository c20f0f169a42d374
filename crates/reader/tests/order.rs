//! The merge against a plain sort, and `next_step` against `next_record`,
//! on random traces: many batches per thread, threads interleaved in the
//! file, equal ticks across threads and batches, a thread's batches out of
//! time order, pages batches beside events batches.

use alloctrace_format::pages::TIME_LOST_BITS;
use alloctrace_reader::testing::{info, EventsBody, PagesBody, Rng, TraceBuilder};
use alloctrace_reader::{Event, EventData, ReadError, Record, Step, TraceReader};

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

/// Every record with `next_record`, and the error that ended the read.
fn one_by_one(bytes: &[u8]) -> (Vec<Record>, Option<ReadError>) {
    let mut reader = TraceReader::new(bytes).expect("header");
    let mut records = Vec::new();
    loop {
        match reader.next_record() {
            Ok(Some(record)) => records.push(record),
            Ok(None) => return (records, None),
            Err(err) => return (records, Some(err)),
        }
    }
}

/// The events of `records`.
fn events(records: &[Record]) -> Vec<&Event> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Event(e) => Some(e),
            Record::GenerationStart { .. } => None,
        })
        .collect()
}

/// Every record with `next_step` in runs of at most `max` events (with
/// `mixed`, every other call is a `next_record`), and the error that ended
/// the read.
fn in_bulk(bytes: &[u8], max: usize, mixed: bool) -> (Vec<Record>, Option<ReadError>) {
    let mut reader = TraceReader::new(bytes).expect("header");
    let mut records = Vec::new();
    for call in 0u64.. {
        if mixed && call % 2 == 1 {
            match reader.next_record() {
                Ok(Some(record)) => records.push(record),
                Ok(None) => return (records, None),
                Err(err) => return (records, Some(err)),
            }
            continue;
        }
        let mut run = Vec::new();
        let step = reader.next_step(max, |e| run.push(e.clone()));
        match step {
            Ok(Step::Events(n)) => {
                assert!(
                    (1..=max.max(1)).contains(&n),
                    "{n} events for at most {max}"
                );
                assert_eq!(run.len(), n);
                let generation = reader.info().map(|i| i.generation);
                assert!(run.iter().all(|e| Some(e.generation) == generation));
                records.extend(run.into_iter().map(Record::Event));
            }
            Ok(Step::GenerationStart { generation }) => {
                assert!(run.is_empty());
                assert_eq!(reader.info().map(|i| i.generation), Some(generation));
                records.push(Record::GenerationStart { generation });
            }
            Ok(Step::End) => {
                assert!(run.is_empty());
                // And again.
                assert_eq!(reader.next_step(max, |_| panic!()).unwrap(), Step::End);
                assert_eq!(reader.next_record().unwrap(), None);
                return (records, None);
            }
            Err(err) => return (records, Some(err)),
        }
    }
    unreachable!()
}

#[test]
fn merge_orders_as_a_sort_by_ticks_thread_and_file_order() {
    let mut rng = Rng::new(0x5eed_0001);
    for _ in 0..300 {
        let generations = 1 + rng.below(3);
        let (bytes, expected) = random_trace(&mut rng, generations);
        let (records, err) = one_by_one(&bytes);
        assert!(err.is_none(), "{err:?}");
        let got: Vec<Key> = events(&records).into_iter().map(key).collect();
        assert_eq!(got, expected);
    }
}

#[test]
fn next_step_hands_out_what_next_record_does() {
    let mut rng = Rng::new(0x5eed_0002);
    for round in 0..300 {
        let generations = 1 + rng.below(3);
        let (bytes, _) = random_trace(&mut rng, generations);
        let want = one_by_one(&bytes);
        let starts = want
            .0
            .iter()
            .filter(|r| matches!(r, Record::GenerationStart { .. }))
            .count();
        assert_eq!(starts as u64, generations);
        for max in [0, 1, 2, 7, 1 << 16] {
            for mixed in [false, true] {
                let got = in_bulk(&bytes, max, mixed);
                assert_eq!(got.0, want.0, "round {round}, max {max}, mixed {mixed}");
                assert!(got.1.is_none(), "{:?}", got.1);
            }
        }
        // Damaged: the same records before the same error.
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
            for mixed in [false, true] {
                let got = in_bulk(&damaged, max, mixed);
                let what = format!("damaged round {round}, max {max}, mixed {mixed}");
                assert_eq!(got.0, want.0, "{what}");
                assert_eq!(
                    got.1.as_ref().map(|e| (e.offset(), e.to_string())),
                    want.1.as_ref().map(|e| (e.offset(), e.to_string())),
                    "{what}"
                );
            }
        }
    }
}

#[test]
fn next_step_after_an_error_returns_it_again() {
    let mut t = TraceBuilder::new();
    t.info(&info(1));
    let mut b = EventsBody::new(1000);
    b.event(&info(1), 1001, 0x10010, &EventData::HeapObjectFree)
        .raw_event(13, 1002, &[1]);
    t.events(1, 1, &b);
    let bytes = t.finish();
    let mut reader = TraceReader::new(bytes.as_slice()).unwrap();
    // The events before the bad one come out first (in time order).
    let mut events = 0;
    let first = loop {
        match reader.next_step(10, |_| events += 1) {
            Ok(Step::End) => panic!("no error"),
            Ok(_) => {}
            Err(err) => break err,
        }
    };
    assert_eq!(events, 1);
    assert!(first.what().contains("unknown event kind 13"), "{first}");
    let mut calls = 0;
    let again = reader.next_step(10, |_| calls += 1).unwrap_err();
    assert_eq!(
        (again.offset(), again.to_string()),
        (first.offset(), first.to_string())
    );
    assert_eq!(calls, 0);
}
