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
mixed (cfi skip, then fp)     10      11        39.7      3.61
dwarf (cached), no-fp         60      67       676.4     10.10
DWARF rule cache: 50800354 hits, 24 misses

memo (16560 bytes per WalkMemo)         chain  frames  ns/capture  shared
dwarf memo, no-fp, same                 40      49       148.6    49.0
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
            ("mixed (cfi skip, then fp)", 10): (11, 39.7, 3.61),
            ("dwarf (cached), no-fp", 60): (67, 676.4, 10.10),
            # The memo table's last column is `shared`: ns/frame is computed.
            ("dwarf memo, no-fp, same", 40): (49, 148.6, 3.03),
        })

    def test_paired_is_the_median_of_ratios_within_rounds(self):
        # Round by round 2x, 1x, 5x: the median ratio is 2, where the ratio
        # of the medians would be 3 / 2 and of the bests 2 / 1.
        self.assertEqual(bench.paired([2.0, 3.0, 10.0], [1.0, 3.0, 2.0]), 2.0)
        self.assertEqual(bench.paired([4.0, 3.0, 10.0], [1.0, 3.0, 2.0]), 4.0)  # 4 / 2 by medians, 3 / 1 by bests

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

    def test_fast_mode_stops_at_the_chain_without_frame_pointers(self):
        res = bench.capture_c("fast")
        if not res["capture"]:
            self.skipTest("built without trace_stack_capture")
        self.assertGreater(res["capture_64_frames"], 64)
        if "capture_nofp_64" in res:
            self.assertLess(res["capture_nofp_64_frames"], 64)


if __name__ == "__main__":
    unittest.main()
