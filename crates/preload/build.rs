//! Compiles execl.c (execl, execlp and execle: variadic, so C) into the shim,
//! and links it `-z nodelete`: session.rs registers its exit handler for the
//! process, so the shim's code must stay mapped until exit even if a
//! program dlopens and dlcloses it.
fn main() {
    println!("cargo:rerun-if-changed=src/execl.c");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    cc::Build::new()
        .file("src/execl.c")
        .flag_if_supported("-std=c11")
        .flag("-D_GNU_SOURCE")
        .warnings_into_errors(true)
        .extra_warnings(true)
        .flag_if_supported("-Wpedantic")
        .compile("alloctrace_execl");
}
