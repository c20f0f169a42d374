//! The traces a command reads: the files, directories and `-` named on
//! the command line ([`expand_inputs`]), each opened as a [`Reader`], and
//! the loop of the reading commands over them ([`run_each`]).

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use alloctrace_reader::TraceReader;

use crate::failure::Failure;
use crate::print::printable;

/// One trace to read: a file, or standard input (`-`).
pub struct Input {
    /// `None`: standard input.
    pub(crate) path: Option<PathBuf>,
}

impl Input {
    pub fn file(path: &Path) -> Input {
        Input {
            path: Some(path.to_path_buf()),
        }
    }

    /// As the user gave it: the path, or `-`.
    pub fn name(&self) -> String {
        match &self.path {
            Some(path) => path.display().to_string(),
            None => "-".to_string(),
        }
    }

    /// The file's size (0 for standard input or when unknown).
    pub fn size(&self) -> u64 {
        self.path
            .as_ref()
            .and_then(|p| std::fs::metadata(p).ok())
            .map_or(0, |m| m.len())
    }
}

pub type Reader = TraceReader<BufReader<Box<dyn Read + Send>>>;

/// Opens a trace and reads its header.
pub fn open(input: &Input) -> Result<Reader, Failure> {
    let (source, name): (Box<dyn Read + Send>, String) = match &input.path {
        Some(path) => (
            Box::new(
                File::open(path)
                    .map_err(|e| Failure::Io(format!("cannot open {}: {e}", path.display())))?,
            ),
            path.display().to_string(),
        ),
        None => (Box::new(io::stdin()), "standard input".to_string()),
    };
    let reader = TraceReader::new(BufReader::with_capacity(8 * 1024, source)).map_err(|e| {
        if e.is_malformed() {
            Failure::Malformed(e)
        } else {
            Failure::Io(format!("cannot read {name}: {e}"))
        }
    })?;
    Ok(reader)
}

/// `a` before `b` in name order, digit runs compared as numbers (`9.trace`
/// before `10.trace`).
fn natural_order(a: &str, b: &str) -> std::cmp::Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    for (x, y) in chunks(a).iter().zip(chunks(b).iter()) {
        let order = match (x, y) {
            ((true, x), (true, y)) => {
                let (x, y) = (x.trim_start_matches('0'), y.trim_start_matches('0'));
                x.len().cmp(&y.len()).then_with(|| x.cmp(y))
            }
            ((_, x), (_, y)) => x.cmp(y),
        };
        if order.is_ne() {
            return order;
        }
    }
    chunks(a).len().cmp(&chunks(b).len()).then_with(|| a.cmp(b))
}

/// The traces named on the command line: files as given, `-` for
/// standard input (once), a directory for its `*.trace` files in name
/// order. The flag says whether outputs are labelled with the file's name
/// (several traces, or any directory).
pub fn expand_inputs(args: &[PathBuf]) -> Result<(Vec<Input>, bool), Failure> {
    let mut inputs = Vec::new();
    let mut labelled = args.len() > 1;
    let mut stdin = false;
    for arg in args {
        if arg.as_os_str() == "-" {
            if stdin {
                return Err(Failure::Io("- (standard input) given twice".to_string()));
            }
            stdin = true;
            inputs.push(Input { path: None });
        } else if arg.is_dir() {
            labelled = true;
            let entries = std::fs::read_dir(arg)
                .map_err(|e| Failure::Io(format!("cannot read {}: {e}", arg.display())))?;
            let mut names: Vec<String> = entries
                .filter_map(|e| e.ok())
                .filter(|e| e.path().is_file())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.ends_with(".trace"))
                .collect();
            if names.is_empty() {
                return Err(Failure::Io(format!(
                    "{}: a directory without .trace files",
                    arg.display()
                )));
            }
            names.sort_by(|a, b| natural_order(a, b));
            inputs.extend(names.iter().map(|n| Input::file(&arg.join(n))));
        } else {
            inputs.push(Input::file(arg));
        }
    }
    Ok((inputs, labelled))
}

/// Runs a reading command on every input. One unlabelled input: as before,
/// its failure is the command's. Several (or a directory): each trace in
/// turn, labelled with its name (`label`); a trace that cannot be read
/// says so and the others are still read; the exit code is the lowest
/// non-zero code of any trace (1 unreadable, 2 malformed, 3 truncated, 4
/// inconsistent), 0 if all succeeded.
pub fn run_each(
    args: &[PathBuf],
    mut f: impl FnMut(&Input, Option<&str>) -> Result<(), Failure>,
) -> Result<(), Failure> {
    let (inputs, labelled) = expand_inputs(args)?;
    if !labelled {
        return f(&inputs[0], None);
    }
    let mut worst: Option<u8> = None;
    for input in &inputs {
        let name = input.name();
        let code = match f(input, Some(&name)) {
            Ok(()) => 0,
            // stdout was closed (`| head`): stop quietly.
            Err(Failure::Verdict(0)) => return Err(Failure::Verdict(0)),
            Err(Failure::Verdict(code)) => code,
            Err(Failure::Io(msg)) => {
                eprintln!("error: {}", printable(&msg));
                1
            }
            Err(Failure::Malformed(err)) => {
                eprintln!("error: {}: {err}", printable(&name));
                2
            }
        };
        if code != 0 {
            worst = Some(worst.map_or(code, |w| w.min(code)));
        }
    }
    match worst {
        None => Ok(()),
        Some(code) => Err(Failure::Verdict(code)),
    }
}
