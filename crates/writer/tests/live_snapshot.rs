//! The live table and its snapshot (writer/live.rs, writer/snapshot.rs;
//! issue 22, the live heap on demand), through the event calls the C API
//! forwards to:
//! - after a known sequence (allocations with call stacks, frees, a
//!   realloc's free and alloc, an alloc at a live address, a span, a
//!   thread stack, an exists event, and another thread's free reaching the
//!   writer before the allocation it ends), the snapshot trace holds
//!   exactly the live objects, with their sizes and call stacks;
//! - in sampling mode it holds exactly the sampled live set: the live
//!   objects of the session's own trace, read to its end, and says the
//!   sampling mean.

mod common;

use std::collections::BTreeMap;
use std::sync::Mutex;

use alloctrace_reader::{EventData, Frame, Record, TraceReader};
use alloctrace_writer::{events, Config};

/// The session is process-wide: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("alloctrace-live-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// What is live in a trace: (kind, address) -> (size, innermost frame's
/// function or address), and the generations it holds.
type Live = BTreeMap<(&'static str, u64), (u64, String)>;

fn frame_name(reader: &TraceReader<&[u8]>, stack: u64) -> String {
    match reader.stacks().frames(stack).and_then(|mut f| f.next()) {
        Some(Frame::Registered(f)) => f.function.clone(),
        Some(Frame::Native { addr, .. }) => format!("{addr:#x}"),
        Some(Frame::Truncated) => "truncated".to_string(),
        None => String::new(),
    }
}

/// Reads a whole trace and returns what is live at its end, in the
/// analysis pass's terms (an alloc at a live address replaces it).
fn live_at_end(bytes: &[u8]) -> (Live, Vec<u64>, u64) {
    let mut r = TraceReader::new(bytes).unwrap();
    let mut live = Live::new();
    let mut generations = Vec::new();
    while let Some(record) = r.next_record().unwrap() {
        let e = match record {
            Record::GenerationStart { generation } => {
                generations.push(generation);
                continue;
            }
            Record::Event(e) => e,
        };
        let name = frame_name(&r, e.stack_id);
        match e.data {
            EventData::HeapObjectAlloc { size, .. } => {
                live.insert(("heap", e.addr), (size, name));
            }
            EventData::HeapObjectExists { size, .. } => {
                live.insert(("heap exists", e.addr), (size, name));
            }
            EventData::HeapObjectFree => {
                live.remove(&("heap", e.addr));
                live.remove(&("heap exists", e.addr));
            }
            EventData::SpanAlloc { npages, .. } => {
                live.insert(("span", e.addr), (npages, name));
            }
            EventData::SpanFree => {
                live.remove(&("span", e.addr));
            }
            EventData::StackAlloc { size } => {
                live.insert(("stack", e.addr), (size, name));
            }
            EventData::StackFree => {
                live.remove(&("stack", e.addr));
            }
            _ => {}
        }
    }
    assert_eq!(r.truncated(), None, "a whole trace");
    (live, generations, r.sample_bytes())
}

fn stack(function: &str) -> u64 {
    let frame = events::frame_register(function.as_bytes(), b"live.rs", 1);
    let main = events::frame_register(b"main", b"live.rs", 1);
    events::stack_register(&[frame, main])
}

const BASE: usize = 0x10_0000_0000;

#[test]
fn a_snapshot_holds_exactly_the_live_objects_with_their_sizes_and_stacks() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // Full mode keeps the table only when asked (writer/live.rs, "Cost").
    std::env::set_var("ALLOCTRACE_LIVE_TABLE", "on");
    let d = dir("known");
    let config = Config {
        min_heap_align: 16,
        ..Default::default()
    };
    common::start_to(&d.join("out.trace"), &config);
    let (a, b) = (stack("site_a"), stack("site_b"));
    for i in 0..10 {
        events::heap_object_alloc_stack(BASE + i * 64, 40, 0, a);
    }
    for i in [1, 3, 5] {
        events::heap_object_free(BASE + i * 64);
    }
    alloctrace_writer::advance().unwrap();
    // A realloc that moves object 0: its free, and the new block.
    events::heap_object_free(BASE);
    events::heap_object_alloc_stack(BASE + 0x10000, 400, 0, b);
    // An alloc at a live address (its free was missed): replaces object 2.
    events::heap_object_alloc_stack(BASE + 2 * 64, 4000, 0, b);
    // Allocated and freed between two snapshots' worth of events.
    events::heap_object_alloc(BASE + 0x20000, 8, 0);
    events::heap_object_free(BASE + 0x20000);
    // A span and a thread stack, live; an object live before tracing.
    events::span_alloc_stack(BASE + 0x100000, 4, 7, a);
    events::span_alloc(BASE + 0x200000, 2, 7);
    events::span_free(BASE + 0x200000);
    events::stack_alloc(BASE + 0x400000, 8192);
    events::heap_object_exists(BASE + 0x30000, 24, 0);
    // Another thread allocates; its batch stays unflushed while this
    // thread frees the object and flushes first: the free reaches the
    // writer before the allocation it ends.
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (done, allocated) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        events::heap_object_alloc_stack(BASE + 0x50000, 77, 0, a);
        events::heap_object_alloc_stack(BASE + 0x50040, 78, 0, a);
        done.send(()).unwrap();
        wait.recv().unwrap();
        events::thread_destroy();
    });
    allocated.recv().unwrap();
    events::heap_object_free(BASE + 0x50000);
    events::thread_destroy();

    let snapshot = alloctrace_writer::snapshot_bytes().unwrap();
    go.send(()).unwrap();
    other.join().unwrap();
    let (live, generations, sample_bytes) = live_at_end(snapshot.as_slice());
    assert_eq!(generations, vec![2], "one generation, the one it ended");
    assert_eq!(sample_bytes, 0);
    let mut want = Live::new();
    for i in [4, 6, 7, 8, 9] {
        want.insert(("heap", (BASE + i * 64) as u64), (40, "site_a".into()));
    }
    want.insert(("heap", (BASE + 2 * 64) as u64), (4000, "site_b".into()));
    want.insert(("heap", (BASE + 0x10000) as u64), (400, "site_b".into()));
    want.insert(("heap", (BASE + 0x50040) as u64), (78, "site_a".into()));
    want.insert(
        ("heap exists", (BASE + 0x30000) as u64),
        (24, String::new()),
    );
    want.insert(("span", (BASE + 0x100000) as u64), (4, "site_a".into()));
    want.insert(("stack", (BASE + 0x400000) as u64), (8192, String::new()));
    assert_eq!(live, want);

    // Tracing goes on, and the session's own trace agrees.
    events::heap_object_free(BASE + 4 * 64);
    let second = alloctrace_writer::snapshot_bytes().unwrap();
    let (after, generations, _) = live_at_end(second.as_slice());
    assert_eq!(generations, vec![3]);
    want.remove(&("heap", (BASE + 4 * 64) as u64));
    assert_eq!(after, want);
    alloctrace_writer::stop().unwrap();
    let (whole, ..) = live_at_end(&std::fs::read(d.join("out.trace")).unwrap());
    assert_eq!(whole, want);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn in_sampling_mode_the_snapshot_is_the_sampled_live_set() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let d = dir("sampled");
    let config = Config {
        min_heap_align: 16,
        sample_bytes: 4096,
        sample_seed: 7,
        ..Default::default()
    };
    common::start_to(&d.join("out.trace"), &config);
    let sites = [stack("small"), stack("large")];
    for i in 0..200_000usize {
        let addr = BASE + i * 64;
        let size = if i % 10 == 0 { 10_000 } else { 48 };
        events::heap_object_alloc_stack(addr, size, 0, sites[usize::from(size > 48)]);
        if i % 3 == 0 {
            events::heap_object_free(addr);
        }
        if i % 50_000 == 0 {
            alloctrace_writer::advance().unwrap();
        }
    }
    let snapshot = alloctrace_writer::snapshot_bytes().unwrap();
    alloctrace_writer::stop().unwrap();
    let (live, _, sample_bytes) = live_at_end(snapshot.as_slice());
    assert_eq!(sample_bytes, 4096, "readers show estimates");
    let (sampled, ..) = live_at_end(&std::fs::read(d.join("out.trace")).unwrap());
    assert!(
        !sampled.is_empty() && sampled.len() < 100_000,
        "{}",
        sampled.len()
    );
    assert_eq!(live, sampled);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn without_a_live_table_a_snapshot_is_refused() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let d = dir("flight");
    assert!(matches!(
        alloctrace_writer::snapshot_bytes(),
        Err(alloctrace_writer::Error::NotStarted)
    ));
    let config = Config {
        flight_recorder: 64 << 20,
        ..Default::default()
    };
    common::start_to(&d.join("out.trace"), &config);
    assert!(matches!(
        alloctrace_writer::snapshot_bytes(),
        Err(alloctrace_writer::Error::BadConfig(_))
    ));
    alloctrace_writer::stop().unwrap();
    // Full mode without ALLOCTRACE_LIVE_TABLE=on: no table.
    std::env::remove_var("ALLOCTRACE_LIVE_TABLE");
    common::start_to(&d.join("full.trace"), &Config::default());
    assert!(matches!(
        alloctrace_writer::snapshot_bytes(),
        Err(alloctrace_writer::Error::BadConfig(why)) if why.contains("ALLOCTRACE_LIVE_TABLE=on")
    ));
    alloctrace_writer::stop().unwrap();
    std::fs::remove_dir_all(&d).unwrap();
}
