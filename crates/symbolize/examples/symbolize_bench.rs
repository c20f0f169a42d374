//! Symbolization speed: N distinct return addresses spread evenly over a
//! library's executable sections, each symbolized once (a cold cache, as
//! `alloctrace symbolize` meets them), then all again (the cache).
//!
//! `cargo run --release -p alloctrace-symbolize --example symbolize_bench -- LIB [N]`
//! (N defaults to 100000). With a `.symbols` file instead of LIB: the time
//! to load it.

use std::time::Instant;

use alloctrace_symbolize::{ModuleKey, Options, Quality, Symbolizer};
use object::{Object, ObjectSection, SectionKind};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: symbolize_bench LIB [N]");
        std::process::exit(2);
    };
    if path.ends_with(".symbols") {
        let start = Instant::now();
        let mut sym = Symbolizer::new(Options::default());
        sym.load_symbols(std::path::Path::new(path))
            .expect("a symbols file");
        println!("{path}: loaded in {:.3} s", start.elapsed().as_secs_f64());
        return;
    }
    let n: u64 = args.get(2).map_or(100_000, |a| a.parse().expect("N"));
    let data = std::fs::read(path).expect("read the library");
    let file = object::File::parse(&*data).expect("an ELF file");
    let build_id = file.build_id().ok().flatten().unwrap_or_default().to_vec();
    let ranges: Vec<(u64, u64)> = file
        .sections()
        .filter(|s| s.kind() == SectionKind::Text && s.size() > 0)
        .map(|s| (s.address(), s.size()))
        .collect();
    let total: u64 = ranges.iter().map(|r| r.1).sum();
    let step = (total / n).max(1);
    let mut offsets = Vec::new();
    let mut at = 0;
    while offsets.len() < n as usize && at < total {
        let mut rest = at;
        for &(start, size) in &ranges {
            if rest < size {
                offsets.push(start + rest + 1);
                break;
            }
            rest -= size;
        }
        at += step;
    }
    let module = ModuleKey {
        path: path.clone(),
        build_id,
    };
    let mut sym = Symbolizer::new(Options::default());
    let start = Instant::now();
    let mut counts = [0usize; 3];
    for &o in &offsets {
        counts[sym.resolve(&module, o).0 as usize] += 1;
    }
    let cold = start.elapsed();
    let start = Instant::now();
    for &o in &offsets {
        assert!(!sym.symbolize(&module, o).is_empty());
    }
    let warm = start.elapsed();
    println!(
        "{path}: {} addresses over {total} bytes of code: {:.3} s ({:.0} addresses/s), cached again {:.3} s; {} with source lines, {} symbols only, {} module+offset",
        offsets.len(),
        cold.as_secs_f64(),
        offsets.len() as f64 / cold.as_secs_f64(),
        warm.as_secs_f64(),
        counts[Quality::Source as usize],
        counts[Quality::Symbol as usize],
        counts[Quality::Module as usize],
    );
    for w in sym.warnings() {
        println!("warning: {w}");
    }
}
