//! The control socket (issue 22, parts 2 and 4): `alloctrace ps`,
//! `snapshot PID -o` and `save PID -o` against running traced programs.
//!
//! - a known program (c_tests/control/live.c: 3 blocks of 1000 bytes at
//!   site_a, 2 of 5000 at site_b, 4 of 777 freed) is listed by `ps` and
//!   its snapshot holds exactly those live blocks, by site;
//! - after a long trace with nothing of it live (frees of another
//!   thread's blocks reaching the writer before their allocations
//!   among them), the snapshot holds exactly those live blocks, from the
//!   writer thread's live table, even with the trace file removed;
//! - one that closes every descriptor and forks keeps answering, and so
//!   does its child (a socket of its own);
//! - a stale socket (a dead process's) is skipped and removed by `ps`,
//!   refused by `snapshot`;
//! - a connection from another user is refused by the process (when the
//!   tests run as root: a client run as uid 65534);
//! - the socket is gone once the program has exited;
//! - `save` of a flight recorder (its ring turning over) writes a trace
//!   with the flight-window flag holding exactly the generations it
//!   names, the last ones, which every reading command reads; twice too;
//!   outside flight-recorder mode, and on bad arguments, it refuses and
//!   writes nothing; combined with sampling, the saved window is a sampled
//!   trace whose answers are estimates and say so.
//!
//! Each test points XDG_RUNTIME_DIR at a scratch directory, so the
//! sockets of other tests and programs are never seen. Synchronised by
//! files only: no timing is asserted. Needs the shim next to the binary,
//! and gcc.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

mod support;

use support::{gcc_program, record_command, Scratch};

/// c_tests/control/live.c, built once per test run.
fn live() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| gcc_program("control/live.c", "control-program", &["-g", "-pthread"]))
}

/// The scratch directory's runtime directory (XDG_RUNTIME_DIR).
fn runtime(dir: &Scratch) -> PathBuf {
    let run = dir.path("run");
    std::fs::create_dir_all(&run).unwrap();
    run
}

/// `alloctrace ARGS` with XDG_RUNTIME_DIR at the scratch's.
fn alloctrace(dir: &Scratch, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .env("XDG_RUNTIME_DIR", runtime(dir))
        .args(args)
        .current_dir(&dir.0)
        .output()
        .expect("run alloctrace")
}

/// A running `record -- live READY OPTIONS`, and the pids it wrote. A
/// test that fails lets the program end too (Drop).
struct Running {
    child: Child,
    ready: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = std::fs::write(format!("{}.go", self.ready.display()), "");
        let _ = self.child.wait();
    }
}

impl Running {
    fn start(dir: &Scratch, options: &[&str]) -> Running {
        Running::start_in(dir, &runtime(dir), &[], options)
    }

    /// With XDG_RUNTIME_DIR at `run`, `record RECORD_OPTIONS`.
    fn start_in(dir: &Scratch, run: &Path, record_options: &[&str], options: &[&str]) -> Running {
        let ready = dir.path("ready");
        let child = record_command()
            .env("XDG_RUNTIME_DIR", run)
            // Full mode keeps the live table only when asked.
            .env("ALLOCTRACE_LIVE_TABLE", "on")
            .arg("--no-report")
            .args(record_options)
            .arg("-o")
            .arg(dir.path("%p.trace"))
            .arg("--")
            .arg(live())
            .arg(&ready)
            .args(options)
            .current_dir(&dir.0)
            .stdout(Stdio::null())
            .spawn()
            .expect("start record");
        Running { child, ready }
    }

    /// The pid written to `path`, once it is there.
    fn pid_in(&mut self, path: &Path) -> u32 {
        let give_up = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(text) = std::fs::read_to_string(path) {
                return text.trim().parse().expect("a pid");
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "record ended before {} was written: {status}",
                    path.display()
                );
            }
            assert!(Instant::now() < give_up, "{} never written", path.display());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn pid(&mut self) -> u32 {
        let ready = self.ready.clone();
        self.pid_in(&ready)
    }

    fn child_pid(&mut self) -> u32 {
        let path = PathBuf::from(format!("{}.child", self.ready.display()));
        self.pid_in(&path)
    }

    /// Lets the program end and waits for record.
    fn finish(mut self) {
        std::fs::write(format!("{}.go", self.ready.display()), "").unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "record: {status}");
    }
}

fn json_of(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "alloctrace failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// `ps --json`'s processes.
fn ps(dir: &Scratch) -> Vec<serde_json::Value> {
    json_of(&alloctrace(dir, &["ps", "--json"]))["processes"]
        .as_array()
        .unwrap()
        .clone()
}

/// `snapshot PID --format json -o -`: (function of the innermost frame,
/// objects, bytes) per site, and the totals.
fn snapshot(dir: &Scratch, pid: u32) -> (Vec<(String, u64, u64)>, u64, u64) {
    let doc = json_of(&alloctrace(
        dir,
        &["snapshot", &pid.to_string(), "--format", "json", "-o", "-"],
    ));
    assert_eq!(doc["pid"], pid);
    let mut by_function: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    for site in doc["live"].as_array().unwrap() {
        let function = site["stack"][0]["function"]
            .as_str()
            .unwrap_or("?")
            .to_string();
        let entry = by_function.entry(function).or_default();
        entry.0 += site["objects"].as_u64().unwrap();
        entry.1 += site["bytes"].as_u64().unwrap();
    }
    (
        by_function
            .into_iter()
            .map(|(f, (o, b))| (f, o, b))
            .collect(),
        doc["objects"].as_u64().unwrap(),
        doc["bytes"].as_u64().unwrap(),
    )
}

fn sockets(dir: &Scratch) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(runtime(dir).join("alloctrace"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn ps_lists_the_program_and_its_snapshot_holds_exactly_its_live_blocks() {
    let dir = Scratch::new("known");
    let mut running = Running::start(&dir, &[]);
    let pid = running.pid();
    let processes = ps(&dir);
    assert_eq!(processes.len(), 1, "{processes:?}");
    assert_eq!(processes[0]["pid"], pid);
    assert_eq!(processes[0]["mode"], "full");
    let trace = dir.path(&format!("{pid}.trace"));
    assert_eq!(processes[0]["trace"], trace.display().to_string());
    assert!(processes[0]["command"].as_str().unwrap().contains("live"));
    let text = alloctrace(&dir, &["ps"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains(&pid.to_string()));

    let (sites, objects, bytes) = snapshot(&dir, pid);
    assert_eq!(
        sites,
        vec![
            ("site_a".to_string(), 3, 3000),
            ("site_b".to_string(), 2, 10000)
        ]
    );
    assert_eq!((objects, bytes), (5, 13000));
    // Asked twice, the same answer: nothing was freed or allocated.
    assert_eq!(snapshot(&dir, pid).2, 13000);

    let pprof = dir.path("live.pb.gz");
    let out = alloctrace(
        &dir,
        &["snapshot", &pid.to_string(), "-o", pprof.to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&pprof).unwrap();
    assert_eq!(&bytes[..2], &[0x1f, 0x8b], "gzipped profile.proto");

    let save = alloctrace(&dir, &["save", &pid.to_string(), "-o", "saved.trace"]);
    assert_eq!(save.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&save.stderr).contains("not in flight-recorder mode"));
    assert!(!dir.path("saved.trace").exists(), "nothing written");

    assert_eq!(sockets(&dir), vec![format!("{pid}.sock")]);
    running.finish();
    assert!(
        sockets(&dir).is_empty(),
        "removed at exit: {:?}",
        sockets(&dir)
    );
    assert!(ps(&dir).is_empty());
}

#[test]
fn a_long_trace_with_few_live_blocks_snapshots_exactly_them_even_with_its_file_removed() {
    let dir = Scratch::new("churn");
    let mut running = Running::start(&dir, &["long"]);
    let pid = running.pid();
    // 600,000 events before these: rotated away, as logs are (the
    // snapshot does not read the trace).
    std::fs::remove_file(dir.path(&format!("{pid}.trace"))).unwrap();
    let (sites, _, _) = snapshot(&dir, pid);
    // The thread's own (its stack's mapping, the C library's calloc of
    // its thread data) is live too, as it should be.
    let program: Vec<_> = sites
        .into_iter()
        .filter(|(function, ..)| function.starts_with("site_"))
        .collect();
    assert_eq!(
        program,
        vec![
            ("site_a".to_string(), 3, 3000),
            ("site_b".to_string(), 2, 10000)
        ],
        "site_t's blocks were freed on another thread"
    );
    running.finish();
}

#[test]
fn a_program_that_closes_its_descriptors_and_forks_keeps_answering() {
    let dir = Scratch::new("fork");
    let mut running = Running::start(&dir, &["close", "fork"]);
    let pid = running.pid();
    let child = running.child_pid();
    let mut pids: Vec<u64> = ps(&dir)
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    pids.sort();
    let mut want = vec![pid as u64, child as u64];
    want.sort();
    assert_eq!(pids, want, "the parent and its child, each with a socket");
    assert_eq!(snapshot(&dir, pid).2, 13000);
    let (sites, objects, bytes) = snapshot(&dir, child);
    assert_eq!(sites, vec![("site_c".to_string(), 1, 3000)]);
    assert_eq!((objects, bytes), (1, 3000));
    running.finish();
    // The child ends with its parent; its socket goes with it.
    let give_up = Instant::now() + Duration::from_secs(120);
    while Path::new(&format!("/proc/{child}")).exists() && Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(sockets(&dir).is_empty(), "{:?}", sockets(&dir));
}

#[test]
fn a_stale_socket_is_skipped_removed_and_refused() {
    let dir = Scratch::new("stale");
    let sockets_dir = runtime(&dir).join("alloctrace");
    std::fs::create_dir_all(&sockets_dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&sockets_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    // A process that has ended: its pid is free (not reused this soon).
    let mut gone = Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let stale = sockets_dir.join(format!("{dead}.sock"));
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(stale.exists(), "the file stays, nobody listens");

    let out = alloctrace(&dir, &["snapshot", &dead.to_string(), "-o", "-"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stale"), "{err}");
    assert!(!stale.exists(), "removed: its pid is dead");

    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    assert!(ps(&dir).is_empty());
    assert!(!stale.exists(), "ps removes it too");
    let out = alloctrace(&dir, &["ps"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("No traced process"));

    let out = alloctrace(&dir, &["snapshot", &dead.to_string(), "-o", "-"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not traced by you"));
}

#[test]
fn a_missing_xdg_runtime_dir_falls_back_to_tmp() {
    let dir = Scratch::new("noxdg");
    let missing = dir.path("missing");
    let mut running = Running::start_in(&dir, &missing, &[], &[]);
    let pid = running.pid();
    let out = Command::new(env!("CARGO_BIN_EXE_alloctrace"))
        .env("XDG_RUNTIME_DIR", &missing)
        .args(["ps", "--json"])
        .output()
        .unwrap();
    let listed: Vec<u64> = json_of(&out)["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    assert!(listed.contains(&(pid as u64)), "{listed:?}");
    // SAFETY: geteuid has no preconditions.
    let tmp = PathBuf::from(format!("/tmp/alloctrace-{}", unsafe { libc::geteuid() }));
    assert!(tmp.join(format!("{pid}.sock")).exists());
    assert!(
        !missing.exists(),
        "nothing made under a missing XDG_RUNTIME_DIR"
    );
    running.finish();
    assert!(!tmp.join(format!("{pid}.sock")).exists());
}

#[test]
fn another_users_connection_is_refused() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to connect as another user (the uid rule is unit-tested in crates/format's control.rs)");
        return;
    }
    let dir = Scratch::new("uid");
    let mut running = Running::start(&dir, &[]);
    let pid = running.pid();
    // The directory (0700) keeps other users out; a link in an open
    // directory reaches the socket past it, for the process's own check.
    let open = dir.path("open");
    std::fs::create_dir_all(&open).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let link = open.join("s.sock");
    std::fs::hard_link(runtime(&dir).join(format!("alloctrace/{pid}.sock")), &link).unwrap();
    std::fs::set_permissions(&link, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut parents = dir.0.parent();
    while let Some(p) = parents {
        // Every directory above must be searchable by uid 65534.
        let mode = std::fs::metadata(p).unwrap().permissions().mode();
        if mode & 0o001 == 0 {
            eprintln!("skipped: {} is not searchable by other users", p.display());
            running.finish();
            return;
        }
        parents = p.parent();
    }
    let client = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b"info\n")
data = b""
while True:
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
sys.stdout.write(data.decode())
"#;
    use std::os::unix::process::CommandExt;
    let out = Command::new("python3")
        .arg("-c")
        .arg(client)
        .arg(&link)
        .uid(65534)
        .gid(65534)
        .output();
    let Ok(out) = out else {
        eprintln!("skipped: no python3");
        running.finish();
        return;
    };
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(
        answer.starts_with("error another user's connection is refused"),
        "{answer:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!answer.contains("pid"), "nothing of the process is told");
    // The owner still gets its answer.
    assert_eq!(ps(&dir).len(), 1);
    running.finish();
}

/// `save PID -o FILE --json`'s answer: (first, last, bytes).
fn save(dir: &Scratch, pid: u32, file: &str) -> (u64, u64, u64) {
    let doc = json_of(&alloctrace(
        dir,
        &["save", &pid.to_string(), "-o", file, "--json"],
    ));
    assert_eq!(doc["pid"], pid);
    assert_eq!(doc["file"], file);
    let bytes = doc["bytes"].as_u64().unwrap();
    assert_eq!(std::fs::metadata(dir.path(file)).unwrap().len(), bytes);
    (
        doc["first"].as_u64().unwrap(),
        doc["last"].as_u64().unwrap(),
        bytes,
    )
}

/// The generations a trace's events are in, by `dump --json`.
fn generations_in(dir: &Scratch, file: &str) -> std::collections::BTreeSet<u64> {
    let out = alloctrace(dir, &["dump", "--json", file]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["gen"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

/// `live churn` under `record --flight-recorder 1MiB OPTIONS`, listed by
/// `ps` in that mode, and its pid.
fn flight_recorder(dir: &Scratch, options: &[&str]) -> (Running, u32) {
    let mut record = vec!["--flight-recorder", "1MiB"];
    record.extend_from_slice(options);
    let mut running = Running::start_in(dir, &runtime(dir), &record, &["churn"]);
    let pid = running.pid();
    let listed = ps(dir);
    // Found by pid: a traced process of this user without XDG_RUNTIME_DIR
    // (another test's) is listed too.
    let this = listed.iter().find(|p| p["pid"] == pid).expect("listed");
    assert_eq!(this["mode"], "flight-recorder");
    (running, pid)
}

#[test]
fn save_writes_the_flight_recorders_last_generations() {
    let dir = Scratch::new("save");
    let (running, pid) = flight_recorder(&dir, &[]);
    // Saved until the ring has turned over: its first generations gone.
    let give_up = Instant::now() + Duration::from_secs(120);
    let (first, last, _) = loop {
        let saved = save(&dir, pid, "a.trace");
        if saved.0 > 1 {
            break saved;
        }
        assert!(
            Instant::now() < give_up,
            "the ring never turned over: {saved:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(first <= last);
    // Exactly the generations named: the last ones, whole.
    let held = generations_in(&dir, "a.trace");
    assert_eq!(held, (first..=last).collect(), "generations {first}-{last}");
    let check = alloctrace(&dir, &["check", "a.trace"]);
    assert_eq!(
        check.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let stats = json_of(&alloctrace(&dir, &["stats", "--json", "a.trace"]));
    assert_eq!(stats["flight_window"], true);
    assert_eq!(stats["anomalies"], 0, "{stats}");
    for command in [&["leaks", "a.trace"][..], &["top", "a.trace"]] {
        let out = alloctrace(&dir, command);
        assert!(
            out.status.success(),
            "{command:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // Again: the next generations, up to the later moment.
    let (first2, last2, _) = save(&dir, pid, "b.trace");
    assert!(
        last2 > last && first2 >= first,
        "{first}-{last}, then {first2}-{last2}"
    );
    assert_eq!(generations_in(&dir, "b.trace"), (first2..=last2).collect());

    // In words.
    let out = alloctrace(&dir, &["save", &pid.to_string(), "-o", "c.trace"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let size = std::fs::metadata(dir.path("c.trace")).unwrap().len();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.starts_with(&format!("saved {size} bytes (generations "))
            && text.trim_end().ends_with(" to c.trace"),
        "{text}"
    );
    running.finish();
}

#[test]
fn save_refuses_bad_arguments_before_asking() {
    let dir = Scratch::new("save-args");
    std::fs::create_dir_all(dir.path("adir")).unwrap();
    for (args, says) in [
        (&["save", "1", "-o", "adir"][..], "is a directory"),
        (&["save", "1", "-o", "nodir/x.trace"], "no such directory"),
        (&["save", "1", "-o", ""], "a value is required"),
        (&["save", "1", "-o", "-"], "save writes a regular file"),
        (&["save", "1", "-o", "/dev/null"], "not a regular file"),
        (&["save", "x", "-o", "x.trace"], "invalid value"),
        (&["save", "1"], "--output"),
        (
            &["save", "4294967295", "-o", "x.trace"],
            "not traced by you",
        ),
    ] {
        let out = alloctrace(&dir, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert!(!dir.path("x.trace").exists());
}

#[test]
fn save_of_a_sampled_flight_recorder_reads_as_estimates() {
    let dir = Scratch::new("save-sampled");
    let (running, pid) = flight_recorder(&dir, &["--sample-bytes", "4KiB"]);
    // Saved until the window holds a sampled allocation (the churn's
    // 100-byte blocks are sampled one in about 41).
    let give_up = Instant::now() + Duration::from_secs(120);
    let stats = loop {
        save(&dir, pid, "s.trace");
        let stats = json_of(&alloctrace(&dir, &["stats", "--json", "s.trace"]));
        if stats["events"]["heap_object_alloc"].as_u64() > Some(0) {
            break stats;
        }
        assert!(Instant::now() < give_up, "nothing sampled: {stats}");
        std::thread::sleep(Duration::from_millis(50));
    };
    running.finish();
    assert_eq!(stats["flight_window"], true);
    assert_eq!(stats["anomalies"], 0, "{stats}");
    let sampled = &stats["sampled"];
    assert_eq!(sampled["sample_bytes"], 4096, "{stats}");
    // The exact totals of the window's generations: more than the samples.
    assert!(
        sampled["total_allocs"].as_u64().unwrap()
            > stats["events"]["heap_object_alloc"].as_u64().unwrap(),
        "{stats}"
    );
    let want = serde_json::json!({"sample_bytes": 4096, "estimated": true});
    for command in ["top", "leaks"] {
        let doc = json_of(&alloctrace(&dir, &[command, "s.trace", "--json"]));
        assert_eq!(doc["sampled"], want, "{command}: {doc}");
        let text = alloctrace(&dir, &[command, "s.trace"]);
        assert!(text.status.success());
        assert!(
            String::from_utf8_lossy(&text.stdout).contains("Estimates: "),
            "{command}"
        );
    }
    let check = alloctrace(&dir, &["check", "s.trace"]);
    assert_eq!(check.status.code(), Some(0));
}

/// The process's own checks on `save`, past the command's: no descriptor
/// passed, or a pipe's, is refused (the dump holds the ring while it
/// writes: a stalled reader would stall the program).
#[test]
fn the_process_saves_only_into_a_passed_regular_file() {
    let dir = Scratch::new("save-fd");
    let (running, pid) = flight_recorder(&dir, &[]);
    let socket = runtime(&dir).join(format!("alloctrace/{pid}.sock"));
    let client = r#"
import os, socket, sys
def ask(fds):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    if fds:
        socket.send_fds(s, [b"save\n"], fds)
    else:
        s.sendall(b"save\n")
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode().splitlines()[0]
r, w = os.pipe()
print(ask([]))
print(ask([w]))
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(client)
        .arg(&socket)
        .output();
    let Ok(out) = out else {
        eprintln!("skipped: no python3");
        running.finish();
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "error save needs the output file's descriptor passed with the request (SCM_RIGHTS)",
            "error save writes into a regular file only",
        ],
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    running.finish();
}
