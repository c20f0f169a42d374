/*
 * Baseline interposers for the LD_PRELOAD comparison (issue 5, item 4),
 * built twice by `make bench`:
 *
 *   libcount.so   counts every call of the allocation functions: the cost
 *                 of interposition itself (a PLT hop and a thread-local
 *                 counter);
 *   librdtsc.so   (-DWITH_RDTSC) counts and reads rdtsc once per call: the
 *                 floor of any tracer that timestamps each event precisely.
 *   librecord.so  (-DWITH_RECORD) also appends the event's record, as the
 *                 shim writes it (kind byte, time delta, zigzag ID delta,
 *                 size and type for an allocation, entry tag: varints,
 *                 docs/FORMAT.md section 3), to a 64 KiB per-thread buffer
 *                 that wraps instead of being handed over: the floor of a
 *                 tracer that records each event, in the workload's
 *                 context (where its stores compete with the allocator's).
 *   librecord_coarse.so (-DWITH_RECORD -DRECORD_COARSE) the same with the
 *                 clock a relaxed load of a shared variable: the floor of
 *                 a coarse-clock tracer.
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
#if defined(WITH_RDTSC) || defined(WITH_RECORD)
#include <x86intrin.h>
#endif

#define EXPORT __attribute__((visibility("default")))

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

#define RECORD_CAP (64 * 1024)

/* One cache line per thread (and a record buffer); only its owner writes it. */
struct counter {
    _Alignas(64) uint64_t calls;
    uint64_t last_ticks;
#ifdef WITH_RECORD
    uint64_t prev_id;
    size_t len;
    uint8_t buf[RECORD_CAP];
#endif
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

#ifdef WITH_RECORD
#ifdef RECORD_COARSE
static _Atomic uint64_t coarse_clock; /* never advanced: a one-byte delta */
#endif

static inline __attribute__((always_inline)) uint8_t *put_uvarint(uint8_t *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (uint8_t)v | 0x80;
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* Records one event: `kind` (5 alloc, 6 free), the block, and for an
 * allocation its size; `entry` the entry-point tag. */
static inline __attribute__((always_inline)) void record(uint8_t kind, void *ptr, size_t size, uint8_t entry) {
    struct counter *c = mine;
    if (__builtin_expect(c == NULL, 0)) {
        count();
        c = mine;
    }
#ifdef RECORD_COARSE
    uint64_t t = atomic_load_explicit(&coarse_clock, memory_order_relaxed);
#else
    uint64_t t = __rdtsc();
#endif
    if (c->len > RECORD_CAP - 64)
        c->len = 0;
    uint8_t *p = c->buf + c->len;
    *p++ = kind | 0x40;
    p = put_uvarint(p, t - c->last_ticks);
    uint64_t id = (uintptr_t)ptr >> 4, d = id - c->prev_id;
    c->prev_id = id;
    p = put_uvarint(p, (d << 1) ^ (uint64_t)((int64_t)d >> 63));
    if (kind == 5) {
        p = put_uvarint(p, size);
        *p++ = 0;
    }
    *p++ = entry;
    c->len = (size_t)(p - c->buf);
    c->last_ticks = t;
    c->calls++;
}
#define BEFORE_FREE(p) record(6, (p), 0, 4)
#define AFTER_ALLOC(p, n, entry) (p ? record(5, (p), (n), (entry)) : (void)0)
#define count() ((void)0)
#else
#define BEFORE_FREE(p) ((void)0)
#define AFTER_ALLOC(p, n, entry) ((void)0)
#endif
EXPORT void *malloc(size_t n) {
    count();
    void *p = __libc_malloc(n);
    AFTER_ALLOC(p, n, 1);
    return p;
}

EXPORT void free(void *p) {
    count();
    BEFORE_FREE(p);
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
