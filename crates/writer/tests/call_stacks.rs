//! Allocations with their call stacks, writer to reader: stacks registered
//! before tracing (native, runtime frames, mixed, deeper than the limit)
//! come back frame for frame in every generation that uses them, and only
//! there; several threads share IDs; an undefined stack ID records the
//! allocation without a stack and counts in `lost_stacks`.

mod common;

use std::collections::HashMap;

use alloctrace_reader::{EventData, Frame, Record, TraceReader};
use alloctrace_writer::events;

/// A frame as the test expects to read it back.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Want {
    Native(u64),
    Runtime(String, String, u64),
    Truncated,
}

fn read_back<'a>(frames: impl Iterator<Item = Frame<'a>>) -> Vec<Want> {
    frames
        .map(|f| match f {
            Frame::Native { addr, .. } => Want::Native(addr),
            Frame::Registered(r) => Want::Runtime(r.function.clone(), r.file.clone(), r.line),
            Frame::Truncated => Want::Truncated,
        })
        .collect()
}

#[test]
fn stacks_come_back_frame_for_frame_in_the_generations_that_use_them() {
    let dir = std::env::temp_dir().join(format!("alloctrace-stacks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("stacks.trace");

    let eval = events::frame_register(b"eval", b"vm.lua", 10);
    let native = [0x40_1234u64, 0x40_1500, 0x40_0800];
    let mixed = [0x7f00_0000_1000u64, eval, 0x40_0800];
    let deep: Vec<u64> = (0..2000).map(|i| 0x50_0000 + 16 * i).collect();
    let a = events::stack_register(&native);
    let b = events::stack_register(&mixed);
    let d = events::stack_register(&deep);
    assert!(a != 0 && b != 0 && d != 0);
    let mut want: HashMap<u64, Vec<Want>> = HashMap::new();
    want.insert(a, native.iter().map(|&x| Want::Native(x)).collect());
    want.insert(
        b,
        vec![
            Want::Native(0x7f00_0000_1000),
            Want::Runtime("eval".into(), "vm.lua".into(), 10),
            Want::Native(0x40_0800),
        ],
    );
    let mut deep_want: Vec<Want> = deep[..1023].iter().map(|&x| Want::Native(x)).collect();
    deep_want.push(Want::Truncated);
    want.insert(d, deep_want);

    let config = alloctrace_writer::Config {
        min_heap_align: 16,
        ..Default::default()
    };
    common::start_to(&path, &config);
    // Generation 1: a and b, a plain allocation, an undefined stack.
    events::heap_object_alloc_stack(0x1000_0000, 48, 0, a);
    events::span_alloc_stack(0x2000_0000, 4, 7, b);
    events::heap_object_alloc_stack(0x1000_0040, 16, 0, 0);
    events::heap_object_alloc_stack(0x1000_0080, 16, 0, 0xdead_beef);
    events::heap_object_free(0x1000_0000);
    alloctrace_writer::advance().unwrap();
    // Generation 2: a again from two threads, and the deep stack.
    std::thread::scope(|s| {
        for t in 0..2 {
            s.spawn(move || {
                for i in 0..1000 {
                    events::heap_object_alloc_stack(0x3000_0000 + (t << 24) + i * 16, 32, 0, a);
                }
            });
        }
    });
    events::heap_object_alloc_stack(0x4000_0000, 64, 0, d);
    alloctrace_writer::stop().unwrap();

    let mut reader =
        TraceReader::new(std::io::BufReader::new(std::fs::File::open(&path).unwrap())).unwrap();
    let mut generation = 0;
    let mut used: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut plain_allocs = 0;
    let mut with_stack = 0;
    while let Some(record) = reader.next_record().unwrap() {
        match record {
            Record::GenerationStart { generation: g } => {
                generation = g;
                if g == 2 {
                    // Generation 2 does not use b: its innermost node is
                    // not re-listed there.
                    assert!(reader.stacks().frames(b).is_none());
                }
            }
            Record::Event(e) => {
                let is_alloc = matches!(
                    e.data,
                    EventData::HeapObjectAlloc { .. } | EventData::SpanAlloc { .. }
                );
                if !is_alloc {
                    continue;
                }
                if e.stack_id == 0 {
                    plain_allocs += 1;
                    continue;
                }
                with_stack += 1;
                let frames = reader
                    .stacks()
                    .frames(e.stack_id)
                    .unwrap_or_else(|| panic!("stack {} undefined in {generation}", e.stack_id));
                assert_eq!(read_back(frames), want[&e.stack_id]);
                used.entry(generation).or_default().push(e.stack_id);
            }
        }
    }
    assert_eq!(with_stack, 2 + 2000 + 1);
    assert_eq!(plain_allocs, 2, "stack 0 and the undefined stack");
    assert_eq!(reader.lost_stacks(), 1, "the undefined stack is counted");
    let mut one = used[&1].clone();
    one.sort();
    assert_eq!(one, vec![a.min(b), a.max(b)]);
    assert!(used[&2].iter().all(|&id| id == a || id == d));
    let _ = std::fs::remove_dir_all(&dir);
}
