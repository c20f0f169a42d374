//! Writes the fuzzing seed corpus, fuzz/seeds/ (ignored by default):
//! `cargo test -p alloctrace-reader --test seeds -- --ignored`. Each seed
//! in version 2 (checksummed, no prefix), in version 1 (`v1-*.bin`), in
//! version 3 (`v3-*.bin`), in version 4 (`v4-*.bin`) and in version 5
//! (`v5-*.bin`), the traces with call stacks (`stacks*.bin`) and with
//! process batches (`process*.bin`), both in version 5, and the hostile
//! call stacks of issue 20: `stacks-deep.bin`, stacks as deep as the
//! format allows (1,024 frames), and `stacks-too-deep.bin`, a chain one
//! node deeper (malformed).

use alloctrace_reader::testing::{
    checksummed_as, info, process_trace, sample_trace_v1, stack_tree_trace, stacks_trace,
    EventsBody, TraceBuilder,
};
use alloctrace_reader::{EventData, TypeInfo};

fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut all = Vec::new();
    for (version, prefix) in [(2, ""), (1, "v1-"), (3, "v3-"), (4, "v4-"), (5, "v5-")] {
        all.extend(
            seeds_of(version)
                .into_iter()
                .map(|(name, bytes)| (format!("{prefix}{name}"), bytes)),
        );
    }
    let stacks = stacks_trace();
    all.push((
        "stacks-cut.bin".into(),
        stacks[..stacks.len() * 2 / 3].to_vec(),
    ));
    all.push(("stacks.bin".into(), stacks));
    let process = process_trace();
    all.push((
        "process-cut.bin".into(),
        process[..process.len() * 2 / 3].to_vec(),
    ));
    all.push(("process.bin".into(), process));
    let depth = alloctrace_format::stacks::MAX_STACK_DEPTH as u64;
    all.push(("stacks-deep.bin".into(), stack_tree_trace(depth - 1, 8)));
    all.push(("stacks-too-deep.bin".into(), stack_tree_trace(depth + 1, 0)));
    all
}

/// Seeds that break the format on purpose.
fn malformed(name: &str) -> bool {
    name == "stacks-too-deep.bin"
}

fn seeds_of(version: u16) -> Vec<(&'static str, Vec<u8>)> {
    let builder = || match version {
        1 => TraceBuilder::v1(),
        2 => TraceBuilder::v2(),
        3 => TraceBuilder::v3(),
        4 => TraceBuilder::v4(),
        _ => TraceBuilder::new(),
    };
    let sample = match version {
        1 => sample_trace_v1(),
        _ => checksummed_as(&sample_trace_v1(), version),
    };
    let mut empty = builder();
    empty.trace_end(1);

    let g = info(1);
    let mut one = builder();
    let mut b = EventsBody::new(1000);
    b.event(
        &g,
        1001,
        0x10010,
        &EventData::HeapObjectAlloc {
            size: 16,
            type_id: 1,
        },
    )
    .event(&g, 1002, 0x10010, &EventData::HeapObjectFree);
    let types = [TypeInfo {
        id: 1,
        size: 16,
        ptr_bytes: 8,
        name: "t".into(),
    }];
    one.info(&g);
    if version >= 4 {
        one.process(1, 0, &[b"./one", b"pair"]);
    }
    one.events(1, 1, &b)
        .types(1, &types)
        .generation_end(1, 2000, 5_001_000, 0)
        .trace_end(1);

    let mut threads = builder();
    threads.info(&g);
    for thread in 1..4u64 {
        let mut b = EventsBody::new(1000);
        for i in 0..8u64 {
            let addr = 0x10000 + 16 * (i + 32 * thread);
            let data = match i % 4 {
                0 => EventData::SpanAlloc {
                    npages: i,
                    kind_class: thread,
                },
                1 => EventData::StackAlloc { size: 4096 << i },
                2 => EventData::StackExists { size: 3000 },
                _ => EventData::SpanFree,
            };
            b.event(&g, 1000 + 3 * i + thread, addr, &data);
        }
        threads.events(1, thread, &b);
    }
    use alloctrace_format::pages::{
        sync_word, Layout, KIND_FREE, SYNC_LONG_EVENT, SYNC_THREAD, SYNC_TIME,
    };
    let layout = Layout {
        page_shift: 12,
        lost_bits: 7,
    };
    let pages: Vec<u8> = [
        layout.word(),
        sync_word(SYNC_THREAD, 1),
        sync_word(SYNC_TIME, 8),
        layout.event_word(KIND_FREE, 0x7000_0000, 3, 5),
        sync_word(SYNC_LONG_EVENT, KIND_FREE | 7 << 2),
        0x1234,
        9,
    ]
    .iter()
    .flat_map(|w| w.to_le_bytes())
    .collect();
    threads.batch(6, 1, 1, 1000, &pages);
    threads.generation_end(1, 2000, 5_001_000, 1);

    vec![
        ("sample.bin", sample.clone()),
        ("sample-cut.bin", sample[..sample.len() / 2].to_vec()),
        ("empty.bin", empty.finish()),
        ("header-only.bin", builder().finish()),
        ("one-pair.bin", one.finish()),
        ("threads-no-end.bin", threads.finish()),
    ]
}

#[test]
#[ignore = "writes fuzz/seeds/; run by hand after a format change"]
fn write_fuzz_seeds() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in seeds() {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    // The shim's modeled trace, kept as the shim wrote it in version 1,
    // and in version 2.
    let shim = std::fs::read(dir.join("v1-shim-modeled.bin")).unwrap();
    std::fs::write(dir.join("shim-modeled.bin"), checksummed_as(&shim, 2)).unwrap();
}

#[test]
fn seeds_read_without_error() {
    for (name, bytes) in seeds() {
        let mut reader = alloctrace_reader::TraceReader::new(bytes.as_slice()).unwrap();
        let read = loop {
            match reader.next_event() {
                Ok(Some(_)) => {}
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        match (read, malformed(&name)) {
            (Ok(()), false) => {}
            (Err(e), true) => assert!(e.what().contains("at most 1024"), "{name}: {e}"),
            (Err(e), false) => panic!("{name}: {e}"),
            (Ok(()), true) => panic!("{name} read without error"),
        }
    }
}
