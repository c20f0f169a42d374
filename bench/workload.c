/*
 * The allocation-heavy workload of issue 5, item 4, for the LD_PRELOAD
 * comparisons: each of THREADS threads does OPS free-then-malloc steps on
 * its own ring of 4096 slots, with sizes skewed to 16-255 bytes and 1 in 64
 * up to 64 KiB (workload_size in bench.h), then frees its ring.
 *
 *   workload THREADS [OPS]
 *
 * Calls per thread: OPS frees (the first 4096 of NULL), OPS mallocs, 4096
 * final frees. The slots are visited in ring order, so blocks are freed in
 * the order they were allocated; with WORKLOAD_ORDER=random in the
 * environment each step picks a random slot instead (the same number of
 * calls, lifetimes no longer all 4096 steps). Prints one JSON object: the wall time of the threads' work
 * and each thread's own loop time (for per-thread throughput), elapsed and
 * on its CPU (less when other threads, such as a tracer's writer, took the
 * CPU from it).
 * Plain C, not linked with alloctrace: the shim or a rival interposes it.
 *
 * Built a second time with -DWITH_CAPI as workload_capi, which records the
 * same calls itself through the C API, as a runtime would:
 *
 *   workload_capi THREADS OPS TRACE_PATH precise|coarse none|zstd
 *
 * (trace_start before the threads start, trace_stop after they end; the
 * clock and compression fields exist when the Makefile defines
 * BENCH_HAVE_CLOCK / BENCH_HAVE_COMPRESSION; without them it exits 3.)
 */
#include "bench.h"

#include <pthread.h>
#include <stdbool.h>
#ifdef WITH_CAPI
#include "alloctrace.h"
#else
#define trace_heap_object_alloc(addr, size, type) ((void)0)
#define trace_heap_object_free(addr) ((void)0)
#endif

#define RING 4096
#define MAX_THREADS 16

struct worker {
    long ops;
    uint64_t seed;
    pthread_barrier_t *barrier;
    uint64_t ns, cpu_ns;
    uint64_t checksum;
};

static uint64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *work(void *arg) {
    struct worker *w = arg;
    void **ring = calloc(RING, sizeof *ring);
    if (!ring)
        abort();
    uint64_t s = w->seed, sum = 0, order = w->seed ^ 0xD1B54A32D192ED03ull;
    const char *env = getenv("WORKLOAD_ORDER");
    bool random_order = env != NULL && strcmp(env, "random") == 0;
    pthread_barrier_wait(w->barrier);
    uint64_t c0 = thread_cpu_ns();
    uint64_t t0 = mono_ns();
    for (long i = 0; i < w->ops; i++) {
        size_t slot = random_order ? (size_t)rng_next(&order) & (RING - 1) : (size_t)i & (RING - 1);
        if (ring[slot])
            trace_heap_object_free((uintptr_t)ring[slot]);
        free(ring[slot]);
        size_t size = workload_size(rng_next(&s));
        unsigned char *p = malloc(size);
        if (!p)
            abort();
        trace_heap_object_alloc((uintptr_t)p, size, 0);
        p[0] = (unsigned char)i; /* touch it: a real program would */
        sum += p[0];
        ring[slot] = p;
    }
    for (size_t slot = 0; slot < RING; slot++) {
        trace_heap_object_free((uintptr_t)ring[slot]);
        free(ring[slot]);
    }
    w->ns = mono_ns() - t0;
    w->cpu_ns = thread_cpu_ns() - c0;
    w->checksum = sum;
    free(ring);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = (int)arg_long(argc, argv, 1, 1);
    long ops = arg_long(argc, argv, 2, 5000000);
    if (threads < 1 || threads > MAX_THREADS || ops < 1) {
        fprintf(stderr, "usage: workload THREADS [OPS]\n");
        return 2;
    }
#ifdef WITH_CAPI
    if (argc != 6) {
        fprintf(stderr, "usage: workload_capi THREADS OPS TRACE_PATH precise|coarse none|zstd\n");
        return 2;
    }
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = argv[3];
    cfg.min_heap_align = 16;
    bool coarse = strcmp(argv[4], "coarse") == 0, zstd = strcmp(argv[5], "zstd") == 0;
#ifdef BENCH_HAVE_CLOCK
    cfg.clock = coarse ? TRACE_CLOCK_COARSE : TRACE_CLOCK_PRECISE;
    coarse = false;
#endif
#ifdef BENCH_HAVE_COMPRESSION
    cfg.compression = zstd ? TRACE_COMPRESSION_ZSTD : TRACE_COMPRESSION_NONE;
    zstd = false;
#endif
    if (coarse || zstd) {
        fprintf(stderr, "workload_capi: this alloctrace.h lacks %s\n", coarse ? "the coarse clock" : "compression");
        return 3;
    }
    trace_result r = trace_start(&cfg);
    if (r != TRACE_OK) {
        fprintf(stderr, "trace_start: %s: %s\n", trace_result_str(r), trace_last_error_detail());
        return 1;
    }
#endif
    pthread_t t[MAX_THREADS];
    struct worker w[MAX_THREADS];
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++) {
        w[i] = (struct worker){ops, 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1), &barrier, 0, 0, 0};
        if (pthread_create(&t[i], NULL, work, &w[i]) != 0) {
            perror("pthread_create");
            return 1;
        }
    }
    pthread_barrier_wait(&barrier);
    uint64_t t0 = mono_ns();
    uint64_t checksum = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        checksum += w[i].checksum;
    }
    uint64_t wall = mono_ns() - t0;
    pthread_barrier_destroy(&barrier);
#ifdef WITH_CAPI
    r = trace_stop();
    if (r != TRACE_OK) {
        fprintf(stderr, "trace_stop: %s: %s\n", trace_result_str(r), trace_last_error_detail());
        return 1;
    }
#endif

    json_begin();
    json_num("threads", threads);
    json_num("ops_per_thread", (double)ops);
    json_num("calls", (double)threads * (2.0 * (double)ops + RING));
    json_num("wall_ns", (double)wall);
    printf(", \"thread_ns\": [");
    for (int i = 0; i < threads; i++)
        printf("%s%llu", i ? ", " : "", (unsigned long long)w[i].ns);
    printf("], \"thread_cpu_ns\": [");
    for (int i = 0; i < threads; i++)
        printf("%s%llu", i ? ", " : "", (unsigned long long)w[i].cpu_ns);
    printf("]");
    json_num("checksum", (double)(checksum & 0xffff));
    json_end();
    return 0;
}
