//! `export --format chrome`: the live memory over time as counter tracks
//! in the Trace Event Format (JSON), which ui.perfetto.dev and
//! chrome://tracing open.
//!
//! Each trace is a process (a `process_name` metadata event names it);
//! its live memory comes from the analysis's [`Timeline`] (at most
//! [`BUCKETS`] buckets per trace, each drawn as its maximum at the
//! bucket's start, then the final value at the last event), and the live
//! bytes of its [`TOP_TYPES`] types with the highest peak from a small
//! [`Timeline`] per type. The output's size is bounded by these numbers,
//! whatever the trace's length.

use std::io::Write;

use alloctrace_analysis::GenerationView;
use alloctrace_analysis::{Alloc, Free, Memory, Series, StackTable, Timeline, Visitor};
use rustc_hash::FxHashMap;
use serde_json::{json, Value};

/// Buckets of a trace's live-memory series.
pub const BUCKETS: usize = 2000;
/// Buckets of a type's series.
const TYPE_BUCKETS: usize = 256;
/// Types of a trace with a series (the first met); the rest are not
/// followed.
const MAX_TYPES: usize = 512;
/// Types per trace written as tracks.
const TOP_TYPES: usize = 10;

/// One type's live bytes over time.
struct TypeSeries {
    name: String,
    timeline: Timeline,
}

/// The live bytes of each type, per trace (C API traces with type IDs).
#[derive(Default)]
pub struct TypeTimelines {
    /// Per trace: its types' series.
    traces: Vec<Vec<TypeSeries>>,
    /// The current trace's type IDs as indexes of its series.
    index: FxHashMap<u64, usize>,
    /// The current trace's type names by ID.
    names: FxHashMap<u64, String>,
    /// The current trace's time origin (monotonic ns).
    origin_ns: u64,
    /// The current generation's `sample_bytes` (0: not sampled).
    sample_bytes: u64,
}

impl TypeTimelines {
    /// The series of `type_id` in the current trace, made if there is
    /// room.
    #[inline]
    fn series(&mut self, type_id: u64) -> Option<&mut Timeline> {
        let trace = self.traces.last_mut()?;
        let i = match self.index.get(&type_id) {
            Some(&i) => i,
            None => {
                if trace.len() >= MAX_TYPES {
                    return None;
                }
                let name = self
                    .names
                    .get(&type_id)
                    .cloned()
                    .unwrap_or_else(|| format!("type {type_id}"));
                let mut timeline = Timeline::new(TYPE_BUCKETS);
                timeline.trace_start(0);
                trace.push(TypeSeries { name, timeline });
                self.index.insert(type_id, trace.len() - 1);
                trace.len() - 1
            }
        };
        let timeline = &mut trace[i].timeline;
        timeline.set_sample_bytes(self.sample_bytes);
        Some(timeline)
    }
}

impl Visitor for TypeTimelines {
    fn trace_start(&mut self, _index: usize) {
        self.traces.push(Vec::new());
        self.index.clear();
        self.names.clear();
        self.origin_ns = 0;
    }

    fn generation(&mut self, reader: &GenerationView, _stacks: &StackTable) {
        self.origin_ns = reader.time_origin_ns().unwrap_or(0);
        self.sample_bytes = reader.info().map_or(0, |i| i.sample_bytes);
        for (id, t) in reader.types() {
            self.names.entry(*id).or_insert_with(|| t.name.clone());
        }
    }

    // The type series never see a generation (they are made between
    // them), so their events carry absolute monotonic times.
    #[inline]
    fn alloc(&mut self, alloc: &Alloc) {
        if alloc.type_id == 0 || alloc.memory != Memory::Heap {
            return;
        }
        let at = self.origin_ns.saturating_add(alloc.time_ns);
        if let Some(t) = self.series(alloc.type_id) {
            t.alloc(&Alloc {
                time_ns: at,
                ..*alloc
            });
        }
    }

    #[inline]
    fn free(&mut self, alloc: &Alloc, free: &Free) {
        if alloc.type_id == 0 || alloc.memory != Memory::Heap {
            return;
        }
        let at = self.origin_ns.saturating_add(free.time_ns);
        if let Some(t) = self.series(alloc.type_id) {
            t.free(
                alloc,
                &Free {
                    time_ns: at,
                    ..*free
                },
            );
        }
    }
}

/// What the JSON names each trace's process after.
pub struct ProcessName {
    pub pid: u64,
    pub name: String,
}

fn counter(name: &str, pid: u64, ts_us: f64, args: Value) -> Value {
    json!({"name": name, "ph": "C", "ts": ts_us, "pid": pid, "args": args})
}

/// The trace events of `timeline` and `types`, one process per trace.
pub fn events(timeline: &Timeline, types: &TypeTimelines, processes: &[ProcessName]) -> Vec<Value> {
    let series = timeline.series();
    let base = series
        .iter()
        .filter_map(|s| s.origin_ns)
        .chain(
            types
                .traces
                .iter()
                .flatten()
                .flat_map(|t| t.timeline.series().iter().filter_map(|s| s.origin_ns)),
        )
        .min()
        .unwrap_or(0);
    let ts = |ns: u64| ns.saturating_sub(base) as f64 / 1000.0;
    let mut out = Vec::new();
    for (i, s) in series.iter().enumerate() {
        let (pid, name) = processes
            .get(i)
            .map_or((i as u64 + 1, format!("trace {i}")), |p| {
                (p.pid, p.name.clone())
            });
        out.push(json!({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}));
        out.push(
            json!({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": i}}),
        );
        live_memory(&mut out, s, pid, &ts);
        if let Some(trace_types) = types.traces.get(i) {
            let mut ranked: Vec<(u64, &TypeSeries)> = trace_types
                .iter()
                .map(|t| (t.timeline.series().first().map_or(0, Series::peak_total), t))
                .filter(|(peak, _)| *peak > 0)
                .collect();
            ranked.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.name.cmp(&b.1.name)));
            for (_, t) in ranked.into_iter().take(TOP_TYPES) {
                let Some(s) = t.timeline.series().first() else {
                    continue;
                };
                let name = format!("type {} (bytes)", t.name);
                for (j, b) in s.buckets.iter().enumerate() {
                    let at = ts(s.bucket_start_ns(j));
                    out.push(counter(&name, pid, at, json!({"bytes": b.heap.max})));
                }
                out.push(counter(
                    &name,
                    pid,
                    ts(s.end_ns),
                    json!({"bytes": s.levels.heap}),
                ));
            }
        }
    }
    out
}

/// The live-memory and live-object counters of one series.
fn live_memory(out: &mut Vec<Value>, s: &Series, pid: u64, ts: &impl Fn(u64) -> f64) {
    for (j, b) in s.buckets.iter().enumerate() {
        let at = ts(s.bucket_start_ns(j));
        out.push(counter(
            "live memory (bytes)",
            pid,
            at,
            json!({"heap": b.heap.max, "spans": b.span.max, "stacks": b.stack.max, "total": b.total.max}),
        ));
        out.push(counter(
            "live objects",
            pid,
            at,
            json!({"objects": b.objects.max}),
        ));
    }
    if s.origin_ns.is_some() {
        let l = &s.levels;
        let at = ts(s.end_ns);
        out.push(counter(
            "live memory (bytes)",
            pid,
            at,
            json!({"heap": l.heap, "spans": l.span, "stacks": l.stack, "total": l.total()}),
        ));
        out.push(counter(
            "live objects",
            pid,
            at,
            json!({"objects": l.objects}),
        ));
    }
}

/// Writes `{"traceEvents": [...]}` to `out`; `sampled` is the answers'
/// `"sampled"` value (null, or what says the counters are estimates).
pub fn write(events: &[Value], sampled: Value, out: &mut dyn Write) -> std::io::Result<()> {
    let mut other = json!({"generator": format!("alloctrace {}", env!("CARGO_PKG_VERSION"))});
    if !sampled.is_null() {
        other["sampled"] = sampled;
    }
    let doc = json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": other,
    });
    // As every --json output: safe on a terminal (`-o -`), DEL and C1
    // escaped too; bounded in size (the module's header), so one string.
    out.write_all(crate::print::json_text(&doc).as_bytes())?;
    out.write_all(b"\n")?;
    out.flush()
}
