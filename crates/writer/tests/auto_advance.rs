//! A program that never calls advance still gets bounded generations: the
//! advancer thread ends a generation once it has written `generation_bytes`,
//! so a reader's memory stays bounded however long the trace.

mod common;

use alloctrace_reader::TraceReader;

#[test]
fn long_traces_are_cut_into_generations() {
    let dir = std::env::temp_dir().join(format!("alloctrace-auto-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("auto.trace");
    const BUDGET: u64 = 256 << 10;
    let config = alloctrace_writer::Config {
        buffer_size: 16 << 10,
        generation_bytes: BUDGET,
        ..Default::default()
    };
    common::start_to(&path, &config);
    const PAIRS: usize = 1_000_000;
    common::churn(PAIRS);
    alloctrace_writer::stop().unwrap();

    let size = std::fs::metadata(&path).unwrap().len();
    let mut reader =
        TraceReader::new(std::io::BufReader::new(std::fs::File::open(&path).unwrap())).unwrap();
    let mut count = 0usize;
    while reader.next_event().unwrap().is_some() {
        count += 1;
    }
    assert_eq!(count, 2 * PAIRS, "every event is still there");
    assert_eq!(reader.lost_events(), 0);
    // Without automatic advances this would be one generation. How far a
    // generation overshoots its budget depends on scheduling, so ask only
    // for several.
    assert!(
        reader.generations() >= 4,
        "{} generations for {size} bytes with a {BUDGET}-byte budget",
        reader.generations()
    );
    std::fs::remove_dir_all(&dir).ok();
}
