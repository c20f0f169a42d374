"""Tests of `python3 -m alloctrace run`: each traces a small script and reads
the trace back with the `alloctrace` command (ALLOCTRACE_CLI, default
target/release/alloctrace). Run with the Python the package is installed
in: `make python-test` does (a venv under build/).
"""

import glob
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("ALLOCTRACE_CLI") or os.path.join(ROOT, "target", "release", "alloctrace")
# bytes(n) as b"x" * n: one allocation of the object header (33 bytes on
# 64-bit: 32 and the terminating NUL) and n bytes, served by the RAW domain
# through pymalloc and recorded once, by the OBJ domain's hook.
BYTES_HEADER = sys.getsizeof(b"")


def line_of(source, marker):
    """The 1-based line of the only line of `source` containing `marker`."""
    lines = [i + 1 for i, text in enumerate(source.splitlines()) if marker in text]
    assert len(lines) == 1, (marker, lines)
    return lines[0]


class Traced:
    """A script run under alloctrace in a fresh directory."""

    def __init__(self, test, source, args=(), module=None, expect_status=0, output=True, native=False):
        self.dir = tempfile.mkdtemp(prefix="alloctrace-py-")
        test.addCleanup(subprocess.call, ["rm", "-rf", self.dir])
        self.source = textwrap.dedent(source)
        name = module or "script"
        self.script = os.path.join(self.dir, name + ".py")
        with open(self.script, "w") as f:
            f.write(self.source)
        self.trace = os.path.join(self.dir, "out.trace")
        cmd = [sys.executable, "-m", "alloctrace", "run"]
        if output:
            cmd += ["-o", self.trace]
        if native:
            cmd += ["--native"]
        cmd += ["-m", module] if module else [self.script]
        cmd += list(args)
        env = dict(os.environ, ALLOCTRACE_CONTROL="off")
        self.run = subprocess.run(cmd, cwd=self.dir, env=env, capture_output=True, text=True, timeout=300)
        test.assertEqual(self.run.returncode, expect_status, self.run.stderr)

    def line(self, marker):
        return line_of(self.source, marker)

    def cli(self, *args, trace=None):
        out = subprocess.run([CLI, *args, trace or self.trace], capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            raise AssertionError("alloctrace %s: exit %d: %s" % (" ".join(args), out.returncode, out.stderr))
        return out.stdout

    def sites(self, *extra):
        return json.loads(self.cli("top", "--json", "-n", "0", *extra))["sites"]

    def innermost(self, function, line=None):
        """The stack sites whose innermost frame is `function` (at `line`)."""
        found = []
        for site in self.sites():
            if site["stack"] and site["stack"][0]["function"] == function:
                if line is None or site["stack"][0]["line"] == line:
                    found.append(site)
        return found

    def check(self, test, trace=None):
        out = subprocess.run([CLI, "check", trace or self.trace], capture_output=True, text=True, timeout=300)
        test.assertEqual(out.returncode, 0, out.stdout + out.stderr)


KNOWN_SITES = """
import sys

def site_a(n):
    return b"a" * n  # SITE-A

def site_b(n):
    return b"b" * n  # SITE-B

def main():
    keep = []
    for _ in range(7):
        keep.append(site_a(100000))
    for _ in range(3):
        keep.append(site_b(50000))
    print(sys.argv[1:], __name__)

main()
"""


class KnownSites(unittest.TestCase):
    def test_exact_counts_per_function_and_line(self):
        t = Traced(self, KNOWN_SITES, args=["x", "--y"])
        self.assertIn("['x', '--y'] __main__", t.run.stdout)
        t.check(self)
        for function, marker, count, n in (("site_a", "SITE-A", 7, 100000), ("site_b", "SITE-B", 3, 50000)):
            sites = t.innermost(function, t.line(marker))
            self.assertEqual(len(sites), 1, sites)
            site = sites[0]
            self.assertEqual(site["allocations"], count)
            self.assertEqual(site["bytes"], count * (n + BYTES_HEADER))
            frames = [(f["function"], f["file"], f["line"]) for f in site["stack"]]
            self.assertEqual(frames[1][0], "main")
            self.assertEqual(frames[2][0], "<module>")
            self.assertEqual(frames[2][2], len(t.source.splitlines()))  # main() is the last line
            self.assertEqual(len(frames), 3, frames)
            self.assertTrue(all(f[1] == t.script for f in frames), frames)
        by_function = {s["key"]: s for s in t.sites("--by", "function")}
        self.assertEqual(by_function["site_a"]["allocations"], 7, by_function.get("site_a"))

    def test_cpythons_debug_hooks_are_wrapped_too(self):
        os.environ["PYTHONMALLOC"] = "debug"
        try:
            t = Traced(self, KNOWN_SITES, args=["d"])
        finally:
            del os.environ["PYTHONMALLOC"]
        t.check(self)
        self.assertEqual(t.innermost("site_a", t.line("SITE-A"))[0]["allocations"], 7)

    def test_module_runs_as_python_dash_m(self):
        t = Traced(self, KNOWN_SITES, args=["m1"], module="knownmod")
        self.assertIn("['m1'] __main__", t.run.stdout)
        t.check(self)
        self.assertEqual(t.innermost("site_a", t.line("SITE-A"))[0]["allocations"], 7)

    def test_default_trace_name(self):
        t = Traced(self, "import os\nprint(os.getpid())\n", output=False)
        pid = t.run.stdout.strip()
        self.assertEqual(glob.glob(os.path.join(t.dir, "*.trace")), [os.path.join(t.dir, "alloctrace-script-%s.trace" % pid)])

    def test_exit_status_passes_through(self):
        t = Traced(self, "import sys\nx = b'e' * 70000\nsys.exit(3)\n", expect_status=3)
        t.check(self)


LEAK = """
LEAKED = []

class Node:
    pass

def make_leak():
    LEAKED.append(Node())  # LEAK

def no_leak():
    n = Node()  # NO-LEAK
    del n

for _ in range(10):
    no_leak()
make_leak()
"""


class Leaks(unittest.TestCase):
    def test_a_pymalloc_object_leaked_from_a_function(self):
        t = Traced(self, LEAK)
        t.check(self)
        leaks = json.loads(t.cli("leaks", "--json"))["leaks"]
        at = [l for l in leaks if l["stack"] and l["stack"][0]["function"] == "make_leak"]
        self.assertEqual(len(at), 1, leaks)
        self.assertEqual(at[0]["stack"][0]["line"], t.line("# LEAK"))
        self.assertGreaterEqual(at[0]["objects"], 1)
        self.assertLess(at[0]["bytes"], 512)  # a pymalloc block
        self.assertFalse([l for l in leaks if l["stack"] and l["stack"][0]["function"] == "no_leak"], leaks)
        self.assertTrue(t.innermost("no_leak", t.line("# NO-LEAK")))


ARENAS = """
def make_many():
    return [(i, i) for i in range(200000)]  # MANY

keep = make_many()
del keep
"""


class Arenas(unittest.TestCase):
    def test_pymallocs_arenas_are_spans(self):
        t = Traced(self, ARENAS)
        t.check(self)
        stats = json.loads(t.cli("stats", "--json"))
        # 400,000 blocks of 48 and 32 bytes: over 16 MiB of 1 MiB arenas
        # (256 KiB before 3.10), most of them emptied and freed by `del`.
        self.assertGreaterEqual(stats["peak_live_span_bytes"], 16 << 20, stats)
        self.assertLess(stats["live_span_bytes"], stats["peak_live_span_bytes"] // 2, stats)
        many = t.innermost("make_many.<locals>.<listcomp>" if sys.version_info < (3, 12) else "make_many", t.line("MANY"))
        self.assertGreaterEqual(sum(s["allocations"] for s in many), 200000)


THREADS = """
import threading

def thread_site(n):
    return b"t" * n  # THREAD-SITE

def worker(out):
    for _ in range(5):
        out.append(thread_site(70000))

out = []
threads = [threading.Thread(target=worker, args=(out,)) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


class Threads(unittest.TestCase):
    def test_every_thread_with_its_own_frames(self):
        t = Traced(self, THREADS)
        t.check(self)
        sites = t.innermost("thread_site", t.line("THREAD-SITE"))
        self.assertEqual(sum(s["allocations"] for s in sites), 20, sites)
        for s in sites:
            self.assertEqual(s["stack"][1]["function"], "worker")
        threads = [s for s in t.sites("--by", "thread")]
        self.assertGreaterEqual(len(threads), 5, threads)


FORK = """
import os

def child_site(n):
    return b"c" * n  # CHILD-SITE

def parent_site(n):
    return b"p" * n  # PARENT-SITE

pid = os.fork()
if pid == 0:
    x = [child_site(80000) for _ in range(3)]
    os._exit(0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
y = parent_site(60000)
"""

FORK_EXIT = """
import os, sys

def child_site(n):
    return b"c" * n

pid = os.fork()
if pid == 0:
    child_site(80000)
    sys.exit(0)   # atexit runs in the child too
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


class Fork(unittest.TestCase):
    def test_child_untraced_parent_traced(self):
        t = Traced(self, FORK)
        t.check(self)
        self.assertEqual(t.innermost("parent_site", t.line("PARENT-SITE"))[0]["allocations"], 1)
        self.assertEqual(t.innermost("child_site"), [])
        self.assertEqual(glob.glob(os.path.join(t.dir, "*.trace")), [t.trace])

    def test_child_exiting_through_atexit(self):
        t = Traced(self, FORK_EXIT)
        t.check(self)


EXCEPTION = """
def deep(n):
    if n == 0:
        x = b"d" * 90000  # DEEP-SITE
        raise ValueError(len(x))
    return deep(n - 1)

def after(n):
    return b"f" * n  # AFTER-SITE

def gen():
    yield b"g" * 40000  # GEN-SITE
    raise KeyError("x")

def main():
    for _ in range(3):
        try:
            deep(50)
        except ValueError:
            pass
    try:
        for _ in gen():
            pass
    except KeyError:
        pass
    return after(30000)

main()
"""


class Exceptions(unittest.TestCase):
    def test_the_shadow_stack_unwinds_with_the_exception(self):
        t = Traced(self, EXCEPTION)
        t.check(self)
        deep = t.innermost("deep", t.line("DEEP-SITE"))
        self.assertEqual(len(deep), 1, deep)
        self.assertEqual(deep[0]["allocations"], 3)
        names = [f["function"] for f in deep[0]["stack"]]
        self.assertEqual(names, ["deep"] * 51 + ["main", "<module>"])
        after = t.innermost("after", t.line("AFTER-SITE"))
        self.assertEqual([f["function"] for f in after[0]["stack"]], ["after", "main", "<module>"])
        self.assertEqual(after[0]["allocations"], 1)
        g = t.innermost("gen", t.line("GEN-SITE"))
        self.assertEqual([f["function"] for f in g[0]["stack"]], ["gen", "main", "<module>"])


DEEP_STACKS = """
import sys

def down(n, size):
    if n == 0:
        return b"x" * size  # DOWN-SITE
    down(n - 1, size)
    return b"y" * size  # UP-SITE

def main():
    sys.setrecursionlimit(5000)
    out = []
    for depth, size in ((1100, 70000), (1020, 60000), (5, 50000), (1100, 70000)):
        out.append(down(depth, size))
    return out

main()
"""


class DeepStacks(unittest.TestCase):
    def test_stacks_past_the_formats_depth_keep_their_innermost_frames(self):
        # Each frame's callers' stack ID is kept on the shadow stack; a stack
        # deeper than the format's 1024 frames is registered whole instead
        # (its innermost 1023 frames under the truncation mark), and the
        # stacks of frames that returned and called again stay right.
        t = Traced(self, DEEP_STACKS)
        t.check(self)
        by_depth = {}
        for site in t.innermost("down", t.line("DOWN-SITE")):
            names = [f["function"] for f in site["stack"]]
            by_depth[len(names)] = (site["allocations"], site["bytes"], names)
        self.assertEqual(sorted(by_depth), [8, 1023, 1024], sorted(by_depth))
        allocs, _, names = by_depth[1024]
        self.assertEqual(allocs, 2)
        self.assertEqual(names, ["down"] * 1023 + ["[truncated]"])
        self.assertEqual(by_depth[1023][2], ["down"] * 1021 + ["main", "<module>"])
        self.assertEqual(by_depth[8][2], ["down"] * 6 + ["main", "<module>"])
        # The way back up: each level allocates at UP-SITE once per call.
        ups = t.innermost("down", t.line("UP-SITE"))
        self.assertEqual(sum(s["allocations"] for s in ups), 1100 + 1020 + 5 + 1100)
        for s in ups:
            names = [f["function"] for f in s["stack"]]
            self.assertTrue(len(names) <= 1024, len(names))
            lines = [f["line"] for f in s["stack"] if f["function"] == "down"]
            # Every caller is suspended at its call of down: the UP-SITE
            # line is the innermost frame's only.
            self.assertTrue(all(line == t.line("DOWN-SITE") + 1 for line in lines[1:]), lines[:5])


PROFILE_TAKEN = """
import sys

def f(n):
    if n == 0:
        sys.setprofile(lambda *a: None)
        return
    f(n - 1)

def g():
    return b"z" * 100000  # G-SITE

f(20)
sys.setprofile(None)
for _ in range(5):
    g()  # G-CALL
"""


# Python-only stacks come from a walk of the running frames on CPython 3.11.1
# and later 3.11 releases (docs/PYTHON.md), from a profile function elsewhere or when this is set
# (make python-test runs the tests both ways).
WALKED = (3, 11, 1) <= sys.version_info[:3] < (3, 12) and os.environ.get("ALLOCTRACE_PYTHON_PROFILE_STACKS") != "1"


class ProfileTakenOver(unittest.TestCase):
    def test_no_stale_stacks_once_the_program_sets_its_own_profile_function(self):
        t = Traced(self, PROFILE_TAKEN)
        t.check(self)
        big = [s for s in t.sites() if s["bytes"] >= 100000]
        if WALKED:
            # A walk needs no profile function: g's five 100 KB blocks keep
            # their stack, g under the module.
            self.assertEqual(len(big), 1, big)
            self.assertEqual(big[0]["allocations"], 5)
            self.assertEqual([(f["function"], f["line"]) for f in big[0]["stack"]],
                             [("g", t.line("G-SITE")), ("<module>", t.line("G-CALL"))])
            return
        self.assertEqual(t.innermost("g"), [])
        # g's five 100 KB blocks: without a stack, not under f's stale frames.
        self.assertEqual([s["stack"] for s in big], [[]], big)
        self.assertGreaterEqual(big[0]["allocations"], 5)


RAW_THREAD = """
import _thread, time

def worker(done):
    done.append(bytes(123456))  # RAW-THREAD-SITE

done = []
_thread.start_new_thread(worker, (done,))
while not done:
    time.sleep(0.01)
"""


class ThreadsNotStartedByThreading(unittest.TestCase):
    def test_a_thread_from_start_new_thread(self):
        t = Traced(self, RAW_THREAD)
        t.check(self)
        big = [s for s in t.sites() if s["bytes"] >= 123456]
        self.assertEqual(len(big), 1, big)
        if WALKED:
            # Walked on its first allocation: its stack is its own frame.
            self.assertEqual([(f["function"], f["line"]) for f in big[0]["stack"]],
                             [("worker", t.line("RAW-THREAD-SITE"))])
        else:
            # No thread_profile ran on it: no shadow stack, no call stack.
            self.assertEqual(big[0]["stack"], [])


NATIVE = """
import threading

def native_site(n):
    return bytes(n)  # NATIVE-SITE

def through_c(n):
    # map and list are C: native_site runs in an eval call of its own.
    return list(map(native_site, [n, n]))  # THROUGH-C

def main():
    keep = []
    for _ in range(3):
        keep.extend(through_c(300000))  # MAIN
    return keep

def thread_site(n):
    return bytes(n)  # THREAD-SITE

def worker(out):
    for _ in range(4):
        out.append(thread_site(200000))

kept = main()
out = []
threads = [threading.Thread(target=worker, args=(out,)) for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


NATIVE_LINES = """
def two_lines(n, a, b):
    keep = [None] * (2 * n)
    for i in range(n):
        keep[2 * i] = b"a" * a  # LINE-1
        keep[2 * i + 1] = b"b" * b  # LINE-2
    return keep

def caller(a, b):
    x = two_lines(50, a, b)  # CALL-1
    y = two_lines(30, a, b)  # CALL-2
    return x, y

kept = caller(3000, 5000)
"""


def is_python(frame, t):
    return frame.get("file") == t.script


def is_native(frame):
    """A native frame of `top --json`: an address (a registered frame has
    none, and `[registered]` for its module)."""
    return bool(frame.get("address")) and frame.get("module") != "[registered]"


class Native(unittest.TestCase):
    """--native: native frames with the eval loop's frames replaced by the
    Python functions they run, innermost first."""

    def sites_with(self, t, function, line):
        found = []
        for site in t.sites():
            names = [(f.get("function"), f.get("line")) for f in site["stack"]]
            if (function, line) in names:
                found.append(site)
        return found

    def test_python_and_native_frames_merged_in_order(self):
        t = Traced(self, NATIVE, native=True)
        t.check(self)
        sites = self.sites_with(t, "native_site", t.line("NATIVE-SITE"))
        self.assertEqual(sum(s["allocations"] for s in sites), 6, sites)
        for site in sites:
            stack = site["stack"]
            names = [f.get("function") for f in stack]
            self.assertNotIn("_PyEval_EvalFrameDefault", names, stack)
            at = names.index("native_site")
            # Innermost first: the allocator's native frames, the Python
            # function, the C code that called it (map, list), then the
            # Python callers, then the interpreter's native frames down to
            # its main.
            self.assertTrue(at > 0 and all(is_native(f) for f in stack[:at]), stack)
            py = [(f["function"], f["line"]) for f in stack if is_python(f, t)]
            self.assertEqual(
                py,
                [
                    ("native_site", t.line("NATIVE-SITE")),
                    ("through_c", t.line("THROUGH-C")),
                    ("main", t.line("MAIN")),
                    ("<module>", t.line("kept = main()")),
                ],
                stack,
            )
            between = stack[at + 1 : names.index("through_c")]
            self.assertTrue(between and all(is_native(f) for f in between), stack)
            outer = stack[names.index("<module>") + 1 :]
            self.assertTrue(outer and all(is_native(f) for f in outer), stack)
            # Named C functions: CPython's own exported ones.
            self.assertIn("Py_RunMain", names[names.index("<module>") :], stack)

    def test_exact_counts_per_line_and_caller(self):
        # Two lines on one native path, alternately, from two call sites:
        # the stacks differ by their Python frames only.
        t = Traced(self, NATIVE_LINES, native=True)
        t.check(self)
        counts = {}
        for site in t.sites():
            py = [(f["function"], f["line"]) for f in site["stack"] if is_python(f, t)]
            if py and py[0][0] == "two_lines":
                size = site["bytes"] // site["allocations"] - BYTES_HEADER
                if size in (3000, 5000):  # the bytes objects, not the list
                    key = (py[0][1], py[1][1], size)
                    counts[key] = counts.get(key, 0) + site["allocations"]
        line1, line2 = t.line("LINE-1"), t.line("LINE-2")
        call1, call2 = t.line("CALL-1"), t.line("CALL-2")
        self.assertEqual(
            counts,
            {(line1, call1, 3000): 50, (line2, call1, 5000): 50, (line1, call2, 3000): 30, (line2, call2, 5000): 30},
        )

    def test_threads(self):
        t = Traced(self, NATIVE, native=True)
        sites = self.sites_with(t, "thread_site", t.line("THREAD-SITE"))
        self.assertEqual(sum(s["allocations"] for s in sites), 8, sites)
        for site in sites:
            stack = site["stack"]
            names = [f.get("function") for f in stack]
            self.assertNotIn("_PyEval_EvalFrameDefault", names, stack)
            at = names.index("thread_site")
            self.assertTrue(at > 0 and all(is_native(f) for f in stack[:at]), stack)
            self.assertEqual(names[at + 1], "worker", stack)
            # Then the native frames of the thread's start, and Thread.run.
            rest = stack[at + 2 :]
            self.assertTrue(rest and all(is_native(f) or f["file"].endswith("threading.py") for f in rest), stack)

    def test_every_scripts_python_frames_as_without_it(self):
        # The other tests' scripts (an exception through 50 frames, a
        # generator, threads, pymalloc leaks): no eval-loop frame is left
        # in any stack, and the Python frames of each stack, in order, are
        # a stack that Python-only mode records too (sizes of 1000 bytes
        # and more: the program's, not the interpreter's own).
        def python_stacks(t):
            stacks = set()
            for site in t.sites():
                if site["bytes"] >= 1000 * site["allocations"]:
                    stacks.add(tuple((f["function"], f["line"]) for f in site["stack"] if f.get("file") == t.script))
            return stacks

        for name, src in (("KNOWN_SITES", KNOWN_SITES), ("LEAK", LEAK), ("THREADS", THREADS), ("EXCEPTION", EXCEPTION)):
            with self.subTest(script=name):
                plain = Traced(self, src)
                t = Traced(self, src, native=True)
                t.check(self)
                for site in t.sites():
                    names = [f.get("function") for f in site["stack"]]
                    self.assertNotIn("_PyEval_EvalFrameDefault", names, site)
                native_stacks = python_stacks(t)
                self.assertLessEqual(native_stacks, python_stacks(plain))
                if name == "LEAK":  # small objects only: the leak is found
                    leaks = json.loads(t.cli("leaks", "--json"))["leaks"]
                    firsts = [[(f["function"], f["line"]) for f in l["stack"] if f.get("file") == t.script][:1] for l in leaks]
                    self.assertIn([("make_leak", t.line("# LEAK"))], firsts, leaks)
                else:
                    self.assertTrue(native_stacks, name)

    def test_python_only_stacks_without_it(self):
        t = Traced(self, NATIVE)
        sites = self.sites_with(t, "native_site", t.line("NATIVE-SITE"))
        self.assertEqual(sum(s["allocations"] for s in sites), 6, sites)
        for site in t.sites():
            self.assertFalse(any(is_native(f) for f in site["stack"]), site)


class Refusals(unittest.TestCase):
    def run_cli(self, *args, cwd=None):
        return subprocess.run([sys.executable, "-m", "alloctrace", *args], capture_output=True, text=True, cwd=cwd, timeout=120)

    def test_missing_script_is_refused_before_running(self):
        with tempfile.TemporaryDirectory() as d:
            out = self.run_cli("run", "missing.py", cwd=d)
            self.assertEqual(out.returncode, 2)
            self.assertIn("cannot read missing.py", out.stderr)
            self.assertEqual(os.listdir(d), [])

    def test_missing_module_and_bad_script_are_refused(self):
        with tempfile.TemporaryDirectory() as d:
            out = self.run_cli("run", "-m", "no_such_module_here", cwd=d)
            self.assertEqual(out.returncode, 2)
            self.assertIn("No module named no_such_module_here", out.stderr)
            with open(os.path.join(d, "bad.py"), "w") as f:
                f.write("def (\n")
            out = self.run_cli("run", "bad.py", cwd=d)
            self.assertEqual(out.returncode, 2)
            self.assertIn("bad.py does not compile", out.stderr)
            self.assertEqual(os.listdir(d), ["bad.py"])

    def test_an_uncreatable_trace_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "ok.py"), "w") as f:
                f.write("raise SystemExit('the program ran')\n")
            out = self.run_cli("run", "-o", os.path.join(d, "no", "x.trace"), "ok.py", cwd=d)
            self.assertEqual(out.returncode, 1)
            self.assertIn("cannot start tracing", out.stderr)
            self.assertNotIn("the program ran", out.stderr)

    def test_usage(self):
        self.assertEqual(self.run_cli().returncode, 2)
        self.assertEqual(self.run_cli("record").returncode, 2)
        self.assertEqual(self.run_cli("run").returncode, 2)
        self.assertEqual(self.run_cli("run", "-m").returncode, 2)

    def test_subinterpreters_are_refused(self):
        src = (
            "try:\n    import _interpreters as s\nexcept ImportError:\n    import _xxsubinterpreters as s\n"
            "s.create()\n"
        )
        t = Traced(self, src, expect_status=1)
        self.assertIn("alloctrace: subinterpreters are not supported", t.run.stderr)
        t.check(self)

    def test_another_allocator_hook_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "s.py"), "w") as f:
                f.write("pass\n")
            out = subprocess.run(
                [sys.executable, "-X", "tracemalloc", "-m", "alloctrace", "run", "s.py"],
                capture_output=True, text=True, cwd=d, timeout=120,
            )
            self.assertEqual(out.returncode, 1)
            self.assertIn("tracemalloc is tracing", out.stderr)


if __name__ == "__main__":
    unittest.main()
