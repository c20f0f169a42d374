//! Page-tracer events (pages batches, FORMAT.md section 7): decoded exactly
//! in every form, merged in time order with the other events, and the word
//! layout round-trips for every page shift the writer uses.

use alloctrace_format::pages::{
    self, decode, sync_word, Layout, Word, KIND_ALLOC, KIND_FREE, KIND_SCAV, SYNC_LONG_EVENT,
    SYNC_THREAD, SYNC_TIME,
};
use alloctrace_reader::testing::{info, EventsBody, PagesBody, TraceBuilder};
use alloctrace_reader::{Event, EventData, TraceReader, PAGE_EVENT_NAMES};
use proptest::prelude::*;

fn read_all(bytes: &[u8]) -> Vec<Event> {
    let mut reader = TraceReader::new(bytes).expect("header");
    let mut events = Vec::new();
    while let Some(event) = reader.next_event().unwrap_or_else(|e| panic!("{e}")) {
        events.push(event);
    }
    assert_eq!(reader.truncated(), None);
    events
}

fn words(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn page_data(kind: u64, npages: u64) -> EventData {
    match kind {
        KIND_ALLOC => EventData::PageAlloc { npages },
        KIND_FREE => EventData::PageFree { npages },
        _ => EventData::PageScav { npages },
    }
}

#[test]
fn names() {
    assert_eq!(EventData::PageAlloc { npages: 1 }.name(), "page_alloc");
    assert_eq!(EventData::PageFree { npages: 1 }.name(), "page_free");
    assert_eq!(EventData::PageScav { npages: 1 }.name(), "page_scav");
    assert_eq!(PAGE_EVENT_NAMES, ["page_alloc", "page_free", "page_scav"]);
}

/// Hand-written words: short, large and long events, time-base words, and
/// the times they give, all exact.
#[test]
fn every_form_decodes_exactly() {
    let l = Layout {
        page_shift: 13,
        lost_bits: 7,
    };
    let body = words(&[
        l.word(),
        sync_word(SYNC_THREAD, 3),
        sync_word(SYNC_TIME, 10), // 1280 ticks
        l.event_word(KIND_ALLOC, 0x7f00_1234_e000, 1023, 0),
        l.event_word(KIND_FREE, 0x2000, 1024, 2),
        1024,
        sync_word(SYNC_LONG_EVENT, KIND_SCAV | 3 << 2),
        0x1001,
        0,
        sync_word(SYNC_LONG_EVENT, KIND_ALLOC | 4 << 2),
        u64::MAX - 4095,
        u64::MAX,
        sync_word(SYNC_TIME, 10 + 70_000),
        l.event_word(KIND_SCAV, 0, 0, 0xffff),
        sync_word(SYNC_LONG_EVENT, KIND_FREE | 0xffff << 2),
        1 << 48,
        1 << 40,
    ]);
    let g = info(1);
    let mut t = TraceBuilder::new();
    t.info(&g)
        .batch(6, 1, 3, 1280, &body)
        .generation_end(1, 2000, 5_001_000, 0)
        .trace_end(1);
    let got: Vec<(u64, u64, bool, u64, EventData)> = read_all(t.bytes())
        .into_iter()
        .map(|e| {
            assert_eq!((e.generation, e.entry), (1, None));
            (e.ticks, e.thread, e.long_form, e.addr, e.data)
        })
        .collect();
    let late = (10 + 70_000 + 0xffff) << 7;
    assert_eq!(
        got,
        [
            (
                1280,
                3,
                false,
                0x7f00_1234_e000,
                EventData::PageAlloc { npages: 1023 }
            ),
            (
                12 << 7,
                3,
                false,
                0x2000,
                EventData::PageFree { npages: 1024 }
            ),
            (13 << 7, 3, true, 0x1001, EventData::PageScav { npages: 0 }),
            (
                14 << 7,
                3,
                true,
                u64::MAX - 4095,
                EventData::PageAlloc { npages: u64::MAX }
            ),
            (late, 3, false, 0, EventData::PageScav { npages: 0 }),
            (
                late,
                3,
                true,
                1 << 48,
                EventData::PageFree { npages: 1 << 40 }
            ),
        ]
    );
    // 1 ns per tick from the clock pair, counted from tick 1000.
    let times: Vec<u64> = read_all(t.bytes()).iter().map(|e| e.time_ns).collect();
    assert_eq!(times, [280, 536, 664, 792, late - 1000, late - 1000]);
}

/// Page and object events of several threads come out as one stream by
/// ticks; ties go by thread, then by file order, as for object events.
#[test]
fn page_and_object_events_interleave_in_time_order() {
    let g = info(1);
    let free = EventData::HeapObjectFree;
    let mut t = TraceBuilder::new();
    t.info(&g);
    let mut objects1 = EventsBody::new(1100);
    objects1
        .event(&g, 1100, 0x10010, &free)
        .event(&g, 1280, 0x10020, &free)
        .event(&g, 1500, 0x10030, &free);
    t.events(1, 1, &objects1);
    // Page times are multiples of 128 ticks here, so exact.
    let mut pages1 = PagesBody::new(12, 1, 1152);
    pages1
        .event(1152, 0x100000, &EventData::PageAlloc { npages: 1 })
        .event(1280, 0x200000, &EventData::PageAlloc { npages: 2 })
        .event(1536, 0x100000, &EventData::PageFree { npages: 1 });
    t.pages(1, 1, &pages1);
    let mut pages2 = PagesBody::new(12, 2, 1024);
    pages2
        .event(1024, 0x300000, &EventData::PageAlloc { npages: 3 })
        .event(1280, 0x300000, &EventData::PageScav { npages: 3 });
    t.pages(1, 2, &pages2);
    let mut objects2 = EventsBody::new(1280);
    objects2
        .event(&g, 1280, 0x10040, &free)
        .event(&g, 1600, 0x10050, &free);
    t.events(1, 2, &objects2);
    // A second pages batch of thread 1 in the next generation.
    let mut g2 = info(2);
    g2.start_ticks = 3000;
    t.info(&g2);
    let mut pages1b = PagesBody::new(12, 1, 3200);
    pages1b.event(3200, 0x200000, &EventData::PageFree { npages: 2 });
    t.pages(2, 1, &pages1b);
    t.generation_end(1, 3000, 5_002_000, 0)
        .generation_end(2, 4000, 5_003_000, 0)
        .trace_end(2);

    let got: Vec<(u64, u64, u64, &str)> = read_all(t.bytes())
        .iter()
        .map(|e| (e.ticks, e.thread, e.addr, e.data.name()))
        .collect();
    assert_eq!(
        got,
        [
            (1024, 2, 0x300000, "page_alloc"),
            (1100, 1, 0x10010, "heap_object_free"),
            (1152, 1, 0x100000, "page_alloc"),
            // Thread 1's events batch comes before its pages batch in the file.
            (1280, 1, 0x10020, "heap_object_free"),
            (1280, 1, 0x200000, "page_alloc"),
            (1280, 2, 0x300000, "page_scav"),
            (1280, 2, 0x10040, "heap_object_free"),
            (1500, 1, 0x10030, "heap_object_free"),
            (1536, 1, 0x100000, "page_free"),
            (1600, 2, 0x10050, "heap_object_free"),
            (3200, 1, 0x200000, "page_free"),
        ]
    );
}

fn page_kind() -> impl Strategy<Value = u64> {
    prop_oneof![Just(KIND_ALLOC), Just(KIND_FREE), Just(KIND_SCAV)]
}

/// Mostly small, often at or above 1024 (large on every shift up to 13),
/// sometimes 0, sometimes huge.
fn npages() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..64,
        3 => 1024u64..1 << 20,
        1 => Just(0u64),
        1 => 0u64..=1 << 40,
        1 => any::<u64>(),
    ]
}

/// Mostly page-aligned below 2^48; sometimes off the grid, at or above
/// 2^48, or near 2^64.
fn base(shift: u32) -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => (0u64..1 << 48).prop_map(move |b| b & !((1u64 << shift) - 1)),
        1 => 0u64..1 << 48,
        1 => (1u64 << 48)..u64::MAX,
        1 => (0u64..1 << 20).prop_map(|d| u64::MAX - d),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The word layout itself: every short event word decodes to what was
    /// packed, for the page shifts of real page sizes.
    #[test]
    fn event_words_round_trip(
        shift in 12u32..=16,
        kind in page_kind(),
        raw_base in 0u64..1 << 48,
        npages in npages(),
        delta in 0u64..1 << 16,
    ) {
        let l = Layout { page_shift: shift, lost_bits: pages::TIME_LOST_BITS };
        let base = raw_base & !((1u64 << shift) - 1);
        prop_assert!(l.fits(base));
        let large = l.is_large(npages);
        prop_assert_eq!(large, npages >= 1 << (shift - 3));
        let w = l.event_word(kind, base, npages, delta);
        let want = Word::Event { kind, base, npages: if large { 0 } else { npages }, large, delta };
        prop_assert_eq!(decode(l, w), want);
        // A long event's sync word carries the kind and any 58-bit delta.
        let long_delta = delta << 40 | raw_base >> 6;
        let s = sync_word(SYNC_LONG_EVENT, kind | long_delta << 2);
        prop_assert_eq!(decode(l, s), Word::Sync { subtype: SYNC_LONG_EVENT, payload: kind | long_delta << 2 });
        // The layout word restores the layout.
        match decode(l, l.word()) {
            Word::Sync { subtype: pages::SYNC_LAYOUT, payload } => {
                prop_assert_eq!(Layout::from_payload(payload), Some(l));
            }
            other => prop_assert!(false, "layout word decodes as {:?}", other),
        }
    }

    /// Through the whole reader, with known true ticks: every event comes
    /// back with its exact base, npages, kind and thread, in order, and its
    /// ticks at most one unit (128 ticks) below the true ones.
    #[test]
    fn page_events_read_back_exactly(
        shift in 12u32..=16,
        start in 0u64..1 << 50,
        events in prop::collection::vec(
            (0u64..2, page_kind(), npages(), prop_oneof![
                3 => 0u64..200,
                2 => 0u64..1 << 23, // past 2^16 units
                1 => 0u64..1 << 40,
            ]),
            1..200,
        ),
        bases in prop::collection::vec(base(12), 200),
    ) {
        let g = info(1);
        let mut bodies = [PagesBody::new(shift, 1, start), PagesBody::new(shift, 2, start)];
        let mut now = [start, start];
        let mut want: Vec<Vec<(u64, u64, EventData)>> = vec![Vec::new(), Vec::new()];
        for (i, &(thread, kind, npages, step)) in events.iter().enumerate() {
            let t = thread as usize;
            now[t] += step;
            // base(12) on any shift: aligned to 4 KiB only, so larger shifts
            // see off-grid bases too.
            let base = bases[i];
            let data = page_data(kind, npages);
            bodies[t].event(now[t], base, &data);
            want[t].push((now[t], base, data));
        }
        let mut trace = TraceBuilder::new();
        trace.info(&g).pages(1, 1, &bodies[0]).pages(1, 2, &bodies[1]);
        trace.generation_end(1, start + (1 << 41), 5_001_000, 0).trace_end(1);
        let got = read_all(trace.bytes());
        prop_assert!(got.windows(2).all(|w| w[0].ticks <= w[1].ticks), "not in time order");
        for (thread, want) in (1u64..).zip(&want) {
            let mine: Vec<&Event> = got.iter().filter(|e| e.thread == thread).collect();
            prop_assert_eq!(mine.len(), want.len());
            for (e, (ticks, base, data)) in mine.iter().zip(want) {
                prop_assert_eq!(&e.data, data);
                prop_assert_eq!(e.addr, *base);
                let fits = Layout { page_shift: shift, lost_bits: 7 }.fits(*base);
                prop_assert_eq!(e.long_form, !fits);
                prop_assert!(e.ticks <= *ticks && *ticks < e.ticks + 128, "ticks {} for true {}", e.ticks, ticks);
            }
        }
    }
}
