//! zstd compression in the writer thread: the trace reads back event for
//! event, and is much smaller than the same events uncompressed.

use std::ffi::CString;

use alloctrace_reader::TraceReader;
use alloctrace_writer::events;

fn record(path: &std::path::Path, compress: bool) -> Vec<(u64, u64)> {
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    let config = alloctrace_writer::Config {
        compress,
        buffer_size: 16 << 10,
        ..Default::default()
    };
    alloctrace_writer::start(
        &config,
        alloctrace_writer::Output::create(&cpath).unwrap(),
        None,
    )
    .unwrap();
    let workers: Vec<_> = (0..2usize)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..200_000usize {
                    let a = 0x5555_0000_0000 + t * 0x1000_0000 + (i * 2654435761 % 4096) * 32;
                    events::heap_object_alloc(a, 16 + (i % 240) as u64, 0);
                    events::heap_object_free(a);
                    if i % 50_000 == 0 {
                        let _ = alloctrace_writer::advance();
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    alloctrace_writer::stop().unwrap();
    let mut reader =
        TraceReader::new(std::io::BufReader::new(std::fs::File::open(path).unwrap())).unwrap();
    let mut out = Vec::new();
    while let Some(e) = reader.next_event().unwrap() {
        out.push((e.thread, e.addr));
    }
    assert_eq!(reader.truncated(), None);
    assert_eq!(reader.lost_events(), 0);
    out
}

#[test]
fn compressed_traces_read_back_exactly_and_smaller() {
    let dir = std::env::temp_dir().join(format!("alloctrace-zstd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plain = record(&dir.join("plain.trace"), false);
    let packed = record(&dir.join("packed.trace"), true);
    assert_eq!(plain.len(), 800_000);
    assert_eq!(packed.len(), 800_000);
    // Same events per thread, in the same order (thread IDs differ between
    // the two sessions only by their numbering).
    let per_thread = |v: &[(u64, u64)]| {
        let mut m: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
        for &(t, a) in v {
            m.entry(t).or_default().push(a);
        }
        let mut lists: Vec<Vec<u64>> = m.into_values().collect();
        lists.sort();
        lists
    };
    assert_eq!(per_thread(&plain), per_thread(&packed));
    let plain_size = std::fs::metadata(dir.join("plain.trace")).unwrap().len();
    let packed_size = std::fs::metadata(dir.join("packed.trace")).unwrap().len();
    assert!(
        packed_size * 2 < plain_size,
        "compressed {packed_size} bytes vs {plain_size} plain"
    );
    std::fs::remove_dir_all(&dir).ok();
}
