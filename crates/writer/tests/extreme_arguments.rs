//! Event calls cannot panic (session.rs invariant 6) whatever values the
//! caller passes: addresses, sizes, npages and type IDs at 0 and at their
//! maximum, under configurations at the edges of what validate accepts
//! (the largest alignments and page size, the highest min_heap_addr), and
//! a type name far over the length limit. Every event comes back exactly.
//! Run it in a debug build too (`cargo test -p alloctrace-writer --test
//! extreme_arguments`), where arithmetic overflow would panic.

use alloctrace_reader::{EventData, TraceReader};
use alloctrace_writer::events;

const VALUES: [usize; 6] = [0, 1, 4095, 4096, usize::MAX / 2 + 1, usize::MAX];

fn run(config: alloctrace_writer::Config, tag: &str) {
    let dir = std::env::temp_dir().join(format!("alloctrace-extreme-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.trace");
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    alloctrace_writer::start(
        &config,
        alloctrace_writer::Output::create(&c).unwrap(),
        None,
    )
    .unwrap();
    let long_name = vec![b'x'; 1 << 20];
    let ty = events::type_register(&long_name, u64::MAX, u64::MAX);
    let mut expected = Vec::new();
    for &a in &VALUES {
        for &v in &VALUES {
            let v64 = v as u64;
            events::heap_object_alloc(a, v64, ty);
            expected.push((
                a as u64,
                EventData::HeapObjectAlloc {
                    size: v64,
                    type_id: ty,
                },
            ));
            events::heap_object_exists(a, v64, u64::MAX);
            expected.push((
                a as u64,
                EventData::HeapObjectExists {
                    size: v64,
                    type_id: u64::MAX,
                },
            ));
            events::heap_object_free(a);
            expected.push((a as u64, EventData::HeapObjectFree));
            events::span_alloc(a, v, u64::MAX);
            expected.push((
                a as u64,
                EventData::SpanAlloc {
                    npages: v64,
                    kind_class: u64::MAX,
                },
            ));
            events::span_exists(a, v, 0);
            expected.push((
                a as u64,
                EventData::SpanExists {
                    npages: v64,
                    kind_class: 0,
                },
            ));
            events::span_free(a);
            expected.push((a as u64, EventData::SpanFree));
            events::stack_alloc(a, v);
            expected.push((a as u64, EventData::StackAlloc { size: v64 }));
            events::stack_exists(a, v);
            expected.push((a as u64, EventData::StackExists { size: v64 }));
            events::stack_free(a);
            expected.push((a as u64, EventData::StackFree));
            events::page_alloc(a, v);
            events::page_free(a, v);
            events::page_scav(a, v);
        }
    }
    alloctrace_writer::stop().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let mut reader = TraceReader::new(&bytes[..]).unwrap();
    let mut got = Vec::new();
    let mut pages = 0;
    while let Some(e) = reader.next_event().unwrap() {
        match e.data {
            EventData::PageAlloc { .. }
            | EventData::PageFree { .. }
            | EventData::PageScav { .. } => pages += 1,
            data => got.push((e.addr, data)),
        }
    }
    assert_eq!(reader.lost_events(), 0);
    assert_eq!(got, expected, "{tag}");
    assert_eq!(pages, 3 * VALUES.len() * VALUES.len(), "{tag}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn extreme_arguments_and_configs_are_recorded_exactly() {
    run(
        alloctrace_writer::Config {
            buffer_size: 4096,
            ..Default::default()
        },
        "default",
    );
    run(
        alloctrace_writer::Config {
            buffer_size: 4096,
            min_heap_addr: u64::MAX,
            min_heap_align: 1 << 63,
            min_stack_align: 1 << 63,
            page_size: 1 << 40,
            ..Default::default()
        },
        "edges",
    );
    run(
        alloctrace_writer::Config {
            min_heap_align: 1,
            min_stack_align: 1,
            page_size: 16,
            ..Default::default()
        },
        "ones",
    );
}
