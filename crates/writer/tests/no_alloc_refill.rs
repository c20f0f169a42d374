//! Once tracing is on, neither the threads that emit events nor the
//! tracer's own threads (writer, advancer) allocate: the event path runs
//! inside the host's malloc, and a writer that allocated would be seen by
//! an allocator that traces itself. Buffers here are the smallest allowed,
//! so threads refill constantly, and generations are short, so the
//! advancer ends several while events flow; with and without compression.
//!
//! A counting global allocator records, while armed, every allocation and
//! the thread that made it. It is armed after `start` returns (the writer
//! and advancer threads have allocated what they need and signalled ready)
//! and disarmed before `stop`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

struct CountingAllocator;

static ARMED: AtomicBool = AtomicBool::new(false);
static COUNT: AtomicU64 = AtomicU64::new(0);
/// The first threads that allocated while armed (kernel thread IDs).
static TIDS: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];

fn note() {
    if !ARMED.load(Ordering::Relaxed) {
        return;
    }
    COUNT.fetch_add(1, Ordering::Relaxed);
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u64;
    for t in &TIDS {
        match t.compare_exchange(0, tid, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return,
            Err(seen) if seen == tid => return,
            Err(_) => {}
        }
    }
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note();
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Names of the threads that allocated while armed, for the message.
fn culprits() -> String {
    TIDS.iter()
        .map(|t| t.load(Ordering::Relaxed))
        .filter(|&t| t != 0)
        .map(|t| {
            let comm =
                std::fs::read_to_string(format!("/proc/self/task/{t}/comm")).unwrap_or_default();
            format!("{t} ({})", comm.trim())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn run(compress: bool) {
    let dir = std::env::temp_dir().join(format!(
        "alloctrace-noalloc-refill-{}-{compress}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = std::ffi::CString::new(dir.join("t.trace").to_str().unwrap()).unwrap();
    let config = alloctrace_writer::Config {
        buffer_size: alloctrace_writer::MIN_BUFFER_SIZE,
        max_buffer_memory: 32 * alloctrace_writer::MIN_BUFFER_SIZE,
        generation_bytes: 256 << 10,
        compress,
        ..Default::default()
    };
    const THREADS: usize = 2;
    const EVENTS: usize = 100_000;
    // Threads and their first event (slot claim, thread-exit registration)
    // come before the window; a barrier wait is a futex, which allocates
    // nothing.
    // Four steps: every worker is running (its thread start freed what it
    // allocated) / go / done / disarmed, so the workers may exit.
    let steps: Arc<[Barrier; 4]> = Arc::new(std::array::from_fn(|_| Barrier::new(THREADS + 1)));
    alloctrace_writer::start(
        &config,
        alloctrace_writer::Output::create(&path).unwrap(),
        None,
    )
    .unwrap();
    let ty = alloctrace_writer::events::type_register(b"Node", 32, 8);
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let steps = Arc::clone(&steps);
            std::thread::spawn(move || {
                alloctrace_writer::events::heap_object_alloc(0x1000 + t * 64, 32, ty);
                steps[0].wait();
                steps[1].wait();
                for i in 0..EVENTS {
                    let a = 0x10_0000 + (t << 32) + i * 64;
                    alloctrace_writer::events::heap_object_alloc(a, 48, ty);
                    alloctrace_writer::events::heap_object_free(a);
                    alloctrace_writer::events::span_alloc(a << 12, 2, 5);
                    alloctrace_writer::events::span_free(a << 12);
                    alloctrace_writer::events::page_alloc(a << 12, 3);
                    alloctrace_writer::events::page_free(a << 12, 3);
                }
                steps[2].wait();
                steps[3].wait();
            })
        })
        .collect();
    steps[0].wait();
    ARMED.store(true, Ordering::SeqCst);
    steps[1].wait();
    steps[2].wait();
    let allocated = COUNT.load(Ordering::SeqCst);
    ARMED.store(false, Ordering::SeqCst);
    steps[3].wait();
    let who = culprits();
    for w in workers {
        w.join().unwrap();
    }
    let stats = alloctrace_writer::session_stats().unwrap();
    alloctrace_writer::stop().unwrap();
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        stats.producer_waits > 0 || stats.buffers_mapped > 4,
        "no refill happened: {stats:?}"
    );
    assert_eq!(
        allocated, 0,
        "{allocated} allocations with tracing on (compress: {compress}), by threads {who}"
    );
}

#[test]
fn refills_and_tracer_threads_do_not_allocate() {
    run(false);
    run(true);
}
