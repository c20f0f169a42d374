/*
 * trace_stack_walk: the caller's native stack as return addresses,
 * innermost first, by trace_stack_capture's walk. 0 while tracing is off
 * and for NULL or max 0; with skip 0, frame 1 is the return address into
 * the caller's caller and frame 0 lies in the caller; skip 1 starts at
 * that return address; max caps the count, keeping the innermost frames;
 * the frames registered with trace_stack_register are the stack
 * trace_stack_capture interns at the same place.
 */
#include "common.h"

#include <stdint.h>
#include <string.h>

#define BARRIER() __asm__ volatile("" ::: "memory")

static uint64_t ra_walk;
static uint64_t frames[64];

__attribute__((noinline)) static size_t walk_here(size_t max, uint32_t skip)
{
    ra_walk = (uint64_t)(uintptr_t)__builtin_return_address(0);
    size_t n = trace_stack_walk(frames, max, skip);
    BARRIER();
    return n;
}

/* Captures and walks from the same place (skip 1: the caller's frame). */
__attribute__((noinline)) static void both(uint64_t *captured, size_t *n)
{
    ra_walk = (uint64_t)(uintptr_t)__builtin_return_address(0);
    *captured = trace_stack_capture(1);
    BARRIER();
    *n = trace_stack_walk(frames, 64, 1);
    BARRIER();
}

int main(void)
{
    test_begin("test_stack_walk", 60);
    char path[512];
    test_path(path, "walk.trace");
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = path;

    CHECK(walk_here(64, 0) == 0); /* tracing off */
    CHECK(trace_start(&cfg) == TRACE_OK);
    CHECK(trace_stack_walk(NULL, 64, 0) == 0);
    CHECK(trace_stack_walk(frames, 0, 0) == 0);

    memset(frames, 0, sizeof frames);
    size_t n = walk_here(64, 0);
    CHECK(n >= 3 && n <= 64);
    uintptr_t fn = (uintptr_t)&walk_here;
    CHECK(frames[0] > fn && frames[0] < fn + 256);
    CHECK(frames[1] == ra_walk);
    uint64_t outer = frames[2];

    memset(frames, 0, sizeof frames);
    size_t n1 = walk_here(64, 1);
    CHECK(n1 == n - 1);
    CHECK(frames[0] == ra_walk && frames[1] == outer);

    memset(frames, 0, sizeof frames);
    CHECK(walk_here(2, 0) == 2);
    CHECK(frames[1] == ra_walk && frames[2] == 0);

    uint64_t captured = 0;
    size_t m = 0;
    both(&captured, &m);
    CHECK(captured != 0 && m > 0 && frames[0] == ra_walk);
    CHECK(trace_stack_register(frames, m) == captured);

    CHECK(trace_stop() == TRACE_OK);
    CHECK(walk_here(64, 0) == 0); /* off again */
    return test_pass();
}
