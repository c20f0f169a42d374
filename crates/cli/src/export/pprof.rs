//! `export --format pprof`: the allocation sites as a heap profile in
//! pprof's profile.proto, gzipped, readable by `go tool pprof`, Pyroscope,
//! Parca and the Perfetto UI.
//!
//! As Go's heap profiles: four sample types, `alloc_objects/count`,
//! `alloc_space/bytes` (everything allocated), `inuse_objects/count`,
//! `inuse_space/bytes` (live at the end of the trace: the leaks), one
//! sample per call stack with its [`Site`]'s counts, unsampled (period 1).
//! A [`Frame`] of the stack table is one location; an address in inlined
//! code has several lines, the inlined function first (profile.proto's
//! order). Modules are mappings, and native locations carry their
//! module-relative address, so a profile whose functions are unknown can
//! still be symbolized by pprof from the binaries (by build ID).
//!
//! The messages are derived by hand from the published profile.proto
//! (github.com/google/pprof, proto/profile.proto, package
//! perftools.profiles), field numbers and types as there, and encoded by
//! `prost`.

use std::io::Write;

use alloctrace_analysis::{
    Frame, Profile, Resolver, Site, SourceFrame, StackId, StackTable, Summary,
};
use flate2::write::GzEncoder;
use prost::Message;
use rustc_hash::FxHashMap;

/// perftools.profiles.Profile (fields 1-14; `doc_url` and the newer
/// breakdown fields are not written).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProfileProto {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// perftools.profiles.ValueType: string table indexes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// perftools.profiles.Sample: the leaf at `location_id[0]`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// perftools.profiles.Label.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

/// perftools.profiles.Mapping.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

/// perftools.profiles.Location.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

/// perftools.profiles.Line.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

/// perftools.profiles.Function.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

/// The string table, each string once; index 0 is "".
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: FxHashMap<String, i64>,
}

impl Strings {
    fn new() -> Strings {
        let mut s = Strings::default();
        s.get("");
        s
    }

    fn get(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// When the profile was taken, for `time_nanos` and `duration_nanos`.
pub struct Times {
    pub start_unix_ns: u64,
    pub duration_ns: u64,
}

impl Times {
    /// The first run's start and the longest run's duration.
    pub fn of(summary: &Summary) -> Times {
        Times {
            start_unix_ns: summary.runs.first().map_or(0, |r| r.start_wall_ns),
            duration_ns: summary
                .runs
                .iter()
                .map(|r| r.duration_ns)
                .max()
                .unwrap_or(0),
        }
    }
}

/// The profile of `profile`'s sites, their stacks symbolized.
pub fn build(
    profile: &Profile,
    stacks: &StackTable,
    resolver: &mut Resolver,
    times: &Times,
) -> ProfileProto {
    let mut strings = Strings::new();
    let mut out = ProfileProto {
        sample_type: [
            "alloc_objects",
            "alloc_space",
            "inuse_objects",
            "inuse_space",
        ]
        .iter()
        .zip(["count", "bytes", "count", "bytes"])
        .map(|(t, u)| ValueType {
            r#type: strings.get(t),
            unit: strings.get(u),
        })
        .collect(),
        time_nanos: times.start_unix_ns as i64,
        duration_nanos: times.duration_ns as i64,
        period_type: Some(ValueType {
            r#type: strings.get("space"),
            unit: strings.get("bytes"),
        }),
        period: 1,
        default_sample_type: strings.get("inuse_space"),
        ..ProfileProto::default()
    };
    // A sampled trace: the values are estimates (Go's heap profiles give
    // their sampling rate as the period, values already unsampled); a
    // comment and a label on each sample say so.
    let sampling = profile.sampling();
    let estimated_label = sampling.estimated().then(|| Label {
        key: strings.get("sample_bytes"),
        str: 0,
        num: sampling.sample_bytes as i64,
        num_unit: strings.get("bytes"),
    });
    if sampling.estimated() {
        out.period = sampling.sample_bytes as i64;
        let note = format!(
            "estimated: alloctrace sampled one allocation per {} bytes allocated on average (--sample-bytes); every value is an estimate",
            sampling.sample_bytes
        );
        out.comment.push(strings.get(&note));
    }
    // A mapping per module, spanning the offsets its frames use.
    let modules = stacks.modules();
    let mut limits = vec![0u64; modules.len()];
    let mut locations: FxHashMap<Frame, u64> = FxHashMap::default();
    let mut functions: FxHashMap<(String, Option<String>), u64> = FxHashMap::default();
    let mut no_stack_location = None;
    for (stack, site) in profile.sites() {
        if site.allocations == 0 && site.leaked_objects == 0 {
            continue;
        }
        let mut ids = Vec::new();
        if stack == 0 {
            // Allocations without a stack: one location of its own.
            let id = *no_stack_location.get_or_insert_with(|| {
                let id = out.location.len() as u64 + 1;
                let source = [no_stack_frame()];
                let loc = location(
                    id,
                    (0, 0),
                    &source,
                    &mut strings,
                    &mut functions,
                    &mut out.function,
                );
                out.location.push(loc);
                id
            });
            ids.push(id);
        }
        for frame in stacks.frames(stack as StackId) {
            let next = out.location.len() as u64 + 1;
            let id = *locations.entry(frame).or_insert(next);
            if id == next {
                let (mapping, address) = match frame {
                    Frame::Native { module, offset } => {
                        let l = &mut limits[module as usize];
                        *l = (*l).max(offset.saturating_add(1));
                        (u64::from(module) + 1, offset)
                    }
                    Frame::Unknown { addr } => (0, addr),
                    Frame::Registered(_) | Frame::Truncated => (0, 0),
                };
                let source = resolver.frame(stacks, frame);
                let loc = location(
                    id,
                    (mapping, address),
                    source,
                    &mut strings,
                    &mut functions,
                    &mut out.function,
                );
                out.location.push(loc);
            }
            ids.push(id);
        }
        out.sample.push(Sample {
            location_id: ids,
            value: values(site),
            label: estimated_label.iter().cloned().collect(),
        });
    }
    for (i, m) in modules.iter().enumerate() {
        let build_id: String = m.build_id.iter().map(|b| format!("{b:02x}")).collect();
        out.mapping.push(Mapping {
            id: i as u64 + 1,
            memory_start: 0,
            memory_limit: limits[i].max(1),
            file_offset: 0,
            filename: strings.get(&m.path),
            build_id: strings.get(&build_id),
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
        });
    }
    out.string_table = strings.table;
    out
}

fn values(site: &Site) -> Vec<i64> {
    [
        site.allocations,
        site.bytes,
        site.leaked_objects,
        site.leaked_bytes,
    ]
    .iter()
    .map(|&v| i64::try_from(v).unwrap_or(i64::MAX))
    .collect()
}

fn no_stack_frame() -> SourceFrame {
    SourceFrame {
        function: "[no stack]".to_string(),
        file: None,
        line: None,
        module: String::new(),
        address: String::new(),
    }
}

/// Location `id` at `(mapping ID, address)` with a line per source frame
/// (functions added to `function_table` as first met).
fn location(
    id: u64,
    (mapping_id, address): (u64, u64),
    source: &[SourceFrame],
    strings: &mut Strings,
    functions: &mut FxHashMap<(String, Option<String>), u64>,
    function_table: &mut Vec<Function>,
) -> Location {
    let line = source
        .iter()
        .map(|s| {
            let key = (s.function.clone(), s.file.clone());
            let next = function_table.len() as u64 + 1;
            let function_id = *functions.entry(key).or_insert(next);
            if function_id == next {
                let name = strings.get(&s.function);
                function_table.push(Function {
                    id: function_id,
                    name,
                    system_name: name,
                    filename: s.file.as_deref().map_or(0, |f| strings.get(f)),
                    start_line: 0,
                });
            }
            Line {
                function_id,
                line: s.line.map_or(0, i64::from),
            }
        })
        .collect();
    Location {
        id,
        mapping_id,
        address,
        line,
        is_folded: false,
    }
}

/// Writes `profile` gzipped to `out`.
pub fn write(profile: &ProfileProto, out: &mut dyn Write) -> std::io::Result<()> {
    let mut gz = GzEncoder::new(out, flate2::Compression::default());
    gz.write_all(&profile.encode_to_vec())?;
    gz.finish()?.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_decodes_as_it_was_encoded() {
        let p = ProfileProto {
            sample: vec![Sample {
                location_id: vec![1, 2],
                value: vec![3, 96, 1, 32],
                label: Vec::new(),
            }],
            string_table: vec![String::new(), "x".into()],
            ..ProfileProto::default()
        };
        let bytes = p.encode_to_vec();
        // Field 2 (sample), length-delimited: tag byte 0x12.
        assert!(bytes.contains(&0x12));
        assert_eq!(ProfileProto::decode(&*bytes).unwrap(), p);
    }
}
