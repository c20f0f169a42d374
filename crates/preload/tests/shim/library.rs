//! The library itself.

use crate::harness::*;

/// The shim exports exactly the functions it interposes.
#[test]
fn exports() {
    let expected = "_Exit __sigaction __sysv_signal _exit aligned_alloc bsd_signal calloc dlclose dlmopen \
                    dlopen execl execle execlp execv execve execvp execvpe fexecve free malloc memalign mmap \
                    mmap64 mremap munmap posix_memalign posix_spawn posix_spawnp pthread_create pvalloc \
                    realloc reallocarray sigaction signal sigset ssignal sysv_signal valloc";
    let out = command("nm")
        .args(["-D", "--defined-only", shim()])
        .output()
        .expect("run nm");
    assert!(
        out.status.success(),
        "nm: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut got: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect();
    got.sort();
    assert_eq!(got.join(" "), expected, "the shim's exports");
}

/// The shim needs only libc, libgcc_s and the loader: a library it
/// brought (libm, say, for a logarithm) would be loaded in every traced
/// process, and a program that dlopens it would make other calls than
/// without tracing (the panic cases count them).
#[test]
fn needs_only_libc() {
    let out = command("readelf")
        .args(["-d", shim()])
        .output()
        .expect("run readelf");
    assert!(
        out.status.success(),
        "readelf: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut needed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| Some(l.split('[').nth(1)?.trim_end_matches(']').to_string()))
        .collect();
    needed.sort();
    assert_eq!(
        needed.join(" "),
        "ld-linux-x86-64.so.2 libc.so.6 libgcc_s.so.1",
        "the shim's NEEDED libraries"
    );
}
