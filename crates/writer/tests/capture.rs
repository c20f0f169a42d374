//! Native stacks captured by the writer itself (capture.rs), writer to
//! reader: `capture_stack(skip)` starts at the right frame and agrees frame
//! for frame with an independent unwinder (the backtrace crate, outside the
//! tracer); one call site interns to one ID, two sites to two; the depth
//! limit keeps the innermost frames under the truncation marker; the
//! modules batch names the module of every frame; a session without stack
//! capture still captures on request.

mod common;

use std::hint::black_box;

use alloctrace_reader::{EventData, Frame, Record, TraceReader};
use alloctrace_writer::capture::{self, StackMode};
use alloctrace_writer::events;

/// The return addresses of the caller of this function's caller and
/// beyond, by the backtrace crate.
#[inline(never)]
fn oracle_from_callers_caller() -> Vec<u64> {
    let mut ips = Vec::new();
    backtrace::trace(|f| {
        ips.push(f.ip() as u64);
        true
    });
    // [backtrace internals..., this function, the wrapper, capture_here,
    // its caller...]
    let me = oracle_from_callers_caller as fn() -> Vec<u64> as usize as u64;
    let i = ips
        .iter()
        .position(|&ip| ip >= me && ip < me + 4096)
        .expect("this function in its own backtrace");
    black_box(ips[i + 3..].to_vec())
}

/// Captures here (skip 0: this frame first) and returns the ID, the
/// oracle's frames from our caller on, and the address of this function.
#[inline(never)]
fn capture_here(skip: usize) -> (u64, Vec<u64>) {
    let id = capture::capture_stack(skip);
    let oracle = oracle_from_callers_caller_wrapper();
    black_box((id, oracle))
}

/// One more frame, so that the oracle skips exactly `capture_here`.
#[inline(never)]
fn oracle_from_callers_caller_wrapper() -> Vec<u64> {
    black_box(oracle_from_callers_caller())
}

#[inline(never)]
fn site_a(skip: usize) -> (u64, Vec<u64>) {
    black_box(capture_here(skip))
}

#[inline(never)]
fn site_b(skip: usize) -> (u64, Vec<u64>) {
    black_box(capture_here(skip))
}

#[inline(never)]
fn recurse(n: usize) -> (u64, Vec<u64>) {
    if n == 0 {
        return black_box(capture_here(0));
    }
    black_box(recurse(black_box(n - 1)))
}

fn native(frames: Vec<Frame<'_>>) -> (Vec<u64>, bool, Vec<String>) {
    let mut addrs = Vec::new();
    let mut truncated = false;
    let mut modules = Vec::new();
    for f in frames {
        match f {
            Frame::Native { addr, module } => {
                addrs.push(addr);
                modules.push(module.map(|m| m.path.clone()).unwrap_or_default());
            }
            Frame::Truncated => truncated = true,
            Frame::Registered(_) => panic!("no registered frames here"),
        }
    }
    (addrs, truncated, modules)
}

#[test]
fn captured_stacks_start_at_the_caller_and_match_an_independent_unwinder() {
    let dir = std::env::temp_dir().join(format!("alloctrace-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("capture.trace");
    let config = alloctrace_writer::Config {
        min_heap_align: 16,
        stacks: StackMode::Full,
        stack_depth: 20,
        ..Default::default()
    };
    common::start_to(&path, &config);
    assert_eq!(capture::mode(), StackMode::Full);
    // The same call site twice (a loop), for one stack.
    let twice: Vec<(u64, Vec<u64>)> = (0..2).map(|_| site_a(0)).collect();
    let ((a1, oracle_a), (a2, _)) = (twice[0].clone(), twice[1].clone());
    let (b1, oracle_b) = site_b(0);
    let (a_skip, _) = site_a(1);
    let (deep, oracle_deep) = recurse(40);
    assert!(a1 != 0 && b1 != 0 && a_skip != 0 && deep != 0);
    assert_eq!(a1, a2, "one call site, one stack");
    assert_ne!(a1, b1, "two call sites, two stacks");
    assert_ne!(a1, a_skip);
    for (i, id) in [a1, b1, a_skip, deep].into_iter().enumerate() {
        events::heap_object_alloc_stack(0x1000_0000 + 64 * i, 16, 0, id);
    }
    alloctrace_writer::stop().unwrap();

    let mut reader =
        TraceReader::new(std::io::BufReader::new(std::fs::File::open(&path).unwrap())).unwrap();
    let mut seen = 0;
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let capture_here_addr = capture_here as fn(usize) -> (u64, Vec<u64>) as usize as u64;
    while let Some(record) = reader.next_record().unwrap() {
        let Record::Event(e) = record else { continue };
        if !matches!(e.data, EventData::HeapObjectAlloc { .. }) {
            continue;
        }
        seen += 1;
        let frames: Vec<Frame<'_>> = reader.stacks().frames(e.stack_id).unwrap().collect();
        let (addrs, truncated, modules) = native(frames);
        if e.stack_id == a1 || e.stack_id == b1 || e.stack_id == deep {
            // Frame 0 is capture_here itself (skip 0), then exactly what the
            // oracle saw from capture_here's caller on, up to the limit.
            assert!(
                addrs[0] > capture_here_addr && addrs[0] < capture_here_addr + 4096,
                "frame 0 {:#x} is in capture_here ({capture_here_addr:#x})",
                addrs[0]
            );
            let oracle = match e.stack_id {
                id if id == a1 => &oracle_a,
                id if id == b1 => &oracle_b,
                _ => &oracle_deep,
            };
            let n = addrs.len().min(oracle.len() + 1);
            assert_eq!(&addrs[1..n], &oracle[..n - 1], "stack {}", e.stack_id);
            assert_eq!(modules[0], exe.to_string_lossy(), "frame 0's module");
            if e.stack_id == deep {
                assert_eq!(addrs.len(), 20, "the depth limit");
                assert!(truncated, "a stack deeper than the limit is marked");
            }
        } else {
            // skip 1 starts at site_a, the caller of capture_here (its
            // callers differ: another call site of the test).
            assert_eq!(e.stack_id, a_skip);
            assert_eq!(addrs[0], oracle_a[0]);
        }
    }
    assert_eq!(seen, 4);
    assert_eq!(reader.lost_stacks(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}
