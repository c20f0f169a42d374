//! `export --format dhat`: the allocation sites as DHAT's JSON
//! (`dhatFileVersion` 2, what Valgrind's `--tool=dhat` and dhat-rs write),
//! for DHAT's viewer (`dh_view.html`, shipped with Valgrind).
//!
//! One program point (`pps`) per call stack, its frames innermost first
//! as indexes into `ftbl` (whose entry 0 is `[root]`), with the fields
//! the viewer requires when block lifetimes are on (`bklt`): total bytes
//! and blocks (`tb`, `tbk`), the sum of the blocks' lifetimes (`tl`, in
//! the file's time unit, µs; freed blocks), the site's own most live bytes and the
//! blocks then (`mb`, `mbk`), its live bytes and blocks at the program's
//! peak (`gb`, `gbk`: [`Profile`]'s peak composition) and at the end
//! (`eb`, `ebk`: the leaks). Block accesses (`bkacc`) are not traced, so
//! they are off. Heap objects and spans count (as in `top`), thread
//! stacks do not; memory live before tracing started is not allocated
//! here, as everywhere.

use std::io::{self, Write};

use alloctrace_analysis::{
    Alloc, Free, Memory, Profile, Resolver, StackId, StackTable, Summary, Visitor,
};
use rustc_hash::FxHashMap;
use serde_json::{json, Value};

/// What DHAT wants and [`Profile`] does not keep: per stack, the
/// lifetimes' sum and the site's own peak.
#[derive(Default)]
pub struct Lifetimes {
    sites: FxHashMap<StackId, Extra>,
}

#[derive(Default, Clone, Copy)]
struct Extra {
    lifetime_ns: u64,
    live_bytes: u64,
    live_blocks: u64,
    max_bytes: u64,
    max_blocks: u64,
}

fn counted(alloc: &Alloc) -> bool {
    alloc.memory != Memory::Stack && !alloc.existed
}

impl Visitor for Lifetimes {
    fn alloc(&mut self, alloc: &Alloc) {
        if !counted(alloc) {
            return;
        }
        let e = self.sites.entry(alloc.stack).or_default();
        e.live_bytes += alloc.size;
        e.live_blocks += 1;
        if e.live_bytes > e.max_bytes {
            e.max_bytes = e.live_bytes;
            e.max_blocks = e.live_blocks;
        }
    }

    fn free(&mut self, alloc: &Alloc, free: &Free) {
        if !counted(alloc) {
            return;
        }
        let e = self.sites.entry(alloc.stack).or_default();
        e.live_bytes = e.live_bytes.saturating_sub(alloc.size);
        e.live_blocks = e.live_blocks.saturating_sub(1);
        e.lifetime_ns += free.time_ns.saturating_sub(alloc.time_ns);
    }
}

/// The DHAT document of the pass's sites. `lifetimes` saw the same pass
/// as `profile`. `tl` sums the lifetimes of the freed blocks only (a
/// block still live at the end has no end of its own).
pub fn build(
    profile: &Profile,
    lifetimes: &Lifetimes,
    summary: &Summary,
    stacks: &StackTable,
    resolver: &mut Resolver,
) -> Value {
    let duration_ns = summary
        .runs
        .iter()
        .map(|r| r.duration_ns)
        .max()
        .unwrap_or(0);
    let peak = profile.peak();
    let mut ftbl: Vec<String> = vec!["[root]".to_string()];
    let mut frame_index: FxHashMap<String, usize> = FxHashMap::default();
    let mut pps = Vec::new();
    let mut sites: Vec<(StackId, _)> = profile.sites().collect();
    sites.sort_by_key(|(stack, _)| *stack);
    for (stack, site) in sites {
        if site.allocations == 0 {
            continue;
        }
        let mut fs = Vec::new();
        let frames: Vec<_> = if stack == 0 {
            vec![]
        } else {
            stacks.frames(stack).collect()
        };
        if frames.is_empty() {
            fs.push(intern(
                &mut ftbl,
                &mut frame_index,
                "[no stack]".to_string(),
            ));
        }
        for frame in frames {
            for source in resolver.frame(stacks, frame) {
                let mut text = String::new();
                if !source.address.is_empty() {
                    text.push_str(&source.address);
                    text.push_str(": ");
                }
                text.push_str(&source.function);
                match (&source.file, source.line) {
                    (Some(file), Some(line)) => text.push_str(&format!(" ({file}:{line})")),
                    (Some(file), None) => text.push_str(&format!(" ({file})")),
                    _ if !source.module.is_empty() => {
                        text.push_str(&format!(" (in {})", source.module))
                    }
                    _ => {}
                }
                fs.push(intern(&mut ftbl, &mut frame_index, text));
            }
        }
        let extra = lifetimes.sites.get(&stack).copied().unwrap_or_default();
        pps.push(json!({
            "tb": site.bytes,
            "tbk": site.allocations,
            "tl": extra.lifetime_ns / 1000,
            "mb": extra.max_bytes,
            "mbk": extra.max_blocks,
            "gb": site.peak_bytes,
            "gbk": site.peak_objects,
            "eb": site.leaked_bytes,
            "ebk": site.leaked_objects,
            "fs": fs,
        }));
    }
    let (cmd, pid) = summary.runs.first().map_or((String::new(), 0), |r| {
        (
            r.command.as_ref().map(|c| c.join(" ")).unwrap_or_default(),
            r.pid,
        )
    });
    json!({
        "dhatFileVersion": 2,
        "mode": "rust-heap",
        "verb": "Allocated",
        "bklt": true,
        "bkacc": false,
        "tu": "µs",
        "Mtu": "s",
        "tuth": 10,
        "cmd": cmd,
        "pid": pid,
        "te": duration_ns / 1000,
        "tg": peak.time_ns / 1000,
        "pps": pps,
        "ftbl": ftbl,
    })
}

fn intern(ftbl: &mut Vec<String>, index: &mut FxHashMap<String, usize>, text: String) -> usize {
    if let Some(&i) = index.get(&text) {
        return i;
    }
    ftbl.push(text.clone());
    index.insert(text, ftbl.len() - 1);
    ftbl.len() - 1
}

/// Writes `doc` as JSON.
pub fn write(doc: &Value, out: &mut dyn Write) -> io::Result<()> {
    serde_json::to_writer(&mut *out, doc)?;
    out.write_all(b"\n")?;
    out.flush()
}
