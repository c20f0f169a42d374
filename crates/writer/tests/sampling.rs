//! Sampling mode (issue 22), writer to reader, through the event calls the
//! C API forwards to: with a fixed seed, the estimated bytes of each
//! allocation site fall within statistical bounds of the exact ones; the
//! exact totals are recorded; every recorded free has its allocation
//! (threads that exit while others free their objects included); a
//! sampled allocation the set refuses is recorded and counted; an
//! interposer's fast path (`events::unsampled`) samples and counts as the
//! ordinary calls do.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use alloctrace_reader::{EventData, Totals, TraceReader};
use alloctrace_writer::events;

/// One session at a time in this process.
static SERIAL: Mutex<()> = Mutex::new(());

fn trace_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("alloctrace-sampling-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{name}.trace"))
}

fn config(sample_bytes: u64, seed: u64) -> alloctrace_writer::Config {
    alloctrace_writer::Config {
        min_heap_align: 16,
        sample_bytes,
        sample_seed: seed,
        ..Default::default()
    }
}

/// What a sampled trace holds.
#[derive(Default)]
struct Read {
    sample_bytes: u64,
    totals: Totals,
    /// Recorded allocations: (address, size, stack ID).
    allocs: Vec<(u64, u64, u64)>,
    frees: u64,
    /// Frees of an address with no live recorded allocation.
    unknown_frees: u64,
    /// Estimated bytes per stack ID: size times its weight.
    estimated: HashMap<u64, f64>,
}

fn read(path: &std::path::Path) -> Read {
    let bytes = std::fs::read(path).unwrap();
    let mut r = TraceReader::new(&bytes[..]).unwrap();
    let mut out = Read::default();
    let mut live = HashSet::new();
    while let Some(e) = r.next_event().unwrap() {
        let info = *r.info().unwrap();
        match e.data {
            EventData::HeapObjectAlloc { size, .. } => {
                out.allocs.push((e.addr, size, e.stack_id));
                live.insert(e.addr);
                *out.estimated.entry(e.stack_id).or_default() +=
                    size as f64 * info.sample_weight(size);
            }
            EventData::HeapObjectFree => {
                out.frees += 1;
                if !live.remove(&e.addr) {
                    out.unknown_frees += 1;
                }
            }
            _ => {}
        }
    }
    assert_eq!(r.truncated(), None);
    out.sample_bytes = r.sample_bytes();
    out.totals = r.totals();
    out
}

/// A site: its stack, object size and count.
struct Site {
    stack: u64,
    size: u64,
    count: u64,
}

fn sites() -> Vec<Site> {
    [(64, 100_000), (4096, 10_000), (1 << 20, 50), (1000, 30_000)]
        .iter()
        .enumerate()
        .map(|(i, &(size, count))| Site {
            stack: events::stack_register(&[0x40_1000 + 0x100 * i as u64, 0x40_0800]),
            size,
            count,
        })
        .collect()
}

/// Allocates every site's objects, interleaved, then frees every other one.
fn workload(sites: &[Site]) -> (u64, u64, u64) {
    let (mut allocs, mut bytes, mut frees) = (0, 0, 0);
    let most = sites.iter().map(|s| s.count).max().unwrap();
    for i in 0..most {
        for (k, s) in sites.iter().enumerate() {
            if i < s.count {
                let addr = 0x10_0000_0000 * (k + 1) + i as usize * 64;
                events::heap_object_alloc_stack(addr, s.size, 0, s.stack);
                allocs += 1;
                bytes += s.size;
                if i % 2 == 0 {
                    events::heap_object_free(addr);
                    frees += 1;
                }
            }
        }
    }
    (allocs, bytes, frees)
}

/// [`workload`] as an interposer runs it with sampling's fast path
/// (`events::unsampled`): what the fast path lets through is only counted,
/// the rest goes through the ordinary calls. Also returns the calls the
/// fast path took.
fn workload_fast(sites: &[Site]) -> ((u64, u64, u64), u64) {
    let fast = || {
        if events::sampling() {
            // No client here: its TLS word is 0.
            events::unsampled(1)
        } else {
            None
        }
    };
    let (mut allocs, mut bytes, mut frees, mut taken) = (0, 0, 0, 0);
    let most = sites.iter().map(|s| s.count).max().unwrap();
    for i in 0..most {
        for (k, s) in sites.iter().enumerate() {
            if i < s.count {
                let addr = 0x10_0000_0000 * (k + 1) + i as usize * 64;
                match fast() {
                    Some(c) if c.skips(s.size as usize) => {
                        c.alloc(s.size as usize);
                        taken += 1;
                    }
                    _ => events::heap_object_alloc_stack(addr, s.size, 0, s.stack),
                }
                allocs += 1;
                bytes += s.size;
                if i % 2 == 0 {
                    match fast() {
                        Some(c) if c.free_skips(addr) => {
                            c.free();
                            taken += 1;
                        }
                        _ => events::heap_object_free(addr),
                    }
                    frees += 1;
                }
            }
        }
    }
    ((allocs, bytes, frees), taken)
}

#[test]
fn the_fast_path_samples_and_counts_as_the_ordinary_calls() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let sites = sites();
    let ordinary = trace_path("ordinary");
    common::start_to(&ordinary, &config(16 << 10, 11));
    let (allocs, bytes, frees) = workload(&sites);
    alloctrace_writer::stop().unwrap();
    let fast = trace_path("fast");
    common::start_to(&fast, &config(16 << 10, 11));
    let (counted, taken) = workload_fast(&sites);
    alloctrace_writer::stop().unwrap();
    assert_eq!(counted, (allocs, bytes, frees));
    let (a, b) = (read(&ordinary), read(&fast));
    // The same allocations sampled (the countdown carries the same
    // bytes), every sampled free recorded, the same exact totals.
    assert!(!a.allocs.is_empty());
    assert_eq!(a.allocs, b.allocs);
    assert_eq!(a.frees, b.frees);
    assert_eq!(b.unknown_frees, 0);
    let exact = Totals {
        allocs,
        alloc_bytes: bytes,
        frees,
        sample_overflow: 0,
    };
    assert_eq!(a.totals, exact);
    assert_eq!(b.totals, exact);
    // Most calls took the fast path.
    assert!(
        taken > (allocs + frees) * 9 / 10,
        "{taken} of {}",
        allocs + frees
    );
}

#[test]
fn estimates_per_site_fall_within_bounds_of_the_exact_bytes() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mean = 64 << 10;
    let sites = sites();
    let path = trace_path("sites");
    common::start_to(&path, &config(mean, 42));
    let (allocs, bytes, frees) = workload(&sites);
    alloctrace_writer::stop().unwrap();
    let t = read(&path);
    assert_eq!(t.sample_bytes, mean);
    assert_eq!(
        t.totals,
        Totals {
            allocs,
            alloc_bytes: bytes,
            frees,
            sample_overflow: 0
        }
    );
    assert_eq!(t.unknown_frees, 0);
    // Far fewer events than allocations; the large ones all recorded.
    assert!(t.allocs.len() < allocs as usize / 20, "{}", t.allocs.len());
    let big = sites.iter().find(|s| s.size == 1 << 20).unwrap();
    assert_eq!(
        t.allocs.iter().filter(|a| a.2 == big.stack).count() as u64,
        big.count
    );
    for s in &sites {
        // The estimate of a site's bytes is a sum of independent
        // size * Bernoulli(p) / p: its variance is count * size^2 (1-p)/p.
        let exact = (s.size * s.count) as f64;
        let p = 1.0 - (-(s.size as f64) / mean as f64).exp();
        let sd = (s.count as f64 * (s.size as f64).powi(2) * (1.0 - p) / p).sqrt();
        let est = t.estimated.get(&s.stack).copied().unwrap_or(0.0);
        assert!(
            (est - exact).abs() <= 4.0 * sd + 1.0,
            "site of {} B x {}: estimated {est}, exact {exact}, sd {sd}",
            s.size,
            s.count
        );
    }
}

#[test]
fn the_same_seed_samples_the_same_allocations() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let sites = sites();
    let run = |name: &str, seed: u64| {
        let path = trace_path(name);
        common::start_to(&path, &config(16 << 10, seed));
        workload(&sites);
        alloctrace_writer::stop().unwrap();
        read(&path).allocs
    };
    let a = run("seed-a", 7);
    assert!(!a.is_empty());
    assert_eq!(a, run("seed-b", 7));
    assert_ne!(a, run("seed-c", 8));
}

#[test]
fn threads_that_exit_leave_no_unknown_free() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let path = trace_path("threads");
    common::start_to(&path, &config(4 << 10, 3));
    let (tx, rx) = std::sync::mpsc::channel::<Vec<usize>>();
    let freer = std::thread::spawn(move || {
        let mut n = 0u64;
        for batch in rx {
            for addr in batch {
                events::heap_object_free(addr);
                n += 1;
            }
        }
        n
    });
    let threads = 8u64;
    let per_thread = 5_000u64;
    for t in 0..threads {
        let tx = tx.clone();
        // Each thread allocates, hands its objects over and exits before
        // they are freed.
        std::thread::spawn(move || {
            let batch: Vec<usize> = (0..per_thread)
                .map(|i| {
                    let addr = 0x20_0000_0000 + (t * per_thread + i) as usize * 256;
                    events::heap_object_alloc(addr, 256, 0);
                    addr
                })
                .collect();
            tx.send(batch).unwrap();
        })
        .join()
        .unwrap();
    }
    drop(tx);
    assert_eq!(freer.join().unwrap(), threads * per_thread);
    alloctrace_writer::stop().unwrap();
    let t = read(&path);
    assert!(t.allocs.len() > 100, "{}", t.allocs.len());
    assert_eq!(t.unknown_frees, 0);
    // Every sampled object was freed, and its free recorded.
    assert_eq!(t.frees, t.allocs.len() as u64);
    assert_eq!(t.totals.allocs, threads * per_thread);
    assert_eq!(t.totals.frees, threads * per_thread);
    assert_eq!(t.totals.alloc_bytes, threads * per_thread * 256);
}

#[test]
fn a_full_set_still_records_and_counts() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let path = trace_path("overflow");
    common::start_to(&path, &config(4 << 10, 1));
    // Objects of 1 MiB at a mean of 4 KiB: every one is sampled.
    alloctrace_writer::inject_sample_set_overflow(3);
    let addrs: Vec<usize> = (0..10).map(|i| 0x30_0000_0000 + i * (2 << 20)).collect();
    for &a in &addrs {
        events::heap_object_alloc(a, 1 << 20, 0);
    }
    for &a in &addrs {
        events::heap_object_free(a);
    }
    alloctrace_writer::stop().unwrap();
    let t = read(&path);
    assert_eq!(t.allocs.len(), 10);
    assert_eq!(t.totals.sample_overflow, 3);
    // The refused ones' frees are not recorded: they read as live.
    assert_eq!(t.frees, 7);
    assert_eq!(t.totals.frees, 10);
    assert_eq!(t.unknown_frees, 0);
}

#[test]
fn without_sampling_every_allocation_is_recorded_and_no_totals() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let sites = sites();
    let path = trace_path("full");
    common::start_to(&path, &config(0, 0));
    let (allocs, _, frees) = workload(&sites);
    alloctrace_writer::stop().unwrap();
    let t = read(&path);
    assert_eq!(t.sample_bytes, 0);
    assert_eq!(t.totals, Totals::default());
    assert_eq!(t.allocs.len() as u64, allocs);
    assert_eq!(t.frees, frees);
}
