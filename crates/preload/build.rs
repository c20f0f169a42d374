//! Compiles execl.c (execl, execlp and execle: variadic, so C) into the shim,
//! links it `-z nodelete`: session.rs registers its exit handler for the
//! process, so the shim's code must stay mapped until exit even if a
//! program dlopens and dlcloses it; and links it with -Bsymbolic-functions:
//! the shim's own calls of the functions it defines (the writer's
//! pthread_create, execvp's execvpe) bind to its own definitions, never to
//! an interposer preloaded before it, which must see only the program's
//! calls.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
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
