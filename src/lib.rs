//! alloctrace: the C API of the alloctrace memory-allocation tracer
//! (`liballoctrace.so`, `liballoctrace.a`, `include/alloctrace.h`).
//!
//! The writer core is the `alloctrace-writer` crate, re-exported here for
//! Rust users; this crate adds the C ABI in [`capi`], from which cbindgen
//! generates the header.
#![warn(unsafe_op_in_unsafe_fn)]
#![allow(non_camel_case_types)]

pub use alloctrace_writer::*;

#[cfg(not(loom))]
pub mod capi;
