//! What the analysis commands (`top`, `leaks`, `flamegraph`, `report`,
//! `diff`, `export`) share: one pass over every trace given, with progress
//! on a terminal, and the symbolizer's options.

use std::path::PathBuf;

use alloctrace_analysis::{Pass, Resolver, Visitor};
use alloctrace_symbolize::{sidecar_path, Options, Symbolizer};

use crate::failure::Failure;
use crate::input::{expand_inputs, open, Input};
use crate::print::{prefix, truncation_warning};
use crate::progress::Progress;

/// The symbolizer's options, the same for every analysis command.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SymbolArgs {
    /// A directory of separate debug files, searched first (by build ID as
    /// .build-id/xx/rest.debug, and by .gnu_debuglink name); may be repeated.
    #[arg(long = "debug-dir", value_name = "DIR")]
    pub debug_dirs: Vec<PathBuf>,
}

impl SymbolArgs {
    /// A resolver for the frames of `inputs`' traces: each trace's
    /// FILE.symbols (`alloctrace symbolize`) answers first, then the
    /// modules' files and the debug directories.
    pub fn resolver(&self, inputs: &[Input]) -> Resolver {
        let mut resolver = Resolver::new(Symbolizer::new(Options {
            debug_dirs: self.debug_dirs.clone(),
        }));
        for path in inputs.iter().filter_map(|i| i.path.as_deref()) {
            let symbols = sidecar_path(path);
            if let Err(err) = resolver.symbolizer.load_symbols(&symbols) {
                eprintln!(
                    "warning: {} is not used: {}; symbolizing from the modules' files",
                    crate::print::printable(&symbols.display().to_string()),
                    crate::print::printable(&err)
                );
            }
        }
        resolver
    }
}

/// The traces named by `files` (directories give their *.trace files, `-`
/// standard input), as every reading command takes them.
pub fn inputs(files: &[PathBuf]) -> Result<Vec<Input>, Failure> {
    Ok(expand_inputs(files)?.0)
}

/// Reads every trace of `inputs` through one pass, as one program's
/// traces (stacks shared, each trace's live memory its own). A cut-off
/// trace gets the usual warning; a malformed one stops the pass.
pub fn run_pass<V: Visitor + Send>(inputs: &[Input], visitor: &mut V) -> Result<Pass, Failure> {
    let mut pass = Pass::new();
    let labelled = inputs.len() > 1;
    for input in inputs {
        let name = input.name();
        let label = labelled.then_some(name.as_str());
        let mut reader = open(input)?;
        let mut progress = Progress::new(input.size());
        let result = pass.run(&mut reader, visitor, |bytes| progress.update(bytes));
        progress.finish();
        match result {
            Ok(_live) => {}
            Err(err) => {
                let failure = Failure::from(err);
                return Err(match failure {
                    Failure::Io(msg) => Failure::Io(format!("{}{msg}", prefix(label))),
                    other => other,
                });
            }
        }
        if let Some(offset) = reader.truncated() {
            eprintln!("{}{}", prefix(label), truncation_warning(offset));
        }
        if reader.flight_window() {
            eprintln!(
                "{}note: a flight-recorder window: the last generations of the run, not all of it; \
                 memory allocated before it and freed in it is not counted, and what is live at its end \
                 was allocated in the window",
                prefix(label)
            );
        }
    }
    Ok(pass)
}
