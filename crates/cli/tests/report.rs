//! `alloctrace report` end to end: c_tests/reports/leaky.c (built with and
//! without frame pointers) recorded under the shim, its report checked for
//! the program's known leaks, peak and temporaries by function name and
//! source line, then opened in headless Chromium (Debian's `chromium`):
//! it must load without a console message, its script must run to its
//! end, and a screenshot must show the timeline chart's lines. A trace of
//! over a million events gives a page of bounded size.
//!
//! Without `chromium` on the PATH the browser checks are skipped, and the
//! test says so. Needs gcc and the shim next to the `alloctrace` binary
//! (`cargo build -p alloctrace-preload`), as tests/stacks.rs.

use std::path::{Path, PathBuf};
use std::process::Command;

mod support;

use support::{compile, repo, Scratch};

/// `alloctrace record -o TRACE -- PROG ARGS` under the shim.
fn record(trace: &Path, prog: &Path, args: &[&str]) {
    support::record(&[], trace, prog, args);
    assert!(trace.is_file(), "no trace at {}", trace.display());
}

/// `alloctrace report TRACE -o HTML`; the page's text.
fn report(trace: &Path, html: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .arg("report")
        .arg(trace)
        .arg("-o")
        .arg(html)
        .output()
        .expect("run alloctrace report");
    assert!(
        out.status.success(),
        "report: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(html).expect("read the report")
}

/// The text between `<section id="ID">` and its end.
fn section<'a>(html: &'a str, id: &str) -> &'a str {
    let start = html
        .find(&format!("<section id=\"{id}\">"))
        .unwrap_or_else(|| panic!("no section {id}"));
    let end = html[start..].find("</section>").expect("section end") + start;
    &html[start..end]
}

/// A table row of a section: its numeric cells' values, and the innermost
/// function and file:line its stack cell names.
struct Row {
    values: Vec<u64>,
    function: String,
    location: String,
}

fn rows(section: &str) -> Vec<Row> {
    let mut out = Vec::new();
    for tr in section.split("<tr>").skip(1) {
        let tr = tr.split("</tr>").next().unwrap();
        if tr.contains("<th>") {
            continue;
        }
        let values = tr
            .split("data-v=\"")
            .skip(1)
            .map(|v| v.split('"').next().unwrap().parse().expect("a number"))
            .collect();
        let function = tr
            .split("<summary><span class=\"fn\">")
            .nth(1)
            .map(|f| f.split('<').next().unwrap().to_string())
            .unwrap_or_default();
        let location = tr
            .split("</summary>")
            .next()
            .and_then(|s| s.split("<span class=\"loc\">").nth(1))
            .map(|l| l.split('<').next().unwrap().to_string())
            .unwrap_or_default();
        out.push(Row {
            values,
            function,
            location,
        });
    }
    out
}

/// Every resource the page refers to is in the page.
fn assert_self_contained(html: &str) {
    for needle in [
        "src=\"http",
        "href=\"http",
        "src=\"//",
        "href=\"//",
        "url(http",
        "url(//",
        "@import",
        "<link",
    ] {
        assert!(!html.contains(needle), "the page refers to {needle}...");
    }
}

fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("chromium"))
        .find(|p| p.is_file())
}

/// Runs headless Chromium on `page` with `args`; its stderr.
fn run_chromium(chromium: &Path, dir: &Scratch, page: &Path, args: &[&str]) -> (String, String) {
    let profile = dir.path("chromium-profile");
    let out = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Console messages (errors, uncaught exceptions) Chromium logged.
fn console_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE") || l.contains("Uncaught"))
        .collect()
}

/// The numbers of the one row whose innermost frame is `name` (in
/// leaky.c, with a line).
fn row_of(rows: &[Row], name: &str) -> Vec<u64> {
    let hits: Vec<&Row> = rows.iter().filter(|r| r.function == name).collect();
    assert_eq!(
        hits.len(),
        1,
        "{name}: rows {:?}",
        rows.iter().map(|r| &r.function).collect::<Vec<_>>()
    );
    assert!(
        hits[0].location.starts_with("leaky.c:"),
        "{name} at {:?}",
        hits[0].location
    );
    hits[0].values.clone()
}

#[test]
fn the_report_of_leaky_names_its_leaks_peak_and_temporaries_and_loads_in_chromium() {
    let dir = Scratch::new("leaky");
    let src = repo().join("c_tests/reports/leaky.c");
    // With and without frame pointers: the same page.
    let mut pages = Vec::new();
    for (name, flags) in [
        ("leaky_fp", ["-O0", "-fno-omit-frame-pointer"]),
        ("leaky_nofp", ["-O2", "-fomit-frame-pointer"]),
    ] {
        let prog = dir.path(name);
        let mut args = vec!["-g", "-Wall", "-Werror"];
        args.extend_from_slice(&flags);
        args.extend_from_slice(&[src.to_str().unwrap(), "-o", prog.to_str().unwrap()]);
        compile("gcc", &args);
        let trace = dir.path(&format!("{name}.trace"));
        record(&trace, &prog, &[]);
        let page = dir.path(&format!("{name}.html"));
        let html = report(&trace, &page);
        check_leaky(&html, name, &prog);
        pages.push(page);
    }
    // On another machine: the symbols written beside the trace name the
    // functions once the program is gone.
    let trace = dir.path("leaky_fp.trace");
    let out = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .arg("symbolize")
        .arg(&trace)
        .output()
        .expect("run alloctrace symbolize");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(dir.path("leaky_fp")).expect("remove the program");
    let html = report(&trace, &dir.path("moved.html"));
    check_leaky(&html, "leaky_fp", &dir.path("leaky_fp"));

    let Some(chromium) = chromium() else {
        eprintln!("report test: skipped the browser checks: chromium is not installed (apt-get install chromium)");
        return;
    };
    let page = &pages[0];
    // The page's script ran to its end, and nothing was logged to the
    // console (an uncaught exception would be).
    let (dom, stderr) = run_chromium(&chromium, &dir, page, &["--dump-dom"]);
    assert!(
        dom.contains("data-report-ready=\"yes\""),
        "the page's script did not finish"
    );
    assert_eq!(console_lines(&stderr), Vec::<&str>::new());
    // The screenshot shows the timeline: many pixels of the total and
    // heap lines' colours (their legend swatches have 66 each).
    let shot = dir.path("shot.png");
    let (_, stderr) = run_chromium(
        &chromium,
        &dir,
        page,
        &[
            "--window-size=1280,1000",
            "--hide-scrollbars",
            &format!("--screenshot={}", shot.display()),
        ],
    );
    assert_eq!(console_lines(&stderr), Vec::<&str>::new());
    let (width, pixels) = decode_rgb(&shot);
    let line = pixels.iter().filter(|p| close(**p, [33, 102, 172])).count();
    let heap = pixels.iter().filter(|p| close(**p, [230, 120, 20])).count();
    assert!(
        line > 300 && heap > 300,
        "the screenshot ({width} px wide) shows {line} pixels of the total line, {heap} of the heap line"
    );
    let distinct: std::collections::HashSet<[u8; 3]> = pixels.iter().copied().collect();
    assert!(distinct.len() > 50, "{} colours", distinct.len());
}

/// leaky.c's known leaks, peak and temporaries, by function.
fn check_leaky(html: &str, name: &str, prog: &Path) {
    assert_self_contained(html);
    // Leaks: make_name's 100 blocks of 32 bytes, build_table's 7 of 1,000
    // (the C library's own blocks may come too). Leaked bytes, objects,
    // allocations:
    let leaks = rows(section(html, "r-leaks"));
    assert_eq!(row_of(&leaks, "make_name"), vec![3200, 100, 100]);
    assert_eq!(row_of(&leaks, "build_table"), vec![7000, 7, 7]);
    // The peak: fill_cache's 20 blocks of 64 KiB and make_name's 100
    // were live; build_table's came after. Live bytes, share, objects,
    // allocations, bytes:
    let peak = rows(section(html, "r-peak"));
    let fill = row_of(&peak, "fill_cache");
    assert_eq!((fill[0], fill[2], fill[3]), (1_310_720, 20, 20));
    let names = row_of(&peak, "make_name");
    assert_eq!((names[0], names[2]), (3200, 100));
    assert!(!peak.iter().any(|r| r.function == "build_table"));
    // Temporaries: scratch's 50 (temporary, allocations).
    let temporary = rows(section(html, "r-temporary"));
    assert_eq!(row_of(&temporary, "scratch")[..2], [50, 50]);
    // The flamegraph of the peak has the functions; the charts; the facts.
    let peak_section = section(html, "r-peak");
    let svg = &peak_section[peak_section.find("<svg").expect("a flamegraph")..];
    for f in ["fill_cache", "make_name", "main"] {
        assert!(svg.contains(f), "{f} not in the flamegraph");
    }
    assert!(html.contains("id=\"r-timeline-chart\""));
    assert!(html.contains("id=\"r-sizes-chart\""));
    assert!(html.contains("id=\"r-lifetimes-chart\""));
    let run = section(html, "r-run");
    assert!(run.contains(&format!("{name}.trace")));
    // The command line the trace records.
    assert!(
        run.contains(&format!("<code>{}</code>", prog.display())),
        "{run}"
    );
}

fn close(a: [u8; 3], b: [u8; 3]) -> bool {
    a.iter().zip(b).all(|(x, y)| x.abs_diff(y) <= 12)
}

/// A PNG's width and its pixels as RGB.
fn decode_rgb(path: &Path) -> (u32, Vec<[u8; 3]>) {
    let file = std::fs::File::open(path).expect("open the screenshot");
    let mut decoder = png::Decoder::new(std::io::BufReader::new(file));
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("a size")];
    let info = reader.next_frame(&mut buf).expect("a frame");
    let channels = info.color_type.samples();
    let pixels = buf[..info.buffer_size()]
        .chunks_exact(channels)
        .map(|p| match channels {
            1 | 2 => [p[0], p[0], p[0]],
            _ => [p[0], p[1], p[2]],
        })
        .collect();
    (info.width, pixels)
}

/// A program of many allocations on 100 call paths of depths 1 to 100.
const MANY: &str = r#"
#include <stdlib.h>
static void *keep[64];
__attribute__((noinline)) void *down(int depth, size_t size) {
    if (depth == 0)
        return malloc(size);
    void *p = down(depth - 1, size);
    __asm__ volatile("" ::: "memory");
    return p;
}
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000;
    for (long i = 0; i < n; i++) {
        void *p = down((int)(i % 100), 16 + (size_t)(i % 4000));
        if (i % 1000 == 0) {
            free(keep[(i / 1000) % 64]);
            keep[(i / 1000) % 64] = p;
        } else {
            free(p);
        }
    }
    return 0;
}
"#;

#[test]
fn the_report_of_a_million_events_stays_small() {
    let dir = Scratch::new("many");
    let src = dir.path("many.c");
    std::fs::write(&src, MANY).expect("write the program");
    let prog = dir.path("many");
    compile(
        "gcc",
        &[
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-fno-optimize-sibling-calls",
            src.to_str().unwrap(),
            "-o",
            prog.to_str().unwrap(),
        ],
    );
    let trace = dir.path("many.trace");
    record(&trace, &prog, &["600000"]);
    let page = dir.path("many.html");
    let html = report(&trace, &page);
    let events: u64 = {
        let run = section(&html, "r-run");
        let after = run.split("<dt>Events</dt><dd>").nth(1).expect("events");
        after
            .split('<')
            .next()
            .unwrap()
            .replace(',', "")
            .parse()
            .expect("a count")
    };
    assert!(events >= 1_200_000, "{events} events");
    // Bounded: at most 2,000 timeline buckets, 50 rows per table.
    let data = html
        .split("id=\"r-timeline-data\">")
        .nth(1)
        .and_then(|d| d.split("</script>").next())
        .expect("timeline data");
    let data: serde_json::Value = serde_json::from_str(data).expect("JSON");
    let buckets = data["t"].as_array().expect("times").len();
    assert!((500..=2000).contains(&buckets), "{buckets} buckets");
    assert!(rows(section(&html, "r-peak")).len() <= 50);
    let size = html.len();
    eprintln!("report of {events} events: {size} bytes of HTML, {buckets} timeline buckets");
    assert!(size < 3 << 20, "{size} bytes of HTML");
    assert_self_contained(&html);
}

/// A C-API style trace (the reader's test builder): typed heap objects,
/// one type with a hostile name, and a span.
fn typed_trace() -> Vec<u8> {
    use alloctrace_reader::testing::{info, EventsBody, TraceBuilder};
    use alloctrace_reader::{EventData, TypeInfo};
    let g = info(1);
    let mut b = EventsBody::new(1000);
    let mut ticks = 1000;
    for i in 0..40u64 {
        ticks += 10;
        b.event(
            &g,
            ticks,
            0x10000 + i * 0x100,
            &EventData::HeapObjectAlloc {
                size: 48,
                type_id: 1 + i % 2,
            },
        );
    }
    ticks += 10;
    b.event(
        &g,
        ticks,
        0x400000,
        &EventData::SpanAlloc {
            npages: 4,
            kind_class: 3,
        },
    );
    for i in 0..10u64 {
        ticks += 10;
        b.event(&g, ticks, 0x10000 + i * 0x100, &EventData::HeapObjectFree);
    }
    let types = [
        TypeInfo {
            id: 1,
            size: 48,
            ptr_bytes: 16,
            name: "struct node".into(),
        },
        TypeInfo {
            id: 2,
            size: 48,
            ptr_bytes: 0,
            name: "<script>alert(1)</script><img src=x onerror=alert(2)>".into(),
        },
    ];
    let mut t = TraceBuilder::new();
    t.info(&g)
        .types(1, &types)
        .events(1, 1, &b)
        .generation_end(1, ticks + 10, 5_000_000 + (ticks + 10 - 1000), 0)
        .trace_end(1);
    t.finish()
}

#[test]
fn types_spans_and_hostile_names_in_a_c_api_trace() {
    let dir = Scratch::new("typed");
    let trace = dir.path("typed.trace");
    std::fs::write(&trace, typed_trace()).expect("write the trace");
    let page = dir.path("typed.html");
    let html = report(&trace, &page);
    assert_self_contained(&html);
    assert!(!html.contains("<script>alert"), "a type name got through");
    assert!(!html.contains("<img src=x"), "a type name got through");
    let types = section(&html, "r-types");
    assert!(types.contains("struct node"));
    assert!(
        types.contains("&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;")
    );
    // Per type: allocations, bytes, at peak, share, leaked bytes,
    // temporary. 20 of each type, 5 of each freed; the span has no type.
    let rows = rows(types);
    assert_eq!(rows.len(), 3);
    assert!(types.contains("(no type)"));
    assert_eq!(rows[0].values[..2], [1, 16384]);
    for r in &rows[1..] {
        assert_eq!(r.values[0], 20);
        assert_eq!(r.values[1], 960);
        assert_eq!(r.values[4], 15 * 48);
    }
    // The run's facts: the builder's pid and start.
    let run = section(&html, "r-run");
    assert!(run.contains("4242"));
    assert!(run.contains("2023-11-14T22:13:20Z"), "{run}");
    // The span is in the peak: 40 objects of 48 bytes and 4 pages.
    let peak = section(&html, "r-peak");
    assert!(peak.contains("Peak: 17.9 KiB live"), "{peak}");
}

#[test]
fn bad_options_and_outputs_are_refused_before_reading() {
    let dir = Scratch::new("refused");
    let trace = dir.path("typed.trace");
    std::fs::write(&trace, typed_trace()).expect("write the trace");
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
            .arg("report")
            .args(args)
            .output()
            .expect("run alloctrace report");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let t = trace.to_str().unwrap();
    // No output, no rows, an output in a missing directory, the trace
    // itself as the output: exit 1, the trace untouched.
    let (code, err) = run(&[t]);
    assert_eq!(code, Some(1), "{err}");
    let (code, err) = run(&[t, "-o", dir.path("x.html").to_str().unwrap(), "-n", "0"]);
    assert_eq!(code, Some(1), "{err}");
    let missing = dir.path("no/such/dir/x.html");
    let (code, err) = run(&[t, "-o", missing.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("cannot write"), "{err}");
    let (code, err) = run(&[t, "-o", t]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("is the input trace"), "{err}");
    assert_eq!(std::fs::read(&trace).unwrap(), typed_trace());
    // A trace that cannot be read leaves no page behind.
    let page = dir.path("none.html");
    let (code, err) = run(&[
        dir.path("absent.trace").to_str().unwrap(),
        "-o",
        page.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(!page.exists());
}
