//! `alloctrace __generate DIR` (for `make install`, not a subcommand): writes the man
//! pages and the shell completions, generated from the clap definition, so
//! they never disagree with `--help`.
//!
//! DIR/man1/alloctrace.1 and alloctrace-SUBCOMMAND.1; DIR/completions/
//! alloctrace.bash, _alloctrace (zsh) and alloctrace.fish.

use std::path::Path;

use clap_complete::Shell;

use crate::failure::Failure;

/// `cmd`: the clap definition of `alloctrace` (main.rs's `Cli`).
pub fn run(dir: &Path, cmd: clap::Command) -> Result<(), Failure> {
    let io = |what: &str, e: std::io::Error| {
        Failure::Io(format!("cannot write {what} under {}: {e}", dir.display()))
    };
    let man = dir.join("man1");
    std::fs::create_dir_all(&man).map_err(|e| io("the man pages", e))?;
    clap_mangen::generate_to(cmd.clone(), &man).map_err(|e| io("the man pages", e))?;
    let completions = dir.join("completions");
    std::fs::create_dir_all(&completions).map_err(|e| io("the completions", e))?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut cmd = cmd.clone();
        clap_complete::generate_to(shell, &mut cmd, "alloctrace", &completions)
            .map_err(|e| io("the completions", e))?;
    }
    Ok(())
}
