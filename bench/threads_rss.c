/*
 * The tracer's memory per live thread (issue 19): THREADS threads each run
 * the workload's free-then-malloc loop (workload.c, OPS steps on a ring of
 * 256 slots, so the blocks themselves stay small) and then park on a
 * barrier, alive; with all of them parked the main thread reads its VmRSS
 * from /proc/self/status, then lets them finish.
 *
 *   threads_rss THREADS [OPS]
 *
 * OPS defaults to 1000: few enough events that each thread's trace buffer
 * holds them (more, and the buffers' backlog, larger without stacks since
 * the threads run faster, outweighs the stack state).
 *
 * Plain C, not linked with alloctrace: run it under the shim with
 * ALLOCTRACE_STACKS=none and =full; the driver divides the difference of
 * the two RSS by THREADS (what the stack capture keeps per thread: its
 * memo, rule cache and scratch, beside the tables shared by all). Prints
 * one JSON object: threads, ops_per_thread, vm_rss_kib, vm_hwm_kib.
 */
#include "bench.h"

#include <pthread.h>

#define RING 256
#define MAX_THREADS 256

struct worker {
    long ops;
    uint64_t seed;
    pthread_barrier_t *parked, *release;
    uint64_t checksum;
};

static void *work(void *arg) {
    struct worker *w = arg;
    void *ring[RING] = {0};
    uint64_t s = w->seed, sum = 0;
    for (long i = 0; i < w->ops; i++) {
        size_t slot = (size_t)i & (RING - 1);
        free(ring[slot]);
        size_t size = workload_size(rng_next(&s)) & 1023; /* small blocks: RSS is the tracer's */
        unsigned char *p = malloc(size + 16);
        if (!p)
            abort();
        p[0] = (unsigned char)i;
        sum += p[0];
        ring[slot] = p;
    }
    w->checksum = sum;
    pthread_barrier_wait(w->parked);  /* alive and parked: main reads RSS */
    pthread_barrier_wait(w->release);
    for (size_t slot = 0; slot < RING; slot++)
        free(ring[slot]);
    return NULL;
}

/* A field of /proc/self/status in KiB ("VmRSS:", "VmHWM:"), or -1. */
static long status_kib(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, field, n) == 0) {
            v = strtol(line + n, NULL, 10);
            break;
        }
    }
    fclose(f);
    return v;
}

int main(int argc, char **argv) {
    int threads = (int)arg_long(argc, argv, 1, 8);
    long ops = arg_long(argc, argv, 2, 1000);
    if (threads < 0 || threads > MAX_THREADS || ops < 1) {
        fprintf(stderr, "usage: threads_rss THREADS [OPS]\n");
        return 2;
    }
    pthread_t t[MAX_THREADS];
    struct worker w[MAX_THREADS];
    pthread_barrier_t parked, release;
    pthread_barrier_init(&parked, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&release, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++) {
        w[i] = (struct worker){ops, 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1), &parked, &release, 0};
        if (pthread_create(&t[i], NULL, work, &w[i]) != 0) {
            perror("pthread_create");
            return 1;
        }
    }
    pthread_barrier_wait(&parked);
    long rss = status_kib("VmRSS:"), hwm = status_kib("VmHWM:");
    pthread_barrier_wait(&release);
    uint64_t checksum = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        checksum += w[i].checksum;
    }
    json_begin();
    json_num("threads", threads);
    json_num("ops_per_thread", (double)ops);
    json_num("vm_rss_kib", (double)rss);
    json_num("vm_hwm_kib", (double)hwm);
    json_num("checksum", (double)(checksum & 0xffff));
    json_end();
    return 0;
}
