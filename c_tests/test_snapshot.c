/*
 * trace_snapshot_write(path, fd) (issue 22, the live heap on demand):
 * writes what is live now, from the writer thread's live table, as a
 * snapshot trace that every reading command accepts:
 *   - after a known sequence (allocations with registered call stacks,
 *     frees, a realloc written as a free and an alloc, an alloc at a live
 *     address that replaces it), the snapshot holds exactly the live
 *     objects, each once, with its size, and `leaks` finds them at their
 *     registered functions; to a path and to a caller's descriptor (left
 *     open);
 *   - a second snapshot after more frees holds what is left;
 *   - `alloctrace check` reads it cleanly;
 *   - bad arguments and settings are refused: NULL and -1, tracing off,
 *     flight-recorder mode (no live table), and no file is created then.
 */
#include "common.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BASE ((uintptr_t)0x100000000ull)

/* The live heap objects a snapshot holds, sorted by address. */
typedef struct live {
    uint64_t addr, size;
} live;

static int by_addr(const void *a, const void *b)
{
    uint64_t x = ((const live *)a)->addr, y = ((const live *)b)->addr;
    return x < y ? -1 : x > y;
}

static size_t snapshot_live(const char *path, live *out, size_t max)
{
    trace_dump d = {0};
    dump_read(path, &d);
    size_t n = 0;
    for (size_t i = 0; i < d.nevents; i++) {
        CHECK_MSG(d.events[i].kind == EV_HEAP_OBJECT_ALLOC, "only live objects, as allocs (kind %d)",
                  (int)d.events[i].kind);
        CHECK(n < max);
        out[n].addr = d.events[i].addr;
        out[n].size = d.events[i].size;
        n++;
    }
    dump_free(&d);
    qsort(out, n, sizeof out[0], by_addr);
    return n;
}

static uint64_t stack_of(const char *function)
{
    uint64_t frames[2];
    frames[0] = trace_frame_register(function, strlen(function), "snapshot.c", 10, 10);
    frames[1] = trace_frame_register("main", 4, "snapshot.c", 10, 1);
    uint64_t id = trace_stack_register(frames, 2);
    CHECK(id != 0);
    return id;
}

static void known_sequence(void)
{
    char out[PATH_BUF_LEN], a[PATH_BUF_LEN], b[PATH_BUF_LEN];
    test_path(out, "known.trace");
    test_path(a, "known-a.trace");
    test_path(b, "known-b.trace");
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = out;
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
    uint64_t site_a = stack_of("site_a"), site_b = stack_of("site_b");

    /* 100 objects at site_a, every other one freed: 50 live. */
    for (uint64_t i = 0; i < 100; i++) {
        trace_heap_object_alloc_stack(BASE + i * 64, 40, 0, site_a);
        if (i % 2 == 1)
            trace_heap_object_free(BASE + i * 64);
    }
    /* A realloc that moves object 0 (free, then alloc at site_b), across
     * a generation's end. */
    CHECK_RESULT(trace_advance(), TRACE_OK);
    trace_heap_object_free(BASE);
    trace_heap_object_alloc_stack(BASE + 0x10000, 400, 0, site_b);
    /* An alloc at a live address (a missed free): it replaces object 2. */
    trace_heap_object_alloc_stack(BASE + 2 * 64, 4000, 0, site_b);
    /* Freed before the snapshot, allocated and freed in one generation. */
    trace_heap_object_alloc(BASE + 0x20000, 8, 0);
    trace_heap_object_free(BASE + 0x20000);

    CHECK_RESULT(trace_snapshot_write(a, -1), TRACE_OK);
    live got[128];
    size_t n = snapshot_live(a, got, 128);
    CHECK_EQ_U64(n, 50);
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += got[i].size;
    /* 48 of 40 at site_a, 400 and 4000 at site_b. */
    CHECK_EQ_U64(bytes, 48 * 40 + 400 + 4000);
    CHECK_EQ_U64(got[0].addr, BASE + 2 * 64);
    CHECK_EQ_U64(got[0].size, 4000);
    CHECK_EQ_U64(got[n - 1].addr, BASE + 0x10000);
    CHECK_EQ_U64(cli_check(a), 0);
    char *json = NULL;
    CHECK_EQ_U64(cli_run("leaks", a, "--json", &json), 0);
    CHECK_EQ_U64(JSON_U64(json, "objects"), 50);
    CHECK_EQ_U64(JSON_U64(json, "bytes"), 48 * 40 + 400 + 4000);
    CHECK_MSG(strstr(json, "site_a") && strstr(json, "site_b"), "the stacks resolve: %s", json);
    free(json);

    /* Tracing went on: free site_b's two, snapshot to a descriptor. */
    trace_heap_object_free(BASE + 0x10000);
    trace_heap_object_free(BASE + 2 * 64);
    int fd = open(b, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    CHECK(fd >= 0);
    CHECK_RESULT(trace_snapshot_write(NULL, fd), TRACE_OK);
    CHECK_MSG(fcntl(fd, F_GETFD) >= 0, "the caller's descriptor stays open");
    close(fd);
    n = snapshot_live(b, got, 128);
    CHECK_EQ_U64(n, 48);
    CHECK_EQ_U64(cli_check(b), 0);

    CHECK_RESULT(trace_snapshot_write(NULL, -1), TRACE_ERR_NULL_ARGUMENT);
    CHECK_RESULT(trace_stop(), TRACE_OK);
    CHECK_RESULT(trace_snapshot_write(a, -1), TRACE_ERR_NOT_STARTED);
}

static void refused(void)
{
    char out[PATH_BUF_LEN], snap[PATH_BUF_LEN];
    test_path(out, "refused.trace");
    test_path(snap, "refused-snapshot.trace");
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = out;
    cfg.flight_recorder = 64u << 20;
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
    CHECK_RESULT(trace_snapshot_write(snap, -1), TRACE_ERR_BAD_CONFIG);
    CHECK_MSG(strstr(trace_last_error_detail(), "flight") != NULL, "%s", trace_last_error_detail());
    CHECK_MSG(access(snap, F_OK) != 0, "a refused write creates no file");
    CHECK_RESULT(trace_stop(), TRACE_OK);
}

int main(void)
{
    test_begin("test_snapshot", 300);
    /* Full mode keeps a live table only when asked (its cost). */
    setenv("ALLOCTRACE_LIVE_TABLE", "on", 1);
    known_sequence();
    refused();
    return test_pass();
}
