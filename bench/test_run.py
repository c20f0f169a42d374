"""Tests of bench/run's parsing and arithmetic (not of any speed):

    python3 bench/test_run.py

The pure helpers run on crafted input. The end-to-end test of the stack
capture bench runs build/bench/stack_capture and the release CLI when they
are built (`make bench` builds them), and is skipped otherwise.
"""

import importlib.machinery
import importlib.util
import os
import shutil
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


def load_run():
    loader = importlib.machinery.SourceFileLoader("bench_run", os.path.join(HERE, "run"))
    spec = importlib.util.spec_from_loader("bench_run", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


bench = load_run()

# `alloctrace dump --stacks --json` lines: a module, a native stack ending
# in a truncation mark, a mixed stack with a registered frame.
STACKS_JSON = "\n".join([
    '{"gen":1,"module":{"id":1,"path":"/usr/bin/app","start":4194304,"end":4198400,"bias":0,'
    '"eh_frame_hdr":0,"build_id":"","load_ticks":0,"unload_ticks":0}}',
    '{"gen":1,"stack":1,"frames":[{"addr":4198656,"module":"/usr/bin/app","offset":4352}]}',
    '{"gen":1,"stack":2,"frames":[{"addr":4198700,"module":"/usr/bin/app","offset":4396},'
    '{"addr":4198656,"module":"/usr/bin/app","offset":4352},{"truncated":true}]}',
    '{"gen":1,"stack":3,"frames":[{"file":"a.lua","function":"f","line":7},'
    '{"addr":4198656,"module":null,"offset":null}]}',
])

CAPTURE_BENCH_OUT = """walk                       chain  frames  ns/capture  ns/frame
note: the fp walk saw 1 of 10 frames: build with -C force-frame-pointers=yes
fp                            10       1         4.0      4.03
dwarf (cached), fp chain      10      11        39.7      3.61
dwarf (cached), no-fp         60      67       676.4     10.10
DWARF rule cache: 50800354 hits, 24 misses

memo (16560 bytes per WalkMemo)         chain  frames  ns/capture  shared
dwarf memo, no-fp, same                 40      49       148.6    49.0
"""

# `callgrind_annotate --inclusive=yes --threshold=100 --auto=no` of a run
# under the shim, trimmed: an inlined function comes as several
# file:function entries (the one with the object is the whole), Python's
# recursion levels as 'N, unknown files as ???.
CALLGRIND_ANNOTATE = """\
--------------------------------------------------------------------------------
Profile data file 'cg.9877' (creator: callgrind-3.19.0)
--------------------------------------------------------------------------------
Events recorded:  Ir
Events shown:     Ir
Thresholds:       100
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
1,000,000 (100.0%)  PROGRAM TOTALS

--------------------------------------------------------------------------------
Ir                      file:function
--------------------------------------------------------------------------------
4,693,794 (469.4%)  ???:_PyEval_EvalFrameDefault'2 [/usr/bin/python3.11]
  800,000 (80.00%)  /w/crates/writer/src/capture.rs:alloctrace_writer::capture::capture_stack_or_lost [/w/liballoctrace_preload.so]
  600,000 (60.00%)  /w/crates/unwind/src/memo.rs:alloctrace_unwind::memo::capture_dwarf_memo [/w/liballoctrace_preload.so]
  150,000 (15.00%)  /w/crates/unwind/src/bounds.rs:alloctrace_unwind::memo::capture_dwarf_memo
  100,000 (10.00%)  /cargo/framehop-0.16.0/src/dwarf.rs:framehop::dwarf::DwarfUnwinder<R,A,UCS>::unwind_frame_with_fde [/w/liballoctrace_preload.so]
   50,000 ( 5.00%)  /cargo/framehop-0.16.0/src/x86_64/unwind_rule.rs:<framehop::x86_64::unwind_rule::UnwindRuleX86_64 as framehop::unwind_rule::UnwindRule>::exec [/w/liballoctrace_preload.so]
   40,000 ( 4.00%)  /w/crates/writer/src/call_stack_table.rs:alloctrace_writer::call_stack_table::intern_child [/w/liballoctrace_preload.so]
   13,708 ( 1.37%)  ???:0x0000000000023930 [/w/liballoctrace_preload.so]
"""


class Parsing(unittest.TestCase):
    def test_stack_table_counts_native_frames_and_the_truncation_mark(self):
        table = bench.parse_stack_table(STACKS_JSON)
        self.assertEqual(table, {1: (1, False), 2: (2, True), 3: (1, False)})

    def test_depth_is_the_mean_over_allocations_not_over_stacks(self):
        table = {1: (2, False), 2: (10, False), 3: (4, True)}
        d = bench.depth_summary(allocs=7, counts={1: 3, 2: 1, 3: 2}, table=table, limit=10)
        self.assertEqual(d["with_stack"], 6)
        self.assertAlmostEqual(d["mean_frames"], (3 * 2 + 10 + 2 * 4) / 6)
        self.assertEqual(d["max_frames"], 10)
        self.assertEqual(d["at_limit"], 1)
        self.assertEqual(d["ended_early"], 2)  # truncated below the limit
        self.assertEqual(d["allocs"], 7)

    def test_depth_of_no_stacks(self):
        d = bench.depth_summary(allocs=5, counts={}, table={}, limit=64)
        self.assertEqual((d["with_stack"], d["mean_frames"]), (0, 0))

    def test_capture_bench_rows(self):
        rows = bench.parse_capture_bench(CAPTURE_BENCH_OUT)
        self.assertEqual(rows, {
            ("fp", 10): (1, 4.0, 4.03),
            ("dwarf (cached), fp chain", 10): (11, 39.7, 3.61),
            ("dwarf (cached), no-fp", 60): (67, 676.4, 10.10),
            # The memo table's last column is `shared`: ns/frame is computed.
            ("dwarf memo, no-fp, same", 40): (49, 148.6, 3.03),
        })

    def test_paired_is_the_median_of_ratios_within_rounds(self):
        # Round by round 2x, 1x, 5x: the median ratio is 2, where the ratio
        # of the medians would be 3 / 2 and of the bests 2 / 1.
        self.assertEqual(bench.paired([2.0, 3.0, 10.0], [1.0, 3.0, 2.0]), 2.0)
        self.assertEqual(bench.paired([4.0, 3.0, 10.0], [1.0, 3.0, 2.0]), 4.0)  # 4 / 2 by medians, 3 / 1 by bests

    def test_callgrind_annotate_keeps_each_functions_whole_entry(self):
        funcs, total = bench.parse_callgrind_annotate(CALLGRIND_ANNOTATE)
        self.assertEqual(total, 1000000)
        # The entry with the object (the whole function), not bounds.rs's part.
        self.assertEqual(funcs["alloctrace_unwind::memo::capture_dwarf_memo"], 600000)
        self.assertEqual(funcs["alloctrace_writer::capture::capture_stack_or_lost"], 800000)
        self.assertEqual(funcs["<framehop::x86_64::unwind_rule::UnwindRuleX86_64 as "
                               "framehop::unwind_rule::UnwindRule>::exec"], 50000)
        self.assertEqual(funcs["_PyEval_EvalFrameDefault'2"], 4693794)
        self.assertEqual(funcs["0x0000000000023930"], 13708)
        self.assertNotIn("PROGRAM TOTALS", funcs)

    def test_callgrind_the_first_pattern_that_matches_wins(self):
        funcs, _ = bench.parse_callgrind_annotate(CALLGRIND_ANNOTATE)
        self.assertEqual(bench.cg_match(funcs, [r"::capture_from$", r"::capture_dwarf_memo$"]),
                         (600000, ["alloctrace_unwind::memo::capture_dwarf_memo"]))
        self.assertEqual(bench.cg_match(funcs, [r"::no_such_fn$"]), (None, []))
        self.assertEqual(bench.cg_match(funcs, [r"(unbalanced", r"::intern_child$"])[0], 40000)  # a bad regex is skipped
        self.assertEqual(bench.cg_match(funcs, None), (None, []))

    def test_callgrind_pieces_per_allocation_and_per_frame(self):
        funcs, _ = bench.parse_callgrind_annotate(CALLGRIND_ANNOTATE)
        pieces = {p[0]: p for p in bench.cg_pieces(funcs, None, 1000, {"new": 2.0, "shared": 0.01})}
        self.assertEqual(pieces["capture"][2], 800)
        self.assertEqual(pieces["walk"][2], 600)
        self.assertIsNone(pieces["own"][2])  # no function matched: n/a
        self.assertIsNone(pieces["revalidate"][2])
        self.assertEqual(pieces["step"][2], 100)  # framehop's unwind_frame_with_fde
        self.assertEqual(pieces["step"][3], 50)  # per new frame
        self.assertEqual(pieces["intern"][2:4], (40, 20))
        self.assertEqual(pieces["framework"][2], 800 - 600 - 40)
        # The delta method subtracts the short run's counts of the same functions.
        short = {f: n // 2 for f, n in funcs.items()}
        pieces = {p[0]: p for p in bench.cg_pieces(funcs, short, 100, {"new": 0.0, "shared": 30})}
        self.assertEqual(pieces["walk"][2], 3000)
        self.assertIsNone(pieces["step"][3])  # no new frames: no figure per frame
        self.assertEqual(pieces["framework"][2], 4000 - 3000 - 200)

    def test_callgrind_steps_inlined_into_the_memo_walk_are_a_piece_of_their_own(self):
        ann = CALLGRIND_ANNOTATE.replace(
            "   13,708 ( 1.37%)  ???:0x0000000000023930 [/w/liballoctrace_preload.so]\n",
            "  500,000 (50.00%)  /w/crates/unwind/src/memo.rs:alloctrace_unwind::memo::walk_to_match [/w/liballoctrace_preload.so]\n"
            "   70,000 ( 7.00%)  /w/crates/unwind/src/step.rs:alloctrace_unwind::memo::walk_to_match\n"
            "   30,000 ( 3.00%)  /w/crates/unwind/src/step.rs:alloctrace_unwind::step::rule_miss [/w/liballoctrace_preload.so]\n")
        funcs, _ = bench.parse_callgrind_annotate(ann)
        # The whole function keeps its entry; the part is kept beside it.
        self.assertEqual(funcs["alloctrace_unwind::memo::walk_to_match"], 500000)
        self.assertEqual(funcs["in:step.rs:alloctrace_unwind::memo::walk_to_match"], 70000)
        # Only an "in:" pattern sees parts.
        self.assertEqual(bench.cg_match(funcs, [r"::walk_to_match$"])[0], 500000)
        self.assertEqual(bench.cg_match(funcs, [r"in:^step\.rs:\S*walk_to_match$"])[0], 70000)
        pieces = {p[0]: p for p in bench.cg_pieces(funcs, None, 1000, {"new": 2.0, "shared": 10.0})}
        self.assertEqual(pieces["step"][2:4], (100, 50))  # 70 inlined + 30 of misses
        # The memo's functions (walk_to_match, 500) without the steps.
        self.assertEqual(pieces["revalidate"][2], 400)

    def test_callgrind_patterns_from_the_environment(self):
        funcs, _ = bench.parse_callgrind_annotate(CALLGRIND_ANNOTATE)
        saved = os.environ.get("BENCH_CG_PATTERNS")
        os.environ["BENCH_CG_PATTERNS"] = "own=::exec$;walk=::nothing$|::unwind_frame_with_fde$"
        try:
            pieces = {p[0]: p for p in bench.cg_pieces(funcs, None, 1000, {})}
        finally:
            if saved is None:
                del os.environ["BENCH_CG_PATTERNS"]
            else:
                os.environ["BENCH_CG_PATTERNS"] = saved
        self.assertEqual(pieces["own"][2], 50)
        self.assertEqual(pieces["walk"][2], 100)
        self.assertEqual(pieces["framework"][2], 800 - 100 - 40)  # own frames are part of the walk

    def test_callgrind_missing_valgrind_is_skipped(self):
        saved = bench.shutil.which
        bench.shutil.which = lambda name: None
        try:
            self.assertEqual(bench.callgrind_skip(), "skipped: valgrind not installed")
        finally:
            bench.shutil.which = saved

    def test_stack_sharing_counts_new_and_shared_frames_per_thread(self):
        table = bench.parse_stack_frames(STACKS_JSON)
        self.assertEqual(table[2], (4198700, 4198656))
        table = {1: (10, 20, 30), 2: (11, 20, 30), 3: (12, 20, 21, 30), 4: (40,)}
        # Thread 1: 1 (all new), 2 (shares 20, 30), 3 (shares 30: 20 is at
        # another depth); thread 2: 4 (all new), 1 (nothing in common).
        d = bench.stack_sharing([(1, 1), (1, 2), (2, 4), (1, 3), (2, 1)], table)
        self.assertEqual(d, {"allocs": 5, "frames": 3 + 3 + 1 + 4 + 3, "new": 3 + 1 + 1 + 3 + 3,
                             "shared": 0 + 2 + 0 + 1 + 0})

    def test_rss_per_thread(self):
        rss = {("none", 3): 1000, ("full", 3): 1300, ("none", 9): 2000, ("full", 9): 2700}
        self.assertEqual(bench.rss_per_thread(rss, 3, 9), (700, 300, 700 / 9, 400 / 6))

    def test_a_stall_during_the_snapshot_is_a_gap_that_overlaps_it(self):
        gaps = [[100, 50], [400, 30], [10, 5], [290, 20]]
        # [300, 350]: the gap from 290 overlaps; 400 starts after; 100 and
        # 10 end before.
        self.assertEqual(bench.stall_during(gaps, 300, 350), (20, 50))
        self.assertEqual(bench.stall_during(gaps, 1000, 2000), (0, 50))
        self.assertEqual(bench.stall_during([], 0, 1), (0, 0))

    def test_bench_only_groups(self):
        saved = bench.ONLY
        try:
            bench.ONLY = ("callgrind",)
            self.assertTrue(bench.want("callgrind"))
            self.assertFalse(bench.want("workload"))
            bench.ONLY = ()
            self.assertTrue(all(bench.want(g) for g in bench.GROUPS))
        finally:
            bench.ONLY = saved

    def test_memray_added_ratio_is_the_median_within_rounds(self):
        times = {"plain": [1.0, 1.0, 2.0], "a": [2.0, 3.0, 3.0], "m": [3.0, 3.0, 6.0]}
        # Rounds: 1/2, 2/2, 1/4.
        self.assertEqual(bench.memray_added_ratio(times, "a", "m"), 0.5)
        # A round where the rival added nothing is left out.
        times = {"plain": [1.0, 1.0], "a": [2.0, 2.0], "m": [1.0, 5.0]}
        self.assertEqual(bench.memray_added_ratio(times, "a", "m"), 0.25)

    def test_memray_and_alloctrace_see_the_same_allocations(self):
        configs = dict(bench.MEMRAY_CONFIGS)
        self.assertEqual(set(configs),
                         {"plain", "alloctrace", "memray", "alloctrace_native", "memray_native", "alloctrace_profile"})
        # The context row's alloctrace keeps its stacks with a profile
        # function, as memray does; the target rows' walks the frames.
        self.assertEqual(bench.MEMRAY_CONFIG_ENV, {"alloctrace_profile": {"ALLOCTRACE_PYTHON_PROFILE_STACKS": "1"}})
        self.assertEqual(configs["alloctrace_profile"], configs["alloctrace"])
        for cfg in ("memray", "memray_native"):
            self.assertIn("--trace-python-allocators", configs[cfg])
        self.assertIn("--native", configs["memray_native"])
        self.assertIn("--native", configs["alloctrace_native"])
        self.assertNotIn("--native", configs["memray"] + configs["alloctrace"])
        # Every configuration runs with the same environment: pymalloc.
        self.assertEqual(bench.MEMRAY_ENV["PYTHONMALLOC"], "pymalloc")
        self.assertEqual({s for _, s, _ in bench.MEMRAY_SCRIPTS}, {"deep_stack.py", "json_dict.py"})
        for _, script, _ in bench.MEMRAY_SCRIPTS:
            self.assertTrue(os.path.exists(os.path.join(HERE, script)), script)

    def memray_rows(self, venv, run_cpu):
        saved = bench.memray_venv, bench.run_cpu, bench.ROWS[:], bench.MEMRAY_REPS, bench.log
        bench.memray_venv, bench.run_cpu, bench.MEMRAY_REPS, bench.log = venv, run_cpu, 2, lambda msg: None
        del bench.ROWS[:]
        raw = {}
        try:
            bench.memray_items(raw)
            return list(bench.ROWS), raw
        finally:
            bench.memray_venv, bench.run_cpu, _, bench.MEMRAY_REPS, bench.log = saved
            bench.ROWS[:] = saved[2]

    def test_memray_rows_say_skipped_without_pypi(self):
        rows, raw = self.memray_rows(lambda: (None, None, "skipped: pip could not install memray from PyPI: x"),
                                     None)
        self.assertEqual([(r["item"], r["status"]) for r in rows], [("U2", "skipped"), ("U3", "skipped")])
        self.assertIn("could not install memray from PyPI", rows[0]["note"])
        self.assertNotIn("memray", raw)

    def test_memray_native_rows_skip_alloctrace_when_it_refuses_native_and_still_time_memray(self):
        calls = []
        # Loop seconds per configuration: plain 1, alloctrace 2, memray 3,
        # memray --native 5 (alloctrace --native refused).
        loop = {"plain": 1.0, "alloctrace": 2.0, "memray": 3.0, "memray_native": 5.0}

        def run_cpu(cmd, env):
            calls.append(cmd)
            self.assertEqual(env["PYTHONMALLOC"], "pymalloc")
            if "alloctrace" in cmd and "--native" in cmd:
                return 0.1, 0.1, "", "alloctrace: error: --native is not supported yet\n", 2
            cfg = ("memray" if "memray" in cmd else "alloctrace" if "alloctrace" in cmd else "plain") + \
                ("_native" if "--native" in cmd else "")
            out = '{"rounds": 1, "wall_ns": %d, "cpu_ns": %d}\n' % (loop[cfg] * 1e9, loop[cfg] * 2e9)
            return loop[cfg] + 0.5, loop[cfg], out, "", 0

        rows, raw = self.memray_rows(lambda: ("/venv/bin/python", "1.0", None), run_cpu)
        by = {(r["item"], r["what"].split(":")[0]): r for r in rows}
        self.assertEqual(len(rows), 6)
        for script in ("deep-stack", "json/dict"):
            context = by[("U2", script + " (profile function)")]
            self.assertEqual((context["status"], context["value"]), ("", "0.500 of memray's"))
        for script in ("deep-stack", "json/dict"):
            u2 = by[("U2", script)]
            self.assertEqual((u2["status"], u2["value"]), ("met", "0.500 of memray's"))
            u3 = by[("U3", script)]
            self.assertEqual(u3["status"], "skipped")
            self.assertIn("refused --native", u3["note"])
            self.assertIn("memray --native 5.00", u3["note"])
            self.assertEqual(raw["memray"]["scripts"][script]["loops"]["memray_native"], [5.0, 5.0])
            self.assertEqual(raw["memray"]["scripts"][script]["loop_cpus"]["alloctrace"], [4.0, 4.0])
            self.assertIn("the loop elapsed 0.500 of memray's", u2["note"])
        # alloctrace --native is tried once, then not again.
        self.assertEqual(sum(1 for c in calls if "alloctrace" in c and "--native" in c), 1)

    def test_default_stack_mode_is_read_from_the_options_crate(self):
        self.assertIn(bench.default_stack_mode(), ("none", "fast", "full", None))


@unittest.skipUnless(os.path.exists(os.path.join(bench.BIN, "stack_capture")) and os.path.exists(bench.CLI),
                     "build/bench/stack_capture or the release CLI not built")
class StackCaptureEndToEnd(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.saved = bench.TMP, bench.EVENT_REPS
        bench.TMP, bench.EVENT_REPS = self.tmp, 1

    def tearDown(self):
        bench.TMP, bench.EVENT_REPS = self.saved
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_each_capture_finds_its_stack_in_the_trace(self):
        res = bench.capture_c("full")
        if not res["capture"]:
            self.skipTest("built without trace_stack_capture")
        for d in res["depths"]:
            # The floor walks the chain and the bench's own frames.
            self.assertEqual(res[f"floor_frames_{d}"], d + 2)
            # DWARF sees the whole chain with and without frame pointers,
            # and the frames below it (main, the C library's start).
            for loop in ("capture", "capture_nofp"):
                if loop == "capture_nofp" and "capture_nofp_8" not in res:
                    continue  # a clang build has no chain without frame pointers
                frames = res[f"{loop}_{d}_frames"]
                self.assertIsNotNone(frames, f"{loop} {d}")
                self.assertGreater(frames, d + 2, f"{loop} {d}")
                self.assertGreater(res[f"{loop}_{d}"]["best"], 0)
        # Deeper chains, more frames: the tags name their own chains.
        self.assertLess(res["capture_8_frames"], res["capture_32_frames"])
        self.assertLess(res["capture_32_frames"], res["capture_64_frames"])


if __name__ == "__main__":
    unittest.main()
