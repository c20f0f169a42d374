//! `alloctrace symbolize FILE... [--debug-dir DIR]...`: resolves every
//! native frame of each trace's call stacks (the alloctrace-symbolize
//! crate: ELF symbols, DWARF lines and inlined frames, separate debug
//! files) and writes them to `FILE.symbols` beside the trace
//! (docs/SYMBOLS.md), so that reports read on another machine, without
//! the binaries, still name functions. See docs/CLI.md.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use alloctrace_format::stacks::FrameWord;
use alloctrace_reader::{Stacks, Step};
use alloctrace_symbolize::{sidecar_path, ModuleKey, Options, Quality, Sidecar, Symbolizer};

use crate::failure::Failure;
use crate::input::{open, run_each, Input};
use crate::output::refuse_traces;
use crate::print::{prefix, truncation_warning};

#[derive(clap::Args)]
#[command(after_help = "\
Each trace FILE gets FILE.symbols beside it (docs/SYMBOLS.md); one that exists is merged, each \
address keeping the answer that knows more. Without debug info a frame is its function's symbol, else \
MODULE+0xOFFSET; a module whose file is missing or is another build (its build ID differs from \
the trace's) is not read, and a warning says so.")]
pub struct Args {
    /// Trace files, or directories of traces (their *.trace files).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// A directory of separate debug files, searched before /usr/lib/debug: by build ID
    /// (DIR/.build-id/xx/rest.debug) and by .gnu_debuglink name. May be repeated.
    #[arg(long = "debug-dir", value_name = "DIR")]
    debug_dirs: Vec<PathBuf>,
}

/// Checks the options, then symbolizes each trace in turn (one symbolizer
/// for all, so that modules they share are loaded once).
pub fn run(args: &Args) -> Result<(), Failure> {
    for dir in &args.debug_dirs {
        if !dir.is_dir() {
            return Err(Failure::Io(format!(
                "--debug-dir {}: not a directory",
                dir.display()
            )));
        }
    }
    if args.files.iter().any(|f| f.as_os_str() == "-") {
        return Err(Failure::Io(
            "symbolize writes FILE.symbols beside each trace: it needs files, not - (standard input)"
                .to_string(),
        ));
    }
    // Its FILE.symbols (and FILE.symbols.tmp, renamed over it) must not
    // be a trace of the run.
    let inputs = crate::analyze::inputs(&args.files)?;
    let written: Vec<PathBuf> = inputs
        .iter()
        .filter_map(|i| i.path.as_deref())
        .flat_map(|path| {
            let sidecar = sidecar_path(path);
            let mut tmp = sidecar.clone().into_os_string();
            tmp.push(".tmp");
            [sidecar, PathBuf::from(tmp)]
        })
        .collect();
    refuse_traces(
        &written,
        &inputs,
        "symbolize writes FILE.symbols beside each trace FILE: rename that trace",
    )?;
    let mut symbolizer = Symbolizer::new(Options {
        debug_dirs: args.debug_dirs.clone(),
    });
    let mut warned = 0;
    run_each(&args.files, |input, label| {
        let result = one(&mut symbolizer, input, label);
        let warnings = symbolizer.warnings();
        for w in &warnings[warned..] {
            eprintln!("warning: {}", crate::print::printable(w));
        }
        warned = warnings.len();
        result
    })
}

/// The native addresses a trace's stacks use, as (module, offset) pairs.
#[derive(Default)]
struct Wanted {
    modules: Vec<ModuleKey>,
    index: HashMap<ModuleKey, usize>,
    offsets: HashSet<(usize, u64)>,
}

impl Wanted {
    /// Adds one generation's native frames: every distinct address, in
    /// every module whose range holds it (modules loaded at different
    /// times may reuse a range).
    fn add(&mut self, stacks: &Stacks) {
        let mut addrs: Vec<u64> = stacks
            .ids()
            .filter_map(|id| stacks.node(id))
            .filter_map(|node| match FrameWord::from_word(node.frame) {
                FrameWord::Native(addr) => Some(addr),
                FrameWord::Registered(_) => None,
            })
            .collect();
        addrs.sort_unstable();
        addrs.dedup();
        let mut modules: Vec<(u64, u64, usize, u64)> = stacks
            .modules()
            .iter()
            .map(|m| {
                let key = ModuleKey {
                    path: m.path.clone(),
                    build_id: m.build_id.clone(),
                };
                let next = self.modules.len();
                let i = *self.index.entry(key.clone()).or_insert(next);
                if i == next {
                    self.modules.push(key);
                }
                (m.start, m.end, i, m.bias)
            })
            .collect();
        modules.sort_unstable();
        // The largest end of the modules up to each one: a backwards scan
        // from the last module starting at or below an address stops where
        // no earlier module reaches it.
        let mut reach = Vec::with_capacity(modules.len());
        let mut max_end = 0;
        for &(_, end, _, _) in &modules {
            max_end = max_end.max(end);
            reach.push(max_end);
        }
        for addr in addrs {
            let mut j = modules.partition_point(|m| m.0 <= addr);
            while j > 0 && reach[j - 1] > addr {
                j -= 1;
                let (start, end, i, bias) = modules[j];
                if start <= addr && addr < end {
                    // As `Module::offset`: the ELF virtual address.
                    self.offsets.insert((i, addr.wrapping_sub(bias)));
                }
            }
        }
    }
}

fn one(symbolizer: &mut Symbolizer, input: &Input, label: Option<&str>) -> Result<(), Failure> {
    let Some(path) = input.path.as_deref() else {
        return Err(Failure::Io(
            "symbolize needs a trace file, not standard input".to_string(),
        ));
    };
    let mut reader = open(input)?;
    let mut wanted = Wanted::default();
    loop {
        match reader.next_step(1 << 16, |_| {})? {
            Step::Events(_) => {}
            Step::GenerationStart { .. } => wanted.add(reader.stacks()),
            Step::End => break,
        }
    }
    if let Some(offset) = reader.truncated() {
        eprintln!("{}{}", prefix(label), truncation_warning(offset));
    }
    let mut pairs: Vec<(usize, u64)> = wanted.offsets.into_iter().collect();
    pairs.sort_unstable_by(|a, b| {
        wanted.modules[a.0]
            .cmp(&wanted.modules[b.0])
            .then(a.1.cmp(&b.1))
    });
    // An existing symbols file (perhaps made where the binaries were) is
    // merged, not lost: each address keeps the answer that knows more.
    let out = sidecar_path(path);
    let old = match Sidecar::read(&out) {
        Ok(old) => old.unwrap_or_default(),
        Err(e) => {
            eprintln!("{}warning: {e}; replacing it", prefix(label));
            Sidecar::new()
        }
    };
    let mut sidecar = Sidecar::new();
    let mut counts = [0usize; 3];
    let mut modules_used = HashSet::new();
    for &(m, offset) in &pairs {
        let module = &wanted.modules[m];
        modules_used.insert(m);
        let (mut quality, mut frames) = symbolizer.resolve(module, offset);
        if let Some(kept) = old.get(module, offset) {
            if Quality::of(kept) > quality {
                (quality, frames) = (Quality::of(kept), kept);
            }
        }
        counts[quality as usize] += 1;
        // Module+offset is what a reader shows anyway; leaving it out lets
        // a machine that has the binary resolve the address itself.
        if quality != Quality::Module {
            sidecar.insert(module, offset, frames);
        }
    }
    sidecar
        .write(&out)
        .map_err(|e| Failure::Io(format!("cannot write {}: {e}", out.display())))?;
    let [unresolved, symbols_only, source] = counts;
    let summary = if pairs.is_empty() {
        format!(
            "{}no native frames (recorded without call stacks?); wrote {}",
            prefix(label),
            out.display()
        )
    } else {
        format!(
            "{}{} addresses in {} modules: {source} with source lines, {symbols_only} with symbols only, {unresolved} unresolved; wrote {}",
            prefix(label),
            pairs.len(),
            modules_used.len(),
            out.display()
        )
    };
    crate::print::print_stdout(&format!("{}\n", crate::print::printable(&summary)))
}
