"""The JSON/dict workload of `make bench` (issue 23, group memray): builds
dicts of records, serializes them with json.dumps and parses them back
with json.loads, ROUNDS times; most of its objects are small (pymalloc's),
a few are large (the JSON text, the records' lists).

    python3 bench/json_dict.py [ROUNDS]

Each function allocates at its own line, so that a tracer's top sites by
bytes allocated are these lines: json's encoder (the JSON text's pieces),
json's decoder (the parsed dicts), then records()'s names, dicts and tags
lists, each at least 1.5 times the next by bytes allocated:
python/tests/test_memray.py compares the top 5 sites of alloctrace and
memray on it.

Prints one JSON object: rounds, records made, bytes of JSON text, the
loop's wall time and the process's CPU time during it (all its threads),
in ns.
"""

import json
import sys
import time

RECORDS = 200  # records per round


def records(r):
    out = [None] * RECORDS  # one list a round, of RECORDS slots
    for i in range(RECORDS):
        name = "user-%d-%d-" % (r, i) + "x" * (i % 64)  # the records' names
        tags = [i, i + 1, i + 2, i + 3, i + 4, i + 5, i + 6, i + 7]  # the tags lists
        rec = {"id": i, "round": r, "name": name, "tags": tags, "score": i * 0.5, "ok": i % 2 == 0}  # the dicts
        out[i] = rec
    return out


def encode(recs):
    return json.dumps(recs)


def decode(text):
    return json.loads(text)


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    made = 0
    text_bytes = 0
    t0 = time.perf_counter_ns()
    c0 = time.process_time_ns()
    for r in range(rounds):
        recs = records(r)
        text = encode(recs)
        back = decode(text)
        made += len(back)
        text_bytes += len(text)
        del recs, text, back
    wall = time.perf_counter_ns() - t0
    cpu = time.process_time_ns() - c0  # all the process's threads, a tracer's too
    print(json.dumps({"rounds": rounds, "records": made, "text_bytes": text_bytes, "wall_ns": wall, "cpu_ns": cpu}))


if __name__ == "__main__":
    main()
