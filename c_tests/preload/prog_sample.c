/* Allocation sites of known sizes and counts, for the sampling mode's
 * tests (crates/preload/tests/shim/sampling.rs): each site_* function
 * allocates COUNT blocks of SIZE bytes (argv[1] divides the counts), half
 * of them freed at once and the rest at the end; then THREADS threads each
 * allocate PER_THREAD blocks and exit, and the main thread frees them
 * after they are gone. Nothing is left live. Prints nothing. */
#include "common.h"

#include <pthread.h>

#define THREADS 4
#define PER_THREAD 5000

static void **held;
static long nheld;

static __attribute__((noinline)) void site(size_t size, long count, void *(*alloc)(size_t)) {
    for (long i = 0; i < count; i++) {
        void *p = alloc(size);
        CHECK(p);
        keep(p);
        if (i % 2 == 0)
            free(p);
        else
            held[nheld++] = p;
    }
}

static __attribute__((noinline)) void *site_small(size_t n) {
    void *p = malloc(n); /* not a tail call: the frame stays */
    keep(p);
    return p;
}
static __attribute__((noinline)) void *site_medium(size_t n) {
    void *p = malloc(n); /* not a tail call: the frame stays */
    keep(p);
    return p;
}
static __attribute__((noinline)) void *site_large(size_t n) {
    void *p = malloc(n); /* not a tail call: the frame stays */
    keep(p);
    return p;
}
static __attribute__((noinline)) void *site_thread(size_t n) {
    void *p = malloc(n); /* not a tail call: the frame stays */
    keep(p);
    return p;
}

static void *thread_body(void *arg) {
    void **out = arg;
    for (int i = 0; i < PER_THREAD; i++) {
        out[i] = site_thread(256);
        CHECK(out[i]);
    }
    return NULL;
}

int main(int argc, char **argv) {
    long scale = argc > 1 ? atol(argv[1]) : 1;
    CHECK(scale > 0);
    long small = 200000 / scale, medium = 20000 / scale, large = 40;
    held = calloc((size_t)(small + medium + large), sizeof *held);
    CHECK(held);
    site(48, small, site_small);
    site(3000, medium, site_medium);
    site(1 << 20, large, site_large);
    static void *objects[THREADS][PER_THREAD];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, thread_body, objects[i]) == 0);
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
    /* Their threads are gone: the frees come from this one. */
    for (int i = 0; i < THREADS; i++)
        for (int j = 0; j < PER_THREAD; j++)
            free(objects[i][j]);
    for (long i = 0; i < nheld; i++)
        free(held[i]);
    free(held);
    return 0;
}
