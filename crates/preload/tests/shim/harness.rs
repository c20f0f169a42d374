//! What the shim's tests share: the programs under test (from the
//! environment `make preload-test` sets), a scratch directory per case,
//! runs under the shim with a time limit, and what the traces say.

use std::ffi::OsStr;
use std::fs::File;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "../../../cli/tests/support/scratch.rs"]
#[allow(dead_code)]
mod scratch;
pub use scratch::Scratch;

/// What `make preload-test` built, named by the environment.
pub struct Built {
    /// The alloctrace command (ALLOCTRACE_TEST_CLI).
    pub cli: String,
    /// liballoctrace_preload.so (ALLOCTRACE_TEST_SO).
    pub shim: String,
    /// The directory of c_tests/preload's programs (ALLOCTRACE_TEST_PROGS).
    pub progs: String,
    /// The shim built with the feature panic-test (ALLOCTRACE_TEST_PANIC_SO).
    pub panic_shim: String,
}

/// The variables above; a child never sees them.
const BUILT_VARS: [&str; 4] = [
    "ALLOCTRACE_TEST_CLI",
    "ALLOCTRACE_TEST_SO",
    "ALLOCTRACE_TEST_PROGS",
    "ALLOCTRACE_TEST_PANIC_SO",
];

/// The built files, or a panic saying how to build them.
pub fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let get = |name: &str| match std::env::var(name) {
            Ok(v) if Path::new(&v).exists() => v,
            Ok(v) => panic!("{name}={v} does not exist: run `make preload-test`, which builds it"),
            Err(_) => panic!(
                "{name} is not set: these tests need the release shim, the CLI and the C test \
                 programs that `make preload-test` builds; run `make preload-test`"
            ),
        };
        Built {
            cli: get(BUILT_VARS[0]),
            shim: get(BUILT_VARS[1]),
            progs: get(BUILT_VARS[2]),
            panic_shim: get(BUILT_VARS[3]),
        }
    })
}

/// Says why the current case cannot run here, on stderr past the test
/// harness's capture (a skipped case passes, so its output would not
/// show): "skipped: NAME: WHY".
pub fn skip(why: &str) {
    use std::io::Write;
    let name = std::thread::current().name().unwrap_or("?").to_string();
    let _ = writeln!(std::io::stderr(), "skipped: {name}: {why}");
}

/// The alloctrace command.
pub fn cli() -> &'static str {
    &built().cli
}

/// The shim.
pub fn shim() -> &'static str {
    &built().shim
}

/// A test program (or library) of c_tests/preload, as built.
pub fn prog(name: &str) -> String {
    format!("{}/{name}", built().progs)
}

/// Seconds a run may take before it is killed (a deadlock fails its case
/// instead of hanging the suite): PRELOAD_TEST_TIMEOUT, or 300.
pub fn limit() -> u64 {
    std::env::var("PRELOAD_TEST_TIMEOUT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

/// The shell's view of an exit status: the code, or 128 + the signal.
pub fn rc(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().expect("a code or a signal"))
}

/// A command with the variables `make preload-test` passes removed.
pub fn command(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for v in BUILT_VARS {
        cmd.env_remove(v);
    }
    cmd
}

/// Waits for `child`, killed after `limit()` seconds (then the case
/// fails); its rc.
pub fn wait_limited(child: &mut std::process::Child, what: &str) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(limit());
    loop {
        if let Some(status) = child.try_wait().expect("wait for a child") {
            return rc(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {} s: killed", limit());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `cmd` to the end, within the time limit; its rc.
pub fn run_limited(cmd: &mut Command) -> i32 {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    wait_limited(&mut child, &what)
}

/// Runs the CLI to the end: (rc, stdout, stderr).
pub fn run_cli<S: AsRef<OsStr>>(args: &[S]) -> (i32, String, String) {
    let out = command(cli())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run alloctrace");
    (
        rc(out.status),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `alloctrace check TRACE`: (rc, its output, stdout then stderr).
pub fn check(trace: &str) -> (i32, String) {
    let (rc, out, err) = run_cli(&["check", trace]);
    (rc, format!("{out}{err}"))
}

/// The first `n` lines of `text`, joined by spaces.
pub fn head(text: &str, n: usize) -> String {
    text.lines().take(n).collect::<Vec<_>>().join(" ")
}

/// A file's text, empty when it cannot be read.
pub fn read(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// `stats --json` of a trace.
pub struct Stats(pub Value);

/// The stats of `trace`; empty (every number -1) when they cannot be read.
pub fn stats(trace: &str) -> Stats {
    let (_, out, _) = run_cli(&["stats", "--json", trace]);
    Stats(serde_json::from_str(&out).unwrap_or(Value::Null))
}

impl Stats {
    /// The first number named `key`, depth first in the JSON's order (as
    /// a grep of the output finds it: the event kinds, entry points and
    /// top-level keys are distinct), or -1.
    pub fn num(&self, key: &str) -> i64 {
        fn find(v: &Value, key: &str) -> Option<i64> {
            match v {
                Value::Object(map) => map.iter().find_map(|(k, v)| match v {
                    Value::Number(n) if k == key => n.as_i64(),
                    _ => find(v, key),
                }),
                _ => None,
            }
        }
        find(&self.0, key).unwrap_or(-1)
    }

    /// The count of one entry point, or -1.
    pub fn entry(&self, name: &str) -> i64 {
        self.0["entry_points"][name].as_i64().unwrap_or(-1)
    }

    /// The sum of the entry points.
    pub fn calls(&self) -> i64 {
        self.0["entry_points"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_i64).sum())
    }

    /// Whether the trace ends without its end (a process that died
    /// before its exit handlers).
    pub fn truncated(&self) -> bool {
        self.0["truncated"] == Value::Bool(true)
    }
}

/// One test case: its scratch directory D, with an empty index file.
pub struct Case {
    dir: Scratch,
}

impl Case {
    pub fn new(name: &str) -> Case {
        let case = Case {
            dir: Scratch::new(name),
        };
        case.reset_index();
        case
    }

    /// D.
    pub fn dir(&self) -> &Path {
        &self.dir.0
    }

    /// D/name, as a string.
    pub fn path(&self, name: &str) -> String {
        self.dir
            .path(name)
            .to_str()
            .expect("a UTF-8 path")
            .to_string()
    }

    /// D/name's text, empty when it cannot be read.
    pub fn read(&self, name: &str) -> String {
        read(self.path(name))
    }

    /// Empties the index file: the next traced runs start a new list.
    pub fn reset_index(&self) {
        File::create(self.path("index")).expect("create the index");
    }

    /// A command with the NAME=VALUE settings `vars`, stdout to D/`out`
    /// and stderr to D/`err`.
    pub fn command(&self, vars: &[(&str, &str)], argv: &[&str], out: &str, err: &str) -> Command {
        let mut cmd = command(argv[0]);
        cmd.args(&argv[1..])
            .envs(vars.iter().copied())
            .stdin(Stdio::null())
            .stdout(File::create(self.path(out)).expect("create the output file"))
            .stderr(File::create(self.path(err)).expect("create the error file"));
        cmd
    }

    /// Runs `argv` with the settings `vars`, stdout to D/out and stderr
    /// to D/err, within the time limit; its rc.
    pub fn limited(&self, vars: &[(&str, &str)], argv: &[&str]) -> i32 {
        run_limited(&mut self.command(vars, argv, "out", "err"))
    }

    /// The settings of a run under the shim: the index D/index, traces
    /// D/t.PID.trace; `vars` come after (and may replace them).
    pub fn shim_vars<'a>(
        &'a self,
        shim: &'a str,
        vars: &[(&'a str, &'a str)],
    ) -> Vec<(String, String)> {
        let mut all = vec![
            ("ALLOCTRACE_INDEX".to_string(), self.path("index")),
            ("ALLOCTRACE_OUTPUT".to_string(), self.path("t.%p.trace")),
            ("LD_PRELOAD".to_string(), shim.to_string()),
        ];
        all.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        all
    }

    /// Runs `argv` under the shim (with the settings `vars`), stdout to
    /// D/out, stderr to D/err; its rc.
    pub fn traced(&self, vars: &[(&str, &str)], argv: &[&str]) -> i32 {
        self.traced_with(shim(), vars, argv)
    }

    /// As `traced`, under the shim `shim`.
    pub fn traced_with(&self, shim: &str, vars: &[(&str, &str)], argv: &[&str]) -> i32 {
        let all = self.shim_vars(shim, vars);
        let vars: Vec<(&str, &str)> = all.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.limited(&vars, argv)
    }

    /// The index's session-start lines: (pid, program, trace path)
    /// (session.rs, append_index).
    fn index_lines(&self) -> Vec<(String, String, String)> {
        self.read("index")
            .lines()
            .filter_map(|l| {
                let mut f = l.split('\t');
                let (pid, prog, path) = (f.next()?, f.next()?, f.next()?);
                (!pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| (pid.to_string(), prog.to_string(), path.to_string()))
            })
            .collect()
    }

    /// The trace files the runs listed, in order.
    pub fn traces(&self) -> Vec<String> {
        self.index_lines().into_iter().map(|l| l.2).collect()
    }

    /// The only trace of the runs, or the first: "" when there is none.
    pub fn trace(&self) -> String {
        self.traces().into_iter().next().unwrap_or_default()
    }

    /// The pids of the traced processes, in order.
    pub fn trace_pids(&self) -> Vec<String> {
        self.index_lines().into_iter().map(|l| l.0).collect()
    }

    /// `alloctrace check` on every trace: "RC PATH (its first lines)" for
    /// each that is not ok.
    pub fn check_all(&self) -> Vec<String> {
        self.traces()
            .iter()
            .filter_map(|t| {
                let (rc, out) = check(t);
                (rc != 0).then(|| format!("{rc} {t} ({})", head(&out, 2)))
            })
            .collect()
    }

    /// The first three lines of D/err, for messages.
    pub fn err_head(&self) -> String {
        head(&self.read("err"), 3)
    }
}

/// The lines of `text` that match `pattern` (a regular expression, as
/// grep's -E takes it, matched line by line).
pub fn grep<'t>(pattern: &str, text: &'t str) -> Vec<&'t str> {
    let re = regex_automata::meta::Regex::new(pattern)
        .unwrap_or_else(|e| panic!("pattern {pattern}: {e}"));
    text.lines().filter(|l| re.is_match(l)).collect()
}

/// Whether a line of `text` matches `pattern` (as `grep -q`).
pub fn has(pattern: &str, text: &str) -> bool {
    !grep(pattern, text).is_empty()
}

/// `text` with the characters special in a regular expression escaped.
pub fn esc(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
