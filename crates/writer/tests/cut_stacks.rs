//! A trace cut while its session runs (the process killed by SIGKILL, a
//! Go program ending with a raw exit_group) keeps the stacks of every
//! event it holds: the writer thread lists a generation's stack tables
//! before the batches that use them (format version 5), not only as the
//! generation ends. The file is read here as it stands mid-session, as a
//! killed process would have left it.

mod common;

use alloctrace_reader::{Frame, Record, TraceReader};
use alloctrace_writer::events;

#[test]
fn a_trace_read_mid_generation_resolves_every_stack_it_holds() {
    let dir = std::env::temp_dir().join(format!("alloctrace-cut-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cut.trace");
    let eval = events::frame_register(b"eval", b"vm.lua", 10);
    let config = alloctrace_writer::Config {
        min_heap_align: 16,
        buffer_size: 4096,
        // One generation for the whole test: nothing ends it.
        generation_bytes: 0,
        ..Default::default()
    };
    common::start_to(&path, &config);
    // Stacks made and first used as the generation goes: each new one
    // after the writer has written batches already.
    let mut stacks = Vec::new();
    let mut made = 0u64;
    for round in 0..40u64 {
        let s = events::stack_register(&[0x40_1000 + round * 16, eval, 0x40_0800]);
        assert_ne!(s, 0);
        stacks.push((s, 0x40_1000 + round * 16));
        for i in 0..2000u64 {
            events::heap_object_alloc_stack((0x1000_0000 + (made + i) * 16) as usize, 32, 0, s);
        }
        made += 2000;
    }
    // Wait until the writer has written most of it (the threads' buffers
    // are full: no flush is asked for).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let bytes = loop {
        let bytes = std::fs::read(&path).unwrap();
        let stacked = count(&bytes).0;
        if stacked >= made / 2 || std::time::Instant::now() > deadline {
            break bytes;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let (stacked, resolved, truncated) = count(&bytes);
    assert!(truncated, "the file as it stands is cut: no generation end");
    assert!(
        stacked >= made / 2,
        "{stacked} of {made} allocations written"
    );
    assert_eq!(resolved, stacked, "every stack ID resolves");
    alloctrace_writer::stop().unwrap();
    // And once complete, the same again.
    let (stacked, resolved, truncated) = count(&std::fs::read(&path).unwrap());
    assert!(!truncated);
    assert_eq!((stacked, resolved), (made, made));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Allocations with a stack, those whose stack resolves to its three
/// frames, and whether the trace is cut.
fn count(bytes: &[u8]) -> (u64, u64, bool) {
    let mut reader = TraceReader::new(bytes).unwrap();
    let (mut stacked, mut resolved) = (0, 0);
    while let Ok(Some(record)) = reader.next_record() {
        let Record::Event(e) = record else { continue };
        if e.stack_id == 0 {
            continue;
        }
        stacked += 1;
        let frames: Vec<String> = match reader.stacks().frames_at(e.stack_id, e.ticks) {
            Some(f) => f
                .map(|f| match f {
                    Frame::Native { addr, .. } => format!("{addr:#x}"),
                    Frame::Registered(r) => r.function.clone(),
                    Frame::Truncated => "[truncated]".into(),
                })
                .collect(),
            None => Vec::new(),
        };
        if frames.len() == 3 && frames[1] == "eval" && frames[2] == "0x400800" {
            resolved += 1;
        }
    }
    (stacked, resolved, reader.truncated().is_some())
}
