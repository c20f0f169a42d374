//! The allocation-heavy program every binary runs: rounds of building a
//! map of strings to vectors through a few levels of calls, then freeing
//! most of it (as a parser or a request handler would). Prints the
//! allocations it made (from HeapStats where the tracer runs) and the
//! elapsed time as one JSON line.

use std::collections::HashMap;
use std::hint::black_box;
use std::time::Instant;

#[inline(never)]
fn leaf(i: u64) -> Vec<u32> {
    let mut v = Vec::with_capacity((i % 16 + 1) as usize);
    for j in 0..(i % 16 + 1) {
        v.push(j as u32);
    }
    v
}

#[inline(never)]
fn nested(depth: u32, i: u64) -> Vec<u32> {
    if depth == 0 {
        leaf(i)
    } else {
        nested(depth - 1, i)
    }
}

#[inline(never)]
fn round(r: u64, keys: u64) -> usize {
    let mut map: HashMap<String, Vec<u32>> = HashMap::new();
    for k in 0..keys {
        let key = format!("key-{r}-{k}");
        let value = nested((k % 8) as u32, k);
        map.insert(key, value);
    }
    map.retain(|k, _| k.len() % 7 == 0);
    map.len()
}

/// Runs the workload: `rounds` rounds of `keys` keys (args 1 and 2).
pub fn main_with(label: &str, stats: impl Fn() -> Option<u64>) {
    let mut args = std::env::args().skip(1);
    let rounds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let keys: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let start = Instant::now();
    let mut kept = 0;
    for r in 0..rounds {
        kept += round(r, keys);
    }
    let elapsed = start.elapsed().as_secs_f64();
    black_box(kept);
    let allocs = stats().map_or("null".to_string(), |n| n.to_string());
    println!("{{\"tool\":\"{label}\",\"seconds\":{elapsed:.6},\"allocations\":{allocs}}}");
}
