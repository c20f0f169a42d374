//! `alloctrace diff`: the sites whose allocations, peak or leaks changed
//! between two traces of a program.
//!
//! Sites are matched by their symbolized function chain (the functions of
//! their source frames, innermost first), not by address, so that two
//! builds of a program match. Sites with the same chain in one trace are
//! summed.

use std::cmp::Ordering;
use std::fmt::Write as _;
use std::path::PathBuf;

use alloctrace_analysis::{Breakdowns, Site, StackId};
use rustc_hash::{FxHashMap, FxHashSet};
use serde_json::{json, Value};

use super::{counts_json, frame_text, stack_json, Output, Profiled, NO_STACK};
use crate::analyze::SymbolArgs;
use crate::failure::Failure;
use crate::print::print_stdout;
use crate::units::{self, Decimals};

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

/// Function chains (the functions of a stack's source frames, innermost
/// first), interned for both traces as one prefix tree: chain node 0 is
/// the empty chain, every other a function called from its parent's
/// chain. Each stack's chain is found from its caller's, once per stack,
/// so the work and memory are the stack tables', never a copy of every
/// site's frames (a trace of many stacks, each up to 1,024 frames deep).
struct Chains {
    /// Per node: its parent chain and its innermost function (an index
    /// into `names`). Node 0's entries are unused.
    nodes: Vec<(u32, u32)>,
    index: FxHashMap<(u32, u32), u32>,
    names: Vec<String>,
    name_index: FxHashMap<String, u32>,
}

impl Chains {
    fn new() -> Chains {
        Chains {
            nodes: vec![(0, 0)],
            index: FxHashMap::default(),
            names: Vec::new(),
            name_index: FxHashMap::default(),
        }
    }

    /// The chain of `function` called from chain `parent`.
    fn intern(&mut self, parent: u32, function: &str) -> u32 {
        let name = match self.name_index.get(function) {
            Some(&i) => i,
            None => {
                let i = self.names.len() as u32;
                self.names.push(function.to_string());
                self.name_index.insert(function.to_string(), i);
                i
            }
        };
        let next = self.nodes.len() as u32;
        *self.index.entry((parent, name)).or_insert_with(|| {
            self.nodes.push((parent, name));
            next
        })
    }

    /// Two chains in the order of their function lists, innermost first
    /// (a list before the longer lists it begins).
    fn cmp(&self, mut a: u32, mut b: u32) -> Ordering {
        loop {
            if a == b {
                return Ordering::Equal;
            }
            if a == 0 || b == 0 {
                return a.cmp(&b);
            }
            let ((pa, na), (pb, nb)) = (self.nodes[a as usize], self.nodes[b as usize]);
            match self.names[na as usize].cmp(&self.names[nb as usize]) {
                Ordering::Equal => (a, b) = (pa, pb),
                other => return other,
            }
        }
    }
}

/// One side's sites summed by function chain, in the order first seen:
/// `(chain, the stack shown for it (its first site's), counts)`.
fn sites(p: &mut Profiled, chains: &mut Chains) -> Vec<(u32, StackId, Site)> {
    let ids: Vec<(StackId, Site)> = p.profile.sites().map(|(id, s)| (id, *s)).collect();
    // Each stack's chain, found when first needed.
    const UNKNOWN: u32 = u32::MAX;
    let mut memo = vec![UNKNOWN; p.pass.stacks.len()];
    memo[0] = 0;
    let mut path = Vec::new();
    let mut out: Vec<(u32, StackId, Site)> = Vec::new();
    let mut by_chain: FxHashMap<u32, usize> = FxHashMap::default();
    for (id, site) in ids {
        // The stacks from `id` out to the first with a known chain, then
        // their chains from the outermost in.
        let mut s = id;
        while memo[s as usize] == UNKNOWN {
            path.push(s);
            s = p.pass.stacks.parent(s);
        }
        while let Some(s) = path.pop() {
            let mut chain = memo[p.pass.stacks.parent(s) as usize];
            if let Some(frame) = p.pass.stacks.frame(s) {
                for f in p.resolver.frame(&p.pass.stacks, frame).iter().rev() {
                    chain = chains.intern(chain, &f.function);
                }
            }
            memo[s as usize] = chain;
        }
        let chain = match memo[id as usize] {
            0 => chains.intern(0, NO_STACK),
            chain => chain,
        };
        match by_chain.get(&chain) {
            Some(&i) => out[i].2.add(&site),
            None => {
                by_chain.insert(chain, out.len());
                let mut sum = Site::default();
                sum.add(&site);
                out.push((chain, id, sum));
            }
        }
    }
    out
}

/// A changed site.
struct Change {
    /// Which trace's stack is shown: 0 before, 1 after.
    side: usize,
    stack: StackId,
    chain: u32,
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
    let mut chains = Chains::new();
    let old = sites(&mut before, &mut chains);
    let new = sites(&mut after, &mut chains);
    before.print_warnings();
    after.print_warnings();
    let mut only_before: FxHashSet<u32> = old.iter().map(|o| o.0).collect();
    // The sites of the trace after, then those only before it: each group
    // in the order of its function chains, then largest change first.
    let old_sites: FxHashMap<u32, Site> = old.iter().map(|o| (o.0, o.2)).collect();
    let mut changes = Vec::new();
    for &(chain, stack, site) in &new {
        only_before.remove(&chain);
        let old_site = old_sites.get(&chain).copied().unwrap_or_default();
        if changed(&old_site, &site) {
            changes.push(Change {
                side: 1,
                stack,
                chain,
                before: old_site,
                after: site,
            });
        }
    }
    for &(chain, stack, site) in &old {
        if only_before.contains(&chain) && changed(&site, &Site::default()) {
            changes.push(Change {
                side: 0,
                stack,
                chain,
                before: site,
                after: Site::default(),
            });
        }
    }
    changes.sort_by(|a, b| {
        b.size()
            .cmp(&a.size())
            .then(b.side.cmp(&a.side))
            .then_with(|| chains.cmp(a.chain, b.chain))
    });
    let (total_before, total_after) = (before.profile.total(), after.profile.total());
    // Either side sampled: its numbers are estimates.
    let mut sampling = before.profile.sampling();
    sampling.note(after.profile.sampling().sample_bytes);
    let mut sides = [before, after];
    let mut out = Output::default();
    let counts = |s: &Site| {
        let mut obj = serde_json::Map::new();
        counts_json(s, &mut obj);
        Value::Object(obj)
    };
    if args.json {
        // {"after", "before", "sampled", "sites"}: the keys in serde_json's
        // order, the sites written one at a time.
        let _ = write!(
            out.text,
            "{{\"after\":{},\"before\":{},\"sampled\":{},\"sites\":[",
            crate::print::json_text(&counts(&total_after)),
            crate::print::json_text(&counts(&total_before)),
            crate::print::json_text(&super::sampled_json(sampling))
        );
        for (i, c) in changes.iter().enumerate() {
            if i > 0 {
                out.text.push(',');
            }
            let site = json!({
                "stack": stack_json(&sides[c.side].frames(c.stack)),
                "before": counts(&c.before),
                "after": counts(&c.after),
            });
            out.text.push_str(&crate::print::json_text(&site));
            out.flush_some()?;
        }
        out.text.push_str("]}\n");
    } else {
        if let Some(line) = super::sampled_line(sampling) {
            out.text.push_str(&line);
        }
        table(
            args,
            &changes,
            &mut sides,
            &total_before,
            &total_after,
            &mut out,
        )?;
    }
    print_stdout(&out.text)
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

fn table(
    args: &Args,
    changes: &[Change],
    sides: &mut [Profiled; 2],
    before: &Site,
    after: &Site,
    output: &mut Output,
) -> Result<(), Failure> {
    let out = &mut output.text;
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
        return Ok(());
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
        // The first four frames shown; a stack's frames are resolved
        // here, one stack at a time.
        let frames = sides[c.side].frames(c.stack);
        let mut frames = frames.iter();
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
    Ok(())
}
