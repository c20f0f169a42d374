//! A program that never calls advance still gets bounded generations: the
//! advancer thread ends a generation once it has written `generation_bytes`,
//! so a reader's memory stays bounded however long the trace.

use std::ffi::CString;

use alloctrace_reader::TraceReader;
use alloctrace_writer::events;

#[test]
fn long_traces_are_cut_into_generations() {
    let dir = std::env::temp_dir().join(format!("alloctrace-auto-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("auto.trace");
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    const BUDGET: u64 = 256 << 10;
    let config = alloctrace_writer::Config {
        buffer_size: 16 << 10,
        generation_bytes: BUDGET,
        ..Default::default()
    };
    alloctrace_writer::start(
        &config,
        alloctrace_writer::Output::create(&cpath).unwrap(),
        None,
    )
    .unwrap();
    const PAIRS: usize = 1_000_000;
    for i in 0..PAIRS {
        // Give the advancer thread a chance to run on a loaded machine.
        if i % 50_000 == 0 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        // Spread addresses so events take several bytes each.
        let a = 0x10_0000_0000 + (i * 7919 % 1_000_003) * 16;
        events::heap_object_alloc(a, 48, 0);
        events::heap_object_free(a);
    }
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
