//! The shim among other libraries: the program's own allocator (jemalloc,
//! tcmalloc, mimalloc), interposers preloaded before and after it, and
//! the children it follows through every exec and spawn.

use crate::harness::*;
use crate::programs::counted;

/// Runs `alloctrace record -o D/r.%p.trace -- ARGV` with the shim under
/// test and the settings `vars`, stdout to D/rout, stderr to D/rerr.
fn recorded(case: &Case, vars: &[(&str, &str)], argv: &[&str]) -> i32 {
    let trace = case.path("r.%p.trace");
    let mut all = vec![cli(), "record", "-o", &trace, "--"];
    all.extend_from_slice(argv);
    let mut vars = vars.to_vec();
    vars.insert(0, ("ALLOCTRACE_PRELOAD", shim()));
    run_limited(&mut case.command(&vars, &all, "rout", "rerr"))
}

/// The biggest trace of `record` in D (the program's, when a shell ran
/// it), or "".
fn biggest_recorded(case: &Case) -> String {
    std::fs::read_dir(case.dir())
        .expect("read the case's directory")
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("r.") && n.ends_with(".trace")
        })
        .max_by_key(|e| e.metadata().map_or(0, |m| m.len()))
        .map(|e| e.path().to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The program keeps its own allocator: prog_allocator linked against (or
/// run with a preloaded) jemalloc, tcmalloc or mimalloc checks with the
/// allocator's own API that every block is the allocator's; under the
/// shim and under `record`, each trace checks ok and holds every
/// allocation.
fn allocator(name: &str, allocator: &str, preloaded: bool, under_record: bool) {
    let case = Case::new(name);
    let linked = prog(&format!("linked_{allocator}"));
    if !std::path::Path::new(&linked).is_file() {
        skip(&format!(
            "lib{allocator} is not installed (CI installs it): linked_{allocator} was not built"
        ));
        return;
    }
    let ldd = command("ldd").arg(&linked).output().expect("run ldd");
    let lib = String::from_utf8_lossy(&ldd.stdout)
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && f[0].contains(allocator)).then(|| f[2].to_string())
        })
        .unwrap_or_default();
    let (program, preload) = if preloaded {
        let preload = if under_record {
            lib.clone()
        } else {
            format!("{}:{lib}", shim())
        };
        (prog("prog_allocator"), Some(preload))
    } else {
        (linked, None)
    };
    let vars: Vec<(&str, &str)> = preload.iter().map(|p| ("LD_PRELOAD", p.as_str())).collect();
    let run = |args: &[&str]| -> (i32, String, String, String) {
        let mut argv = vec![program.as_str()];
        argv.extend_from_slice(args);
        if under_record {
            let rc = recorded(&case, &vars, &argv);
            (
                rc,
                biggest_recorded(&case),
                case.read("rout"),
                case.read("rerr"),
            )
        } else {
            let rc = case.traced(&vars, &argv);
            (rc, case.trace(), case.read("out"), case.read("err"))
        }
    };
    let (rc, t, out, err) = run(&[allocator]);
    let allocs = out
        .lines()
        .find_map(|l| l.strip_prefix("ALLOCS ")?.trim().parse::<i64>().ok());
    assert_eq!(rc, 0, "exit status; stderr: {}", head(&err, 3));
    assert!(
        out.lines().any(|l| l == "ok"),
        "the program's checks: {}",
        head(&out, 3)
    );
    assert!(!t.is_empty(), "no trace");
    let (crc, check_out) = check(&t);
    assert_eq!(crc, 0, "check: {}", head(&check_out, 2));
    let allocs = allocs.expect("the program printed no ALLOCS line");
    let n = stats(&t).num("heap_object_alloc");
    assert!(
        n >= allocs,
        "{n} allocs in the trace, the program made {allocs}"
    );
    if allocator == "jemalloc" {
        let (rc, _, out, err) = run(&[allocator, "mallocx"]);
        assert_eq!(
            rc,
            0,
            "free(mallocx(64)): exit status; stderr: {}",
            head(&err, 3)
        );
        assert!(
            out.lines().any(|l| l == "ok"),
            "free(mallocx(64)): {}",
            head(&out, 3)
        );
    }
}

macro_rules! allocator_cases {
    ($($name:ident: $allocator:literal, $preloaded:literal, $record:literal;)*) => {$(
        #[test]
        fn $name() {
            allocator(stringify!($name), $allocator, $preloaded, $record);
        }
    )*};
}

allocator_cases! {
    allocator_jemalloc_linked_shim: "jemalloc", false, false;
    allocator_jemalloc_linked_record: "jemalloc", false, true;
    allocator_jemalloc_preloaded_shim: "jemalloc", true, false;
    allocator_jemalloc_preloaded_record: "jemalloc", true, true;
    allocator_tcmalloc_linked_shim: "tcmalloc", false, false;
    allocator_tcmalloc_linked_record: "tcmalloc", false, true;
    allocator_tcmalloc_preloaded_shim: "tcmalloc", true, false;
    allocator_tcmalloc_preloaded_record: "tcmalloc", true, true;
    allocator_mimalloc_linked_shim: "mimalloc", false, false;
    allocator_mimalloc_linked_record: "mimalloc", false, true;
    allocator_mimalloc_preloaded_shim: "mimalloc", true, false;
    allocator_mimalloc_preloaded_record: "mimalloc", true, true;
}

/// A second interposer preloaded after the shim (libcounter.so) sees
/// exactly the heap calls the trace holds. (libcounter.so ends the chain:
/// its mmap, munmap and mremap are system calls; libchain.so, below,
/// forwards them.)
fn counter_after(name: &str, under_record: bool) {
    let case = Case::new(name);
    let counts = case.path("counts");
    let counter = prog("libcounter.so");
    let entry_points = prog("prog_entry_points");
    let (rc, t, err) = if under_record {
        // COUNT_OUTPUT only for the program (record itself has the counter too).
        let script = format!("COUNT_OUTPUT='{counts}' exec '{entry_points}'");
        let rc = recorded(&case, &[("LD_PRELOAD", &counter)], &["sh", "-c", &script]);
        (rc, biggest_recorded(&case), case.read("rerr"))
    } else {
        let preload = format!("{}:{counter}", shim());
        let rc = case.traced(
            &[("LD_PRELOAD", &preload), ("COUNT_OUTPUT", &counts)],
            &[&entry_points],
        );
        (rc, case.trace(), case.read("err"))
    };
    assert_eq!(rc, 0, "exit status; stderr: {}", head(&err, 3));
    assert!(!t.is_empty(), "no trace");
    let counts = case.read("counts");
    assert!(!counts.is_empty(), "the counter wrote nothing");
    let (crc, check_out) = check(&t);
    assert_eq!(crc, 0, "check: {}", head(&check_out, 2));
    let s = stats(&t);
    for e in crate::programs::ENTRIES.iter().take(10) {
        let want = counted(&counts, e);
        assert_eq!(
            Some(s.entry(e)),
            want,
            "{e}: trace (left) vs counter (right)"
        );
        assert!(want.is_some_and(|n| n > 0), "{e}: never called");
    }
}

#[test]
fn second_interposer_shim() {
    counter_after("second_interposer_shim", false);
}

#[test]
fn second_interposer_record() {
    counter_after("second_interposer_record", true);
}

/// What prog_chain main calls, as libchain.so counts them.
const CHAIN_MAIN: &str = "mmap=500 mmap64=20 munmap=520 mremap=500 pthread_create=4 sigaction=6 __sigaction=2 \
                          signal=1 bsd_signal=1 ssignal=1 sysv_signal=1 __sysv_signal=1 sigset=1 dlopen=3 \
                          dlmopen=1 dlclose=4";
/// Its exec and spawn calls, counted alone or before the shim.
const CHAIN_EXEC: &str =
    "execve=1 execv=2 execvp=1 execvpe=1 fexecve=1 execl=1 execlp=1 execle=1 posix_spawn=2 posix_spawnp=1";
/// Its exec and spawn calls, counted after the shim (which passes the
/// run's environment, which only execve and execvpe take).
const CHAIN_EXEC_AFTER: &str = "execve=5 execvpe=3 fexecve=1 posix_spawn=2 posix_spawnp=1";

/// The nonzero counts of the last line of `label` in libchain's output,
/// and how many lines it has ("none" when none).
fn chain_counts(chain: &str, label: &str) -> (usize, String) {
    let lines: Vec<&str> = chain
        .lines()
        .filter(|l| l.split_whitespace().next() == Some(label))
        .collect();
    let last = lines.last().map_or("none".to_string(), |l| {
        l.split_whitespace()
            .skip(2)
            .filter(|f| !f.ends_with("=0"))
            .collect::<Vec<_>>()
            .join(" ")
    });
    (lines.len(), last)
}

/// Every interposed function reaches the next definition (real.rs): a
/// counting interposer that forwards with dlsym(RTLD_NEXT) (libchain.c),
/// preloaded after the shim and before it, sees exactly the calls
/// prog_chain makes (500 mmap, mremap and munmap, threads, the signal
/// functions, dlopen, spawns, every exec function), as it does alone.
/// After the shim, execv and execl reach it as execve, execvp and execlp
/// as execvpe, execle as execve. Nothing of the shim's own (its mappings,
/// its threads, its signal handlers) reaches it. Each process image's last
/// line counts (prog_chain main's is its last exec; tail and spawned end
/// in _exit, _Exit).
fn chain(name: &str, order: &str) {
    let case = Case::new(name);
    let libchain = prog("libchain.so");
    let (preload, want) = match order {
        "alone" => (libchain.clone(), format!("{CHAIN_MAIN} {CHAIN_EXEC}")),
        "before" => (
            format!("{libchain}:{}", shim()),
            format!("{CHAIN_MAIN} {CHAIN_EXEC}"),
        ),
        _ => (
            format!("{}:{libchain}", shim()),
            format!("{CHAIN_MAIN} {CHAIN_EXEC_AFTER}"),
        ),
    };
    let want: String = want.split_whitespace().collect::<Vec<_>>().join(" ");
    let output = case.path("chain");
    let vars = [
        ("LD_PRELOAD", preload.as_str()),
        ("CHAIN_OUTPUT", output.as_str()),
    ];
    let argv = [prog("prog_chain"), "main".to_string()];
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let rc = if order == "alone" {
        case.limited(&vars, &argv)
    } else {
        case.traced(&vars, &argv)
    };
    let chain = case.read("chain");
    assert_eq!(
        rc,
        0,
        "exit status; out: {} {}",
        head(&case.read("out"), 3),
        case.err_head()
    );
    assert!(
        case.read("out").lines().any(|l| l == "main done"),
        "out: {}",
        case.read("out")
    );
    assert!(!chain.is_empty(), "libchain wrote nothing");
    assert_eq!(chain_counts(&chain, "main").1, want, "main's calls");
    assert_eq!(chain_counts(&chain, "tail").1, "_exit=1", "tail's calls");
    let (n, spawned) = chain_counts(&chain, "spawned");
    assert_eq!(n, 3, "spawned lines");
    assert_eq!(spawned, "_Exit=1", "the last spawned's calls");
    if order != "alone" {
        let n = case.traces().len();
        assert!(n >= 5, "{n} traces, want one per image and failed exec");
        let bad = case.check_all();
        assert!(bad.is_empty(), "check: {bad:?}");
    }
}

#[test]
fn chain_alone() {
    chain("chain_alone", "alone");
}

#[test]
fn chain_before() {
    chain("chain_before", "before");
}

#[test]
fn chain_after() {
    chain("chain_after", "after");
}

/// The run follows every exec and spawn (run_env.rs, exec.rs): prog_follow
/// starts a child with its own LD_PRELOAD, a custom environment
/// (posix_spawn(p), execve, execle; with a wrong ALLOCTRACE_OUTPUT and
/// ALLOCTRACE_OVERWRITE=1 in it), execl and execlp; `env -i` and `env -u
/// LD_PRELOAD` start one with none. Each child is traced (listed in the
/// index, into the run's directory), the shim first in its LD_PRELOAD (the
/// program's own entries kept), without ALLOCTRACE_OVERWRITE; the parent's
/// trace is complete.
fn follow(name: &str, mode: &str, argv: &[&str]) {
    let case = Case::new(name);
    let rc = case.traced(&[], argv);
    let traces = case.traces();
    let out = case.read("out");
    let line = out
        .lines()
        .find(|l| l.starts_with("child "))
        .unwrap_or_default();
    assert_eq!(rc, 0, "exit status; stderr: {}", case.err_head());
    assert_eq!(traces.len(), 2, "traces: {traces:?}");
    let bad = case.check_all();
    assert!(bad.is_empty(), "check: {bad:?}");
    assert!(
        line.starts_with(&format!("child LD_PRELOAD={}", shim())),
        "the child's LD_PRELOAD: '{line}'"
    );
    assert!(
        !line.contains("OVERWRITE"),
        "the child has ALLOCTRACE_OVERWRITE: '{line}'"
    );
    let child = &traces[1];
    let allocs = stats(child).num("heap_object_alloc");
    assert!(
        allocs >= 100,
        "the child's trace {child} has {allocs} allocs"
    );
    assert!(
        child.starts_with(&case.path("")),
        "the child's trace {child} is not in the run's directory"
    );
    if mode == "preload" {
        assert!(
            line.ends_with(&format!(":{}", prog("libcounter.so"))),
            "the child's own preload was dropped: '{line}'"
        );
    }
    if mode.starts_with("execl") {
        assert!(
            out.lines().any(|l| l == "argc 10 last 8"),
            "the child's arguments: {out}"
        );
    }
}

#[test]
fn follow_preload() {
    follow(
        "follow_preload",
        "preload",
        &[&prog("prog_follow"), "preload", &prog("libcounter.so")],
    );
}

#[test]
fn follow_execve() {
    follow("follow_execve", "execve", &[&prog("prog_follow"), "execve"]);
}

#[test]
fn follow_spawn() {
    follow("follow_spawn", "spawn", &[&prog("prog_follow"), "spawn"]);
}

#[test]
fn follow_spawnp() {
    follow("follow_spawnp", "spawnp", &[&prog("prog_follow"), "spawnp"]);
}

#[test]
fn follow_execl() {
    follow("follow_execl", "execl", &[&prog("prog_follow"), "execl"]);
}

#[test]
fn follow_execlp() {
    follow("follow_execlp", "execlp", &[&prog("prog_follow"), "execlp"]);
}

#[test]
fn follow_execle() {
    follow("follow_execle", "execle", &[&prog("prog_follow"), "execle"]);
}

#[test]
fn follow_env_i() {
    follow(
        "follow_env_i",
        "env_i",
        &["env", "-i", &prog("prog_follow"), "child"],
    );
}

/// `env -u LD_PRELOAD`: the shim is added back.
#[test]
fn follow_env_u() {
    follow(
        "follow_env_u",
        "env_u",
        &["env", "-u", "LD_PRELOAD", &prog("prog_follow"), "child"],
    );
}

/// A child environment with ALLOCTRACE_DISABLE=1 opts that program out: it
/// runs untraced; the parent's trace checks ok.
#[test]
fn follow_disable() {
    let case = Case::new("follow_disable");
    let rc = case.traced(&[], &[&prog("prog_follow"), "disable"]);
    let traces = case.traces();
    assert_eq!(rc, 0, "exit status; stderr: {}", case.err_head());
    assert_eq!(traces.len(), 1, "traces: {traces:?}");
    assert!(
        case.read("out").lines().any(|l| l.starts_with("child ")),
        "out: {}",
        case.read("out")
    );
    let bad = case.check_all();
    assert!(bad.is_empty(), "check: {bad:?}");
}
