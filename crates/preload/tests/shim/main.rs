//! The LD_PRELOAD shim's tests: the C programs of c_tests/preload, real
//! programs and `alloctrace record` under the release shim.
//!
//! `make preload-test` builds the shim, the panic-test shim, the CLI and
//! the programs, and runs these with their paths in the environment
//! (harness.rs, `Built`): `cargo test --release -p alloctrace-preload
//! --test shim` alone fails, saying so. Each case is a test of its own;
//! every traced run has a time limit (PRELOAD_TEST_TIMEOUT, 300 s), so a
//! deadlock fails its case instead of hanging the suite. A case that
//! cannot run here (an allocator or program not installed) passes and
//! prints "skipped: CASE: why" on stderr, which the harness does not
//! capture.

mod chain;
mod config;
mod flight;
mod harness;
mod library;
mod panic;
mod programs;
mod real_programs;
mod record;
mod sampling;
mod signals;
mod snapshot_signal;
