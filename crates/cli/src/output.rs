//! What every command that writes files checks first: that no file it
//! would write is one of the files it reads.
//!
//! Files are compared by device and inode, as the kernel sees them, so
//! the same trace is caught by any name: `T`, `./T`, a symbolic link to
//! it, a hard link, or standard input redirected from it. A written file
//! that does not exist yet cannot be an input.

use std::fs::{File, Metadata};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use alloctrace_symbolize::sidecar_path;

use crate::failure::Failure;
use crate::input::Input;

/// One file a command reads, as the user will recognise it.
struct Read {
    what: String,
    id: (u64, u64),
}

fn file_id(meta: &Metadata) -> (u64, u64) {
    (meta.dev(), meta.ino())
}

/// The files `inputs` stand for: each trace (standard input when it is a
/// regular file) and, with `symbols`, each trace's FILE.symbols that
/// exists, which the analysis commands read too.
fn files_read(inputs: &[Input], symbols: bool) -> Vec<Read> {
    let mut read = Vec::new();
    for input in inputs {
        match &input.path {
            Some(path) => {
                if let Ok(meta) = std::fs::metadata(path) {
                    read.push(Read {
                        what: format!("the input trace {}", path.display()),
                        id: file_id(&meta),
                    });
                }
                let sidecar = sidecar_path(path);
                if let Some(meta) = std::fs::metadata(&sidecar).ok().filter(|_| symbols) {
                    read.push(Read {
                        what: format!(
                            "{}, the symbols of the input trace {}",
                            sidecar.display(),
                            path.display()
                        ),
                        id: file_id(&meta),
                    });
                }
            }
            None => {
                // A pipe or a terminal cannot be overwritten by a path;
                // a file redirected to standard input can.
                let stdin = io::stdin()
                    .as_fd()
                    .try_clone_to_owned()
                    .map(File::from)
                    .and_then(|f| f.metadata());
                if let Some(meta) = stdin.ok().filter(|m| m.is_file()) {
                    read.push(Read {
                        what: "the input trace (the file on standard input)".to_string(),
                        id: file_id(&meta),
                    });
                }
            }
        }
    }
    read
}

/// Refuses, before anything is opened for writing, a `written` file that
/// is one of the files `inputs` read (the trace or its FILE.symbols), so
/// that an output never truncates an input. `remedy` ends the message:
/// what the user can do (`choose another -o`).
pub fn refuse_inputs(written: &[PathBuf], inputs: &[Input], remedy: &str) -> Result<(), Failure> {
    refuse(written, &files_read(inputs, true), remedy)
}

/// As [`refuse_inputs`], for `symbolize`, whose FILE.symbols are inputs
/// meant to be rewritten: only the traces count.
pub fn refuse_traces(written: &[PathBuf], inputs: &[Input], remedy: &str) -> Result<(), Failure> {
    refuse(written, &files_read(inputs, false), remedy)
}

fn refuse(written: &[PathBuf], read: &[Read], remedy: &str) -> Result<(), Failure> {
    for path in written {
        if path.as_os_str() == "-" {
            continue;
        }
        // Through a symbolic link: writing would truncate its target.
        let Ok(meta) = std::fs::metadata(path) else {
            continue;
        };
        if let Some(input) = read.iter().find(|r| r.id == file_id(&meta)) {
            return Err(Failure::Io(format!(
                "output {} is {}; {remedy}",
                path.display(),
                input.what
            )));
        }
    }
    Ok(())
}

/// The files a command writing into `dir` creates: `names` in it.
pub fn files_in(dir: &Path, names: &[&str]) -> Vec<PathBuf> {
    names.iter().map(|n| dir.join(n)).collect()
}
