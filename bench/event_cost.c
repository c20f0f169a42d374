/*
 * Event cost through the public C API, against the floor measured in the
 * same process (issue 5, items 1-3).
 *
 *   event_cost TRACE_PATH precise|coarse [PAIRS [REPS]]
 *
 * Every loop walks the same ring of 4096 (address, size) pairs and makes
 * one alloc and one free per step, so "per event" is the loop time over
 * 2 * PAIRS. Loops of one phase are interleaved rep by rep and summarised
 * as best (minimum) and median over REPS, so a noisy neighbour hits them
 * alike.
 *
 * Phase A, tracing off:
 *   atomic_branch  one relaxed atomic load and a branch per call (inline)
 *   disabled       trace_heap_object_alloc/free before trace_start (the
 *                  header's macros: the check is inline)
 *   disabled_call  (trace_heap_object_alloc)/(..._free): the library's
 *                  functions, called
 *   writer_disabled  trace_writer_heap_object_alloc/free before trace_start
 *   call_so        the same check behind a call into a shared library
 *                  (bench/noop.c): what a disabled call costs at least
 *   rdtsc, clock_gettime, clock_gettime_coarse: the clocks alone
 * Phase B, tracing on (trace_start to TRACE_PATH, min_heap_align 16):
 *   floor_precise  rdtsc + the event's varint record appended to a
 *                  thread-local buffer, inline in the loop: the floor
 *   floor_coarse   the same with the clock a relaxed load of a shared
 *                  atomic that a ticker thread advances every millisecond
 *   encode_store   the record without any clock
 *   api            trace_heap_object_alloc + trace_heap_object_free, as
 *                  compiled here (an executable: the header writes
 *                  ordinary events inline)
 *   api_call       the same calls made to the library's functions
 *   writer         trace_writer_heap_object_alloc + _free with the thread's
 *                  handle: the header's inline event path
 * each with 1 thread and with 2 threads (per-thread ns per event).
 *
 * The second argument sets trace_config.clock. It exits with status 3 for
 * "coarse" when built against a header without TRACE_CLOCK_COARSE (the
 * Makefile defines BENCH_HAVE_CLOCK when the header has it).
 */
#include "alloctrace.h"
#include "bench.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>

#define RING 4096
#define BUF_CAP (64 * 1024)
#define HEAP_BASE ((uintptr_t)0x7f3a00000000ull)
#define HEAP_SHIFT 4 /* min_heap_align 16 */

static uintptr_t addrs[RING];
static uint64_t sizes[RING];

/* The floor's thread-local batch buffer: a header's worth of bytes, then
 * records; wraps instead of handing over (the hand-over is amortised over
 * thousands of events and not part of the floor). */
static _Thread_local struct {
    size_t len;
    uint64_t last;
    uint8_t buf[BUF_CAP];
} tb;

/* The coarse clock of floor_coarse: advanced by a ticker thread. */
static _Atomic uint64_t coarse_now;
static _Atomic bool ticker_stop;

/* The "enabled" flag of the atomic_branch baseline: always 0. */
static _Atomic uint64_t fake_generation;
static volatile uint64_t sink;

/* bench/noop.c, in libbenchnoop.so. */
void bench_noop_alloc(uintptr_t addr, uint64_t size, uint64_t type_id);
void bench_noop_free(uintptr_t addr);

enum clock_kind { CLK_RDTSC, CLK_COARSE, CLK_NONE };

enum loop_kind {
    L_ATOMIC_BRANCH,
    L_DISABLED,
    L_CALL_SO,
    L_RDTSC,
    L_CLOCK_GETTIME,
    L_CLOCK_GETTIME_COARSE,
    L_FLOOR_PRECISE,
    L_FLOOR_COARSE,
    L_ENCODE_STORE,
    L_API,
    L_API_CALL,
    L_DISABLED_CALL,
    L_WRITER_DISABLED,
    L_WRITER,
    L_COUNT
};

static const char *loop_names[L_COUNT] = {
    "atomic_branch", "disabled", "call_so", "rdtsc", "clock_gettime", "clock_gettime_coarse",
    "floor_precise", "floor_coarse", "encode_store", "api", "api_call", "disabled_call", "writer_disabled", "writer",
};

static void *ticker(void *arg) {
    (void)arg;
    while (!atomic_load_explicit(&ticker_stop, memory_order_relaxed)) {
        atomic_store_explicit(&coarse_now, ticks(), memory_order_relaxed);
        usleep(1000);
    }
    return NULL;
}

__attribute__((noinline)) static void slow_path(uintptr_t a, uint64_t s) { sink = a + s; }

static inline __attribute__((always_inline)) uint64_t read_clock(enum clock_kind c) {
    switch (c) {
    case CLK_RDTSC:
        return ticks();
    case CLK_COARSE:
        return atomic_load_explicit(&coarse_now, memory_order_relaxed);
    default:
        return tb.last + 27; /* a one-byte delta, like rdtsc's */
    }
}

/* HeapObjectAlloc [id, size, type] and HeapObjectFree [id]: kind byte,
 * varint delta, varint args (docs/FORMAT.md section 3). */
static inline __attribute__((always_inline)) void floor_event(enum clock_kind c, uint8_t kind, uint64_t id,
                                                               uint64_t size, int nargs) {
    uint64_t t = read_clock(c);
    if (tb.len > BUF_CAP - 64)
        tb.len = 16;
    uint8_t *p = tb.buf + tb.len;
    *p = kind;
    p = put_uvarint(p + 1, t - tb.last);
    p = put_uvarint(p, id);
    if (nargs == 3) {
        p = put_uvarint(p, size);
        p = put_uvarint(p, 0);
    }
    tb.len = (size_t)(p - tb.buf);
    tb.last = t;
}

static inline __attribute__((always_inline)) void floor_loop(enum clock_kind c, long pairs, uintptr_t off) {
    for (long i = 0; i < pairs; i++) {
        uintptr_t a = addrs[i & (RING - 1)] + off;
        uint64_t id = (a - HEAP_BASE) >> HEAP_SHIFT;
        floor_event(c, 5, id, sizes[i & (RING - 1)], 3);
        floor_event(c, 6, id, 0, 1);
    }
}

static uint64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ns per event (or per clock read): elapsed, and on this thread's CPU time
 * (less than elapsed when another thread, such as the tracer's writer,
 * took the CPU). */
typedef struct {
    double wall, cpu;
} cost;

/* Runs one loop on thread `thread` (each thread has its own addresses, so
 * the trace stays consistent). */
static cost run_loop(enum loop_kind k, long pairs, int thread) {
    uintptr_t off = (uintptr_t)thread * RING * 64;
    uint64_t acc = 0;
    uint64_t c0 = thread_cpu_ns();
    uint64_t t0 = mono_ns();
    switch (k) {
    case L_ATOMIC_BRANCH:
        for (long i = 0; i < pairs; i++) {
            uintptr_t a = addrs[i & (RING - 1)] + off;
            if (atomic_load_explicit(&fake_generation, memory_order_relaxed))
                slow_path(a, sizes[i & (RING - 1)]);
            if (atomic_load_explicit(&fake_generation, memory_order_relaxed))
                slow_path(a, 0);
        }
        break;
    case L_DISABLED:
    case L_API:
        for (long i = 0; i < pairs; i++) {
            uintptr_t a = addrs[i & (RING - 1)] + off;
            trace_heap_object_alloc(a, sizes[i & (RING - 1)], 0);
            trace_heap_object_free(a);
        }
        break;
    case L_DISABLED_CALL:
    case L_API_CALL:
        /* The name in parentheses: always the library's function. */
        for (long i = 0; i < pairs; i++) {
            uintptr_t a = addrs[i & (RING - 1)] + off;
            (trace_heap_object_alloc)(a, sizes[i & (RING - 1)], 0);
            (trace_heap_object_free)(a);
        }
        break;
    case L_WRITER_DISABLED:
    case L_WRITER: {
        trace_writer *w = trace_writer_get();
        for (long i = 0; i < pairs; i++) {
            uintptr_t a = addrs[i & (RING - 1)] + off;
            trace_writer_heap_object_alloc(w, a, sizes[i & (RING - 1)], 0);
            trace_writer_heap_object_free(w, a);
        }
        break;
    }
    case L_CALL_SO:
        for (long i = 0; i < pairs; i++) {
            uintptr_t a = addrs[i & (RING - 1)] + off;
            bench_noop_alloc(a, sizes[i & (RING - 1)], 0);
            bench_noop_free(a);
        }
        break;
    case L_RDTSC:
        for (long i = 0; i < 2 * pairs; i++)
            acc += ticks();
        break;
    case L_CLOCK_GETTIME:
        for (long i = 0; i < 2 * pairs; i++)
            acc += mono_ns();
        break;
    case L_CLOCK_GETTIME_COARSE:
        for (long i = 0; i < 2 * pairs; i++) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
            acc += (uint64_t)ts.tv_nsec;
        }
        break;
    case L_FLOOR_PRECISE:
        floor_loop(CLK_RDTSC, pairs, off);
        break;
    case L_FLOOR_COARSE:
        floor_loop(CLK_COARSE, pairs, off);
        break;
    case L_ENCODE_STORE:
        floor_loop(CLK_NONE, pairs, off);
        break;
    default:
        break;
    }
    uint64_t t1 = mono_ns();
    uint64_t c1 = thread_cpu_ns();
    sink += acc + tb.len;
    cost c = {(double)(t1 - t0) / (double)(2 * pairs), (double)(c1 - c0) / (double)(2 * pairs)};
    return c;
}

/* ---- Two threads: each runs the loop after a barrier; per-thread mean. */

struct job {
    enum loop_kind kind;
    long pairs;
    int thread;
    pthread_barrier_t *barrier;
    cost ns;
};

static void *thread_main(void *arg) {
    struct job *j = arg;
    pthread_barrier_wait(j->barrier);
    j->ns = run_loop(j->kind, j->pairs, j->thread);
    return NULL;
}

static cost run_threads(enum loop_kind k, long pairs, int nthreads) {
    if (nthreads == 1)
        return run_loop(k, pairs, 0);
    pthread_t t[8];
    struct job jobs[8];
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)nthreads);
    for (int i = 0; i < nthreads; i++) {
        jobs[i] = (struct job){k, pairs, i, &barrier, {0, 0}};
        if (pthread_create(&t[i], NULL, thread_main, &jobs[i]) != 0) {
            perror("pthread_create");
            exit(1);
        }
    }
    cost sum = {0, 0};
    for (int i = 0; i < nthreads; i++) {
        pthread_join(t[i], NULL);
        sum.wall += jobs[i].ns.wall / nthreads;
        sum.cpu += jobs[i].ns.cpu / nthreads;
    }
    pthread_barrier_destroy(&barrier);
    return sum;
}

#define MAX_REPS 64

/* Interleaves `n` loops rep by rep; prints each as "name_Nt" (elapsed)
 * and "name_Nt_cpu" (on-CPU). */
static void measure(const enum loop_kind *kinds, int n, int nthreads, long pairs, int reps) {
    static double wall[L_COUNT][MAX_REPS], cpu[L_COUNT][MAX_REPS];
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < n; i++) {
            cost c = run_threads(kinds[i], pairs, nthreads);
            wall[kinds[i]][r] = c.wall;
            cpu[kinds[i]][r] = c.cpu;
        }
    for (int i = 0; i < n; i++) {
        char key[64];
        snprintf(key, sizeof key, "%s_%dt", loop_names[kinds[i]], nthreads);
        json_summary(key, summarize(wall[kinds[i]], reps));
        snprintf(key, sizeof key, "%s_%dt_cpu", loop_names[kinds[i]], nthreads);
        json_summary(key, summarize(cpu[kinds[i]], reps));
    }
}

int main(int argc, char **argv) {
    if (argc < 3 || (strcmp(argv[2], "precise") != 0 && strcmp(argv[2], "coarse") != 0)) {
        fprintf(stderr, "usage: event_cost TRACE_PATH precise|coarse [PAIRS [REPS]]\n");
        return 2;
    }
    const char *path = argv[1];
    bool coarse = strcmp(argv[2], "coarse") == 0;
    long pairs = arg_long(argc, argv, 3, 1000000);
    int reps = (int)arg_long(argc, argv, 4, 7);
    if (reps < 1 || reps > MAX_REPS || pairs < 1) {
        fprintf(stderr, "event_cost: bad PAIRS or REPS\n");
        return 2;
    }

    /* A ring of distinct 64-byte-spaced addresses in a shuffled order and
     * the workload's sizes: object IDs take 2 varint bytes, sizes 1 or 2. */
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < RING; i++)
        addrs[i] = HEAP_BASE + (uintptr_t)i * 64;
    for (int i = RING - 1; i > 0; i--) {
        int j = (int)(rng_next(&seed) % (uint64_t)(i + 1));
        uintptr_t t = addrs[i];
        addrs[i] = addrs[j];
        addrs[j] = t;
    }
    for (int i = 0; i < RING; i++)
        sizes[i] = workload_size(rng_next(&seed));

    pthread_t tick;
    atomic_store(&coarse_now, ticks());
    pthread_create(&tick, NULL, ticker, NULL);

    json_begin();
    json_str("clock", argv[2]);
    json_num("pairs", (double)pairs);
    json_num("reps", reps);

    /* Phase A: tracing off. */
    run_loop(L_DISABLED, pairs / 4 + 1, 0); /* warm up */
    const enum loop_kind off[] = {L_ATOMIC_BRANCH, L_DISABLED,     L_DISABLED_CALL,       L_WRITER_DISABLED,
                                  L_CALL_SO,       L_RDTSC,        L_CLOCK_GETTIME,       L_CLOCK_GETTIME_COARSE};
    measure(off, 8, 1, pairs, reps);

    /* Phase B: tracing on. */
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = path;
    cfg.min_heap_addr = HEAP_BASE;
    cfg.min_heap_align = 1u << HEAP_SHIFT;
#ifdef BENCH_HAVE_CLOCK
    cfg.clock = coarse ? TRACE_CLOCK_COARSE : TRACE_CLOCK_PRECISE;
#else
    if (coarse) {
        fprintf(stderr, "event_cost: this alloctrace.h has no coarse clock\n");
        return 3;
    }
#endif
    trace_result r = trace_start(&cfg);
    if (r != TRACE_OK) {
        fprintf(stderr, "trace_start: %s: %s\n", trace_result_str(r), trace_last_error_detail());
        return 1;
    }
    run_loop(L_API, pairs / 4 + 1, 0); /* warm up: claim a slot, map buffers */
    run_loop(L_WRITER, pairs / 4 + 1, 0);
    run_loop(L_API_CALL, pairs / 4 + 1, 0);
    const enum loop_kind on[] = {L_FLOOR_PRECISE, L_FLOOR_COARSE, L_ENCODE_STORE, L_API, L_API_CALL, L_WRITER};
    measure(on, 6, 1, pairs, reps);
    measure(on, 6, 2, pairs, reps);
    r = trace_stop();
    if (r != TRACE_OK) {
        fprintf(stderr, "trace_stop: %s: %s\n", trace_result_str(r), trace_last_error_detail());
        return 1;
    }
    /* heap_object_alloc events the trace must hold. */
    json_num("api_allocs", 3 * ((double)(pairs / 4 + 1) + (double)reps * pairs * 3));

    atomic_store(&ticker_stop, true);
    pthread_join(tick, NULL);
    json_end();
    return 0;
}
