/*
 * Helpers shared by the benchmark programs in bench/: clocks, a small RNG,
 * the varint encoder of the trace format, best-of/median statistics and
 * JSON output. Header-only; every program is one .c file.
 *
 * The programs print one JSON object on stdout; bench/run collects them.
 */
#ifndef ALLOCTRACE_BENCH_H
#define ALLOCTRACE_BENCH_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>

static inline uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The trace clock on x86-64 (crates/writer/src/clock.rs). */
static inline uint64_t ticks(void) { return __rdtsc(); }

/* Ticks per ns, measured over `ms` milliseconds against CLOCK_MONOTONIC. */
static inline double ticks_per_ns(unsigned ms) {
    uint64_t n0 = mono_ns(), t0 = ticks();
    while (mono_ns() - n0 < (uint64_t)ms * 1000000u) {
    }
    uint64_t n1 = mono_ns(), t1 = ticks();
    return (double)(t1 - t0) / (double)(n1 - n0);
}

/* xorshift64*: deterministic, cheap, no libc state. */
static inline uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* The workload's size distribution: mostly 16-255 bytes, skewed to small
 * ones (product of two uniforms), 1 in 64 up to 64 KiB. */
static inline size_t workload_size(uint64_t r) {
    if ((r & 63) == 0)
        return 256 + (size_t)((r >> 8) % (65536 - 256 + 1));
    uint64_t u = (r >> 8) & 255, v = (r >> 16) & 255;
    return 16 + (size_t)(u * v / 273);
}

/* Unsigned LEB128, as put_uvarint in crates/format/src/lib.rs. */
static inline uint8_t *put_uvarint(uint8_t *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (uint8_t)v | 0x80;
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Best (minimum) and median of n samples; sorts them. */
typedef struct {
    double best, median;
} summary;

static inline summary summarize(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    summary s = {v[0], n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2};
    return s;
}

/* JSON output: one flat object, keys in the order printed. */
static int json_fields;
static inline void json_begin(void) {
    printf("{");
    json_fields = 0;
}
static inline void json_num(const char *key, double v) {
    printf("%s\"%s\": %.6g", json_fields++ ? ", " : "", key, v);
}
static inline void json_str(const char *key, const char *v) {
    printf("%s\"%s\": \"%s\"", json_fields++ ? ", " : "", key, v);
}
static inline void json_summary(const char *key, summary s) {
    printf("%s\"%s\": {\"best\": %.6g, \"median\": %.6g}", json_fields++ ? ", " : "", key, s.best, s.median);
}
static inline void json_end(void) {
    printf("}\n");
    fflush(stdout);
}

static inline long arg_long(int argc, char **argv, int i, long dflt) {
    return i < argc ? strtol(argv[i], NULL, 10) : dflt;
}

#endif
