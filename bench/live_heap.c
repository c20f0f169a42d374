/* The live heap on demand (issue 22, item P2): a program with N live
 * objects, for `alloctrace snapshot` under the shim in sampling mode with
 * every object sampled (ALLOCTRACE_SAMPLE_BYTES=1).
 *
 * usage: live_heap READY_FILE N
 *
 * Allocates N blocks of 16 to 79 bytes at four call sites and keeps them;
 * writes its pid to READY_FILE; then, until READY_FILE.go exists, frees
 * and allocates one of them per step (the same sites), reading
 * CLOCK_MONOTONIC around each step: the longest gaps between two steps,
 * with when they began, are the program's stalls. Prints one JSON line,
 * {"steps": S, "gaps": [[start_ns, length_ns], ...]}, the 32 longest,
 * longest first, and exits 0. */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define KEEP 32

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *volatile *blocks;

__attribute__((noinline)) static void *site_0(size_t n) { return malloc(n); }
__attribute__((noinline)) static void *site_1(size_t n) { return malloc(n); }
__attribute__((noinline)) static void *site_2(size_t n) { return malloc(n); }
__attribute__((noinline)) static void *site_3(size_t n) { return malloc(n); }

static void *alloc_at(uint64_t i) {
    size_t n = 16 + (size_t)(i * 7 % 64);
    switch (i % 4) {
    case 0: return site_0(n);
    case 1: return site_1(n);
    case 2: return site_2(n);
    default: return site_3(n);
    }
}

static uint64_t gap_start[KEEP], gap_len[KEEP];

static void note_gap(uint64_t start, uint64_t len) {
    if (len <= gap_len[KEEP - 1]) return;
    int i = KEEP - 1;
    while (i > 0 && gap_len[i - 1] < len) {
        gap_len[i] = gap_len[i - 1];
        gap_start[i] = gap_start[i - 1];
        i--;
    }
    gap_len[i] = len;
    gap_start[i] = start;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: live_heap READY_FILE N\n");
        return 2;
    }
    uint64_t n = strtoull(argv[2], NULL, 10);
    if (n == 0) return 2;
    blocks = calloc(n, sizeof(void *));
    if (!blocks) return 3;
    for (uint64_t i = 0; i < n; i++) blocks[i] = alloc_at(i);
    char tmp[4096], go[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", argv[1]);
    snprintf(go, sizeof go, "%s.go", argv[1]);
    FILE *f = fopen(tmp, "w");
    if (!f) return 4;
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
    rename(tmp, argv[1]);
    uint64_t steps = 0, last = now_ns();
    for (;;) {
        uint64_t i = steps * 2654435761u % n;
        free(blocks[i]);
        blocks[i] = alloc_at(i);
        steps++;
        uint64_t t = now_ns();
        note_gap(last, t - last);
        last = t;
        if (steps % 4096 == 0) {
            if (access(go, F_OK) == 0) break;
            last = now_ns();
        }
    }
    printf("{\"steps\": %llu, \"gaps\": [", (unsigned long long)steps);
    for (int i = 0; i < KEEP && gap_len[i]; i++)
        printf("%s[%llu, %llu]", i ? ", " : "", (unsigned long long)gap_start[i], (unsigned long long)gap_len[i]);
    printf("]}\n");
    return 0;
}
