//! Writes the C header of the alloctrace library: `alloctrace-header-gen OUT`.
//! Run from the workspace root (the Makefile does); reads cbindgen.toml.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(out) = std::env::args_os().nth(1) else {
        eprintln!("usage: alloctrace-header-gen OUT.h   (run from the workspace root)");
        return ExitCode::from(2);
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let config = match cbindgen::Config::from_file(root.join("cbindgen.toml")) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: reading cbindgen.toml: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cbindgen::Builder::new().with_crate(&root).with_config(config).generate() {
        Ok(bindings) => {
            bindings.write_to_file(out);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: generating the header: {e}");
            ExitCode::FAILURE
        }
    }
}
