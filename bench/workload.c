/*
 * The allocation-heavy workload of issue 5, item 4, for the LD_PRELOAD
 * comparisons: each of THREADS threads does OPS free-then-malloc steps on
 * its own ring of 4096 slots, with sizes skewed to 16-255 bytes and 1 in 64
 * up to 64 KiB (workload_size in bench.h), then frees its ring.
 *
 *   workload THREADS [OPS]
 *
 * Calls per thread: OPS frees (the first 4096 of NULL), OPS mallocs, 4096
 * final frees. Prints one JSON object: the wall time of the threads' work
 * and each thread's own loop time (for per-thread throughput).
 * Plain C, not linked with alloctrace: the shim or a rival interposes it.
 */
#include "bench.h"

#include <pthread.h>

#define RING 4096
#define MAX_THREADS 16

struct worker {
    long ops;
    uint64_t seed;
    pthread_barrier_t *barrier;
    uint64_t ns;
    uint64_t checksum;
};

static void *work(void *arg) {
    struct worker *w = arg;
    void **ring = calloc(RING, sizeof *ring);
    if (!ring)
        abort();
    uint64_t s = w->seed, sum = 0;
    pthread_barrier_wait(w->barrier);
    uint64_t t0 = mono_ns();
    for (long i = 0; i < w->ops; i++) {
        size_t slot = (size_t)i & (RING - 1);
        free(ring[slot]);
        size_t size = workload_size(rng_next(&s));
        unsigned char *p = malloc(size);
        if (!p)
            abort();
        p[0] = (unsigned char)i; /* touch it: a real program would */
        sum += p[0];
        ring[slot] = p;
    }
    for (size_t slot = 0; slot < RING; slot++)
        free(ring[slot]);
    w->ns = mono_ns() - t0;
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
    pthread_t t[MAX_THREADS];
    struct worker w[MAX_THREADS];
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++) {
        w[i] = (struct worker){ops, 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1), &barrier, 0, 0};
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

    json_begin();
    json_num("threads", threads);
    json_num("ops_per_thread", (double)ops);
    json_num("calls", (double)threads * (2.0 * (double)ops + RING));
    json_num("wall_ns", (double)wall);
    printf(", \"thread_ns\": [");
    for (int i = 0; i < threads; i++)
        printf("%s%llu", i ? ", " : "", (unsigned long long)w[i].ns);
    printf("]");
    json_num("checksum", (double)(checksum & 0xffff));
    json_end();
    return 0;
}
