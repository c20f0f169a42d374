//! Gives `liballoctrace.so` its SONAME, `liballoctrace.so.SOVERSION`.
//!
//! SOVERSION is the ABI version (docs/ABI.md says what bumps it); the Makefile
//! reads it from this line, installs the library as
//! `liballoctrace.so.SOVERSION.MINOR.PATCH` (MINOR.PATCH of the crate
//! version) and links the build tree's `liballoctrace.so.SOVERSION` to it.
const SOVERSION: &str = "0";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,liballoctrace.so.{SOVERSION}");
}
