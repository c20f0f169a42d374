//! The report's HTML: one page, its CSS, script, charts and flamegraph
//! inline. Every string from the trace goes through [`esc`].

use std::fmt::Write as _;

use alloctrace_analysis::{
    log2_bucket_min, Histogram, Memory, Pass, Profile, Resolver, Series, Site, SourceFrame,
    StackId, Summary, Timeline,
};
use base64::Engine as _;
use plotters::style::RGBColor;

use super::charts::{self, Line};
use super::{FLAME_DEPTH, FLAME_STACKS, MAX_FRAMES, MAX_NAME};
use crate::units::{self, Decimals};

const CSS: &str = include_str!("style.css");
const SCRIPT: &str = include_str!("script.js");

const TOTAL_COLOR: RGBColor = RGBColor(33, 102, 172);
const HEAP_COLOR: RGBColor = RGBColor(230, 120, 20);
const SPAN_COLOR: RGBColor = RGBColor(40, 150, 70);
const BAR_COLOR: RGBColor = RGBColor(70, 130, 180);

/// What the page shows.
pub struct Model<'a> {
    /// The traces' names, as given.
    pub files: &'a [String],
    pub pass: &'a Pass,
    pub profile: &'a Profile,
    pub timeline: &'a Timeline,
    pub summary: &'a Summary,
    /// Rows per table.
    pub rows: usize,
    pub resolver: &'a mut Resolver,
}

/// `s` safe in HTML text and in quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Control characters other than tab and newline show as U+FFFD.
            c if c.is_control() && c != '\t' && c != '\n' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// At most [`MAX_NAME`] characters of `s`, with an ellipsis when cut.
fn clip(s: &str) -> String {
    match s.char_indices().nth(MAX_NAME) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// A chart's SVG as an image (the charts need no script; as images their
/// styles and IDs cannot clash with the page's or the flamegraph's).
fn svg_img(svg: &str, alt: &str, id: &str) -> String {
    let data = base64::engine::general_purpose::STANDARD.encode(svg.as_bytes());
    format!(
        "<img id=\"{id}\" class=\"chart\" alt=\"{}\" src=\"data:image/svg+xml;base64,{data}\">",
        esc(alt)
    )
}

/// One section of the page: its anchor, its link in the navigation, and
/// what writes its body (all between `<section id=...>` and
/// `</section>`). [`SECTIONS`] drives both the navigation and the page.
struct Section(
    /// The anchor (`<section id=...>`).
    &'static str,
    /// The link's text.
    &'static str,
    /// Writes the body.
    fn(&mut String, &mut Model, &Shared),
);

/// What several sections show, computed once.
struct Shared {
    /// Every trace's live memory over time, merged.
    merged: Series,
    /// The allocation sites, by stack.
    sites: Vec<(StackId, Site)>,
}

/// The page's sections, in order. A Symbols section follows them when
/// the symbolizer has warnings (it has no link).
const SECTIONS: [Section; 9] = [
    Section("r-run", "Run", run_section),
    Section("r-timeline", "Live memory", timeline_section),
    Section("r-peak", "Peak", peak_section),
    Section("r-leaks", "Leaks", leaks_section),
    Section("r-temporary", "Temporary", temporary_section),
    Section("r-sizes", "Sizes", sizes_section),
    Section("r-lifetimes", "Lifetimes", lifetimes_section),
    Section("r-threads", "Threads", threads_section),
    Section("r-types", "Types", types_section),
];

pub fn render(m: &mut Model) -> String {
    let mut h = String::with_capacity(256 * 1024);
    let title = if m.files.len() == 1 {
        m.files[0].clone()
    } else {
        format!("{} traces", m.files.len())
    };
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"generator\" content=\"alloctrace {}\">\n\
         <title>alloctrace report: {}</title>\n<style>\n{CSS}</style>\n</head>\n<body>\n",
        env!("CARGO_PKG_VERSION"),
        esc(&clip(&title))
    );
    let _ = write!(
        h,
        "<header><h1>alloctrace report</h1><p class=\"files\">{}</p>\n<nav>",
        m.files
            .iter()
            .map(|f| format!("<code>{}</code>", esc(&clip(f))))
            .collect::<Vec<_>>()
            .join(" ")
    );
    for Section(id, nav, _) in &SECTIONS {
        let _ = write!(h, "<a href=\"#{id}\">{nav}</a>");
    }
    h.push_str("</nav></header>\n<main>\n");
    if let Some(line) = crate::answers::sampled_line(m.profile.sampling()) {
        let _ = writeln!(
            h,
            "<p class=\"warning\" id=\"r-sampled\">{}</p>",
            esc(line.trim_end())
        );
    }
    let shared = Shared {
        merged: m.timeline.merged(),
        sites: m.profile.sites().map(|(id, s)| (id, *s)).collect(),
    };
    for Section(id, _, body) in &SECTIONS {
        let _ = write!(h, "<section id=\"{id}\">");
        body(&mut h, m, &shared);
        h.push_str("</section>\n");
    }
    let warnings = m.resolver.symbolizer.warnings();
    if !warnings.is_empty() {
        h.push_str("<section id=\"r-symbols\"><h2>Symbols</h2>\n");
        for w in warnings.iter().take(100) {
            let _ = writeln!(h, "<p class=\"warning\">{}</p>", esc(&clip(w)));
        }
        h.push_str("</section>\n");
    }
    let _ = write!(
        h,
        "</main>\n<footer>Written by alloctrace {}. Everything on this page is in this one file.</footer>\n\
         <script>\n{SCRIPT}</script>\n</body>\n</html>\n",
        env!("CARGO_PKG_VERSION")
    );
    h
}

fn run_section(h: &mut String, m: &mut Model, _: &Shared) {
    let stats = &m.pass.stats;
    let total = m.profile.total();
    let peak = m.profile.peak();
    h.push_str("<h2>Run</h2>\n");
    h.push_str(
        "<table class=\"facts\"><thead><tr><th>Trace</th><th>PID</th><th>Command</th>\
         <th>Started (UTC)</th><th>Duration</th><th>Generations</th></tr></thead><tbody>\n",
    );
    for (i, run) in m.summary.runs.iter().enumerate() {
        let file = m.files.get(i).map_or("", String::as_str);
        let command = match &run.command {
            Some(args) => format!("<code>{}</code>", esc(&clip(&shell_line(args)))),
            None => "<span class=\"none\">unknown</span>".to_string(),
        };
        let started = if run.start_wall_ns == 0 {
            "unknown".to_string()
        } else {
            let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(run.start_wall_ns);
            humantime::format_rfc3339_seconds(t).to_string()
        };
        let _ = writeln!(
            h,
            "<tr><td><code>{}</code></td><td class=\"num\">{}</td><td>{command}</td>\
             <td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            esc(&clip(file)),
            run.pid,
            esc(&started),
            units::duration_decimal(run.duration_ns),
            run.generations
        );
    }
    h.push_str("</tbody></table>\n<dl class=\"totals\">\n");
    let mut fact = |name: &str, value: String| {
        let _ = writeln!(h, "<div><dt>{name}</dt><dd>{value}</dd></div>");
    };
    fact("Events", units::thousands(stats.events));
    fact("Allocations", units::thousands(total.allocations));
    fact(
        "Bytes allocated",
        units::bytes(total.bytes, Decimals::OneBelow100),
    );
    fact("Frees", units::thousands(stats.frees));
    fact(
        "Peak live (heap objects and spans)",
        units::bytes(peak.total_bytes, Decimals::OneBelow100),
    );
    fact(
        "of which heap objects",
        units::bytes(peak.heap_bytes, Decimals::OneBelow100),
    );
    fact(
        "of which spans (mmap)",
        units::bytes(peak.span_bytes, Decimals::OneBelow100),
    );
    if peak.stack_bytes != 0 {
        fact(
            "Stacks then (not in the peak)",
            units::bytes(peak.stack_bytes, Decimals::OneBelow100),
        );
    }
    fact(
        "Leaked",
        format!(
            "{} in {} objects",
            units::bytes(total.leaked_bytes, Decimals::OneBelow100),
            units::thousands(total.leaked_objects)
        ),
    );
    fact("Temporary allocations", units::thousands(total.temporary));
    fact(
        "Allocation sites (distinct stacks)",
        units::thousands(m.profile.sites().count() as u64),
    );
    h.push_str("</dl>\n");
    let mut warnings = Vec::new();
    if stats.lost_events != 0 {
        warnings.push(format!(
            "The tracer lost {} events: counts are low.",
            units::thousands(stats.lost_events)
        ));
    }
    if stats.unmatched_frees != 0 {
        warnings.push(format!(
            "{} frees of memory allocated before tracing started (or whose allocation was lost).",
            units::thousands(stats.unmatched_frees)
        ));
    }
    if stats.frees_before_window != 0 {
        warnings.push(format!(
            "A flight-recorder window (the last generations of the run): {} frees of memory allocated before it are not counted, and what is live at its end was allocated in it.",
            units::thousands(stats.frees_before_window)
        ));
    }
    for (i, t) in stats.truncated.iter().enumerate() {
        if let Some(offset) = t {
            warnings.push(format!(
                "{} is truncated at byte offset {offset}: everything before it is shown.",
                esc(&clip(m.files.get(i).map_or("", String::as_str)))
            ));
        }
    }
    for w in warnings {
        let _ = writeln!(h, "<p class=\"warning\">{w}</p>");
    }
}

/// The command line as a shell would take it back (arguments quoted
/// where needed), as `stats` prints it.
fn shell_line(args: &[String]) -> String {
    shlex::try_join(args.iter().map(String::as_str)).unwrap_or_else(|_| args.join(" "))
}

fn timeline_section(h: &mut String, m: &mut Model, shared: &Shared) {
    let s = &shared.merged;
    h.push_str("<h2>Live memory over time</h2>\n");
    let Some(origin) = s.origin_ns else {
        h.push_str("<p class=\"none\">No allocations in the trace.</p>");
        return;
    };
    // The x axis counts from the first trace's start (event times count
    // from it; the peak's time too).
    let start = m
        .summary
        .runs
        .first()
        .map_or(origin, |r| r.start_mono_ns)
        .min(origin);
    let span_ns = s.end_ns.saturating_sub(start).max(1);
    let (unit, per) = units::time_unit(span_ns);
    let x = |ns: u64| ns.saturating_sub(start) as f64 / per;
    let mut times = Vec::with_capacity(s.buckets.len() + 1);
    for i in 0..s.buckets.len() {
        times.push(x(s.bucket_start_ns(i)));
    }
    let points = |f: &dyn Fn(&alloctrace_analysis::Bucket) -> u64| -> Vec<(f64, f64)> {
        // Each bucket's largest value, drawn across the bucket.
        let mut v = Vec::with_capacity(s.buckets.len() * 2);
        for (i, b) in s.buckets.iter().enumerate() {
            let t0 = times[i];
            let t1 = x(s
                .bucket_start_ns(i + 1)
                .min(s.end_ns.max(s.bucket_start_ns(i))));
            v.push((t0, f(b) as f64));
            v.push((t1.max(t0), f(b) as f64));
        }
        v
    };
    let peaks = s.peaks();
    let lines = vec![
        Line {
            label: "total (heap objects and spans)",
            color: TOTAL_COLOR,
            points: points(&|b| b.total.max),
        },
        Line {
            label: "heap objects",
            color: HEAP_COLOR,
            points: points(&|b| b.heap.max),
        },
        Line {
            label: "spans (mmap)",
            color: SPAN_COLOR,
            points: points(&|b| b.span.max),
        },
    ];
    let single = m.profile.peaks().len() == 1;
    let peak = m.profile.peak();
    // The peak's time counts from the trace's start (its first generation).
    let trace_start = m.summary.runs.first().map_or(start, |r| r.start_mono_ns);
    let marker =
        (single && peak.total_bytes != 0).then(|| x(trace_start.saturating_add(peak.time_ns)));
    let x_max = x(s.end_ns);
    match charts::timeline(&lines, x_max, unit, s.peak_total() as f64, marker) {
        Ok((svg, area)) => {
            h.push_str("<figure class=\"timeline\"><div class=\"legend\">");
            for line in &lines {
                let RGBColor(r, g, b) = line.color;
                let _ = write!(
                    h,
                    "<span><i style=\"background:rgb({r},{g},{b})\"></i>{}</span>",
                    line.label
                );
            }
            if marker.is_some() {
                h.push_str("<span><i class=\"dashed\"></i>peak</span>");
            }
            h.push_str("</div>");
            h.push_str(&svg_img(
                &svg,
                "Live heap objects, spans and total bytes over time",
                "r-timeline-chart",
            ));
            h.push_str("<div id=\"r-readout\" class=\"readout\"></div></figure>\n");
            // The hover readout's data: numbers only.
            let data = serde_json::json!({
                "width": charts::TIMELINE_SIZE.0,
                "height": charts::TIMELINE_SIZE.1,
                "area": [area.left, area.right, area.top, area.bottom],
                "x_max": if x_max > 0.0 { x_max } else { 1.0 },
                "unit": unit,
                "t": times,
                "total": s.buckets.iter().map(|b| b.total.max).collect::<Vec<_>>(),
                "heap": s.buckets.iter().map(|b| b.heap.max).collect::<Vec<_>>(),
                "span": s.buckets.iter().map(|b| b.span.max).collect::<Vec<_>>(),
                "objects": s.buckets.iter().map(|b| b.objects.max).collect::<Vec<_>>(),
            });
            let _ = writeln!(
                h,
                "<script type=\"application/json\" id=\"r-timeline-data\">{}</script>",
                serde_json::to_string(&data)
                    .unwrap_or_default()
                    .replace('<', "\\u003c")
            );
        }
        Err(e) => {
            let _ = writeln!(h, "<p class=\"warning\">{}</p>", esc(&e));
        }
    }
    let _ = writeln!(
        h,
        "<p class=\"note\">Each point is the highest value within its time bucket, so \
         short spikes stay visible: {} buckets of {} each{}. Peaks: total {}, heap \
         objects {}, spans {}{}{}.</p>",
        s.buckets.len(),
        units::duration_decimal(s.width_ns()),
        if m.summary.runs.len() > 1 {
            " (the traces' live memory summed; a bucket's highest value is the sum of \
             each trace's, an upper bound)"
        } else {
            ""
        },
        units::bytes(s.peak_total(), Decimals::OneBelow100),
        units::bytes(peaks.heap, Decimals::OneBelow100),
        units::bytes(peaks.span, Decimals::OneBelow100),
        if peaks.stack != 0 {
            format!(
                "; stacks, not in the chart (threads' stacks the shim records, a runtime's \
                 goroutine stacks), up to {}",
                units::bytes(peaks.stack, Decimals::OneBelow100)
            )
        } else {
            String::new()
        },
        if single && peak.total_bytes != 0 {
            format!(
                "; the dashed line marks the peak, at {}",
                units::duration_decimal(peak.time_ns)
            )
        } else {
            String::new()
        }
    );
}

/// The frames of a stack, innermost first ("[no stack]" for 0).
fn frames(m: &mut Model, stack: StackId) -> Vec<SourceFrame> {
    if stack == 0 {
        return vec![SourceFrame {
            function: "[no stack recorded]".to_string(),
            file: None,
            line: None,
            module: String::new(),
            address: String::new(),
        }];
    }
    m.resolver.stack(&m.pass.stacks, stack)
}

fn file_line(f: &SourceFrame) -> Option<String> {
    let file = f.file.as_ref()?;
    let base = file.rsplit('/').next().unwrap_or(file);
    Some(match f.line {
        Some(line) => format!("{base}:{line}"),
        None => base.to_string(),
    })
}

/// A table cell with a stack: the innermost frame, the rest on demand.
fn stack_cell(frames: &[SourceFrame]) -> String {
    let mut out = String::new();
    let first = &frames[0];
    let _ = write!(
        out,
        "<td class=\"stack\"><details><summary><span class=\"fn\">{}</span>",
        esc(&clip(&first.function))
    );
    if let Some(loc) = file_line(first) {
        let _ = write!(out, " <span class=\"loc\">{}</span>", esc(&clip(&loc)));
    }
    out.push_str("</summary><ol class=\"frames\">");
    for f in frames.iter().take(MAX_FRAMES) {
        let _ = write!(
            out,
            "<li><span class=\"fn\">{}</span>",
            esc(&clip(&f.function))
        );
        if let Some(file) = &f.file {
            let loc = match f.line {
                Some(line) => format!("{file}:{line}"),
                None => file.clone(),
            };
            let _ = write!(out, " <span class=\"loc\">{}</span>", esc(&clip(&loc)));
        }
        if !f.module.is_empty() {
            let base = f.module.rsplit('/').next().unwrap_or(&f.module);
            let _ = write!(
                out,
                " <span class=\"mod\" title=\"{}\">{}{}</span>",
                esc(&clip(&f.module)),
                esc(&clip(base)),
                if f.address.is_empty() {
                    String::new()
                } else {
                    format!("+{}", esc(&f.address))
                }
            );
        }
        out.push_str("</li>");
    }
    if frames.len() > MAX_FRAMES {
        let _ = write!(
            out,
            "<li class=\"more\">… {} more frames</li>",
            frames.len() - MAX_FRAMES
        );
    }
    out.push_str("</ol></details></td>");
    out
}

/// A numeric cell, sortable by its value.
fn num(value: u64, text: String) -> String {
    format!("<td class=\"num\" data-v=\"{value}\">{text}</td>")
}

fn table_head(h: &mut String, id: &str, columns: &[&str]) {
    let _ = write!(h, "<table class=\"sortable\" id=\"{id}\"><thead><tr>");
    for c in columns {
        let _ = write!(h, "<th>{c}</th>");
    }
    h.push_str("</tr></thead><tbody>\n");
}

/// The `n` sites with the largest `key`, largest first (ties by stack ID).
fn top(sites: &[(StackId, Site)], n: usize, key: impl Fn(&Site) -> u64) -> Vec<(StackId, Site)> {
    let mut v: Vec<(StackId, Site)> = sites.iter().filter(|(_, s)| key(s) != 0).copied().collect();
    v.sort_by(|a, b| key(&b.1).cmp(&key(&a.1)).then(a.0.cmp(&b.0)));
    v.truncate(n);
    v
}

/// Flamegraph frame names: no `;` (inferno's separator) or line breaks.
fn flame_name(s: &str) -> String {
    clip(s)
        .chars()
        .map(|c| if c == ';' || c.is_control() { ' ' } else { c })
        .collect()
}

fn flamegraph(m: &mut Model, sites: &[(StackId, Site)]) -> Option<String> {
    let chosen = top(sites, FLAME_STACKS, |s| s.peak_bytes);
    if chosen.is_empty() {
        return None;
    }
    let shown: u64 = chosen.iter().map(|(_, s)| s.peak_bytes).sum();
    let all: u64 = sites.iter().map(|(_, s)| s.peak_bytes).sum();
    let mut lines = Vec::with_capacity(chosen.len() + 1);
    for (stack, site) in &chosen {
        let frames = frames(m, *stack);
        let mut names: Vec<String> = frames
            .iter()
            .take(FLAME_DEPTH)
            .map(|f| flame_name(&f.function))
            .collect();
        if frames.len() > FLAME_DEPTH {
            names.push(format!("[{} outer frames]", frames.len() - FLAME_DEPTH));
        }
        names.reverse();
        lines.push(format!("{} {}", names.join(";"), site.peak_bytes));
    }
    if all > shown {
        lines.push(format!(
            "[{} smaller stacks] {}",
            sites.len() - chosen.len(),
            all - shown
        ));
    }
    flame_svg(&lines)
}

/// The flamegraph of folded `lines` ("outer;inner bytes"), inline SVG.
fn flame_svg(lines: &[String]) -> Option<String> {
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = "Live at the peak".to_string();
    opts.count_name = "bytes".to_string();
    opts.colors =
        inferno::flamegraph::Palette::Basic(inferno::flamegraph::color::BasicPalette::Mem);
    opts.hash = true;
    opts.deterministic = true;
    opts.min_width = 0.5;
    let mut out = Vec::new();
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut out).ok()?;
    let svg = String::from_utf8(out).ok()?;
    // Inline in the page: the XML prologue and doctype go.
    let start = svg.find("<svg")?;
    Some(svg[start..].to_string())
}

fn peak_section(h: &mut String, m: &mut Model, shared: &Shared) {
    let sites = &shared.sites[..];
    let peak = m.profile.peak();
    let _ = writeln!(
        h,
        "<h2>Peak: {} live{}</h2>\n<p>Heap objects {}, spans (mmap) {}, \
         {} live allocations{}. What was live at that moment, by call stack:</p>",
        units::bytes(peak.total_bytes, Decimals::OneBelow100),
        if m.profile.peaks().len() == 1 && peak.total_bytes != 0 {
            format!(" at {}", units::duration_decimal(peak.time_ns))
        } else if m.profile.peaks().len() > 1 {
            " (each trace's peak, summed)".to_string()
        } else {
            String::new()
        },
        units::bytes(peak.heap_bytes, Decimals::OneBelow100),
        units::bytes(peak.span_bytes, Decimals::OneBelow100),
        units::thousands(peak.objects),
        if peak.stack_bytes != 0 {
            format!(
                " (stacks, not counted in it: {})",
                units::bytes(peak.stack_bytes, Decimals::OneBelow100)
            )
        } else {
            String::new()
        },
    );
    match flamegraph(m, sites) {
        Some(svg) => {
            h.push_str("<figure class=\"flamegraph\">\n");
            h.push_str(&svg);
            h.push_str(
                "\n<figcaption>Click a frame to zoom in, Ctrl-F to search. Width: bytes live at the peak.</figcaption></figure>\n",
            );
        }
        None => h.push_str("<p class=\"none\">Nothing was live at the peak.</p>\n"),
    }
    let chosen = top(sites, m.rows, |s| s.peak_bytes);
    if !chosen.is_empty() {
        table_head(
            h,
            "r-peak-table",
            &[
                "Live at peak",
                "Share",
                "Objects at peak",
                "Allocations",
                "Bytes allocated",
                "Stack (innermost frame first)",
            ],
        );
        for (stack, s) in &chosen {
            let f = frames(m, *stack);
            let _ = writeln!(
                h,
                "<tr>{}{}{}{}{}{}</tr>",
                num(
                    s.peak_bytes,
                    units::bytes(s.peak_bytes, Decimals::OneBelow100)
                ),
                num(s.peak_bytes, units::percent(s.peak_bytes, peak.total_bytes)),
                num(s.peak_objects, units::thousands(s.peak_objects)),
                num(s.allocations, units::thousands(s.allocations)),
                num(s.bytes, units::bytes(s.bytes, Decimals::OneBelow100)),
                stack_cell(&f)
            );
        }
        h.push_str("</tbody></table>\n");
        more(
            h,
            sites.iter().filter(|(_, s)| s.peak_bytes != 0).count(),
            chosen.len(),
        );
    }
}

/// "N more not shown" under a table cut at `shown` rows.
fn more(h: &mut String, all: usize, shown: usize) {
    if all > shown {
        let _ = writeln!(
            h,
            "<p class=\"note\">{} more not shown (<code>-n</code> sets the rows).</p>",
            units::thousands((all - shown) as u64)
        );
    }
}

fn leaks_section(h: &mut String, m: &mut Model, shared: &Shared) {
    let sites = &shared.sites[..];
    let total = m.profile.total();
    let _ = writeln!(
        h,
        "<h2>Leaks: {} in {} objects</h2>\n<p>Memory allocated in the \
         trace and still live when it ended, by call stack, largest first.</p>",
        units::bytes(total.leaked_bytes, Decimals::OneBelow100),
        units::thousands(total.leaked_objects)
    );
    let chosen = top(sites, m.rows, |s| s.leaked_bytes);
    if chosen.is_empty() {
        h.push_str("<p class=\"none\">Nothing leaked.</p>\n");
    } else {
        table_head(
            h,
            "r-leaks-table",
            &[
                "Leaked bytes",
                "Objects",
                "Allocations",
                "Stack (innermost frame first)",
            ],
        );
        for (stack, s) in &chosen {
            let f = frames(m, *stack);
            let _ = writeln!(
                h,
                "<tr>{}{}{}{}</tr>",
                num(
                    s.leaked_bytes,
                    units::bytes(s.leaked_bytes, Decimals::OneBelow100)
                ),
                num(s.leaked_objects, units::thousands(s.leaked_objects)),
                num(s.allocations, units::thousands(s.allocations)),
                stack_cell(&f)
            );
        }
        h.push_str("</tbody></table>\n");
        more(
            h,
            sites.iter().filter(|(_, s)| s.leaked_bytes != 0).count(),
            chosen.len(),
        );
    }
}

fn temporary_section(h: &mut String, m: &mut Model, shared: &Shared) {
    let sites = &shared.sites[..];
    let total = m.profile.total();
    let _ = writeln!(
        h,
        "<h2>Temporary allocations: {} of {}</h2>\n<p>Allocations freed \
         right after they were made, with no other allocation or free between (as heaptrack \
         counts them), by call stack.</p>",
        units::thousands(total.temporary),
        units::thousands(total.allocations)
    );
    let chosen = top(sites, m.rows, |s| s.temporary);
    if chosen.is_empty() {
        h.push_str("<p class=\"none\">No temporary allocations.</p>\n");
    } else {
        table_head(
            h,
            "r-temporary-table",
            &[
                "Temporary",
                "Allocations",
                "Share temporary",
                "Stack (innermost frame first)",
            ],
        );
        for (stack, s) in &chosen {
            let f = frames(m, *stack);
            let _ = writeln!(
                h,
                "<tr>{}{}{}{}</tr>",
                num(s.temporary, units::thousands(s.temporary)),
                num(s.allocations, units::thousands(s.allocations)),
                num(
                    s.temporary * 1000 / s.allocations.max(1),
                    units::percent(s.temporary, s.allocations)
                ),
                stack_cell(&f)
            );
        }
        h.push_str("</tbody></table>\n");
        more(
            h,
            sites.iter().filter(|(_, s)| s.temporary != 0).count(),
            chosen.len(),
        );
    }
}

fn histogram_table(
    h: &mut String,
    id: &str,
    first: &str,
    rows: Vec<(String, Vec<(u64, String)>)>,
    columns: &[&str],
) {
    let mut cols = vec![first];
    cols.extend_from_slice(columns);
    table_head(h, id, &cols);
    for (label, cells) in rows {
        let _ = write!(h, "<tr><td>{}</td>", esc(&label));
        for (v, text) in cells {
            h.push_str(&num(v, text));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</tbody></table>\n");
}

fn sizes_section(h: &mut String, m: &mut Model, _: &Shared) {
    h.push_str("<h2>Allocation sizes</h2>\n");
    let heap = &m.summary.sizes[Memory::Heap as usize];
    let span = &m.summary.sizes[Memory::Span as usize];
    let stack = &m.summary.sizes[Memory::Stack as usize];
    let used = [heap, span, stack].iter().filter_map(|h| h.used()).fold(
        None::<(usize, usize)>,
        |acc, r| {
            Some(match acc {
                None => (*r.start(), *r.end()),
                Some((a, b)) => (a.min(*r.start()), b.max(*r.end())),
            })
        },
    );
    let Some((lo, hi)) = used else {
        h.push_str("<p class=\"none\">No allocations.</p>");
        return;
    };
    if let Some(r) = heap.used() {
        let labels: Vec<String> = r
            .clone()
            .map(|k| units::size_short(log2_bucket_min(k)))
            .collect();
        let values: Vec<u64> = r.map(|k| heap.counts[k]).collect();
        match charts::bars(&labels, &values, BAR_COLOR, "heap objects") {
            Ok(svg) => {
                h.push_str("<figure>");
                h.push_str(&svg_img(
                    &svg,
                    "Heap objects by size (power-of-two buckets)",
                    "r-sizes-chart",
                ));
                h.push_str("<figcaption>Heap objects by size: each bar counts the sizes from its label to just below the next.</figcaption></figure>\n");
            }
            Err(e) => {
                let _ = writeln!(h, "<p class=\"warning\">{}</p>", esc(&e));
            }
        }
    }
    let rows = (lo..=hi)
        .map(|k| {
            let mut cells = vec![
                (heap.counts[k], units::thousands(heap.counts[k])),
                (
                    heap.bytes[k],
                    units::bytes(heap.bytes[k], Decimals::OneBelow100),
                ),
                (span.counts[k], units::thousands(span.counts[k])),
                (
                    span.bytes[k],
                    units::bytes(span.bytes[k], Decimals::OneBelow100),
                ),
            ];
            if stack.total() != 0 {
                cells.push((stack.counts[k], units::thousands(stack.counts[k])));
                cells.push((
                    stack.bytes[k],
                    units::bytes(stack.bytes[k], Decimals::OneBelow100),
                ));
            }
            (size_range(k), cells)
        })
        .collect();
    let mut columns = vec!["Heap objects", "Heap bytes", "Spans", "Span bytes"];
    if stack.total() != 0 {
        columns.extend_from_slice(&["Stacks", "Stack bytes"]);
    }
    histogram_table(h, "r-sizes-table", "Size", rows, &columns);
}

/// The sizes of bucket `k`: "0 B", "1 B", "2 – 3 B", "1 KiB – 2 KiB".
fn size_range(k: usize) -> String {
    let lo = log2_bucket_min(k);
    if k <= 1 {
        return units::bytes(lo, Decimals::OneBelow100);
    }
    let hi = if k == 64 { u64::MAX } else { (1u64 << k) - 1 };
    if lo >= 1024 {
        format!(
            "{} – <{}",
            units::bytes(lo, Decimals::OneBelow100),
            units::bytes(hi.saturating_add(1), Decimals::OneBelow100)
        )
    } else {
        format!("{lo} – {hi} B")
    }
}

fn lifetimes_section(h: &mut String, m: &mut Model, _: &Shared) {
    h.push_str("<h2>Lifetimes</h2>\n");
    let l: &Histogram = &m.summary.lifetimes;
    let total = m.profile.total();
    let Some(r) = l.used() else {
        h.push_str("<p class=\"none\">Nothing was freed.</p>");
        return;
    };
    let labels: Vec<String> = r
        .clone()
        .map(|k| units::duration_short(log2_bucket_min(k)))
        .collect();
    let values: Vec<u64> = r.clone().map(|k| l.counts[k]).collect();
    match charts::bars(&labels, &values, BAR_COLOR, "freed allocations") {
        Ok(svg) => {
            h.push_str("<figure>");
            h.push_str(&svg_img(
                &svg,
                "Freed allocations by lifetime (power-of-two buckets)",
                "r-lifetimes-chart",
            ));
            let _ = writeln!(
                h,
                "<figcaption>Freed allocations by time from allocation to free; {} never freed \
                 (leaked) are not in it.</figcaption></figure>",
                units::thousands(total.leaked_objects)
            );
        }
        Err(e) => {
            let _ = writeln!(h, "<p class=\"warning\">{}</p>", esc(&e));
        }
    }
    let rows = r
        .map(|k| {
            let lo = log2_bucket_min(k);
            let label = if k == 0 {
                "0 ns".to_string()
            } else {
                format!(
                    "{} – {}",
                    units::duration_decimal(lo),
                    units::duration_decimal(lo.saturating_mul(2))
                )
            };
            (
                label,
                vec![
                    (l.counts[k], units::thousands(l.counts[k])),
                    (l.bytes[k], units::bytes(l.bytes[k], Decimals::OneBelow100)),
                ],
            )
        })
        .collect();
    histogram_table(
        h,
        "r-lifetimes-table",
        "Lifetime",
        rows,
        &["Freed allocations", "Bytes"],
    );
}

fn breakdown_table(h: &mut String, id: &str, key: &str, rows: &[(String, Site)], peak_total: u64) {
    table_head(
        h,
        id,
        &[
            key,
            "Allocations",
            "Bytes allocated",
            "Live at peak",
            "Share of peak",
            "Leaked bytes",
            "Temporary",
        ],
    );
    for (name, s) in rows {
        let _ = writeln!(
            h,
            "<tr><td>{}</td>{}{}{}{}{}{}</tr>",
            esc(&clip(name)),
            num(s.allocations, units::thousands(s.allocations)),
            num(s.bytes, units::bytes(s.bytes, Decimals::OneBelow100)),
            num(
                s.peak_bytes,
                units::bytes(s.peak_bytes, Decimals::OneBelow100)
            ),
            num(s.peak_bytes, units::percent(s.peak_bytes, peak_total)),
            num(
                s.leaked_bytes,
                units::bytes(s.leaked_bytes, Decimals::OneBelow100)
            ),
            num(s.temporary, units::thousands(s.temporary)),
        );
    }
    h.push_str("</tbody></table>\n");
}

fn threads_section(h: &mut String, m: &mut Model, _: &Shared) {
    h.push_str("<h2>Threads</h2>\n<p>By the thread that made the allocation, most bytes allocated first.</p>\n");
    let mut threads = m.profile.by_thread().unwrap_or_default();
    threads.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(&b.0)));
    let all = threads.len();
    threads.truncate(m.rows);
    let rows: Vec<(String, Site)> = threads
        .into_iter()
        .map(|(t, s)| (t.to_string(), s))
        .collect();
    if rows.is_empty() {
        h.push_str("<p class=\"none\">No allocations.</p>\n");
    } else {
        breakdown_table(
            h,
            "r-threads-table",
            "Thread",
            &rows,
            m.profile.peak().total_bytes,
        );
        more(h, all, rows.len());
    }
}

fn types_section(h: &mut String, m: &mut Model, _: &Shared) {
    h.push_str("<h2>Types</h2>\n");
    let mut types = m.profile.by_type().unwrap_or_default();
    if types
        .iter()
        .all(|(name, _)| name == alloctrace_analysis::profile::NO_TYPE)
    {
        h.push_str(
            "<p class=\"none\">No typed allocations: types come from programs that register them \
             through the C API (<code>trace_type_register</code>).</p>",
        );
        return;
    }
    h.push_str("<p>Heap objects by registered type, most bytes allocated first.</p>\n");
    types.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(&b.0)));
    let all = types.len();
    types.truncate(m.rows);
    breakdown_table(
        h,
        "r-types-table",
        "Type",
        &types,
        m.profile.peak().total_bytes,
    );
    more(h, all, types.len());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_strings_are_escaped_and_clipped() {
        assert_eq!(
            esc("<script>alert('x')</script>&\"\u{7}"),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;\u{fffd}"
        );
        let long = "é".repeat(MAX_NAME + 10);
        let c = clip(&long);
        assert_eq!(c.chars().count(), MAX_NAME + 1);
        assert!(c.ends_with('…'));
        assert_eq!(flame_name("a;b\nc"), "a b c");
        assert_eq!(
            shell_line(&["echo".to_string(), "a b".to_string()]),
            "echo 'a b'"
        );
    }

    #[test]
    fn the_flamegraph_escapes_its_names() {
        let hostile = flame_name("<script>alert(1)</script>&\"'");
        let svg = flame_svg(&[format!("main;{hostile} 100")]).expect("an SVG");
        assert!(!svg.contains("alert(1)</script>"));
        assert!(svg.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(svg.starts_with("<svg"));
    }

    #[test]
    fn size_ranges_name_their_bounds() {
        assert_eq!(size_range(0), "0 B");
        assert_eq!(size_range(1), "1 B");
        assert_eq!(size_range(2), "2 – 3 B");
        assert_eq!(size_range(10), "512 – 1023 B");
    }
}
