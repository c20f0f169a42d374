/*
 * Baseline interposers for the LD_PRELOAD comparison (issue 5, item 4),
 * built twice by `make bench`:
 *
 *   libcount.so   counts every call of the allocation functions: the cost
 *                 of interposition itself (a PLT hop and a thread-local
 *                 counter);
 *   librdtsc.so   (-DWITH_RDTSC) counts and reads rdtsc once per call: the
 *                 floor of any tracer that timestamps each event precisely.
 *
 * They reach glibc's allocator through its __libc_* entry points, so they
 * never recurse and need no dlsym bootstrap. With BENCH_INTERPOSE_REPORT
 * set, the totals are printed to stderr at exit (to check that calls were
 * really interposed).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef WITH_RDTSC
#include <x86intrin.h>
#endif

#define EXPORT __attribute__((visibility("default")))

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

/* One cache line per thread; only its owner writes it. */
struct counter {
    _Alignas(64) uint64_t calls;
    uint64_t last_ticks;
};

#define MAX_COUNTERS 256
static struct counter counters[MAX_COUNTERS];
static atomic_uint next_counter;
static _Thread_local struct counter *mine __attribute__((tls_model("initial-exec")));

static inline __attribute__((always_inline)) void count(void) {
    struct counter *c = mine;
    if (__builtin_expect(c == NULL, 0)) {
        c = &counters[atomic_fetch_add_explicit(&next_counter, 1, memory_order_relaxed) % MAX_COUNTERS];
        mine = c;
    }
    c->calls++;
#ifdef WITH_RDTSC
    c->last_ticks = __rdtsc();
#endif
}

EXPORT void *malloc(size_t n) {
    count();
    return __libc_malloc(n);
}

EXPORT void free(void *p) {
    count();
    __libc_free(p);
}

EXPORT void *calloc(size_t n, size_t m) {
    count();
    return __libc_calloc(n, m);
}

EXPORT void *realloc(void *p, size_t n) {
    count();
    return __libc_realloc(p, n);
}

EXPORT void *memalign(size_t align, size_t n) {
    count();
    return __libc_memalign(align, n);
}

EXPORT void *aligned_alloc(size_t align, size_t n) {
    count();
    return __libc_memalign(align, n);
}

EXPORT int posix_memalign(void **out, size_t align, size_t n) {
    count();
    if (align < sizeof(void *) || (align & (align - 1)) != 0)
        return EINVAL;
    void *p = __libc_memalign(align, n);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

__attribute__((destructor)) static void report(void) {
    if (!getenv("BENCH_INTERPOSE_REPORT"))
        return;
    uint64_t total = 0;
    for (int i = 0; i < MAX_COUNTERS; i++)
        total += counters[i].calls;
    char line[96];
    int n = snprintf(line, sizeof line, "interposed_calls %llu\n", (unsigned long long)total);
    if (n > 0 && write(2, line, (size_t)n) < 0)
        return;
}
