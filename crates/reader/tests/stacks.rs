//! Call stacks (format version 3): resolved per generation, and every
//! malformed stack, frame and module batch reported at its byte.

use alloctrace_format::stacks::{FrameEntry, FrameWord, ModuleEntry};
use alloctrace_format::EventKind;
use alloctrace_reader::testing::{
    checksummed_as, info, node, sample_trace, sample_trace_v1, stacks_trace, EventsBody,
    TraceBuilder,
};
use alloctrace_reader::{Event, EventData, Frame, ReadError, Record, TraceReader};

/// Each generation's events with, per event, its stack's frames rendered
/// innermost first.
fn read_with_frames(bytes: &[u8]) -> Result<Vec<(Event, Vec<String>)>, ReadError> {
    let mut reader = TraceReader::new(bytes)?;
    let mut out = Vec::new();
    while let Some(record) = reader.next_record()? {
        let Record::Event(e) = record else { continue };
        let frames = match reader.stacks().frames_at(e.stack_id, e.ticks) {
            Some(frames) => frames.map(render).collect(),
            None => Vec::new(),
        };
        out.push((e, frames));
    }
    Ok(out)
}

fn render(f: Frame<'_>) -> String {
    match f {
        Frame::Native {
            addr,
            module: Some(m),
        } => format!("{}+{:#x}", m.file_name(), m.offset(addr)),
        Frame::Native { addr, module: None } => format!("{addr:#x}"),
        Frame::Registered(r) => format!("{} {}:{}", r.function, r.file, r.line),
        Frame::Truncated => "[truncated]".into(),
    }
}

fn error(bytes: &[u8]) -> ReadError {
    match read_with_frames(bytes) {
        Ok(events) => panic!("expected an error, read {} events", events.len()),
        Err(e) => {
            assert!(e.is_malformed(), "{e}");
            e
        }
    }
}

#[test]
fn stacks_resolve_across_two_generations_with_relisted_nodes() {
    let bytes = stacks_trace();
    let events = read_with_frames(&bytes).unwrap();
    let got: Vec<(u64, u64, Vec<&str>)> = events
        .iter()
        .map(|(e, f)| {
            (
                e.generation,
                e.stack_id,
                f.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    let main = "app+0x1100";
    let make_name = "libfoo.so+0x234";
    assert_eq!(
        got,
        vec![
            (1, 1, vec![main]),
            (1, 2, vec![make_name, main]),
            (1, 3, vec!["f a.lua:7", make_name, main]),
            (1, 0, vec![]),
            (1, 4, vec!["[truncated]"]),
            (1, 0, vec![]),
            (2, 2, vec![make_name, main]),
            (2, 5, vec!["0x9000", main]),
            (2, 0, vec![]),
        ]
    );
    // Kinds 11 and 12 read as the allocations they are, with the kind
    // written in Event::kind.
    let (e, _) = &events[4];
    assert!(matches!(e.data, EventData::SpanAlloc { npages: 2, .. }));
    assert_eq!(e.kind(), Some(EventKind::SpanAllocStack));
    assert_eq!(e.addr, 0x22000);
    let (e, _) = &events[2];
    assert_eq!(e.kind(), Some(EventKind::HeapObjectAllocStack));
    assert!(e.long_form, "0x10081 is off the heap alignment");
    assert_eq!(e.addr, 0x10081);
    assert_eq!(events[3].0.kind(), Some(EventKind::HeapObjectAlloc));
    // The reader's totals and the second generation's tables.
    let mut reader = TraceReader::new(bytes.as_slice()).unwrap();
    while reader.next_event().unwrap().is_some() {}
    assert_eq!(reader.lost_stacks(), 3);
    assert_eq!(reader.lost_events(), 0);
    let stacks = reader.stacks();
    assert_eq!(stacks.ids().collect::<Vec<_>>(), vec![1, 2, 5]);
    assert!(!stacks.contains(3), "generation 2 does not re-list stack 3");
    assert_eq!(stacks.modules().len(), 2);
    assert_eq!(stacks.modules()[0].build_id, vec![0xde, 0xad, 0xbe, 0xef]);
    assert_eq!(stacks.registered_frames().count(), 0);
    let n = stacks.node(5).unwrap();
    assert_eq!((n.parent, n.frame_word()), (1, FrameWord::Native(0x9000)));
}

#[test]
fn a_module_is_resolved_only_while_it_is_loaded() {
    let bytes = stacks_trace();
    let mut reader = TraceReader::new(bytes.as_slice()).unwrap();
    reader.next_record().unwrap();
    let stacks = reader.stacks();
    let addr = 0x7f00_0000_0234;
    // libfoo.so was dlopened at tick 1200.
    assert!(stacks.module_of(addr, Some(1199)).is_none());
    assert_eq!(stacks.module_of(addr, Some(1200)).unwrap().id, 2);
    assert_eq!(stacks.module_of(addr, None).unwrap().id, 2);
    let at_1100: Vec<String> = stacks.frames_at(2, 1100).unwrap().map(render).collect();
    assert_eq!(at_1100, vec!["0x7f0000000234", "app+0x1100"]);
}

/// Generation 1's info, one events body, then `stacks` batches, then the
/// generation end; returns the builder and the offset the stacks batches
/// start at.
fn with_events(
    events: &EventsBody,
    stacks: impl FnOnce(&mut TraceBuilder),
) -> (Vec<u8>, usize, usize) {
    let mut t = TraceBuilder::new();
    t.info(&info(1));
    let events_at = t.len();
    t.events(1, 1, events);
    let stacks_at = t.len();
    stacks(&mut t);
    t.generation_end_v3(1, 5000, 5_004_000, 0, 0).trace_end(1);
    (t.finish(), events_at, stacks_at)
}

/// The file offset of byte `i` of the body of the batch at `batch_at`
/// (kind, length, then generation 1, thread 0, base 0: one byte each).
fn body(batch_at: usize, i: usize) -> u64 {
    (batch_at + 5 + 3 + i) as u64
}

fn alloc() -> EventData {
    EventData::HeapObjectAlloc {
        size: 16,
        type_id: 0,
    }
}

#[test]
fn an_undefined_stack_id_is_malformed_at_its_event() {
    let g = info(1);
    let mut b = EventsBody::new(1000);
    b.event_with_stack(&g, 1001, 0x10010, &alloc(), 1)
        .event_with_stack(&g, 1002, 0x10020, &alloc(), 2);
    let (bytes, events_at, _) = with_events(&b, |t| {
        t.call_stacks(1, &[node(1, 0, FrameWord::Native(0x1234))]);
    });
    // kind, length, header (1, 1, 1000: 4 bytes), the first event: 6 bytes.
    let second = events_at + 5 + 4 + 6;
    let e = error(&bytes);
    assert_eq!(e.offset(), second as u64, "{e}");
    assert!(
        e.what()
            .contains("heap_object_alloc_stack event names stack ID 2, which no call-stacks batch of its generation defines"),
        "{e}"
    );
    // The same stack ID without a call-stacks batch at all: the first event.
    let (bytes, events_at, _) = with_events(&b, |_| {});
    assert_eq!(error(&bytes).offset(), (events_at + 9) as u64);
    // A stack ID defined only in the next generation is not this one's.
    let mut t = TraceBuilder::new();
    let mut g2 = info(2);
    g2.start_ticks = 5000;
    t.info(&g)
        .events(1, 1, &b)
        .info(&g2)
        .call_stacks(
            2,
            &[
                node(1, 0, FrameWord::Native(0x10)),
                node(2, 1, FrameWord::Native(0x20)),
            ],
        )
        .generation_end_v3(1, 5000, 5_004_000, 0, 0)
        .generation_end_v3(2, 6000, 5_005_000, 0, 0);
    let e = error(&t.finish());
    assert_eq!(e.offset(), (events_at + 9) as u64, "{e}");
}

#[test]
fn stack_id_zero_is_malformed() {
    let mut b = EventsBody::new(1000);
    b.event_with_stack(&info(1), 1001, 0x10010, &alloc(), 0);
    let (bytes, events_at, _) = with_events(&b, |_| {});
    let e = error(&bytes);
    assert_eq!(e.offset(), (events_at + 9) as u64);
    assert!(e.what().contains("stack ID 0"), "{e}");
}

#[test]
fn malformed_call_stack_nodes_are_reported_at_their_entry() {
    let b = EventsBody::new(1000);
    let native = FrameWord::Native(0x1234);
    // The frame word takes 2 bytes: entry i starts at body byte 4 * i.
    let cases: Vec<(Vec<alloctrace_format::stacks::CallStackNode>, usize, &str)> = vec![
        (
            vec![node(1, 0, native), node(2, 2, native)],
            4,
            "parent is not below its ID",
        ),
        (
            vec![node(1, 0, native), node(3, 5, native)],
            4,
            "parent is not below its ID",
        ),
        (
            vec![node(1, 0, native), node(4, 2, native)],
            4,
            "names parent 2, which is not an earlier node",
        ),
        (
            vec![node(2, 0, native), node(2, 0, native)],
            4,
            "node ID 2 listed twice",
        ),
        // Since version 5 a node may come after a larger one, but once.
        (
            vec![node(3, 0, native), node(2, 0, native), node(3, 0, native)],
            8,
            "node ID 3 listed twice",
        ),
        (vec![node(0, 0, native)], 0, "node ID 0"),
        (
            vec![node(1, 0, FrameWord::Registered(1))],
            0,
            "names registered frame 1, which the generation's frames batch does not list",
        ),
    ];
    for (nodes, entry, what) in cases {
        let (bytes, _, stacks_at) = with_events(&b, |t| {
            t.call_stacks(1, &nodes);
        });
        let e = error(&bytes);
        assert_eq!(e.offset(), body(stacks_at, entry), "{nodes:?}: {e}");
        assert!(e.what().contains(what), "{nodes:?}: {e}");
        assert!(e.what().contains("in call-stacks batch starting at offset"));
    }
    // A body that does not end exactly: the cut entry's field.
    let (bytes, _, stacks_at) = with_events(&b, |t| {
        t.batch(12, 1, 0, 0, &[1, 0, 2, 2, 1]);
    });
    let e = error(&bytes);
    assert_eq!(e.offset(), body(stacks_at, 5), "{e}");
    assert!(e.what().contains("past the end"), "{e}");
}

#[test]
fn a_frames_batch_defines_registered_frames_and_nodes_may_span_batches() {
    let g = info(1);
    let mut b = EventsBody::new(1000);
    b.event_with_stack(&g, 1001, 0x10010, &alloc(), 3);
    let (bytes, _, _) = with_events(&b, |t| {
        t.frames(
            1,
            &[FrameEntry {
                id: 9,
                line: 0,
                func: b"jit stub",
                file: b"",
            }],
        )
        // The table continues in a second call-stacks batch.
        .call_stacks(1, &[node(1, 0, FrameWord::TRUNCATED)])
        .call_stacks(
            1,
            &[
                node(2, 1, FrameWord::Native(0x4000)),
                node(3, 2, FrameWord::Registered(9)),
            ],
        );
    });
    let events = read_with_frames(&bytes).unwrap();
    assert_eq!(events[0].1, vec!["jit stub :0", "0x4000", "[truncated]"]);
    // A registered frame listed twice, at its second entry.
    let f = FrameEntry {
        id: 9,
        line: 1,
        func: b"f",
        file: b"g",
    };
    let (bytes, _, stacks_at) = with_events(&EventsBody::new(1000), |t| {
        t.frames(1, &[f, f]);
    });
    let e = error(&bytes);
    assert_eq!(e.offset(), body(stacks_at, f.encoded_len()), "{e}");
    assert!(
        e.what().contains("registered frame ID 9 listed twice"),
        "{e}"
    );
}

#[test]
fn malformed_modules_are_reported_at_their_field() {
    let m = ModuleEntry {
        id: 1,
        start: 0x1000,
        end: 0x2000,
        bias: 0,
        eh_frame_hdr: 0,
        load_ticks: 0,
        unload_ticks: 0,
        build_id: &[],
        path: b"/a",
    };
    let empty = ModuleEntry { end: 0x1000, ..m };
    let (bytes, _, at) = with_events(&EventsBody::new(1000), |t| {
        t.modules(1, &[m, empty]);
    });
    let e = error(&bytes);
    assert_eq!(e.offset(), body(at, m.encoded_len()), "{e}");
    assert!(e.what().contains("range is empty"), "{e}");
    // Listed again (version 5): the same object, its unload learnt, is
    // fine; another object under the ID, or a second unload, is not.
    let other = ModuleEntry { path: b"/b", ..m };
    let unloaded = ModuleEntry {
        unload_ticks: 500,
        ..m
    };
    let later = ModuleEntry {
        unload_ticks: 600,
        ..m
    };
    for (second, third) in [(other, None), (unloaded, Some(later))] {
        let list: Vec<ModuleEntry> = [Some(m), Some(second), third]
            .into_iter()
            .flatten()
            .collect();
        let (bytes, _, at) = with_events(&EventsBody::new(1000), |t| {
            t.modules(1, &list);
        });
        let e = error(&bytes);
        let bad = list[..list.len() - 1].iter().map(|m| m.encoded_len()).sum();
        assert_eq!(e.offset(), body(at, bad), "{e}");
        assert!(e.what().contains("module ID 1 listed twice"), "{e}");
    }
    // A build ID of 65 bytes, a path of 4096 bytes (the most) running past
    // the end, and a huge path length (no huge allocation: the reader
    // borrows, then refuses).
    // Fields: id 1, start 0x1000 (2 bytes), end 0x2000 (2), bias, eh,
    // load, unload: 9 bytes; then the build ID length, the path length.
    let mut long = vec![1, 0x80, 0x20, 0x80, 0x40, 0, 0, 0, 0, 65];
    long.extend_from_slice(&[0; 65]);
    long.push(0);
    let lying = [1, 0x80, 0x20, 0x80, 0x40, 0, 0, 0, 0, 0, 0x80, 0x20];
    let huge = [
        1, 0x80, 0x20, 0x80, 0x40, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f,
    ];
    for (body_bytes, field, what) in [
        (&long[..], 9, "build ID is longer than 64 bytes"),
        (&lying[..], 10, "runs past the end"),
        (&huge[..], 10, "path is longer than 4096 bytes"),
    ] {
        let (bytes, _, at) = with_events(&EventsBody::new(1000), |t| {
            t.batch(10, 1, 0, 0, body_bytes);
        });
        let e = error(&bytes);
        assert_eq!(e.offset(), body(at, field), "{e}");
        assert!(e.what().contains(what), "{e}");
    }
}

#[test]
fn a_version_2_trace_reads_as_before() {
    let v2 = checksummed_as(&sample_trace_v1(), 2);
    let v3 = checksummed_as(&sample_trace_v1(), 3);
    assert_eq!(&v2[8..10], &[2, 0]);
    assert_eq!(&v3[8..10], &[3, 0]);
    let v6 = sample_trace();
    assert_eq!(&v6[8..10], &[6, 0]);
    assert_eq!(
        read_with_frames(&v3).unwrap(),
        read_with_frames(&v6).unwrap()
    );
    let (a, b) = (
        read_with_frames(&v2).unwrap(),
        read_with_frames(&v3).unwrap(),
    );
    assert_eq!(a, b);
    assert!(!a.is_empty());
    assert!(a.iter().all(|(e, f)| e.stack_id == 0 && f.is_empty()));
    let mut reader = TraceReader::new(v2.as_slice()).unwrap();
    while reader.next_event().unwrap().is_some() {
        assert!(reader.stacks().is_empty());
    }
    // Generation-end bodies without lost_stacks count none.
    assert_eq!(reader.generation_end().unwrap().lost_stacks, 0);
    assert_eq!((reader.lost_events(), reader.lost_stacks()), (3, 0));
    // A version-2 builder writes the same trace as a version-2 header.
    let mut t = TraceBuilder::v2();
    t.trace_end(1);
    assert_eq!(&t.finish()[8..10], &[2, 0]);
}

#[test]
fn a_generation_cut_off_keeps_its_stack_ids_unchecked() {
    // The process died before generation 1 ended: its events are in the
    // file, its stack batches (written as a generation ends) are not.
    let g = info(1);
    let mut b = EventsBody::new(1000);
    b.event_with_stack(&g, 1001, 0x10010, &alloc(), 7)
        .event_with_stack(&g, 1002, 0x10020, &alloc(), 8);
    let mut t = TraceBuilder::new();
    t.info(&g).events(1, 1, &b);
    let bytes = t.finish();
    let mut reader = TraceReader::new(bytes.as_slice()).unwrap();
    let mut ids = Vec::new();
    while let Some(e) = reader.next_event().unwrap() {
        ids.push(e.stack_id);
        assert!(reader.stacks().is_cut());
        assert!(reader.stacks().frames(e.stack_id).is_none());
    }
    assert_eq!(ids, vec![7, 8]);
    assert_eq!(reader.truncated(), Some(bytes.len() as u64));
    // The same events with the generation's end: malformed.
    t.generation_end_v3(1, 2000, 5_001_000, 0, 0);
    assert!(read_with_frames(&t.finish()).is_err());
    // A complete generation is not cut.
    let complete = stacks_trace();
    let mut reader = TraceReader::new(complete.as_slice()).unwrap();
    reader.next_record().unwrap();
    assert!(!reader.stacks().is_cut());
}

/// Version 5: the writer lists a generation's stack tables as it goes,
/// before the events that use them. A trace cut before its generation
/// ends (a process killed by SIGKILL) still resolves every event's stack;
/// nodes may come after larger ones, and a module listed again carries
/// the unload tick learnt since.
#[test]
fn a_cut_trace_resolves_the_stacks_listed_before_its_events() {
    let g = info(1);
    let lib = ModuleEntry {
        id: 1,
        start: 0x7f00_0000_0000,
        end: 0x7f00_0001_0000,
        bias: 0x7f00_0000_0000,
        eh_frame_hdr: 0,
        load_ticks: 0,
        unload_ticks: 0,
        build_id: &[],
        path: b"/lib/libinner0.so",
    };
    let mut t = TraceBuilder::new();
    t.info(&g);
    t.modules(1, &[lib]);
    t.call_stacks(1, &[node(5, 0, FrameWord::Native(0x7f00_0000_0100))]);
    let mut a = EventsBody::new(1000);
    a.event_with_stack(&g, 1001, 0x10010, &alloc(), 5);
    t.events(1, 1, &a);
    // An older node, first used now; the module's unload, now known.
    t.call_stacks(1, &[node(2, 0, FrameWord::Native(0x7f00_0000_0200))]);
    t.modules(
        1,
        &[ModuleEntry {
            unload_ticks: 3000,
            ..lib
        }],
    );
    let mut b = EventsBody::new(2000);
    b.event_with_stack(&g, 2001, 0x10020, &alloc(), 2)
        .event_with_stack(&g, 2002, 0x10030, &alloc(), 5);
    t.events(1, 1, &b);
    let bytes = t.finish();
    let mut reader = TraceReader::new(bytes.as_slice()).unwrap();
    let mut got = Vec::new();
    while let Some(record) = reader.next_record().unwrap() {
        let Record::Event(e) = record else { continue };
        let frames: Vec<String> = reader
            .stacks()
            .frames_at(e.stack_id, e.ticks)
            .map(|f| f.map(render).collect())
            .unwrap_or_default();
        got.push((e.stack_id, frames));
    }
    assert!(reader.truncated().is_some(), "the trace is cut");
    assert_eq!(
        got,
        vec![
            (5, vec!["libinner0.so+0x100".to_string()]),
            (2, vec!["libinner0.so+0x200".to_string()]),
            (5, vec!["libinner0.so+0x100".to_string()]),
        ]
    );
    let stacks = reader.stacks();
    assert_eq!(stacks.ids().collect::<Vec<_>>(), vec![2, 5]);
    assert_eq!(stacks.modules().len(), 1);
    assert_eq!(stacks.modules()[0].unload_ticks, 3000);
}

/// The file offset of entry `i` of a call-stacks batch at `batch_at`
/// holding `nodes`.
fn node_at(batch_at: usize, nodes: &[alloctrace_format::stacks::CallStackNode], i: usize) -> u64 {
    body(batch_at, nodes[..i].iter().map(|n| n.encoded_len()).sum())
}

#[test]
fn a_stack_deeper_than_the_format_allows_is_malformed_at_its_node() {
    use alloctrace_format::stacks::MAX_STACK_DEPTH;
    let max = MAX_STACK_DEPTH as u64;
    let chain = |n: u64| -> Vec<_> {
        (1..=n)
            .map(|id| node(id, id - 1, FrameWord::Native(0x40_0000 + 16 * id)))
            .collect()
    };
    let b = EventsBody::new(1000);
    // A chain as deep as the format allows reads, and its stack has every
    // frame.
    let nodes = chain(max);
    let (bytes, _, _) = with_events(&b, |t| {
        t.call_stacks(1, &nodes);
    });
    let mut reader = TraceReader::new(bytes.as_slice()).unwrap();
    while let Some(Record::Event(_)) | Some(Record::GenerationStart { .. }) =
        reader.next_record().unwrap()
    {
        if reader.stacks().len() == nodes.len() {
            break;
        }
    }
    assert_eq!(reader.stacks().depth(max), Some(MAX_STACK_DEPTH));
    assert_eq!(
        reader.stacks().frames(max).unwrap().count(),
        MAX_STACK_DEPTH
    );
    assert_eq!(reader.stacks().depth(1), Some(1));

    // One node more: malformed at that node.
    let nodes = chain(max + 1);
    let (bytes, _, stacks_at) = with_events(&b, |t| {
        t.call_stacks(1, &nodes);
    });
    let e = error(&bytes);
    assert_eq!(
        e.offset(),
        node_at(stacks_at, &nodes, MAX_STACK_DEPTH),
        "{e}"
    );
    assert_eq!(
        e.what().split(" in ").next().unwrap(),
        format!(
            "call-stack node {} makes a stack of {} frames (at most {MAX_STACK_DEPTH})",
            max + 1,
            max + 1
        ),
        "{e}"
    );

    // The depth carries across batches, and a node listed after larger
    // ones (version 5) counts its parent's depth too.
    let mut nodes = chain(max);
    nodes.push(node(5000, 0, FrameWord::Native(0x10)));
    let (first, second) = nodes.split_at(600);
    let mut second = second.to_vec();
    second.push(node(max + 1, max, FrameWord::Native(0x20)));
    let mut first_len = 0;
    let (bytes, _, stacks_at) = with_events(&b, |t| {
        t.call_stacks(1, first);
        first_len = t.len();
        t.call_stacks(1, &second);
    });
    let e = error(&bytes);
    assert!(first_len > stacks_at);
    assert_eq!(
        e.offset(),
        node_at(first_len, &second, second.len() - 1),
        "{e}"
    );
    assert!(e.what().contains("1025 frames (at most 1024)"), "{e}");

    // The hostile traces of issue 20: a chain of 50,000 nodes is refused
    // at its node 1025; a tree as deep and wide as allowed reads.
    let e = error(&alloctrace_reader::testing::stack_tree_trace(50_000, 0));
    assert!(
        e.what().contains("node 1025 makes a stack of 1025 frames"),
        "{e}"
    );
    let events = read_with_frames(&alloctrace_reader::testing::stack_tree_trace(1023, 50)).unwrap();
    assert_eq!(events.len(), 1023 + 50);
    assert_eq!(events.last().unwrap().1.len(), MAX_STACK_DEPTH);
}

#[test]
fn nodes_listed_in_decreasing_order_read_whole() {
    // Version 5: nodes 100 down to 51 as roots after node 200 (each then
    // listed after a larger one), then 101 under 60 and 150 under 101,
    // and a late node listed twice.
    let native = |a: u64| FrameWord::Native(0x1000 + a);
    let mut nodes = vec![node(200, 0, native(200))];
    nodes.extend((51..=100).rev().map(|id| node(id, 0, native(id))));
    nodes.push(node(101, 60, native(101)));
    let b = EventsBody::new(1000);
    let (bytes, _, _) = with_events(&b, |t| {
        t.call_stacks(1, &nodes)
            .call_stacks(1, &[node(150, 101, native(150))]);
    });
    let mut reader = TraceReader::new(bytes.as_slice()).unwrap();
    while reader.next_record().unwrap().is_some() {}
    let stacks = reader.stacks();
    let mut want: Vec<u64> = (51..=101).collect();
    want.extend([150, 200]);
    assert_eq!(stacks.ids().collect::<Vec<_>>(), want);
    assert_eq!(stacks.len(), want.len());
    assert!(stacks.contains(77) && stacks.contains(200) && !stacks.contains(102));
    assert_eq!(stacks.depth(150), Some(3));
    let words: Vec<FrameWord> = stacks.words(150).unwrap().collect();
    assert_eq!(words, vec![native(150), native(101), native(60)]);
    assert_eq!(stacks.node(101).unwrap().parent, 60);

    let at = nodes.len() - 1;
    nodes.insert(at, node(70, 0, native(70)));
    let (bytes, _, stacks_at) = with_events(&b, |t| {
        t.call_stacks(1, &nodes);
    });
    let e = error(&bytes);
    assert_eq!(e.offset(), node_at(stacks_at, &nodes, at), "{e}");
    assert!(e.what().contains("node ID 70 listed twice"), "{e}");
}
