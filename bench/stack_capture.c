/*
 * Stack capture alone (issue 12, "Targets": stack capture in the C bench):
 * the cost of trace_stack_capture per call and per frame, at the end of a
 * C call chain of a few depths, against the frame-pointer floor.
 *
 *   stack_capture TRACE_PATH full [REPS]
 *
 * Built with frame pointers (-fno-omit-frame-pointer). For each chain depth
 * (CHAIN_DEPTHS levels of `chain`) and each of REPS rounds (default 15;
 * loops interleaved round by round, best and median kept), at the bottom
 * of the chain:
 *   floor     a bare walk of the rbp chain, no checks, storing each return
 *             address into an array, up to the frame that started the
 *             chain: the least any frame-pointer capture can cost
 *   register  trace_stack_register of the frames the floor found: the
 *             interning alone, of a stack already in the table
 *   capture   trace_stack_capture(0) with the library started in the
 *             mode of the second argument (trace_config's stack mode):
 *             the unwind plus the interning, as the shim's malloc pays it
 * and `capture_nofp`: the same capture at the end of a chain of the same
 * depth compiled without frame pointers (where a frame-pointer walk stops
 * at the first frame and only DWARF CFI unwinds; GCC builds only).
 *
 * The per-call times are on this thread's CPU clock (the library's writer
 * thread shares the machine), ns per call. Frames per call: the floor
 * counts its own; a capture's frame count (its walk goes on past main, into
 * the C library's start code, and stops at the depth limit) is in the
 * trace: after the timed loops, each chain records one allocation at
 * address tag_addr(kind, depth) with its captured stack, which bench/run
 * looks up with `alloctrace dump --json` and `dump --stacks --json`.
 *
 * Prints one JSON object: "<loop>_<depth>" -> {"best", "median"} ns per
 * call, "floor_frames_<depth>", "capture": 1 or 0 (0 when built against a
 * header without trace_stack_capture, the Makefile's
 * BENCH_HAVE_STACK_CAPTURE: then only floor and register run) and
 * "tag_base".
 */
#include "alloctrace.h"
#include "bench.h"

#include <stdbool.h>

#define MAX_FRAMES 512
#define TAG_BASE 0x10000000u

static const int CHAIN_DEPTHS[] = {8, 32, 64};
#define N_DEPTHS ((int)(sizeof CHAIN_DEPTHS / sizeof CHAIN_DEPTHS[0]))

enum loop_kind { L_FLOOR, L_REGISTER, L_CAPTURE, L_CAPTURE_NOFP, L_COUNT };
static const char *loop_names[L_COUNT] = {"floor", "register", "capture", "capture_nofp"};

/* The address of the allocation recorded with the capture at the end of a
 * chain (kind 0 with frame pointers, 1 without); bench/run computes it the
 * same way. */
static inline uintptr_t tag_addr(int kind, int depth) {
    return TAG_BASE + (uintptr_t)kind * 0x10000u + (uintptr_t)depth * 0x100u;
}

struct job {
    int depth_index;
    int kind;        /* 0: frame-pointer chain, 1: chain without frame pointers */
    void *stop;      /* frame address of the function that started the chain */
    long iters[L_COUNT];
    double *samples; /* [L_COUNT][N_DEPTHS][reps] */
    int rep, reps;
    bool capture;
    bool record_tag; /* record one allocation with the captured stack */
    long floor_frames[N_DEPTHS];
};

static volatile uint64_t sink;

static uint64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The floor: follow saved rbp values until the chain's root, storing
 * return addresses; no bounds, alignment or depth checks. */
__attribute__((noinline)) static size_t floor_walk(void *stop, uint64_t *out) {
    void **fp = __builtin_frame_address(0);
    size_t n = 0;
    while ((void *)fp != stop) {
        out[n++] = (uint64_t)(uintptr_t)fp[1];
        fp = (void **)fp[0];
    }
    return n;
}

static double *sample(struct job *j, int loop) {
    return &j->samples[((size_t)loop * N_DEPTHS + (size_t)j->depth_index) * (size_t)j->reps + (size_t)j->rep];
}

/* Runs the timed loops at the bottom of a chain. */
__attribute__((noinline)) static void bottom(struct job *j) {
    static uint64_t frames[MAX_FRAMES];
    uint64_t acc = 0;
    if (j->kind == 0) {
        size_t n = floor_walk(j->stop, frames);
        /* ns per call, on this thread's CPU */
        long it = j->iters[L_FLOOR];
        uint64_t c0 = thread_cpu_ns();
        for (long i = 0; i < it; i++) {
            acc += floor_walk(j->stop, frames);
            __asm__ volatile("" ::: "memory");
        }
        *sample(j, L_FLOOR) = (double)(thread_cpu_ns() - c0) / (double)it;

        it = j->iters[L_REGISTER];
        c0 = thread_cpu_ns();
        for (long i = 0; i < it; i++)
            acc += trace_stack_register(frames, n);
        *sample(j, L_REGISTER) = (double)(thread_cpu_ns() - c0) / (double)it;
        j->floor_frames[j->depth_index] = (long)n;
    }
#ifdef BENCH_HAVE_STACK_CAPTURE
    if (j->capture) {
        int loop = j->kind == 0 ? L_CAPTURE : L_CAPTURE_NOFP;
        long it = j->iters[loop];
        uint64_t c0 = thread_cpu_ns();
        for (long i = 0; i < it; i++)
            acc += trace_stack_capture(0);
        *sample(j, loop) = (double)(thread_cpu_ns() - c0) / (double)it;
        if (j->record_tag) {
            uint64_t id = trace_stack_capture(0);
            uintptr_t a = tag_addr(j->kind, CHAIN_DEPTHS[j->depth_index]);
            trace_heap_object_alloc_stack(a, 16, 0, id);
            trace_heap_object_free(a);
        }
    }
#endif
    sink = acc;
}

/* depth frames of chain, then bottom; not tail calls (the + 1). */
__attribute__((noinline)) static int chain(int n, struct job *j) {
    if (n <= 1) {
        bottom(j);
        return 1;
    }
    int r = chain(n - 1, j) + 1;
    __asm__ volatile("" : "+r"(r));
    return r;
}

/* The same chain without frame pointers: GCC's optimize attribute (clang
 * has none per function, so a clang build runs only the frame-pointer
 * chain and prints no capture_nofp figures). */
#if defined(__GNUC__) && !defined(__clang__)
#define HAVE_NOFP_CHAIN 1
__attribute__((noinline, optimize("omit-frame-pointer")))
#else
#define HAVE_NOFP_CHAIN 0
__attribute__((noinline))
#endif
static int chain_nofp(int n, struct job *j) {
    if (n <= 1) {
        bottom(j);
        return 1;
    }
    int r = chain_nofp(n - 1, j) + 1;
    __asm__ volatile("" : "+r"(r));
    return r;
}

/* The frame the floor stops at: this function's. */
__attribute__((noinline)) static void start_chain(struct job *j, int depth) {
    j->stop = __builtin_frame_address(0);
    int r = j->kind == 0 ? chain(depth, j) : chain_nofp(depth, j);
    __asm__ volatile("" : "+r"(r));
    sink += (uint64_t)r;
}

int main(int argc, char **argv) {
    if (argc < 3 || strcmp(argv[2], "full") != 0) {
        fprintf(stderr, "usage: stack_capture TRACE_PATH full [REPS]\n");
        return 2;
    }
    int reps = (int)arg_long(argc, argv, 3, 15);
    if (reps < 1)
        reps = 1;
    if (reps > 64)
        reps = 64;
    static double samples[L_COUNT * N_DEPTHS * 64];
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = argv[1];
    bool capture = false;
#ifdef BENCH_HAVE_STACK_CAPTURE
    cfg.stacks = TRACE_STACKS_FULL; /* the only mode with stacks (issue 19 removes `fast`) */
    cfg.stack_depth = MAX_FRAMES / 2;
    capture = true;
#endif
    trace_result r = trace_start(&cfg);
    if (r != TRACE_OK) {
        fprintf(stderr, "trace_start: %s: %s\n", trace_result_str(r), trace_last_error_detail());
        return 1;
    }
    struct job j = {.samples = samples, .reps = reps, .capture = capture};

    /* Iterations per loop: about 2 ms each, from a first (untimed) round. */
    for (int k = 0; k < L_COUNT; k++)
        j.iters[k] = 200;
    for (int rep = -1; rep < reps; rep++) {
        j.rep = rep < 0 ? 0 : rep;
        j.record_tag = rep == reps - 1;
        for (int d = 0; d < N_DEPTHS; d++) {
            j.depth_index = d;
            for (int kind = 0; kind < 2; kind++) {
                j.kind = kind;
                if (kind == 1 && !(capture && HAVE_NOFP_CHAIN))
                    continue;
                start_chain(&j, CHAIN_DEPTHS[d]);
            }
        }
        if (rep < 0) {
            for (int k = 0; k < L_COUNT; k++) {
                double ns = samples[((size_t)k * N_DEPTHS + N_DEPTHS - 1) * (size_t)reps];
                if (ns > 0)
                    j.iters[k] = (long)(2e6 / ns) + 1;
            }
        }
    }
    r = trace_stop();
    if (r != TRACE_OK) {
        fprintf(stderr, "trace_stop: %s: %s\n", trace_result_str(r), trace_last_error_detail());
        return 1;
    }

    json_begin();
    json_num("capture", capture);
    json_num("reps", reps);
    printf(", \"tag_base\": %u", TAG_BASE);
    for (int k = 0; k < L_COUNT; k++) {
        if ((!capture && (k == L_CAPTURE || k == L_CAPTURE_NOFP)) || (k == L_CAPTURE_NOFP && !HAVE_NOFP_CHAIN))
            continue;
        for (int d = 0; d < N_DEPTHS; d++) {
            char key[64];
            snprintf(key, sizeof key, "%s_%d", loop_names[k], CHAIN_DEPTHS[d]);
            json_summary(key, summarize(&samples[((size_t)k * N_DEPTHS + (size_t)d) * (size_t)reps], reps));
            snprintf(key, sizeof key, "%s_%d_iters", loop_names[k], CHAIN_DEPTHS[d]);
            json_num(key, (double)j.iters[k]);
        }
    }
    for (int d = 0; d < N_DEPTHS; d++) {
        char key[64];
        snprintf(key, sizeof key, "floor_frames_%d", CHAIN_DEPTHS[d]);
        json_num(key, (double)j.floor_frames[d]);
    }
    printf(", \"depths\": [");
    for (int d = 0; d < N_DEPTHS; d++)
        printf("%s%d", d ? ", " : "", CHAIN_DEPTHS[d]);
    printf("]");
    json_end();
    return 0;
}
