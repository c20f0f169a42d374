/*
 * trace_frame_register and trace_stack_register, as a runtime calls them
 * (before and while tracing, from several threads): frame values have bit
 * 63 set and are distinct; a stack interns to one ID however often and from
 * whichever thread it is registered; stacks differing in any frame, or in a
 * frame's caller, get distinct IDs; native and registered frames mix;
 * NULL, n = 0, a frame of 0 and a registered value that names no frame give
 * 0; a stack deeper than 1024 frames keeps its innermost 1023 under the
 * truncation mark, so two deep stacks sharing those frames get one ID.
 * trace_stack_push grows a stack ID by one frame to the ID the whole stack
 * registers to, refuses the odd arguments trace_stack_register does and a
 * parent that names no stack, and stops at the format's 1024 frames.
 */
#include "common.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define REGISTERED (UINT64_C(1) << 63)
#define DEEP 3000

static uint64_t deep[DEEP];

struct job {
    const uint64_t *frames;
    size_t n;
    uint64_t id[200];
};

static void *register_often(void *arg)
{
    struct job *j = arg;
    for (int i = 0; i < 200; i++)
        j->id[i] = trace_stack_register(j->frames, j->n);
    return NULL;
}

int main(void)
{
    test_begin("test_stack_register", 60);

    /* Before tracing starts. */
    uint64_t eval = trace_frame_register("eval", 4, "vm.lua", 6, 10);
    uint64_t call = trace_frame_register("call", 4, NULL, 0, 0);
    uint64_t nameless = trace_frame_register(NULL, 0, NULL, 0, 7);
    CHECK(eval & REGISTERED);
    CHECK(call & REGISTERED);
    CHECK(nameless & REGISTERED);
    CHECK(eval != call && call != nameless && eval != nameless);

    uint64_t native_a[] = {0x401234, 0x401500, 0x400800};
    uint64_t native_b[] = {0x401238, 0x401500, 0x400800};
    uint64_t other_caller[] = {0x401234, 0x401504, 0x400800};
    uint64_t mixed[] = {0x7f0000001000, eval, call, 0x400800};
    uint64_t a = trace_stack_register(native_a, 3);
    uint64_t b = trace_stack_register(native_b, 3);
    uint64_t c = trace_stack_register(other_caller, 3);
    uint64_t m = trace_stack_register(mixed, 4);
    CHECK(a != 0 && b != 0 && c != 0 && m != 0);
    CHECK(a != b && a != c && b != c && m != a);
    CHECK_EQ_U64(trace_stack_register(native_a, 3), a);
    CHECK_EQ_U64(trace_stack_register(mixed, 4), m);
    /* A prefix (the callers alone) is a stack of its own. */
    uint64_t callers = trace_stack_register(native_a + 1, 2);
    CHECK(callers != 0 && callers != a);

    /* Odd arguments: no stack, never a crash. */
    uint64_t zero_frame[] = {0x401234, 0, 0x400800};
    uint64_t unknown[] = {0x401234, REGISTERED | UINT64_C(0xfffffff)};
    uint64_t unknown_marker[] = {REGISTERED};
    CHECK_EQ_U64(trace_stack_register(NULL, 3), 0);
    CHECK_EQ_U64(trace_stack_register(native_a, 0), 0);
    CHECK_EQ_U64(trace_stack_register(zero_frame, 3), 0);
    CHECK_EQ_U64(trace_stack_register(unknown, 2), 0);
    CHECK_EQ_U64(trace_stack_register(unknown_marker, 1), 0);

    /* Deep stacks: the innermost 1023 frames under the truncation mark. */
    for (int i = 0; i < DEEP; i++)
        deep[i] = 0x500000 + 16 * (uint64_t)i;
    uint64_t d2000 = trace_stack_register(deep, 2000);
    uint64_t d3000 = trace_stack_register(deep, 3000);
    uint64_t d1023 = trace_stack_register(deep, 1023);
    uint64_t d1024 = trace_stack_register(deep, 1024);
    CHECK(d2000 != 0 && d1023 != 0 && d1024 != 0);
    CHECK_EQ_U64(d3000, d2000);
    CHECK(d1023 != d2000 && d1024 != d2000 && d1023 != d1024);

    /* trace_stack_push: the stack of a parent ID and one frame inside it. */
    uint64_t outer = trace_stack_push(0, 0x400800);
    CHECK(outer != 0);
    CHECK_EQ_U64(outer, trace_stack_register(native_a + 2, 1));
    CHECK_EQ_U64(trace_stack_push(trace_stack_push(outer, 0x401500), 0x401234), a);
    CHECK_EQ_U64(trace_stack_push(callers, native_a[0]), a);
    CHECK_EQ_U64(trace_stack_push(trace_stack_register(mixed + 1, 3), mixed[0]), m);
    CHECK_EQ_U64(trace_stack_push(trace_stack_push(outer, call), eval), trace_stack_register(mixed + 1, 3));
    CHECK_EQ_U64(trace_stack_push(callers, 0), 0);
    CHECK_EQ_U64(trace_stack_push(callers, REGISTERED | UINT64_C(0xfffffff)), 0);
    CHECK_EQ_U64(trace_stack_push(UINT64_C(0x7fffffff), 0x401234), 0);
    CHECK_EQ_U64(trace_stack_push(UINT64_MAX, 0x401234), 0);
    /* At the depth limit: 1024 frames, and no frame more. */
    uint64_t pushed1024 = trace_stack_push(trace_stack_register(deep + 1, 1023), deep[0]);
    CHECK_EQ_U64(pushed1024, d1024);
    CHECK_EQ_U64(trace_stack_push(d1024, 0x400100), 0);
    CHECK_EQ_U64(trace_stack_push(d2000, 0x400100), 0);
    CHECK(trace_stack_push(trace_stack_register(deep + 2, 1022), 0x400100) != 0);

    /* While tracing, from threads at once: one ID per stack. */
    char path[PATH_BUF_LEN];
    test_path(path, "stacks.trace");
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = path;
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
    uint64_t fresh[] = {0x402000, eval, 0x400900};
    struct job jobs[4];
    pthread_t threads[4];
    for (int t = 0; t < 4; t++) {
        jobs[t].frames = t % 2 ? fresh : native_b;
        jobs[t].n = 3;
        CHECK(pthread_create(&threads[t], NULL, register_often, &jobs[t]) == 0);
    }
    for (int t = 0; t < 4; t++)
        CHECK(pthread_join(threads[t], NULL) == 0);
    uint64_t f = trace_stack_register(fresh, 3);
    CHECK(f != 0 && f != b);
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 200; i++)
            CHECK_EQ_U64(jobs[t].id[i], t % 2 ? f : b);
    /* Allocations with their stacks, plain and through the handle; one
     * with an ID that names no stack is recorded without it and counted. */
    trace_heap_object_alloc_stack(0x10000000, 48, 0, b);
    trace_writer_heap_object_alloc_stack(trace_writer_get(), 0x10000040, 48, 0, m);
    trace_span_alloc_stack(0x20000000, 2, 1, f);
    trace_writer_span_alloc_stack(trace_writer_get(), 0x20010000, 2, 1, d2000);
    trace_heap_object_alloc_stack(0x10000080, 16, 0, 0);
    trace_heap_object_alloc_stack(0x100000c0, 16, 0, UINT64_C(0x7fffffff));
    trace_heap_object_alloc_stack(0x10000100, 16, 0, trace_stack_push(d1023, 0x400100));
    CHECK_RESULT(trace_stop(), TRACE_OK);
    CHECK(cli_check(path) == 0);
    char *json = cli_stats_json(path);
    CHECK_EQ_U64(JSON_U64(json, "lost_stacks"), 1);
    free(json);
    /* dump shows the stack of each allocation that has one. */
    char *text = NULL;
    CHECK(cli_run("dump", path, NULL, &text) == 0);
    int with_stack = 0, allocs = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (strstr(line, "alloc"))
            allocs++;
        if (strstr(line, "stack="))
            with_stack++;
    }
    free(text);
    CHECK_EQ_U64((uint64_t)allocs, 7);
    CHECK_EQ_U64((uint64_t)with_stack, 5);
    return test_pass();
}
