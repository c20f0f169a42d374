//! Compiles execl.c (execl, execlp and execle: variadic, so C) into the shim.
fn main() {
    println!("cargo:rerun-if-changed=src/execl.c");
    cc::Build::new()
        .file("src/execl.c")
        .flag_if_supported("-std=c11")
        .flag("-D_GNU_SOURCE")
        .warnings_into_errors(true)
        .extra_warnings(true)
        .flag_if_supported("-Wpedantic")
        .compile("alloctrace_execl");
}
