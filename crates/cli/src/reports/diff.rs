//! `alloctrace diff`: the sites whose allocations, peak or leaks changed
//! between two traces of a program.
//!
//! Sites are matched by their symbolized function chain (the functions of
//! their source frames, innermost first), not by address, so that two
//! builds of a program match. Sites with the same chain in one trace are
//! summed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use alloctrace_analysis::{Breakdowns, Site, SourceFrame};
use serde_json::{json, Value};

use super::{counts_json, frame_text, stack_json, Profiled, NO_STACK};
use crate::analyze::SymbolArgs;
use crate::units::{self, Decimals};
use crate::{print_stdout, Failure};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The earlier trace (a file, a directory of one run's traces, or -).
    #[arg(value_name = "BEFORE")]
    pub before: PathBuf,
    /// The later trace.
    #[arg(value_name = "AFTER")]
    pub after: PathBuf,
    /// {"sites": [...], "before": {...}, "after": {...}} as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Rows in the table; 0 for all (JSON lists every changed site).
    #[arg(short = 'n', value_name = "N", default_value_t = 20)]
    pub n: usize,
    #[command(flatten)]
    pub symbols: SymbolArgs,
}

/// One side's sites by function chain, each with the stack shown for it.
type Sites = BTreeMap<Vec<String>, (Vec<SourceFrame>, Site)>;

fn sites(p: &mut Profiled) -> Sites {
    let ids: Vec<(u32, Site)> = p.profile.sites().map(|(id, s)| (id, *s)).collect();
    let mut out = Sites::new();
    for (id, site) in ids {
        let frames = p.frames(id);
        let mut chain: Vec<String> = frames.iter().map(|f| f.function.clone()).collect();
        if chain.is_empty() {
            chain.push(NO_STACK.to_string());
        }
        out.entry(chain)
            .or_insert_with(|| (frames, Site::default()))
            .1
            .add(&site);
    }
    out
}

/// A changed site.
struct Change {
    frames: Vec<SourceFrame>,
    before: Site,
    after: Site,
}

impl Change {
    /// The largest change of bytes allocated, at the peak or leaked; then
    /// of allocations.
    fn size(&self) -> (u64, u64) {
        let d = |a: u64, b: u64| a.abs_diff(b);
        (
            d(self.before.bytes, self.after.bytes)
                .max(d(self.before.peak_bytes, self.after.peak_bytes))
                .max(d(self.before.leaked_bytes, self.after.leaked_bytes)),
            d(self.before.allocations, self.after.allocations),
        )
    }
}

/// Whether the counts the diff is about changed.
fn changed(a: &Site, b: &Site) -> bool {
    a.allocations != b.allocations
        || a.bytes != b.bytes
        || a.peak_bytes != b.peak_bytes
        || a.leaked_objects != b.leaked_objects
        || a.leaked_bytes != b.leaked_bytes
}

pub fn run(args: &Args) -> Result<(), Failure> {
    let mut before = Profiled::read(
        std::slice::from_ref(&args.before),
        Breakdowns::default(),
        &args.symbols,
    )?;
    let mut after = Profiled::read(
        std::slice::from_ref(&args.after),
        Breakdowns::default(),
        &args.symbols,
    )?;
    let mut old = sites(&mut before);
    let new = sites(&mut after);
    before.print_warnings();
    after.print_warnings();
    let mut changes = Vec::new();
    for (chain, (frames, site)) in new {
        let old_site = old.remove(&chain).map(|o| o.1).unwrap_or_default();
        if changed(&old_site, &site) {
            changes.push(Change {
                frames,
                before: old_site,
                after: site,
            });
        }
    }
    for (_, (frames, site)) in old {
        if changed(&site, &Site::default()) {
            changes.push(Change {
                frames,
                before: site,
                after: Site::default(),
            });
        }
    }
    changes.sort_by_key(|c| std::cmp::Reverse(c.size()));
    let (total_before, total_after) = (before.profile.total(), after.profile.total());
    let text = if args.json {
        let counts = |s: &Site| {
            let mut obj = serde_json::Map::new();
            counts_json(s, &mut obj);
            Value::Object(obj)
        };
        let sites: Vec<Value> = changes
            .iter()
            .map(|c| {
                json!({
                    "stack": stack_json(&c.frames),
                    "before": counts(&c.before),
                    "after": counts(&c.after),
                })
            })
            .collect();
        let mut out = crate::json_text(&json!({
            "sites": sites,
            "before": counts(&total_before),
            "after": counts(&total_after),
        }));
        out.push('\n');
        out
    } else {
        table(args, &changes, &total_before, &total_after)
    };
    print_stdout(&text)
}

/// `+1.50 KiB`, `-3 B`, `0 B`.
fn signed_bytes(before: u64, after: u64) -> String {
    match after.cmp(&before) {
        std::cmp::Ordering::Greater => {
            format!("+{}", units::bytes(after - before, Decimals::Three))
        }
        std::cmp::Ordering::Less => format!("-{}", units::bytes(before - after, Decimals::Three)),
        std::cmp::Ordering::Equal => "0".to_string(),
    }
}

fn signed_count(before: u64, after: u64) -> String {
    match after.cmp(&before) {
        std::cmp::Ordering::Greater => format!("+{}", units::count_compact(after - before)),
        std::cmp::Ordering::Less => format!("-{}", units::count_compact(before - after)),
        std::cmp::Ordering::Equal => "0".to_string(),
    }
}

fn table(args: &Args, changes: &[Change], before: &Site, after: &Site) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "before: {} allocations, {} allocated, {} at the peak, {} leaked",
        units::count_compact(before.allocations),
        units::bytes(before.bytes, Decimals::Three),
        units::bytes(before.peak_bytes, Decimals::Three),
        units::bytes(before.leaked_bytes, Decimals::Three)
    );
    let _ = writeln!(
        out,
        "after:  {} allocations, {} allocated, {} at the peak, {} leaked",
        units::count_compact(after.allocations),
        units::bytes(after.bytes, Decimals::Three),
        units::bytes(after.peak_bytes, Decimals::Three),
        units::bytes(after.leaked_bytes, Decimals::Three)
    );
    if changes.is_empty() {
        let _ = writeln!(out, "No site changed.");
        return out;
    }
    let limit = if args.n == 0 { usize::MAX } else { args.n };
    let _ = writeln!(
        out,
        "{} site{} changed, largest change first:",
        changes.len(),
        if changes.len() == 1 { "" } else { "s" }
    );
    let header = ["allocs", "allocated", "peak", "leaked"];
    let cells: Vec<[String; 4]> = changes
        .iter()
        .take(limit)
        .map(|c| {
            [
                signed_count(c.before.allocations, c.after.allocations),
                signed_bytes(c.before.bytes, c.after.bytes),
                signed_bytes(c.before.peak_bytes, c.after.peak_bytes),
                signed_bytes(c.before.leaked_bytes, c.after.leaked_bytes),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    for (h, w) in header.iter().zip(widths) {
        let _ = write!(out, "{h:>w$}  ");
    }
    let _ = writeln!(out, "stack (innermost first)");
    let indent: usize = widths.iter().map(|w| w + 2).sum();
    for (c, row) in changes.iter().zip(&cells) {
        for (cell, w) in row.iter().zip(widths) {
            let _ = write!(out, "{cell:>w$}  ");
        }
        let mut frames = c.frames.iter();
        let first = frames
            .next()
            .map_or_else(|| NO_STACK.to_string(), frame_text);
        let _ = writeln!(out, "{first}");
        for f in frames.take(3) {
            let _ = writeln!(out, "{:indent$}{}", "", frame_text(f));
        }
    }
    if changes.len() > cells.len() {
        let _ = writeln!(
            out,
            "... {} more (-n 0 for all)",
            changes.len() - cells.len()
        );
    }
    out
}
