#!/usr/bin/env bash
# The LD_PRELOAD shim's tests (`make preload-test`) not yet moved to
# crates/preload/tests/shim (the library, the C programs, the panic
# boundary, the configuration, the signals, `alloctrace record` and the
# shim among other libraries are there).
#
# usage: run_tests.sh CLI SHIM BIN_DIR [PANIC_SHIM]
#   CLI         the alloctrace command
#   SHIM        liballoctrace_preload.so
#   BIN_DIR     where the Makefile built the test programs of c_tests/preload
#   PANIC_SHIM  the shim built with the feature panic-test (`make
#               preload-panic`); without it the panic boundary's tests skip
#
# Each test prints one line (ok, FAIL or skip, its name, what it showed);
# the last line is "preload-tests: N passed, M failed, K skipped" and the
# exit status is 1 if any test failed. Every traced run has a time limit,
# so a deadlock fails a test instead of hanging the suite.
set -u

CLI=$1
SHIM=$2
BIN=$3
PANIC_SHIM=${4:-}
LIMIT=${PRELOAD_TEST_TIMEOUT:-300}

pass=0
fail=0
skip=0
ok() { echo "ok   $T: $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $T: $*"; fail=$((fail + 1)); }
skipped() { echo "skip $T: skipped: $*"; skip=$((skip + 1)); }

WORK=$(mktemp -d)
# Only this shell cleans up: bash may run an inherited EXIT trap in a
# background subshell that a signal ends (the watchdog below).
trap '[ "$BASHPID" = "$$" ] && rm -rf "$WORK"' EXIT

# A fresh directory for the current test: $D.
fresh() {
    T=$1
    D=$WORK/$T
    mkdir -p "$D"
    : >"$D/index"
}

# Runs "$@" with the environment variables given as NAME=VALUE words
# before a "--", killed after $LIMIT seconds. Nothing else runs with that
# environment (timeout(1) or env(1) would be traced too). Sets RC.
limited() {
    local vars=()
    while [ "$1" != -- ]; do vars+=("$1"); shift; done
    shift
    (for v in "${vars[@]}"; do export "${v?}"; done; exec "$@") &
    local pid=$!
    (for _ in $(seq "$LIMIT"); do sleep 1; kill -0 "$pid" 2>/dev/null || exit 0; done; kill -9 "$pid") 2>/dev/null &
    local watchdog=$!
    wait "$pid"
    RC=$?
    # SIGKILL: a bash subshell ended by a catchable signal may run an
    # inherited EXIT trap.
    kill -9 "$watchdog" 2>/dev/null
    wait "$watchdog" 2>/dev/null
}

# Runs a command under the shim, traces in $D (t.PID.trace), stdout in
# $D/out, stderr in $D/err. Extra NAME=VALUE settings come from $EXTRA.
traced() {
    # shellcheck disable=SC2086
    limited ALLOCTRACE_INDEX="$D/index" ALLOCTRACE_OUTPUT="${OUTPUT:-$D/t.%p.trace}" LD_PRELOAD="$SHIM" ${EXTRA:-} \
        -- "$@" >"$D/out" 2>"$D/err"
}

# The trace files the run listed, one per line (the index's session-start
# lines: PID<TAB>PROGRAM<TAB>PATH; session.rs, append_index).
traces() { awk -F'\t' '$1 ~ /^[0-9]+$/ {print $3}' "$D/index"; }
# The pids of those lines, one per line.
trace_pids() { awk -F'\t' '$1 ~ /^[0-9]+$/ {print $1}' "$D/index"; }

# stats --json of a trace, cached next to it.
stats_of() {
    [ -n "$1" ] || return 0
    [ -s "$1.json" ] || "$CLI" stats --json "$1" >"$1.json" 2>/dev/null
    cat "$1.json"
}

# A number from a trace's stats --json: num TRACE KEY (the first key of
# that name: event kinds, entry points and top-level keys are distinct).
num() {
    local v
    v=$(stats_of "$1" | grep -o "\"$2\":[0-9]*" | head -1 | cut -d: -f2)
    echo "${v:--1}"
}

# Runs `alloctrace check` on every trace of the run; prints
# "exit-code path" lines for those that are not 0.
check_all() {
    local t rc
    for t in $(traces); do
        "$CLI" check "$t" >/dev/null 2>"$t.check"
        rc=$?
        [ $rc -eq 0 ] || echo "$rc $t ($(head -c 300 "$t.check" | head -2 | tr '\n' ' '))"
    done
}

# --- real programs -----------------------------------------------------------

# Runs a real program under the shim; every trace must check ok. Prints the
# number of traces and events.
real_program() {
    local desc=$1
    shift
    traced "$@"
    local bad_checks n events=0 t
    bad_checks=$(check_all)
    n=$(traces | wc -l)
    for t in $(traces); do events=$((events + $(num "$t" total_events))); done
    if [ $RC -ne 0 ] || [ "$n" -lt 1 ] || [ -n "$bad_checks" ]; then
        bad "$desc: rc=$RC, $n traces: $bad_checks $(head -3 "$D/err")"
    else
        ok "$desc: $n trace(s), $events events, all check ok"
    fi
}

PYTHON=""
for p in /usr/bin/python3 "$(command -v python3 2>/dev/null)"; do
    if [ -n "$p" ] && [ -x "$p" ] && head -c 4 "$p" 2>/dev/null | grep -q ELF; then PYTHON=$p; break; fi
done
fresh python_malloc
if [ -z "$PYTHON" ]; then skipped "python3 not installed"; else
    EXTRA=PYTHONMALLOC=malloc real_program "python3 (PYTHONMALLOC=malloc) allocation loop" "$PYTHON" -c '
d = {}
for i in range(200000):
    d[i] = [str(i)] * (i % 7)
    if i % 3 == 0:
        del d[i // 2]
print(len(d))'
fi
fresh python_pymalloc
if [ -z "$PYTHON" ]; then skipped "python3 not installed"; else
    real_program "python3 (pymalloc arenas: mmap) with threads and a subprocess" "$PYTHON" -c '
import threading, subprocess
def work(n):
    x = [bytes(100) * (i % 50) for i in range(n)]
    return len(x)
ts = [threading.Thread(target=work, args=(100000,)) for _ in range(3)]
[t.start() for t in ts]
[t.join() for t in ts]
print(subprocess.run(["true"]).returncode)'
fi

fresh sort
if ! command -v sort >/dev/null; then skipped "sort (coreutils) not installed"; else
    seq 1 300000 | awk '{print ($1 * 7919) % 300007 " line " $1}' >"$D/input"
    real_program "sort --parallel=2 on 300000 lines" sort --parallel=2 -S 4M -T "$D" -o "$D/sorted" "$D/input"
fi

fresh sh_pipeline
if ! command -v sh >/dev/null || ! command -v sort >/dev/null; then skipped "sh or sort not installed"; else
    seq 1 100000 >"$D/input"
    real_program "sh -c pipeline (cat | sort -r | uniq | wc -l)" sh -c "cat '$D/input' | sort -r | uniq | wc -l"
fi

fresh xz_threads
if ! command -v xz >/dev/null; then skipped "xz not installed (xz-utils)"; else
    seq 1 400000 >"$D/input"
    real_program "xz -T2 (2 compression threads)" xz -T2 --block-size=256KiB -k -c "$D/input"
    if [ "$(traces | head -1)" ] && [ "$(num "$(traces | head -1)" stack_alloc)" -lt 2 ]; then
        bad "xz ran fewer than 2 threads: $(num "$(traces | head -1)" stack_alloc) stack allocs"
    fi
fi

# --- threads-capi ---

# A thread keeps one slot and one thread ID for its whole life, including
# glibc's free(NULL) calls after its exit flush; its slot is reused once it
# is gone, so nothing is lost and memory stays flat (issue 10, item 8).
# prog_threads TOTAL AT_ONCE [idle]; the trace must count exactly
# TOTAL + 1 threads (the main thread too).
threads_short_lived() {
    local total=$1 at_once=$2 mode=${3:-work} t rss_2000 rss_end growth
    fresh "threads_${total}_by_${at_once}_$mode"
    traced "$BIN/prog_threads" "$total" "$at_once" "$mode"
    t=$(traces)
    local bad_checks
    bad_checks=$(check_all)
    if [ $RC -ne 0 ] || [ -z "$t" ] || [ -n "$bad_checks" ] || ! grep -q "^threads $total$" "$D/out"; then
        bad "rc=$RC traces=[$t] $bad_checks $(head -3 "$D/err")"
        return
    fi
    local threads lost
    threads=$(num "$t" threads)
    lost=$(num "$t" lost_events)
    if [ "$threads" != $((total + 1)) ] || [ "$lost" != 0 ]; then
        bad "$threads threads in the trace (want $((total + 1))), $lost events lost (want 0)"
        return
    fi
    if [ "$total" -ge 2000 ] && [ "$at_once" -eq 1 ]; then
        read -r _ rss_2000 _ rss_end _ <<<"$(grep '^rss_2000' "$D/out")"
        growth=$((${rss_end:-0} - ${rss_2000:-0}))
        # Slots are reused (a leaked slot per thread would exhaust the
        # slots long before 20,000 threads and lose events, which the
        # check above refuses). Resident memory is shown, not judged: it
        # depends on how far the writer lags on a loaded machine.
        ok "check ok; $threads threads, 0 lost; VmRSS ${rss_2000} kB after 2000 threads, ${rss_end} kB after $total (+${growth} kB)"
    else
        ok "check ok; $threads threads, 0 lost"
    fi
}

threads_short_lived 20000 1
threads_short_lived 64 64
threads_short_lived 5000 8
threads_short_lived 6000 1 idle

echo "preload-tests: $pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
