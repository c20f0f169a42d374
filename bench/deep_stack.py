"""The deep-stack program of `make bench` (issue 12): an allocation-heavy
loop for /usr/bin/python3, run with PYTHONMALLOC=malloc so that every
object the interpreter makes goes through malloc and free.

    python3 bench/deep_stack.py [ROUNDS]

Each round builds a small tree of objects through nested constructors and
drops it. Python 3.11 runs a call of a Python function from Python code
without a new C frame, but a class's constructor goes through C
(type_call, slot_tp_init, the vectorcall of __init__, a new evaluation
loop), so each level of nesting adds several native frames: the mallocs
deep in a tree run 30-60 native frames down. Lists, dicts, tuples,
strings and ints of a few sizes are made and freed at every level.

Prints one JSON object: rounds, nodes built, the loop's wall time and
the process's CPU time during it (all its threads), in ns.
"""

import json
import sys
import time

DEPTH = 6  # levels of nested constructors below the round's root


class Node:
    __slots__ = ("items", "attrs", "name", "children")

    def __init__(self, depth, i):
        self.items = [i, i + 1, (i, depth), str(i)]
        self.attrs = {"depth": depth, "i": i, "tag": "n" * (i % 40)}
        self.name = f"node-{depth}-{i}"
        if depth > 0:
            # Two children, the second one level shallower: stacks of every
            # depth from the root's to the deepest.
            self.children = [Node(depth - 1, 2 * i), Leaf(depth - 1, 2 * i + 1)]
        else:
            self.children = None


class Leaf:
    __slots__ = ("node", "words")

    def __init__(self, depth, i):
        self.words = " ".join(str(j) for j in range(i % 8)).split()
        self.node = Node(depth - 1, i) if depth > 1 else None


def count(node):
    if node is None:
        return 0
    if isinstance(node, Leaf):
        return 1 + count(node.node)
    return 1 + sum(count(c) for c in node.children or ())


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
    nodes = 0
    t0 = time.perf_counter_ns()
    c0 = time.process_time_ns()
    for r in range(rounds):
        tree = Node(DEPTH, r)
        nodes += count(tree)
        del tree
    wall = time.perf_counter_ns() - t0
    cpu = time.process_time_ns() - c0  # all the process's threads, a tracer's too
    print(json.dumps({"rounds": rounds, "nodes": nodes, "wall_ns": wall, "cpu_ns": cpu}))


if __name__ == "__main__":
    main()
