/*
 * Native stacks captured by the library (trace_config.stacks, and
 * trace_stack_capture): allocations made through the plain call carry the
 * stack of their caller, frame 1 being exactly the return address into
 * the caller's caller; one call site gives one stack ID, two sites two;
 * trace_stack_capture(1) starts one frame further out; the depth limit keeps
 * the innermost frames under the truncation marker; odd stacks and
 * stack_depth values are refused by trace_start. Checked through
 * `alloctrace dump --stacks`, whose frames are module+offset.
 */
#include "common.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t ra_in_middle[2];
static uint64_t ra_skip;
static uintptr_t base;
static const char *module;

#define BARRIER() __asm__ volatile("" ::: "memory")

/* The library's own call, whatever TEST_WRITER makes of the plain name. */
__attribute__((noinline)) static void inner(int site, uintptr_t p)
{
    ra_in_middle[site] = (uint64_t)(uintptr_t)__builtin_return_address(0);
    (trace_heap_object_alloc)(p, 16, 0);
    BARRIER();
}

__attribute__((noinline)) static void middle_a(uintptr_t p)
{
    inner(0, p);
    BARRIER();
}

__attribute__((noinline)) static void middle_b(uintptr_t p)
{
    inner(1, p);
    BARRIER();
}

__attribute__((noinline)) static uint64_t capture_here(void)
{
    uint64_t id = trace_stack_capture(0);
    BARRIER();
    return id;
}

__attribute__((noinline)) static uint64_t capture_skipping_me(void)
{
    ra_skip = (uint64_t)(uintptr_t)__builtin_return_address(0);
    uint64_t id = trace_stack_capture(1);
    BARRIER();
    return id;
}

__attribute__((noinline)) static uint64_t deep(int n)
{
    uint64_t id = n == 0 ? trace_stack_capture(0) : deep(n - 1);
    BARRIER();
    return id;
}

/* The frames of stack `id` in the dump text, as "#I FRAME" lines; NULL if
 * the stack is not listed. */
static const char *stack_of(const char *dump, uint64_t id)
{
    char head[64];
    snprintf(head, sizeof head, "stack gen=1 id=%" PRIu64 " frames=", id);
    return strstr(dump, head);
}

/* Whether frame `i` of the stack listing `s` is this program's `addr`. */
static bool frame_is(const char *s, int i, uint64_t addr)
{
    char want[256];
    snprintf(want, sizeof want, "\n  #%d %s+0x%" PRIx64 "\n", i, module, (uint64_t)(addr - base));
    const char *next = strstr(s + 1, "\nstack ");
    const char *hit = strstr(s, want);
    return hit != NULL && (next == NULL || hit < next);
}

/* The stack ID of the event whose dump line contains `needle`; 0 if none. */
static uint64_t stack_of_event(const char *dump, const char *needle)
{
    const char *line = strstr(dump, needle);
    if (line == NULL)
        return 0;
    const char *end = strchr(line, '\n');
    const char *s = strstr(line, " stack=");
    if (s == NULL || (end != NULL && s > end))
        return 0;
    return strtoull(s + 7, NULL, 10);
}

static int count_events_with_stack(const char *dump, uint64_t id)
{
    char want[64];
    snprintf(want, sizeof want, " stack=%" PRIu64 "\n", id);
    int n = 0;
    for (const char *p = strstr(dump, want); p; p = strstr(p + 1, want))
        n++;
    return n;
}

int main(int argc, char **argv)
{
    (void)argc;
    test_begin("test_stack_capture", 60);
    Dl_info info;
    CHECK(dladdr((void *)&ra_skip, &info) != 0); /* any address of this program */
    base = (uintptr_t)info.dli_fbase;
    module = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];

    char path[512];
    test_path(path, "capture.trace");
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = path;
    cfg.min_heap_align = 16;
    CHECK(cfg.stacks == TRACE_STACKS_NONE && cfg.stack_depth == 0);

    cfg.stacks = 7;
    CHECK(trace_start(&cfg) == TRACE_ERR_BAD_CONFIG);
    CHECK(strstr(trace_last_error_detail(), "stacks") != NULL);
    cfg.stacks = TRACE_STACKS_FULL;
    cfg.stack_depth = 257;
    CHECK(trace_start(&cfg) == TRACE_ERR_BAD_CONFIG);
    cfg.stack_depth = 0;

    CHECK(trace_stack_capture(0) == 0); /* tracing off */
    CHECK(trace_start(&cfg) == TRACE_OK);
    /* Loops the compiler cannot unroll: one call site each. */
    volatile int three = 3, five = 5;
    for (int i = 0; i < three; i++)
        middle_a(0x10000000 + 16 * (uintptr_t)i);
    for (int i = 0; i < five; i++)
        middle_b(0x20000000 + 16 * (uintptr_t)i);
    /* One call site (a loop the compiler cannot unroll). */
    uint64_t here[2];
    volatile int two = 2;
    for (int i = 0; i < two; i++)
        here[i] = capture_here();
    uint64_t skip = capture_skipping_me();
    CHECK(here[0] != 0 && here[0] == here[1]);
    CHECK(skip != 0 && skip != here[0]);
    /* The plain name: in a program, the header's inline path, which hands
     * the event to the library while stacks are captured (so do the
     * trace_writer_* calls of the TEST_WRITER build). */
    trace_heap_object_alloc(0x50000000, 16, 0);
    trace_heap_object_alloc_stack(0x30000000, 16, 0, here[0]);
    trace_heap_object_alloc_stack(0x30000010, 16, 0, skip);
    CHECK(trace_stop() == TRACE_OK);

    char *events = NULL, *stacks = NULL;
    CHECK(cli_run("dump", path, NULL, &events) == 0);
    CHECK(cli_run("dump", path, "--stacks", &stacks) == 0);
    uint64_t a = stack_of_event(events, "addr=0x10000000 ");
    uint64_t b = stack_of_event(events, "addr=0x20000000 ");
    CHECK(a != 0 && b != 0 && a != b);
    CHECK(count_events_with_stack(events, a) == 3);
    CHECK(count_events_with_stack(events, b) == 5);
    /* Through the inline path (trace_writer_* in the TEST_WRITER build). */
    CHECK(stack_of_event(events, "addr=0x50000000 ") != 0);
    const char *sa = stack_of(stacks, a), *sb = stack_of(stacks, b);
    const char *sh = stack_of(stacks, here[0]), *ss = stack_of(stacks, skip);
    CHECK(sa && sb && sh && ss);
    /* Frame 0 is in inner (the same return address for both sites), frame
     * 1 the return address into each middle. */
    CHECK(frame_is(sa, 1, ra_in_middle[0]));
    CHECK(frame_is(sb, 1, ra_in_middle[1]));
    CHECK(!frame_is(sa, 1, ra_in_middle[1]));
    /* skip 1: frame 0 is the return address into capture_skipping_me's
     * caller. */
    CHECK(frame_is(ss, 0, ra_skip));
    free(events);
    free(stacks);

    /* The depth limit: 3 frames, then the truncation marker. */
    test_path(path, "depth.trace");
    cfg.path = path;
    cfg.stack_depth = 3;
    CHECK(trace_start(&cfg) == TRACE_OK);
    uint64_t d = deep(10);
    CHECK(d != 0);
    trace_heap_object_alloc_stack(0x40000000, 16, 0, d);
    CHECK(trace_stop() == TRACE_OK);
    CHECK(cli_run("dump", path, "--stacks", &stacks) == 0);
    const char *sd = stack_of(stacks, d);
    CHECK(sd != NULL && strncmp(strstr(sd, "frames="), "frames=4\n", 9) == 0);
    CHECK(strstr(sd, "\n  #3 [truncated]") != NULL);
    free(stacks);
    return test_pass();
}
