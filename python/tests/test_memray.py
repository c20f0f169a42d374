"""alloctrace beside memray (issue 23): on the scripts of `make bench`'s
memray group (bench/deep_stack.py and bench/json_dict.py, fewer rounds),
`python -m alloctrace run` and `memray run --trace-python-allocators` must
name the same top 5 allocation sites by bytes allocated, in the same
order: a site is the innermost Python frame (function, file, line).

Run with the Python the package and memray are installed in: `make
python-test` does (memray from PyPI into its venv). memray missing is a
failure, not a skip.

What is compared, on both sides:
- bytes allocated over the run (every allocation's size, a realloc's new
  size), not bytes live at the peak: memray's `stats` counts that
  ("top_allocations_by_size" of `memray stats --json`), alloctrace's `top
  --json` has it as each call stack's "bytes". (At the peak these scripts
  hold one round's objects, a few hundred KiB, and each tool's peak is a
  different moment: memray starts before the script is compiled, its
  sites have runpy's, alloctrace at the script's first line);
- the same allocations: memray with --trace-python-allocators records
  every call of the PyMem domains' allocators (pymalloc's small objects
  too) and not the memory those allocators take from malloc or mmap
  underneath (its recursion guard), as alloctrace records each block once,
  by the domain the program called; both with PYTHONMALLOC=pymalloc.
  alloctrace also records pymalloc's arenas (1 MiB spans, with the stack
  that made pymalloc take one), which memray does not: here pymalloc takes
  none or a few once tracing starts (ARENA_SLACK). The two tools' bytes
  per site agree to 0.1% (a few hundred bytes more on some of
  alloctrace's sites); the scripts' top 5 sites are 15% or more apart,
  so the order is the same;
- memray names a frame by its function's name, alloctrace by its
  qualified name (Node.__init__): the last dotted part is compared, with
  the file and the line;
- the same program: memray keeps its call stacks with a profile function,
  for which CPython makes a frame object per Python call (deep_stack.py's
  constructors: a fifth more allocations, at the call lines). alloctrace
  walks the frames on CPython 3.11 and the program makes none of them
  (docs/PYTHON.md), so on deep_stack.py the two tools see different
  programs. There alloctrace is compared with
  ALLOCTRACE_PYTHON_PROFILE_STACKS=1 (a profile function too); on
  json_dict.py, whose calls are few, both ways.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("ALLOCTRACE_CLI") or os.path.join(ROOT, "target", "release", "alloctrace")
BENCH = os.path.join(ROOT, "bench")
TOP = 5
# The arenas' bytes alloctrace may add to a site (a 1 MiB span each time
# pymalloc takes one), and how far the tools' bytes per site may differ
# otherwise.
ARENA_SLACK = 4 << 20
TOLERANCE = 0.01
ENV = dict(os.environ, PYTHONMALLOC="pymalloc", ALLOCTRACE_CONTROL="off", PYTHONDONTWRITEBYTECODE="1")


def run(test, cmd):
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    test.assertEqual(p.returncode, 0, "%s: exit %d\n%s" % (" ".join(cmd), p.returncode, p.stderr[-3000:]))
    return p.stdout


def memray_sites(test, results, n):
    """[((function, file, line), bytes)] from `memray stats --json`, largest first."""
    out = results + ".json"
    run(test, [sys.executable, "-m", "memray", "stats", "--json", "-n", str(n), "-f", "-o", out, results])
    with open(out) as f:
        stats = json.load(f)
    sites = []
    for entry in stats["top_allocations_by_size"]:
        if entry["location"] == "<stack trace unavailable>":
            continue
        # "function:file:line"; a file name may hold ':'.
        function, rest = entry["location"].split(":", 1)
        path, line = rest.rsplit(":", 1)
        sites.append(((function, path, int(line)), entry["size"]))
    return sites


def alloctrace_sites(test, trace):
    """[((function, file, line), bytes)], largest first: `alloctrace top
    --json` (one row per call stack) summed by the stack's innermost frame,
    the function named by the last part of its qualified name."""
    top = json.loads(run(test, [CLI, "top", "--json", "-n", "0", trace]))
    by_site = {}
    for site in top["sites"]:
        if not site["stack"]:
            continue
        frame = site["stack"][0]
        key = (frame["function"].rsplit(".", 1)[-1], frame["file"], frame["line"])
        by_site[key] = by_site.get(key, 0) + site["bytes"]
    return sorted(by_site.items(), key=lambda kv: -kv[1])


def mib(sites):
    return "\n".join("  %8.2f MiB  %s %s:%s" % (b / 2**20, *k) for k, b in sites)


class TopSitesAsMemray(unittest.TestCase):
    def compare(self, script, rounds, profile_stacks=False):
        tmp = tempfile.mkdtemp(prefix="alloctrace-memray-")
        self.addCleanup(subprocess.call, ["rm", "-rf", tmp])
        path = os.path.join(BENCH, script)
        trace = os.path.join(tmp, "run.trace")
        results = os.path.join(tmp, "run.bin")
        cmd = [sys.executable, "-m", "alloctrace", "run", "-o", trace, path, str(rounds)]
        if profile_stacks:
            cmd = ["env", "ALLOCTRACE_PYTHON_PROFILE_STACKS=1"] + cmd
        run(self, cmd)
        run(self, [sys.executable, "-m", "memray", "run", "--trace-python-allocators", "-q", "-f", "-o", results,
                   path, str(rounds)])
        theirs = memray_sites(self, results, 4 * TOP)
        ours = alloctrace_sites(self, trace)
        how = ", profile stacks" if profile_stacks else ""
        msg = "%s, %d rounds%s:\nalloctrace:\n%s\nmemray:\n%s" % (script, rounds, how, mib(ours[:2 * TOP]),
                                                              mib(theirs[:2 * TOP]))
        self.assertGreaterEqual(len(theirs), TOP, msg)
        # The top sites are the script's own lines or the json module's,
        # never the runners'.
        for (_, path_, _), _ in theirs[:TOP]:
            self.assertTrue(path_ == path or os.path.basename(os.path.dirname(path_)) == "json", msg)
        self.assertEqual([k for k, _ in ours[:TOP]], [k for k, _ in theirs[:TOP]], msg)
        # The same allocations: each top site's bytes agree, but for the
        # arenas alloctrace adds.
        for (key, b_ours), (_, b_theirs) in zip(ours[:TOP], theirs[:TOP]):
            self.assertGreaterEqual(b_ours, b_theirs * (1 - TOLERANCE), "%s\n%s" % (key, msg))
            self.assertLessEqual(b_ours, b_theirs * (1 + TOLERANCE) + ARENA_SLACK, "%s\n%s" % (key, msg))

    def test_deep_stack_loop(self):
        self.compare("deep_stack.py", 1000, profile_stacks=True)

    def test_json_dict_workload(self):
        self.compare("json_dict.py", 100)

    def test_json_dict_workload_with_profile_stacks(self):
        self.compare("json_dict.py", 100, profile_stacks=True)


if __name__ == "__main__":
    try:
        import memray  # noqa: F401
    except ImportError:
        sys.exit("test_memray: memray is not installed in %s (make python-test installs it from PyPI)" % sys.prefix)
    unittest.main()
