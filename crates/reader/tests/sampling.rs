//! Format version 6's sampling fields: `sample_bytes` at the end of the
//! info body and the exact totals at the end of the generation-end body
//! (FORMAT.md sections 2 and 9), and their absence in older traces.

use alloctrace_reader::testing::{info, TraceBuilder};
use alloctrace_reader::{sample_weight, Totals, TraceReader};

fn read_all(bytes: &[u8]) -> TraceReader<&[u8]> {
    let mut r = TraceReader::new(bytes).unwrap();
    while r.next_record().unwrap().is_some() {}
    r
}

#[test]
fn sample_bytes_and_totals_are_read_and_summed() {
    let mut g1 = info(1);
    g1.sample_bytes = 512 << 10;
    let mut g2 = info(2);
    g2.sample_bytes = 512 << 10;
    let t1 = Totals {
        allocs: 1000,
        alloc_bytes: 64_000,
        frees: 900,
        sample_overflow: 3,
    };
    let t2 = Totals {
        allocs: 5,
        alloc_bytes: 7,
        frees: 11,
        sample_overflow: 0,
    };
    let mut t = TraceBuilder::new();
    t.info(&g1)
        .generation_end_v6(1, 5000, 5_004_000, &t1)
        .info(&g2)
        .generation_end_v6(2, 6000, 5_005_000, &t2)
        .trace_end(2);
    let bytes = t.finish();
    let mut r = TraceReader::new(&bytes[..]).unwrap();
    r.next_record().unwrap();
    assert_eq!(r.info().unwrap().sample_bytes, 512 << 10);
    assert_eq!(r.generation_end().unwrap().totals, t1);
    let r = read_all(&bytes);
    assert_eq!(r.sample_bytes(), 512 << 10);
    assert_eq!(
        r.totals(),
        Totals {
            allocs: 1005,
            alloc_bytes: 64_007,
            frees: 911,
            sample_overflow: 3
        }
    );
}

#[test]
fn a_version_5_trace_records_everything() {
    let mut t = TraceBuilder::with_version(alloctrace_format::VERSION_5);
    t.info(&info(1))
        .generation_end_v3(1, 5000, 5_004_000, 0, 0)
        .trace_end(1);
    let bytes = t.finish();
    let r = read_all(&bytes);
    assert_eq!(r.sample_bytes(), 0);
    assert_eq!(r.totals(), Totals::default());
}

#[test]
fn the_weight_is_pprofs() {
    assert_eq!(sample_weight(100, 0), 1.0);
    // A large allocation is always sampled; a small one stands for many.
    assert!((sample_weight(64 << 20, 512 << 10) - 1.0).abs() < 1e-9);
    let w = sample_weight(64, 512 << 10);
    let p = 1.0 - (-64.0f64 / (512 << 10) as f64).exp();
    assert!((w - 1.0 / p).abs() / w < 1e-9, "{w}");
    assert!(w > 8000.0 && w < 8300.0, "{w}");
}
