//! The event path must never allocate: it runs inside the host's malloc.
//! A counting global allocator watches the calling thread while it emits
//! events between buffer refills.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct CountingAllocator;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|a| a.set(a.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        ALLOCATIONS.with(|a| a.set(a.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

fn allocations() -> u64 {
    ALLOCATIONS.with(|a| a.get())
}

#[test]
fn events_do_not_allocate() {
    let dir = std::env::temp_dir().join(format!("alloctrace-noalloc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = std::ffi::CString::new(dir.join("t.trace").to_str().unwrap()).unwrap();
    let config = alloctrace_writer::Config {
        buffer_size: 1 << 20,
        ..Default::default()
    };
    alloctrace_writer::start(
        &config,
        alloctrace_writer::Output::create(&path).unwrap(),
        None,
    )
    .unwrap();
    let ty = alloctrace_writer::events::type_register(b"Node", 32, 8);

    // Warm up: claims the thread slot and the first buffer.
    alloctrace_writer::events::heap_object_alloc(0x1000, 32, ty);
    let before = allocations();
    // 6 kinds x 5,000 events, well under what a 1 MiB buffer holds.
    for i in 0..5_000usize {
        let a = 0x10_0000 + i * 64;
        alloctrace_writer::events::heap_object_alloc(a, 48, ty);
        alloctrace_writer::events::heap_object_free(a);
        alloctrace_writer::events::span_alloc(a << 12, 2, 5);
        alloctrace_writer::events::span_free(a << 12);
        alloctrace_writer::events::stack_alloc(a << 12, 8192);
        alloctrace_writer::events::stack_free(a << 12);
    }
    // Odd arguments take the long form; that must not allocate either.
    alloctrace_writer::events::heap_object_alloc(0x1003, 5, 0);
    alloctrace_writer::events::stack_alloc(0x7001, 12345);
    let after = allocations();
    assert_eq!(
        after - before,
        0,
        "the event path allocated {} times",
        after - before
    );

    alloctrace_writer::stop().unwrap();
    // Disabled calls must not allocate either.
    let before = allocations();
    alloctrace_writer::events::heap_object_alloc(0x2000, 8, 0);
    assert_eq!(allocations(), before);
    std::fs::remove_dir_all(&dir).ok();
}
