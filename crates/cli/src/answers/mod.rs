//! The answers about allocation sites: `top`, `leaks`, `flamegraph` and
//! `diff`, each a [`Profile`] of one pass over the traces given, its
//! stacks symbolized for output. (The HTML report is html.rs.)

pub mod diff;
pub mod flamegraph;
pub mod leaks;
pub mod suppressions;
pub mod top;

use std::path::PathBuf;

use alloctrace_analysis::{
    Breakdowns, Pass, Profile, Resolver, Sampling, Site, SourceFrame, StackId,
};
use serde_json::{json, Value};

use crate::analyze::{inputs, run_pass, SymbolArgs};
use crate::failure::Failure;
use crate::print::printable;

/// A pass over `files` with a [`Profile`] of its sites.
pub struct Profiled {
    pub pass: Pass,
    pub profile: Profile,
    pub resolver: Resolver,
    /// The files as given, for titles.
    pub names: Vec<String>,
}

impl Profiled {
    /// Reads every trace of `files` (one program's traces) into one
    /// profile.
    pub fn read(
        files: &[PathBuf],
        breakdowns: Breakdowns,
        symbols: &SymbolArgs,
    ) -> Result<Profiled, Failure> {
        let inputs = inputs(files)?;
        let mut profile = Profile::new(breakdowns);
        let pass = run_pass(&inputs, &mut profile)?;
        let resolver = symbols.resolver(&inputs);
        Ok(Profiled {
            pass,
            profile,
            resolver,
            names: inputs.iter().map(|i| i.name()).collect(),
        })
    }

    /// The source frames of `stack`, innermost first (none for stack 0).
    pub fn frames(&mut self, stack: StackId) -> Vec<SourceFrame> {
        self.resolver.stack(&self.pass.stacks, stack)
    }

    /// The function of the innermost source frame of `stack`;
    /// [`NO_STACK`] for stack 0.
    pub fn innermost_function(&mut self, stack: StackId) -> String {
        match self.pass.stacks.frame(stack) {
            Some(frame) => self.resolver.frame(&self.pass.stacks, frame)[0]
                .function
                .clone(),
            None => NO_STACK.to_string(),
        }
    }

    /// The symbolizer's notes (a missing module file, a build ID that does
    /// not match) on stderr, once each.
    pub fn print_warnings(&self) {
        for warning in self.resolver.symbolizer.warnings() {
            eprintln!("warning: {}", printable(&warning));
        }
    }
}

/// Text for stdout, written out a piece at a time as it grows, so that a
/// report of many deep stacks never holds all of its output.
#[derive(Default)]
pub struct Output {
    pub text: String,
}

impl Output {
    /// Writes the text so far when it has grown past 64 KiB.
    pub fn flush_some(&mut self) -> Result<(), Failure> {
        if self.text.len() >= 1 << 16 {
            crate::print::print_stdout(&self.text)?;
            self.text.clear();
        }
        Ok(())
    }
}

/// The line a sampled trace's text answers open with, saying that their
/// counts and bytes are estimates; `None` for a trace that recorded
/// every allocation.
pub fn sampled_line(sampling: Sampling) -> Option<String> {
    sampling.estimated().then(|| {
        format!(
            "Estimates: the trace sampled one allocation per {} allocated on average (--sample-bytes); counts and bytes are estimated from the samples (see docs/CLI.md, \"Sampled traces\").\n",
            crate::units::bytes(sampling.sample_bytes, crate::units::Decimals::Three)
        )
    })
}

/// The JSON answers' `"sampled"` value: `{"sample_bytes": N, "estimated":
/// true}` for a sampled trace, null otherwise.
pub fn sampled_json(sampling: Sampling) -> Value {
    if sampling.estimated() {
        json!({"sample_bytes": sampling.sample_bytes, "estimated": true})
    } else {
        Value::Null
    }
}

/// The name of allocations recorded without a stack.
pub const NO_STACK: &str = "[no stack]";

/// A frame as the JSON outputs give it.
pub fn frame_json(f: &SourceFrame) -> Value {
    json!({
        "function": f.function,
        "file": f.file,
        "line": f.line,
        "module": f.module,
        "address": f.address,
    })
}

pub fn stack_json(frames: &[SourceFrame]) -> Value {
    Value::Array(frames.iter().map(frame_json).collect())
}

/// A site's counts as JSON keys (`peak_objects` is not part of the
/// issue's shape and is left out).
pub fn counts_json(site: &Site, into: &mut serde_json::Map<String, Value>) {
    into.insert("allocations".into(), site.allocations.into());
    into.insert("bytes".into(), site.bytes.into());
    into.insert("peak_bytes".into(), site.peak_bytes.into());
    into.insert("leaked_objects".into(), site.leaked_objects.into());
    into.insert("leaked_bytes".into(), site.leaked_bytes.into());
    into.insert("temporary".into(), site.temporary.into());
}

/// `function file:line` (or `function (module)` without a file), how a
/// frame is shown in text tables: control characters escaped
/// ([`printable`]).
pub fn frame_text(f: &SourceFrame) -> String {
    let text = match (&f.file, f.line) {
        (Some(file), Some(line)) => format!("{} {}:{line}", f.function, short_path(file)),
        (Some(file), None) => format!("{} {}", f.function, short_path(file)),
        (None, _) if !f.module.is_empty() && !f.function.contains('+') => {
            let module = f.module.rsplit('/').next().unwrap_or(&f.module);
            format!("{} ({module})", f.function)
        }
        (None, _) => f.function.clone(),
    };
    printable(&text).into_owned()
}

/// The last two components of a path (`src/main.c`).
fn short_path(path: &str) -> &str {
    let mut cut = path.len();
    for _ in 0..2 {
        match path[..cut].rfind('/') {
            Some(i) => cut = i,
            None => return path,
        }
    }
    &path[cut + 1..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_as_text() {
        let mut f = SourceFrame {
            function: "make_name".into(),
            file: Some("/src/c_tests/reports/leaky.c".into()),
            line: Some(33),
            module: "/tmp/leaky".into(),
            address: "0x1149".into(),
        };
        assert_eq!(frame_text(&f), "make_name reports/leaky.c:33");
        f.file = None;
        assert_eq!(frame_text(&f), "make_name (leaky)");
        f.function = "leaky+0x1149".into();
        assert_eq!(frame_text(&f), "leaky+0x1149");
    }
}
