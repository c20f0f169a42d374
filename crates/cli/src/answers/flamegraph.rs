//! `alloctrace flamegraph`: the sites as an interactive flame graph SVG
//! (the inferno crate), or as folded stacks (`--collapsed`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;

use alloctrace_analysis::{Breakdowns, Frame};
use inferno::flamegraph::{self, color::BasicPalette, Direction, Palette};
use rustc_hash::FxHashMap;

use super::{Profiled, NO_STACK};
use crate::analyze::{inputs, SymbolArgs};
use crate::failure::Failure;
use crate::output::refuse_inputs;
use crate::print::{output_error, printable};

/// What the width of a frame measures.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// Number of allocations.
    Allocations,
    /// Bytes allocated.
    Bytes,
    /// Bytes live at the program's peak.
    Peak,
    /// Bytes live at the end.
    Leaked,
}

impl Metric {
    fn of(self, site: &alloctrace_analysis::Site) -> u64 {
        match self {
            Metric::Allocations => site.allocations,
            Metric::Bytes => site.bytes,
            Metric::Peak => site.peak_bytes,
            Metric::Leaked => site.leaked_bytes,
        }
    }

    fn title(self) -> &'static str {
        match self {
            Metric::Allocations => "Allocations",
            Metric::Bytes => "Bytes allocated",
            Metric::Peak => "Bytes live at the peak",
            Metric::Leaked => "Bytes leaked (live at the end)",
        }
    }

    fn count_name(self) -> &'static str {
        match self {
            Metric::Allocations => "allocations",
            _ => "bytes",
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Trace files, directories of traces (their *.trace files), or - for standard input; several are one program's traces, summed.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// The output file (- for standard output); required for the SVG, standard output by default for --collapsed.
    #[arg(short = 'o', value_name = "OUT")]
    pub output: Option<PathBuf>,
    /// What a frame's width measures.
    #[arg(long, value_enum, default_value = "bytes")]
    pub metric: Metric,
    /// The allocating functions as the roots, their callers above them, drawn top down (an icicle).
    #[arg(long)]
    pub inverted: bool,
    /// Folded stacks (`outer;...;inner VALUE` lines) instead of the SVG.
    #[arg(long)]
    pub collapsed: bool,
    #[command(flatten)]
    pub symbols: SymbolArgs,
}

pub fn run(args: &Args) -> Result<(), Failure> {
    if !args.collapsed && args.output.is_none() {
        return Err(Failure::Io(
            "flamegraph: -o OUT.svg is required (or --collapsed for folded stacks on standard output)"
                .to_string(),
        ));
    }
    if let Some(output) = &args.output {
        refuse_inputs(
            std::slice::from_ref(output),
            &inputs(&args.files)?,
            "choose another -o",
        )?;
    }
    let mut p = Profiled::read(&args.files, Breakdowns::default(), &args.symbols)?;
    let folded = fold(&mut p, args.metric, args.inverted);
    p.print_warnings();
    let to_stdout = args.output.as_ref().is_none_or(|o| o.as_os_str() == "-");
    let mut out: Box<dyn Write> = if to_stdout {
        Box::new(std::io::stdout().lock())
    } else {
        let path = args.output.as_ref().expect("checked");
        Box::new(std::io::BufWriter::new(
            std::fs::File::create(path)
                .map_err(|e| Failure::Io(format!("cannot create {}: {e}", path.display())))?,
        ))
    };
    let write_error = |e: std::io::Error| {
        if to_stdout {
            output_error(e)
        } else {
            Failure::Io(format!("cannot write the output: {e}"))
        }
    };
    let sampling = p.profile.sampling();
    if args.collapsed {
        // Folded stacks have no room for a note: it goes to stderr.
        if let Some(line) = super::sampled_line(sampling) {
            eprint!("{line}");
        }
        for (stack, value) in &folded {
            writeln!(out, "{stack} {value}").map_err(write_error)?;
        }
    } else {
        let traces = match p.names.len() {
            1 => printable(&p.names[0]).into_owned(),
            n => printable(&format!("{n} traces: {}", p.names.join(", "))).into_owned(),
        };
        let mut options = flamegraph::Options::default();
        options.title = args.metric.title().to_string();
        if sampling.estimated() {
            options.title = format!(
                "{} (estimated: sampled every {} on average)",
                options.title,
                crate::units::bytes(sampling.sample_bytes, crate::units::Decimals::Three)
            );
        }
        options.subtitle = Some(traces);
        options.count_name = args.metric.count_name().to_string();
        options.colors = Palette::Basic(BasicPalette::Mem);
        if args.inverted {
            options.direction = Direction::Inverted;
        }
        if folded.is_empty() {
            // inferno refuses empty input; one zero-width root says "nothing".
            let line = format!("no {} 0", args.metric.count_name());
            flamegraph::from_lines(&mut options, std::iter::once(line.as_str()), &mut out)
                .or_else(|e| {
                    if e.kind() == std::io::ErrorKind::InvalidData {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })
                .map_err(write_error)?;
        } else {
            // The folded stacks become the lines in place (no second copy),
            // already in order: inferno need not sort them (a stack's
            // names hold no control character, so the value's space sorts
            // as the key's end).
            let lines: Vec<String> = folded
                .into_iter()
                .map(|(mut s, v)| {
                    // " VALUE": a space and at most 20 digits.
                    s.reserve_exact(21);
                    let _ = write!(s, " {v}");
                    s
                })
                .collect();
            options.no_sort = true;
            flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut out)
                .map_err(write_error)?;
        }
    }
    out.flush().map_err(write_error)
}

/// Folded stacks (outermost frame first, or innermost with `inverted`)
/// and their values; equal symbolized stacks are summed, zero values left
/// out. Each frame's names are cleaned once and each line is built from
/// them, so that the work per site is its stack's depth (at most 1,024
/// frames, FORMAT.md section 10) with no copy of its source frames.
fn fold(p: &mut Profiled, metric: Metric, inverted: bool) -> BTreeMap<String, u64> {
    let sites: Vec<(u32, u64)> = p
        .profile
        .sites()
        .map(|(id, s)| (id, metric.of(s)))
        .filter(|&(_, v)| v > 0)
        .collect();
    // A frame's names, innermost first (inlined code has several).
    let mut names: FxHashMap<Frame, Vec<String>> = FxHashMap::default();
    let mut stack: Vec<Frame> = Vec::new();
    let mut line = String::new();
    let mut folded: BTreeMap<String, u64> = BTreeMap::new();
    for (id, value) in sites {
        stack.clear();
        stack.extend(p.pass.stacks.frames(id));
        for &frame in &stack {
            names.entry(frame).or_insert_with(|| {
                let source = p.resolver.frame(&p.pass.stacks, frame);
                source.iter().map(|f| clean(&f.function)).collect()
            });
        }
        line.clear();
        let mut push = |name: &String| {
            if !line.is_empty() {
                line.push(';');
            }
            line.push_str(name);
        };
        if inverted {
            stack.iter().flat_map(|f| &names[f]).for_each(&mut push);
        } else {
            stack
                .iter()
                .rev()
                .flat_map(|f| names[f].iter().rev())
                .for_each(&mut push);
        }
        if stack.is_empty() {
            line.push_str(NO_STACK);
        }
        // A new key is a copy of the line, of its exact size.
        match folded.get_mut(line.as_str()) {
            Some(v) => *v += value,
            None => {
                folded.insert(line.clone(), value);
            }
        }
    }
    folded
}

/// A function name as a folded-stack frame: no `;` (the separator), and
/// control characters escaped ([`printable`]): no line breaks, nothing
/// that drives a terminal or breaks the SVG's XML.
fn clean(function: &str) -> String {
    printable(function).replace(';', ":")
}
