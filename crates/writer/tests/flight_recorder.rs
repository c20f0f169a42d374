//! The flight recorder (writer/flight.rs): the writer keeps the last
//! complete generations in a ring bounded by its size, writes nothing to
//! the output until a trigger, and a dump is a trace of its own with the
//! flight-recorder window flag: the C API's write (here its Rust call), the
//! RSS threshold, and a fatal-signal flush. Combined with sampling, a dump
//! keeps the sampling parameter and the window's exact totals, and the
//! ring stays within its size.

mod common;

use std::ffi::CString;
use std::path::Path;
use std::sync::Mutex;

use alloctrace_reader::{EventData, Record, TraceReader};
use alloctrace_writer::{events, Config, Error, Output};

/// The session is process-wide: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("alloctrace-flight-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// What a dump holds: its window flag, its generations in order, its
/// heap allocations by address, whether it was cut.
struct Dump {
    window: bool,
    generations: Vec<u64>,
    allocs: Vec<u64>,
    truncated: Option<u64>,
}

fn read(path: &Path) -> Dump {
    let bytes = std::fs::read(path).unwrap();
    let mut reader = TraceReader::new(&bytes[..]).unwrap();
    let mut d = Dump {
        window: reader.flight_window(),
        generations: Vec::new(),
        allocs: Vec::new(),
        truncated: None,
    };
    while let Some(record) = reader.next_record().unwrap() {
        match record {
            Record::GenerationStart { generation } => d.generations.push(generation),
            Record::Event(e) => {
                if let EventData::HeapObjectAlloc { .. } = e.data {
                    d.allocs.push(e.addr);
                }
            }
        }
    }
    d.truncated = reader.truncated();
    d
}

fn write_dump(path: &Path) -> (u64, u64) {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    let out = Output::create(&c).unwrap();
    let r = alloctrace_writer::flight_recorder_write(&out).unwrap();
    drop(out);
    r
}

#[test]
fn a_dump_holds_exactly_the_generations_up_to_the_call() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let d = dir("moment");
    let config = Config {
        flight_recorder: 64 << 20,
        ..Default::default()
    };
    common::start_to(&d.join("out.trace"), &config);
    for g in 1..=5u64 {
        events::heap_object_alloc(0x10_0000_0000 + g as usize * 64, 32, 0);
        if g < 5 {
            alloctrace_writer::advance().unwrap();
        }
    }
    assert_eq!(write_dump(&d.join("a.trace")), (1, 5));
    let a = read(&d.join("a.trace"));
    assert!(a.window);
    assert_eq!(a.generations, [1, 2, 3, 4, 5]);
    assert_eq!(
        a.allocs.len(),
        5,
        "the last allocation, just before the call, too"
    );
    assert_eq!(a.truncated, None);
    // The write ended generation 5; two more advances, then a second dump.
    events::heap_object_alloc(0x20_0000_0000, 32, 0);
    alloctrace_writer::advance().unwrap();
    alloctrace_writer::advance().unwrap();
    assert_eq!(write_dump(&d.join("b.trace")), (1, 8));
    let b = read(&d.join("b.trace"));
    assert_eq!(b.generations, (1..=8).collect::<Vec<_>>());
    assert!(b.allocs.contains(&0x20_0000_0000));
    alloctrace_writer::stop().unwrap();
    assert_eq!(
        std::fs::metadata(d.join("out.trace")).unwrap().len(),
        0,
        "nothing reaches the output at a normal stop"
    );
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn the_ring_stays_within_its_size_over_a_long_run() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let d = dir("bounded");
    const SIZE: u64 = 1 << 20;
    let config = Config {
        flight_recorder: SIZE,
        buffer_size: 16 << 10,
        ..Default::default()
    };
    common::start_to(&d.join("out.trace"), &config);
    // About 20 MiB of events through a 1 MiB ring.
    common::churn(2_000_000);
    let (first, last) = write_dump(&d.join("dump.trace"));
    let stats = alloctrace_writer::flight_stats().unwrap();
    alloctrace_writer::stop().unwrap();
    assert_eq!(stats.capacity, SIZE);
    assert!(stats.high_water <= stats.capacity, "{stats:?}");
    assert!(stats.evicted > 0 && first > 1, "{stats:?}");
    assert!(
        last > first,
        "the ring holds several generations: {stats:?}"
    );
    let size = std::fs::metadata(d.join("dump.trace")).unwrap().len();
    assert!(
        size <= SIZE + 16 + 32,
        "the dump ({size} bytes) is what the ring held"
    );
    let dump = read(&d.join("dump.trace"));
    assert!(dump.window);
    assert_eq!(dump.generations, (first..=last).collect::<Vec<_>>());
    assert_eq!(dump.truncated, None);
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn a_sampled_flight_recorder_keeps_its_parameter_and_exact_totals() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let d = dir("sampled");
    const SIZE: u64 = 1 << 20;
    const MEAN: u64 = 512;
    const OBJECT: u64 = 48;
    let config = Config {
        flight_recorder: SIZE,
        buffer_size: 16 << 10,
        min_heap_align: 16,
        sample_bytes: MEAN,
        sample_seed: 7,
        ..Default::default()
    };
    common::start_to(&d.join("out.trace"), &config);
    // About 9% of 3 M allocations (of 48 bytes) sampled, their frees
    // too: several MiB of events through a 1 MiB ring.
    const PAIRS: usize = 3_000_000;
    common::churn(PAIRS);
    let (first, last) = write_dump(&d.join("dump.trace"));
    let stats = alloctrace_writer::flight_stats().unwrap();
    alloctrace_writer::stop().unwrap();
    assert!(stats.high_water <= stats.capacity, "{stats:?}");
    assert!(stats.evicted > 0 && first > 1 && last > first, "{stats:?}");
    let size = std::fs::metadata(d.join("dump.trace")).unwrap().len();
    assert!(
        size <= SIZE + 16 + 32,
        "the dump ({size} bytes) is the ring's"
    );

    let bytes = std::fs::read(d.join("dump.trace")).unwrap();
    let mut reader = TraceReader::new(&bytes[..]).unwrap();
    assert!(reader.flight_window());
    let (mut sampled, mut estimated, mut generations) = (0u64, 0f64, Vec::new());
    while let Some(record) = reader.next_record().unwrap() {
        match record {
            Record::GenerationStart { generation } => generations.push(generation),
            Record::Event(e) => {
                if let EventData::HeapObjectAlloc { size, .. } = e.data {
                    sampled += 1;
                    estimated += size as f64 * reader.info().unwrap().sample_weight(size);
                }
            }
        }
    }
    assert_eq!(reader.truncated(), None);
    assert_eq!(generations, (first..=last).collect::<Vec<_>>());
    assert_eq!(
        reader.sample_bytes(),
        MEAN,
        "the parameter is in the window"
    );
    // The generation ends' exact totals, of the window's generations only.
    let totals = reader.totals();
    assert!(
        totals.allocs > sampled && totals.allocs < PAIRS as u64,
        "{totals:?}, {sampled} sampled"
    );
    assert_eq!(totals.alloc_bytes, totals.allocs * OBJECT, "{totals:?}");
    // Each object freed at once: a pair split by the window's start at
    // most adds a free.
    assert!(totals.frees <= totals.allocs + 1, "{totals:?}");
    assert_eq!(totals.sample_overflow, 0, "{totals:?}");
    // The window's estimate stands for its exact bytes (a fixed seed; some
    // thousands of samples: within a few percent).
    let exact = totals.alloc_bytes as f64;
    assert!(
        (estimated / exact - 1.0).abs() < 0.1,
        "estimated {estimated} of {exact} bytes"
    );
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn the_rss_threshold_dumps_to_the_output_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let d = dir("rss");
    let out = d.join("out.trace");
    let config = Config {
        flight_recorder: 4 << 20,
        dump_on_rss: 1,
        ..Default::default()
    };
    common::start_to(&out, &config);
    events::heap_object_alloc(0x30_0000_0000, 32, 0);
    // The writer thread reads the RSS within milliseconds; a loaded
    // machine may take longer: wait for the dump, up to a minute.
    let since = std::time::Instant::now();
    while alloctrace_writer::flight_stats().is_some_and(|s| s.dumps == 0)
        && since.elapsed() < std::time::Duration::from_secs(60)
    {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    events::heap_object_alloc(0x40_0000_0000, 32, 0);
    alloctrace_writer::stop().unwrap();
    let dump = read(&out);
    assert!(dump.window);
    assert_eq!(dump.truncated, None);
    assert_eq!(dump.generations.first(), Some(&1));
    assert!(dump.allocs.contains(&0x30_0000_0000), "{:?}", dump.allocs);
    assert!(
        !dump.allocs.contains(&0x40_0000_0000),
        "once: nothing after the threshold's dump"
    );
    std::fs::remove_dir_all(&d).ok();
}

static FLUSHED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_usr1(_: libc::c_int) {
    let r = alloctrace_writer::flush_for_fatal_signal();
    FLUSHED.store(r.ended && r.drained, std::sync::atomic::Ordering::SeqCst);
}

#[test]
fn a_fatal_signal_flush_writes_the_ring() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let d = dir("crash");
    let out = d.join("out.trace");
    let config = Config {
        flight_recorder: 4 << 20,
        ..Default::default()
    };
    common::start_to(&out, &config);
    events::heap_object_alloc(0x50_0000_0000, 32, 0);
    alloctrace_writer::advance().unwrap();
    events::heap_object_alloc(0x60_0000_0000, 32, 0);
    // SAFETY: installs a handler for SIGUSR1, then raises it on this thread.
    unsafe {
        libc::signal(libc::SIGUSR1, on_usr1 as *const () as libc::sighandler_t);
        libc::raise(libc::SIGUSR1);
        libc::signal(libc::SIGUSR1, libc::SIG_DFL);
    }
    assert!(FLUSHED.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(alloctrace_writer::stop(), Err(Error::NotStarted));
    let dump = read(&out);
    assert!(dump.window);
    assert_eq!(dump.generations, [1, 2]);
    assert_eq!(dump.allocs, [0x50_0000_0000, 0x60_0000_0000]);
    assert_eq!(dump.truncated, None);
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn bad_flight_recorder_settings_are_refused() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let bad = |c: Config| c.validate().unwrap_err();
    assert!(matches!(
        bad(Config {
            flight_recorder: 1000,
            ..Default::default()
        }),
        Error::BadConfig(m) if m.contains("flight_recorder")
    ));
    assert!(matches!(
        bad(Config {
            dump_on_rss: 1 << 30,
            ..Default::default()
        }),
        Error::BadConfig(m) if m.contains("dump_on_rss")
    ));
    let d = dir("bad");
    common::start_to(&d.join("out.trace"), &Config::default());
    let c = CString::new(d.join("x.trace").to_str().unwrap()).unwrap();
    assert!(matches!(
        alloctrace_writer::flight_recorder_write(&Output::create(&c).unwrap()),
        Err(Error::BadConfig(_))
    ));
    alloctrace_writer::stop().unwrap();
    assert_eq!(
        alloctrace_writer::flight_recorder_write(&Output::create(&c).unwrap()),
        Err(Error::NotStarted)
    );
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn an_age_keeps_only_the_generations_of_the_last_that_long() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let d = dir("age");
    let config = Config {
        flight_recorder: 64 << 20,
        flight_recorder_age_ms: 1000,
        ..Default::default()
    };
    common::start_to(&d.join("out.trace"), &config);
    const OLD: u64 = 0x30_0000_0000;
    const NEW: u64 = 0x40_0000_0000;
    events::heap_object_alloc(OLD as usize, 32, 0);
    alloctrace_writer::advance().unwrap();
    // The advancer ends a generation every 125 ms meanwhile, and the
    // ring drops those that ended more than 1 s before each end.
    std::thread::sleep(std::time::Duration::from_millis(3000));
    events::heap_object_alloc(NEW as usize, 32, 0);
    let (first, last) = write_dump(&d.join("aged.trace"));
    assert!(first >= 2, "generation 1 was dropped: {first}..{last}");
    let aged = read(&d.join("aged.trace"));
    assert!(aged.window);
    assert!(aged.allocs.contains(&NEW), "the last allocation is kept");
    assert!(
        !aged.allocs.contains(&OLD),
        "the allocation of 3 s ago is older than the age"
    );
    assert_eq!(aged.truncated, None);
    alloctrace_writer::stop().unwrap();
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn an_age_needs_the_flight_recorder_and_a_second_at_least() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    for (flight, age) in [(0, 1000), (64 << 20, 999), (64 << 20, 8 * 24 * 3600 * 1000)] {
        let config = Config {
            flight_recorder: flight,
            flight_recorder_age_ms: age,
            ..Default::default()
        };
        assert!(
            matches!(config.validate(), Err(Error::BadConfig(why)) if why.contains("flight_recorder_age_ms")),
            "{flight} {age}"
        );
    }
}
