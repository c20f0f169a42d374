/* malloc/free/realloc churn on N threads (N = argv[1], 0 for the main
 * thread alone), OPS operations each (argv[2]). Thread i does (i+1)/N of
 * the work, so threads exit while others still allocate. Every block is
 * freed before its thread ends. Prints "threads N" at the end. */
#include "common.h"

#include <pthread.h>

struct job {
    long ops;
    uint64_t seed;
};

static void *churn(void *arg) {
    struct job *job = arg;
    void *slot[256] = {0};
    uint64_t s = job->seed;
    for (long i = 0; i < job->ops; i++) {
        uint64_t r = next_rand(&s);
        int k = (int)(r % 256);
        size_t size = (size_t)((r >> 8) % 4096) + 1;
        switch ((r >> 32) % 4) {
        case 0:
        case 1:
            free(slot[k]);
            slot[k] = malloc(size);
            CHECK(slot[k]);
            memset(slot[k], 1, size < 64 ? size : 64);
            break;
        case 2:
            slot[k] = realloc(slot[k], size);
            CHECK(slot[k]);
            break;
        default:
            free(slot[k]);
            slot[k] = NULL;
        }
    }
    for (int k = 0; k < 256; k++) free(slot[k]);
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 0;
    long ops = argc > 2 ? atol(argv[2]) : 100000;
    if (n <= 0) {
        struct job job = {ops, 1};
        churn(&job);
        say("threads %ld\n", 0, 0);
        return 0;
    }
    pthread_t t[64];
    struct job jobs[64];
    CHECK(n <= 64);
    for (int i = 0; i < n; i++) {
        jobs[i] = (struct job){ops * (i + 1) / n, (uint64_t)i + 7};
        CHECK(pthread_create(&t[i], NULL, churn, &jobs[i]) == 0);
    }
    for (int i = 0; i < n; i++) CHECK(pthread_join(t[i], NULL) == 0);
    say("threads %ld\n", n, 0);
    return 0;
}
