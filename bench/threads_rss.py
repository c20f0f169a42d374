"""The tracer's memory per live thread, for /usr/bin/python3 (issue 19):
THREADS threads each build deep_stack.py's trees for ROUNDS rounds (native
stacks 30-60 frames deep) and then park, alive, on a barrier; with all of
them parked the main thread reads its VmRSS from /proc/self/status.

    python3 bench/threads_rss.py THREADS [ROUNDS]

ROUNDS defaults to 2: few enough events that the trace buffers' backlog at
the reading (larger without stacks, since those threads run faster) does
not swamp the stack state; at 20 rounds it moved full minus none by a few
MiB either way from run to run, more than 128 threads' states.

Run it with PYTHONMALLOC=malloc under the shim with ALLOCTRACE_STACKS=none
and =full; the driver divides the difference of the two RSS by THREADS.
Prints one JSON object: threads, rounds, vm_rss_kib, vm_hwm_kib.
"""

import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deep_stack  # noqa: E402


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return -1


def main():
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    parked = threading.Barrier(threads + 1)
    release = threading.Event()

    def work(seed):
        for r in range(rounds):
            tree = deep_stack.Node(deep_stack.DEPTH, seed + r)
            deep_stack.count(tree)
            del tree
        parked.wait()
        release.wait()

    ts = [threading.Thread(target=work, args=(i * rounds,)) for i in range(threads)]
    for t in ts:
        t.start()
    parked.wait()
    rss, hwm = status_kib("VmRSS:"), status_kib("VmHWM:")
    release.set()
    for t in ts:
        t.join()
    print(json.dumps({"threads": threads, "rounds": rounds, "vm_rss_kib": rss, "vm_hwm_kib": hwm}))


if __name__ == "__main__":
    main()
