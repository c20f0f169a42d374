//! Sampling mode under the shim (ALLOCTRACE_SAMPLE_BYTES, `record
//! --sample-bytes`) on prog_sample, whose allocation sites have known
//! sizes and counts: with a fixed seed the estimated bytes of each site
//! fall within statistical bounds of the exact run's; the exact totals
//! are recorded (a realloc that fails included); no free is unknown,
//! threads that exit while another frees their sampled objects included.

use serde_json::Value;

use crate::harness::*;

/// Mean bytes between samples in these runs: small enough for every site
/// to be sampled many times.
const MEAN: f64 = 65536.0;

/// (function, block size, blocks) of prog_sample at scale 1.
const SITES: [(&str, f64, f64); 4] = [
    ("site_small", 48.0, 200_000.0),
    ("site_medium", 3000.0, 20_000.0),
    ("site_large", 1048576.0, 40.0),
    ("site_thread", 256.0, 20_000.0),
];

/// `top --by function --json`'s bytes per function, and its "sampled".
fn bytes_by_function(trace: &str) -> (Vec<(String, f64)>, Value) {
    let (rc, out, err) = run_cli(&["top", "--by", "function", "-n", "1000", "--json", trace]);
    assert_eq!(rc, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("top's JSON");
    let sites = v["sites"]
        .as_array()
        .expect("sites")
        .iter()
        .map(|s| {
            (
                s["key"].as_str().unwrap_or_default().to_string(),
                s["bytes"].as_f64().unwrap_or(0.0),
            )
        })
        .collect();
    (sites, v["sampled"].clone())
}

fn of(sites: &[(String, f64)], function: &str) -> f64 {
    sites
        .iter()
        .filter(|(f, _)| f == function)
        .map(|(_, b)| b)
        .sum()
}

#[test]
fn sampled_estimates_per_site_fall_within_bounds_of_the_exact_run() {
    let prog = prog("prog_sample");
    let exact = Case::new("sample_exact");
    assert_eq!(exact.traced(&[], &[&prog]), 0, "{}", exact.err_head());
    let (exact_sites, sampled) = bytes_by_function(&exact.trace());
    assert_eq!(sampled, Value::Null);

    let case = Case::new("sample_sampled");
    let vars = [
        ("ALLOCTRACE_SAMPLE_BYTES", "64KiB"),
        ("ALLOCTRACE_SAMPLE_SEED", "12345"),
    ];
    assert_eq!(case.traced(&vars, &[&prog]), 0, "{}", case.err_head());
    let trace = case.trace();
    // Well formed, and not one unknown free.
    let bad = case.check_all();
    assert!(bad.is_empty(), "check: {bad:?}");
    let s = stats(&trace);
    assert_eq!(s.num("unknown_free"), 0);
    // Far fewer events than allocations, and the exact totals beside them.
    let allocs: f64 = SITES.iter().map(|s| s.2).sum();
    assert!(
        (s.num("heap_object_alloc") as f64) < allocs / 20.0,
        "{} allocations recorded",
        s.num("heap_object_alloc")
    );
    assert_eq!(s.num("sample_bytes"), 65536);
    assert!(
        s.num("total_allocs") as f64 >= allocs,
        "{}",
        s.num("total_allocs")
    );
    assert!(
        s.num("total_frees") as f64 >= allocs,
        "{}",
        s.num("total_frees")
    );
    let (sites, sampled) = bytes_by_function(&trace);
    assert_eq!(
        sampled,
        serde_json::json!({"sample_bytes": 65536, "estimated": true})
    );
    for (function, size, count) in SITES {
        let want = of(&exact_sites, function);
        assert_eq!(want, size * count, "{function} in the exact run");
        // A sum of count independent size * Bernoulli(p) / p.
        let p = 1.0 - (-size / MEAN).exp();
        let sd = (count * size * size * (1.0 - p) / p).sqrt();
        let got = of(&sites, function);
        assert!(
            (got - want).abs() <= 4.0 * sd + 1.0,
            "{function}: estimated {got}, exact {want}, sd {sd}"
        );
    }
}

#[test]
fn record_takes_sample_bytes() {
    let case = Case::new("sample_record");
    let out = case.path("t.trace");
    let rc = case.limited(
        &[("ALLOCTRACE_PRELOAD", shim())],
        &[
            cli(),
            "record",
            "--sample-bytes",
            "512KiB",
            "-o",
            &out,
            "--",
            &prog("prog_sample"),
            "10",
        ],
    );
    assert_eq!(rc, 0, "{}", case.err_head());
    // The report says the trace holds samples.
    let report = case.read("err");
    assert!(report.contains("sampled every 512"), "{report}");
    let s = stats(&out);
    assert_eq!(s.num("sample_bytes"), 512 << 10);
    assert_eq!(s.num("unknown_free"), 0);
    assert!(s.num("total_allocs") > 20_000, "{}", s.num("total_allocs"));
}

#[test]
fn every_entry_point_and_fork_under_sampling_leave_no_unknown_free() {
    // Every entry point (realloc's moves and failures among them) and a
    // fork, sampled finely: every trace checks, not one free unknown.
    let case = Case::new("sample_entry_points");
    let vars = [
        ("ALLOCTRACE_SAMPLE_BYTES", "256"),
        ("ALLOCTRACE_SAMPLE_SEED", "3"),
    ];
    let rc = case.traced(&vars, &[&prog("prog_entry_points")]);
    assert_eq!(rc, 0, "{}", case.err_head());
    let bad = case.check_all();
    assert!(bad.is_empty(), "check: {bad:?}");
    for trace in case.traces() {
        let s = stats(&trace);
        assert_eq!(s.num("unknown_free"), 0, "{trace}");
        assert_eq!(s.num("sample_bytes"), 256, "{trace}");
    }
    let s = stats(&case.trace());
    assert!(s.num("heap_object_alloc") > 0);
    assert!(s.num("total_allocs") > s.num("heap_object_alloc"));
}

#[test]
fn a_failed_realloc_leaves_the_totals_exact() {
    // prog_realloc_fail asks 2000 blocks to grow to SIZE_MAX / 2: each
    // block stays. Whichever way a failure goes (the traced path counts
    // the free before the call and the block's stay, an allocation, after
    // it; the fast path counts nothing), a run with the failures differs
    // from a run without them by as many allocations as frees.
    let totals = |name: &str, fails: &str| {
        let case = Case::new(name);
        let vars = [
            ("ALLOCTRACE_SAMPLE_BYTES", "64KiB"),
            ("ALLOCTRACE_SAMPLE_SEED", "5"),
        ];
        let rc = case.traced(&vars, &[&prog("prog_realloc_fail"), "2000", fails]);
        assert_eq!(rc, 0, "{}", case.err_head());
        let s = stats(&case.trace());
        assert_eq!(s.num("unknown_free"), 0);
        (s.num("total_allocs"), s.num("total_frees"))
    };
    let (allocs0, frees0) = totals("sample_realloc_ok", "0");
    let (allocs1, frees1) = totals("sample_realloc_fail", "1");
    assert!(
        (0..=2000).contains(&(frees1 - frees0)),
        "{frees1} - {frees0}"
    );
    assert_eq!(allocs1 - allocs0, frees1 - frees0, "allocations and frees");
}
