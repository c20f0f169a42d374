//! `alloctrace top`: the allocation sites, by stack, function, type, size
//! or thread, sorted by one count.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use alloctrace_analysis::{Breakdowns, Site, StackId};
use serde_json::{json, Value};

use super::{counts_json, frame_text, stack_json, Output, Profiled};
use crate::analyze::SymbolArgs;
use crate::failure::Failure;
use crate::print::print_stdout;
use crate::units::{self, Decimals};

/// What a row of `top` stands for.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum By {
    /// The whole call stack.
    Stack,
    /// The innermost frame's function.
    Function,
    /// The heap object's type (C-API traces).
    Type,
    /// The allocation's size in bytes.
    Size,
    /// The allocating thread.
    Thread,
}

/// The count rows are sorted by (largest first).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortBy {
    /// Number of allocations.
    Allocations,
    /// Bytes allocated.
    Bytes,
    /// Bytes live at the program's peak.
    Peak,
    /// Bytes live at the end.
    Leaked,
    /// Number of temporary allocations.
    Temporary,
}

impl SortBy {
    pub fn of(self, site: &Site) -> u64 {
        match self {
            SortBy::Allocations => site.allocations,
            SortBy::Bytes => site.bytes,
            SortBy::Peak => site.peak_bytes,
            SortBy::Leaked => site.leaked_bytes,
            SortBy::Temporary => site.temporary,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            SortBy::Allocations => "allocations",
            SortBy::Bytes => "bytes allocated",
            SortBy::Peak => "bytes live at the peak",
            SortBy::Leaked => "bytes leaked",
            SortBy::Temporary => "temporary allocations",
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Trace files, directories of traces (their *.trace files), or - for standard input; several are one program's traces, summed.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// What a row stands for.
    #[arg(long, value_enum, default_value = "stack")]
    pub by: By,
    /// The count the rows are sorted by, largest first (rows where it is 0 are left out).
    #[arg(long, value_enum, default_value = "bytes")]
    pub sort: SortBy,
    /// How many rows; 0 for all.
    #[arg(short = 'n', value_name = "N", default_value_t = 10)]
    pub n: usize,
    /// {"sites": [...]} as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub symbols: SymbolArgs,
}

/// A row's key, as it is printed.
enum Key {
    /// Symbolized when shown, a row at a time: a stack of up to 1,024
    /// frames per row, never all rows' frames at once.
    Stack(StackId),
    Text(String),
    Number(u64),
}

pub fn run(args: &Args) -> Result<(), Failure> {
    let breakdowns = Breakdowns {
        threads: args.by == By::Thread,
        types: args.by == By::Type,
        sizes: args.by == By::Size,
    };
    let mut p = Profiled::read(&args.files, breakdowns, &args.symbols)?;
    let sort = args.sort;
    let limit = if args.n == 0 { usize::MAX } else { args.n };
    let keep = |rows: &mut Vec<(Key, Site)>| {
        rows.retain(|(_, s)| sort.of(s) > 0);
        // Ties: as found (stable), which is the key's order below.
        rows.sort_by_key(|(_, s)| std::cmp::Reverse(sort.of(s)));
        rows.truncate(limit);
    };
    let mut rows: Vec<(Key, Site)> = match args.by {
        By::Stack => {
            // Kept and sorted before the stacks are symbolized, so that only
            // the rows shown are.
            let mut sites: Vec<(u32, Site)> = p
                .profile
                .sites()
                .filter(|(_, s)| sort.of(s) > 0)
                .map(|(id, s)| (id, *s))
                .collect();
            sites.sort_by_key(|(_, s)| std::cmp::Reverse(sort.of(s)));
            sites.truncate(limit);
            sites
                .into_iter()
                .map(|(id, s)| (Key::Stack(id), s))
                .collect()
        }
        By::Function => {
            let ids: Vec<(u32, Site)> = p.profile.sites().map(|(id, s)| (id, *s)).collect();
            let mut functions: BTreeMap<String, Site> = BTreeMap::new();
            for (id, site) in ids {
                functions
                    .entry(p.innermost_function(id))
                    .or_default()
                    .add(&site);
            }
            functions
                .into_iter()
                .map(|(f, s)| (Key::Text(f), s))
                .collect()
        }
        By::Type => {
            let mut types = p.profile.by_type().unwrap_or_default();
            types.sort_by(|a, b| a.0.cmp(&b.0));
            types.into_iter().map(|(t, s)| (Key::Text(t), s)).collect()
        }
        By::Size => {
            let mut sizes = p.profile.by_size().unwrap_or_default();
            sizes.sort_by_key(|s| s.0);
            sizes
                .into_iter()
                .map(|(n, s)| (Key::Number(n), s))
                .collect()
        }
        By::Thread => {
            let mut threads = p.profile.by_thread().unwrap_or_default();
            threads.sort_by_key(|s| s.0);
            threads
                .into_iter()
                .map(|(n, s)| (Key::Number(n), s))
                .collect()
        }
    };
    keep(&mut rows);
    p.print_warnings();
    let mut out = Output::default();
    if args.json {
        // {"sampled": ..., "sites": [...]}, the sites written one at a
        // time.
        out.text.push_str("{\"sampled\":");
        out.text
            .push_str(&crate::print::json_text(&super::sampled_json(
                p.profile.sampling(),
            )));
        out.text.push_str(",\"sites\":[");
        for (i, (key, site)) in rows.iter().enumerate() {
            if i > 0 {
                out.text.push(',');
            }
            let mut obj = serde_json::Map::new();
            match key {
                Key::Stack(id) => obj.insert("stack".into(), stack_json(&p.frames(*id))),
                Key::Text(t) => obj.insert("key".into(), json!(t)),
                Key::Number(n) => obj.insert("key".into(), json!(n)),
            };
            counts_json(site, &mut obj);
            out.text
                .push_str(&crate::print::json_text(&Value::Object(obj)));
            out.flush_some()?;
        }
        out.text.push_str("]}\n");
    } else {
        out.text = super::sampled_line(p.profile.sampling()).unwrap_or_default();
        out.text.push_str(&table(&mut p, args, &rows));
    }
    print_stdout(&out.text)
}

/// Frames shown per stack in the text table.
const FRAMES_SHOWN: usize = 4;

fn table(p: &mut Profiled, args: &Args, rows: &[(Key, Site)]) -> String {
    let total = p.profile.total();
    let peak = p.profile.peak();
    let mut out = String::new();
    let traces = match p.names.len() {
        1 => crate::print::printable(&p.names[0]).into_owned(),
        n => format!("{n} traces"),
    };
    let _ = writeln!(
        out,
        "{traces}: {} allocations, {} allocated, peak {} live ({} heap, {} spans; {} of stacks beside), {} leaked in {} objects, {} temporary",
        units::count_compact(total.allocations),
        units::bytes(total.bytes, Decimals::Three),
        units::bytes(peak.total_bytes, Decimals::Three),
        units::bytes(peak.heap_bytes, Decimals::Three),
        units::bytes(peak.span_bytes, Decimals::Three),
        units::bytes(peak.stack_bytes, Decimals::Three),
        units::bytes(total.leaked_bytes, Decimals::Three),
        units::count_compact(total.leaked_objects),
        units::count_compact(total.temporary),
    );
    let what = match args.by {
        By::Stack => "stacks",
        By::Function => "functions",
        By::Type => "types",
        By::Size => "sizes",
        By::Thread => "threads",
    };
    let _ = writeln!(out, "Top {what} by {}:", args.sort.describe());
    if rows.is_empty() {
        let _ = writeln!(out, "  (none)");
        return out;
    }
    let header = ["allocs", "allocated", "peak", "leaked", "objects", "temp"];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|(_, s)| {
            [
                units::count_compact(s.allocations),
                units::bytes(s.bytes, Decimals::Three),
                units::bytes(s.peak_bytes, Decimals::Three),
                units::bytes(s.leaked_bytes, Decimals::Three),
                units::count_compact(s.leaked_objects),
                units::count_compact(s.temporary),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let line = |out: &mut String, row: &[String], key: &str| {
        for (c, w) in row.iter().zip(widths) {
            let _ = write!(out, "{c:>w$}  ");
        }
        let _ = writeln!(out, "{key}");
    };
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    let site = match args.by {
        By::Stack => "stack (innermost first)",
        By::Function => "function",
        By::Type => "type",
        By::Size => "size",
        By::Thread => "thread",
    };
    line(&mut out, &header, site);
    let indent: usize = widths.iter().map(|w| w + 2).sum();
    for ((key, _), row) in rows.iter().zip(&cells) {
        match key {
            Key::Stack(id) => {
                let frames = p.frames(*id);
                let first = frames
                    .first()
                    .map_or_else(|| super::NO_STACK.to_string(), frame_text);
                line(&mut out, row, &first);
                for f in frames.iter().skip(1).take(FRAMES_SHOWN - 1) {
                    let _ = writeln!(out, "{:indent$}{}", "", frame_text(f));
                }
                if frames.len() > FRAMES_SHOWN {
                    let _ = writeln!(
                        out,
                        "{:indent$}... {} more frames",
                        "",
                        frames.len() - FRAMES_SHOWN
                    );
                }
            }
            Key::Text(t) => line(&mut out, row, &crate::print::printable(t)),
            Key::Number(n) => {
                let key = match args.by {
                    By::Size => format!("{n} B"),
                    _ => n.to_string(),
                };
                line(&mut out, row, &key)
            }
        }
    }
    out
}
