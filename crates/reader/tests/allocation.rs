//! A declared length is never trusted for an allocation: a trace that claims
//! a huge batch but holds a few bytes costs a few bytes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use alloctrace_format::MAX_BATCH_PAYLOAD;
use alloctrace_reader::testing::{info, TraceBuilder};
use alloctrace_reader::TraceReader;

/// Records the largest single allocation request.
struct Largest;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Largest = Largest;

/// The largest allocation made while reading `bytes` to the end.
fn largest_allocation_reading(bytes: &[u8]) -> usize {
    LARGEST.store(0, Ordering::Relaxed);
    if let Ok(mut reader) = TraceReader::new(bytes) {
        while let Ok(Some(_)) = reader.next_event() {}
    }
    LARGEST.load(Ordering::Relaxed)
}

// One test only: the counter is global to this test binary.
#[test]
fn huge_declared_lengths_allocate_nothing_big() {
    for declared in [MAX_BATCH_PAYLOAD, MAX_BATCH_PAYLOAD + 1, u32::MAX] {
        for kind in 1u8..=5 {
            let mut t = TraceBuilder::new();
            t.info(&info(1));
            t.raw(&[kind])
                .raw(&declared.to_le_bytes())
                .raw(&[1, 1, 0, 6, 0, 1]);
            let bytes = t.finish();
            let largest = largest_allocation_reading(&bytes);
            assert!(
                largest < 64 * 1024,
                "kind {kind}, declared {declared}: allocated {largest} bytes"
            );
        }
    }
    // A type name length far past the payload.
    let mut t = TraceBuilder::new();
    let mut body = vec![1, 1, 1];
    alloctrace_reader::testing::varint(&mut body, u64::MAX);
    t.info(&info(1)).batch(3, 1, 0, 0, &body);
    assert!(largest_allocation_reading(t.bytes()) < 64 * 1024);
}
