/* Helpers shared by the preload test programs (header-only). */
#ifndef PRELOAD_TEST_COMMON_H
#define PRELOAD_TEST_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Keeps the compiler from dropping allocations whose result is unused. */
static void *volatile sink;
static inline void keep(void *p) { sink = p; }

/* A small deterministic generator (xorshift64*). */
static inline uint64_t next_rand(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* Prints a line with write(2): no stdio buffer, so no allocation. */
static inline void say(const char *fmt, long a, long b) {
    char buf[256];
    int n = snprintf(buf, sizeof buf, fmt, a, b);
    if (n > 0 && write(1, buf, (size_t)n) < 0) { /* nothing to do */ }
}

static inline void die(const char *what, int line) {
    fprintf(stderr, "FAIL: line %d: %s\n", line, what);
    exit(1);
}

#define CHECK(cond) do { if (!(cond)) die(#cond, __LINE__); } while (0)

#endif
