/*
 * Allocation paths for the shim's stack check mode (ALLOCTRACE_CHECK_STACKS=1,
 * crates/cli/tests/check_stacks.rs): every malloc here is walked by the
 * memo walk, the full compact walk and framehop's, which must agree frame
 * for frame. Built twice: -O0 with frame pointers and -O2 without them.
 *
 *   check_walks [ROUNDS]
 *
 * Each round, on the main thread and then on a second thread:
 * - inner paths that alternate: below a fixed outer chain, a chain of 1 to
 *   16 levels, each level one of two functions (`level_a`: a fixed frame;
 *   `level_b`: a variable-length array, so a frame addressed by rbp),
 *   chosen by the bits of a pattern; consecutive allocations differ in
 *   their innermost 1 to 16 frames;
 * - the same leaf from different callers at the same depth: yz_y and yz_z
 *   have equal frames and both call yz_x, which allocates: the frames of
 *   yz_x lie at the same addresses with the same saved words either way,
 *   and only yz_x's return address tells the two stacks apart;
 * - a stack deeper than the depth limit (truncated walks), and allocations
 *   from two leaves at each of 12 depths of a recursion deeper than the
 *   limit (consecutive truncated walks: the same window of frames, and a
 *   window one frame further out);
 * - an allocation in a signal handler (a walk through the signal frame).
 *
 * Prints the number of allocations it made.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define NOINLINE __attribute__((noinline, noclone))
#define BARRIER() __asm__ volatile("" ::: "memory")

/* Where blocks go, so that no allocation is optimised away; the stores
 * after the calls keep them from being tail calls. */
void *volatile cw_sink;
volatile unsigned cw_after;
static unsigned long allocations;

NOINLINE static void leaf(unsigned size)
{
    void *p = malloc(16 + size % 200);
    BARRIER();
    cw_sink = p;
    free(p);
    cw_after++;
}

static void level(unsigned pattern, int left);

NOINLINE static void level_a(unsigned pattern, int left)
{
    level(pattern >> 1, left - 1);
    cw_after += 1;
}

NOINLINE static void level_b(unsigned pattern, int left)
{
    volatile char pad[8 + (pattern & 7) * 8];
    pad[0] = (char)left;
    level(pattern >> 1, left - 1);
    cw_after += (unsigned)pad[0];
}

/* left levels more, each by the pattern's next bit, then the leaf. */
NOINLINE static void level(unsigned pattern, int left)
{
    if (left <= 0)
        leaf(pattern);
    else if (pattern & 1)
        level_b(pattern, left);
    else
        level_a(pattern, left);
    cw_after++;
}

static unsigned long next_random(unsigned long *seed)
{
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    return *seed;
}

/* Inner paths of 1 to 16 levels under one outer chain. */
NOINLINE static void alternating(unsigned long *seed, int n)
{
    for (int i = 0; i < n; i++) {
        unsigned long r = next_random(seed);
        level((unsigned)(r >> 8), 1 + (int)(r % 16));
        allocations++;
    }
    cw_after++;
}

/* Two outer chains of different frames around the same inner paths. */
NOINLINE static void outer_x(unsigned long *seed, int n)
{
    alternating(seed, n);
    cw_after += 2;
}

NOINLINE static void outer_y(unsigned long *seed, int n)
{
    volatile char pad[40];
    pad[0] = 1;
    outer_x(seed, n);
    cw_after += (unsigned)pad[0];
}

NOINLINE static void yz_x(unsigned size)
{
    leaf(size);
    cw_after += 1;
}

NOINLINE static void yz_y(unsigned size)
{
    yz_x(size);
    cw_after += 2;
}

NOINLINE static void yz_z(unsigned size)
{
    yz_x(size);
    cw_after += 3;
}

NOINLINE static void same_leaf(int n)
{
    for (int i = 0; i < n; i++) {
        if (i % 2)
            yz_y((unsigned)i);
        else
            yz_z((unsigned)i);
        allocations++;
    }
    cw_after++;
}

NOINLINE static void deep(int depth)
{
    if (depth > 0)
        deep(depth - 1);
    else
        leaf(7);
    cw_after++;
}

NOINLINE static void leaf_b(unsigned size)
{
    cw_sink = malloc(size);
    free(cw_sink);
    cw_after++;
}

/* Recurses `depth` levels, then allocates from `leaf` and `leaf_b` at each
 * of the 12 innermost levels on the way back: 24 allocations. */
NOINLINE static void deep_mix(int depth)
{
    if (depth > 0)
        deep_mix(depth - 1);
    if (depth < 12) {
        leaf(8);
        leaf_b(9);
        allocations += 2;
    }
    cw_after++;
}

static void on_signal(int sig)
{
    (void)sig;
    level(5, 3);
}

NOINLINE static void round_of(unsigned long seed, int n)
{
    if (seed % 2)
        outer_y(&seed, n);
    else
        outer_x(&seed, n);
    same_leaf(n / 4);
    for (int i = 0; i < 8; i++)
        deep(70 + i);
    deep_mix(90);
    for (int i = 0; i < 4; i++)
        raise(SIGUSR1);
    allocations += 8 + 4;
}

static void *thread_main(void *arg)
{
    round_of((unsigned long)arg, 2000);
    return NULL;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 8;
    signal(SIGUSR1, on_signal);
    /* Leave the tracer's writer thread time to build the compact tables
     * (the walks before them are compared with framehop's only). */
    struct timespec pause = {0, 50 * 1000 * 1000};
    nanosleep(&pause, NULL);
    for (int r = 0; r < rounds; r++) {
        round_of(0x9e3779b97f4a7c15ul + (unsigned long)r, 4000);
        pthread_t t;
        if (pthread_create(&t, NULL, thread_main, (void *)(0x2545f4914f6cdd1dul + (unsigned long)r)) != 0)
            return 1;
        pthread_join(t, NULL);
    }
    printf("%lu allocations\n", allocations);
    return 0;
}
