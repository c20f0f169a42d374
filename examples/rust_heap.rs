//! A complete Rust program traced by alloctrace's safe API: the global
//! allocator records every allocation with its call stack, a guard starts
//! and stops the trace, and `HeapStats` reports the heap's use.
//!
//! ```text
//! cargo run --example rust_heap -- run.trace
//! alloctrace top run.trace
//! ```
//!
//! It keeps 1000 blocks of 64 bytes from `small_blocks` and 100 of 4096
//! bytes from `big_blocks`, frees the big ones, stops the trace and
//! prints its HeapStats as one JSON line: the trace's counts are the same.

use std::alloc::System;

#[global_allocator]
static ALLOC: alloctrace::TracingAlloc<System> = alloctrace::TracingAlloc::new(System);

// Separate blocks on purpose: each box is one allocation to count.
#[allow(clippy::vec_box)]
#[inline(never)]
fn small_blocks(n: usize) -> Vec<Box<[u8; 64]>> {
    (0..n).map(|_| Box::new([1u8; 64])).collect()
}

#[inline(never)]
fn big_blocks(n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|_| vec![2u8; 4096]).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "rust_heap.trace".into());
    let guard = alloctrace::Tracer::new().path(&path).start()?;
    let mut small = Vec::with_capacity(1000);
    small.extend(small_blocks(1000));
    let big = big_blocks(100);
    drop(big);
    guard.stop()?;
    // After the stop the counters stand still: they count what the trace
    // holds.
    let s = alloctrace::HeapStats::now();
    println!(
        "{{\"live_bytes\":{},\"live_blocks\":{},\"peak_bytes\":{},\"peak_blocks\":{},\"total_allocations\":{},\"total_bytes\":{}}}",
        s.live_bytes, s.live_blocks, s.peak_bytes, s.peak_blocks, s.total_allocations, s.total_bytes
    );
    std::hint::black_box(&small);
    Ok(())
}
