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
