//! Compiles the C call chains used by the tests and the benchmark example
//! (tests/c/): one file with frame pointers (-O0 -fno-omit-frame-pointer),
//! one without (-O2 -fomit-frame-pointer). They are linked into the test and
//! example binaries only (`rustc-link-arg-tests`/`-examples`), never into the
//! library, so the shim that depends on this crate gets none of them.

fn main() {
    println!("cargo:rerun-if-changed=tests/c/fp_chain.c");
    println!("cargo:rerun-if-changed=tests/c/nofp_chain.c");
    let target = std::env::var("TARGET").unwrap_or_default();
    if !(target.starts_with("x86_64") && target.contains("linux")) {
        return;
    }
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    cc::Build::new()
        .file("tests/c/fp_chain.c")
        .opt_level(0)
        .debug(true)
        .flag("-fno-omit-frame-pointer")
        .cargo_metadata(false)
        .compile("unwt_fp");
    cc::Build::new()
        .file("tests/c/nofp_chain.c")
        .opt_level(2)
        .debug(true)
        .flag("-fomit-frame-pointer")
        .flag("-fasynchronous-unwind-tables")
        .cargo_metadata(false)
        .compile("unwt_nofp");
    // Link arguments go after the Rust objects, so the archives resolve
    // the tests' references to unwt_*.
    for kind in ["tests", "examples"] {
        println!("cargo:rustc-link-arg-{kind}={out}/libunwt_fp.a");
        println!("cargo:rustc-link-arg-{kind}={out}/libunwt_nofp.a");
    }
}
