/*
 * The flight recorder (issue 22): with trace_config.flight_recorder set,
 * the tracer keeps its last complete generations in a ring of that size,
 * writes nothing to the trace's output until a dump, and
 * trace_flight_recorder_write(path, fd) writes them, up to the call, as a
 * trace of their own that every reading command accepts:
 *   - a dump at a known moment holds exactly generations 1..5 after four
 *     advances (the call ends the fifth), then 1..8 after two more; to a
 *     path and to a caller's descriptor (left open);
 *   - over a long run in a 1 MiB ring, the dump starts after generation 1
 *     and its size stays within the ring's (the ring's own bound);
 *   - `alloctrace check` reads the dumps cleanly;
 *   - nothing reaches the session's output at trace_stop;
 *   - bad arguments and settings are refused.
 */
#include "common.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define BASE ((uintptr_t)0x100000000ull)

static uint64_t file_size(const char *path)
{
    struct stat st;
    CHECK_MSG(stat(path, &st) == 0, "stat(%s)", path);
    return (uint64_t)st.st_size;
}

/* The first and last generation of the events a dump holds, and how many
 * allocations it has. */
static void dump_span(const char *path, uint64_t *first, uint64_t *last, size_t *allocs)
{
    trace_dump d = {0};
    dump_read(path, &d);
    *first = UINT64_MAX;
    *last = 0;
    *allocs = 0;
    for (size_t i = 0; i < d.nevents; i++) {
        if (d.events[i].gen < *first)
            *first = d.events[i].gen;
        if (d.events[i].gen > *last)
            *last = d.events[i].gen;
        if (d.events[i].kind == EV_HEAP_OBJECT_ALLOC)
            (*allocs)++;
    }
    dump_free(&d);
}

static void known_moment(void)
{
    char out[PATH_BUF_LEN], a[PATH_BUF_LEN], b[PATH_BUF_LEN];
    test_path(out, "moment.trace");
    test_path(a, "moment-a.trace");
    test_path(b, "moment-b.trace");
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = out;
    cfg.flight_recorder = 64u << 20;
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
    for (uint64_t g = 1; g <= 5; g++) {
        trace_heap_object_alloc(BASE + g * 64, 32, 0);
        if (g < 5)
            CHECK_RESULT(trace_advance(), TRACE_OK);
    }
    CHECK_RESULT(trace_flight_recorder_write(a, -1), TRACE_OK);
    uint64_t first, last;
    size_t allocs;
    dump_span(a, &first, &last, &allocs);
    CHECK_EQ_U64(first, 1);
    CHECK_EQ_U64(last, 5);
    CHECK_EQ_U64(allocs, 5);
    CHECK_EQ_U64(cli_check(a), 0);

    /* The write ended generation 5: one event in 6, two advances. */
    trace_heap_object_alloc(BASE + 4096, 32, 0);
    CHECK_RESULT(trace_advance(), TRACE_OK);
    CHECK_RESULT(trace_advance(), TRACE_OK);
    int fd = open(b, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    CHECK(fd >= 0);
    CHECK_RESULT(trace_flight_recorder_write(NULL, fd), TRACE_OK);
    CHECK_MSG(fcntl(fd, F_GETFD) >= 0, "the caller's descriptor stays open");
    close(fd);
    dump_span(b, &first, &last, &allocs);
    CHECK_EQ_U64(first, 1);
    CHECK_EQ_U64(last, 6); /* 7 and 8 hold no event */
    CHECK_EQ_U64(allocs, 6);
    CHECK_EQ_U64(cli_check(b), 0);
    char *json = cli_stats_json(b);
    CHECK_EQ_U64(JSON_U64(json, "generations"), 8);
    free(json);

    CHECK_RESULT(trace_flight_recorder_write(NULL, -1), TRACE_ERR_NULL_ARGUMENT);
    CHECK_RESULT(trace_stop(), TRACE_OK);
    CHECK_EQ_U64(file_size(out), 0);
    CHECK_RESULT(trace_flight_recorder_write(a, -1), TRACE_ERR_NOT_STARTED);
}

static void bounded(void)
{
    char out[PATH_BUF_LEN], dump[PATH_BUF_LEN];
    test_path(out, "bounded.trace");
    test_path(dump, "bounded-dump.trace");
    const uint64_t size = 1u << 20;
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = out;
    cfg.buffer_size = 16 << 10;
    cfg.flight_recorder = size;
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
    /* About 60 generations of ~300 KiB: far more than the ring holds. */
    uint64_t n = 3000000 / test_scale();
    for (uint64_t i = 0; i < n; i++) {
        uintptr_t p = BASE + (uintptr_t)(i * 7919 % 1000003) * 16;
        trace_heap_object_alloc(p, 48, 0);
        trace_heap_object_free(p);
        if (i % 50000 == 49999)
            CHECK_RESULT(trace_advance(), TRACE_OK);
    }
    CHECK_RESULT(trace_flight_recorder_write(dump, -1), TRACE_OK);
    CHECK_RESULT(trace_stop(), TRACE_OK);
    uint64_t first, last;
    size_t allocs;
    dump_span(dump, &first, &last, &allocs);
    CHECK_MSG(first > 1, "the oldest generations were evicted (first %" PRIu64 ")", first);
    CHECK_MSG(last > first, "the ring holds several generations (%" PRIu64 "..%" PRIu64 ")", first, last);
    CHECK_MSG(file_size(dump) <= size + 64, "a dump of %" PRIu64 " bytes from a ring of %" PRIu64,
              file_size(dump), size);
    CHECK_EQ_U64(cli_check(dump), 0);
    CHECK_EQ_U64(file_size(out), 0);
}

static void refused(void)
{
    char out[PATH_BUF_LEN], dump[PATH_BUF_LEN];
    test_path(out, "refused.trace");
    test_path(dump, "refused-dump.trace");
    trace_config cfg;
    trace_config_init(&cfg);
    CHECK_EQ_U64(cfg.flight_recorder, 0);
    CHECK_EQ_U64(cfg.dump_on_rss, 0);
    cfg.path = out;
    cfg.flight_recorder = 1000;
    CHECK_RESULT(trace_start(&cfg), TRACE_ERR_BAD_CONFIG);
    CHECK_MSG(strstr(trace_last_error_detail(), "flight_recorder") != NULL, "%s", trace_last_error_detail());
    cfg.flight_recorder = 0;
    cfg.dump_on_rss = 1u << 30;
    CHECK_RESULT(trace_start(&cfg), TRACE_ERR_BAD_CONFIG);
    CHECK_MSG(strstr(trace_last_error_detail(), "dump_on_rss") != NULL, "%s", trace_last_error_detail());
    cfg.dump_on_rss = 0;
    CHECK_EQ_U64(cfg.flight_recorder_age_ms, 0);
    cfg.flight_recorder_age_ms = 30000;
    CHECK_RESULT(trace_start(&cfg), TRACE_ERR_BAD_CONFIG);
    CHECK_MSG(strstr(trace_last_error_detail(), "flight_recorder_age_ms") != NULL, "%s", trace_last_error_detail());
    cfg.flight_recorder = 4u << 20;
    cfg.flight_recorder_age_ms = 999;
    CHECK_RESULT(trace_start(&cfg), TRACE_ERR_BAD_CONFIG);
    cfg.flight_recorder = 0;
    cfg.flight_recorder_age_ms = 0;
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
    CHECK_RESULT(trace_flight_recorder_write(dump, -1), TRACE_ERR_BAD_CONFIG);
    CHECK_MSG(access(dump, F_OK) != 0, "a refused write creates no file");
    CHECK_RESULT(trace_stop(), TRACE_OK);
}

int main(void)
{
    test_begin("test_flight_recorder", 300);
    known_moment();
    bounded();
    refused();
    return test_pass();
}
