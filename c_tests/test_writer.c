/*
 * The inline event path (trace_writer_*, include/alloctrace_inline.h):
 *   - before trace_start a handle can be had and the calls record nothing;
 *   - an ordinary event really is written inline: the thread's batch grows
 *     without any call into the library (white-box, where the header
 *     inlines), through a handle and through the plain calls;
 *   - every event kind, odd arguments (long form) and events around an
 *     advance come back field by field, with the caller's thread ID;
 *   - misuse is recorded, never a race: a handle used on another thread
 *     records on that thread's own writer, a NULL handle and a handle kept
 *     past trace_thread_destroy go out of line; nothing is lost;
 *   - the coarse clock: inline events keep their thread's order; times come
 *     from the published clock: they never go down, move on while the
 *     thread sleeps, and an advance publishes before its new generation;
 *   - fork: the forking thread's writer stays its own in the child.
 * The whole C suite also runs through these calls (c-test-writer).
 */
#include "common.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define M 0x10000000u

static expect_log log_;
static trace_writer *main_writer;
static uint64_t tid_other;

/* Another thread, given the main thread's handle by mistake. */
static void *other_thread(void *arg)
{
    (void)arg;
    tid_other = trace_thread_id();
    log_.thread = tid_other;
    trace_writer_heap_object_alloc(main_writer, M + 0x100, 24, 0);
    expect_heap_object(&log_, EV_HEAP_OBJECT_ALLOC, M + 0x100, 24, 0);
    trace_writer_heap_object_free(main_writer, M + 0x100);
    expect_heap_object(&log_, EV_HEAP_OBJECT_FREE, M + 0x100, 0, 0);
    return NULL;
}

static size_t batch_len(trace_writer *w)
{
#if ALLOCTRACE_INLINE
    uint64_t gen = alloctrace_inline_v2->generation;
    struct alloctrace_batch_ *b = w->batch_[gen & 1][0];
    return b ? b->len : 0;
#else
    (void)w;
    return 0;
#endif
}

/* This file's configuration: IDs from M, 16-byte heap alignment. */
static trace_config config(const char *path, trace_clock clock)
{
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = path;
    cfg.min_heap_addr = M;
    cfg.min_heap_align = 16;
    cfg.clock = clock;
    return cfg;
}

static void run(trace_clock clock, const char *file)
{
    char path[PATH_BUF_LEN];
    test_path(path, file);
    trace_config cfg = config(path, clock);
    expect_init(&log_, &cfg);

    /* Before start: a handle, and calls that record nothing. */
    trace_writer *w = trace_writer_get();
    CHECK(w != NULL);
    CHECK(trace_writer_get() == w);
    trace_writer_heap_object_alloc(w, M, 16, 0);
    trace_writer_heap_object_alloc(NULL, M, 16, 0);

    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
    const uint64_t tid_main = trace_thread_id();
    log_.thread = tid_main;
    log_.gen = 1;

    /* Every kind; the first event maps the batch (out of line). */
    trace_writer_span_exists(w, M, 4, 7);
    expect_span(&log_, EV_SPAN_EXISTS, M, 4, 7);
    size_t len0 = batch_len(w);
    trace_writer_span_alloc(w, M + 8192, 2, 3);
    expect_span(&log_, EV_SPAN_ALLOC, M + 8192, 2, 3);
    if (ALLOCTRACE_INLINE && clock == TRACE_CLOCK_PRECISE)
        CHECK_MSG(batch_len(w) > len0, "the event was not written inline (batch %zu -> %zu bytes)", len0,
                  batch_len(w));
    /* The plain calls write inline too, in an executable. */
    size_t len1 = batch_len(w);
    trace_heap_object_alloc(M + 0x200, 16, 0);
    expect_heap_object(&log_, EV_HEAP_OBJECT_ALLOC, M + 0x200, 16, 0);
    if (ALLOCTRACE_INLINE && clock == TRACE_CLOCK_PRECISE)
        CHECK_MSG(batch_len(w) > len1, "the plain call was not written inline (batch %zu -> %zu bytes)", len1,
                  batch_len(w));
    /* ... and through the library when called by name in parentheses. */
    (trace_heap_object_free)(M + 0x200);
    expect_heap_object(&log_, EV_HEAP_OBJECT_FREE, M + 0x200, 0, 0);
    trace_writer_span_free(w, M + 8192);
    expect_span(&log_, EV_SPAN_FREE, M + 8192, 0, 0);
    trace_writer_heap_object_exists(w, M + 32, 48, 0);
    expect_heap_object(&log_, EV_HEAP_OBJECT_EXISTS, M + 32, 48, 0);
    trace_writer_heap_object_alloc(w, M + 64, 16, 0);
    expect_heap_object(&log_, EV_HEAP_OBJECT_ALLOC, M + 64, 16, 0);
    trace_writer_heap_object_free(w, M + 64);
    expect_heap_object(&log_, EV_HEAP_OBJECT_FREE, M + 64, 0, 0);
    trace_writer_stack_exists(w, M + 0x10000, 8192);
    expect_stack(&log_, EV_STACK_EXISTS, M + 0x10000, 8192);
    trace_writer_stack_alloc(w, M + 0x20000, 65536);
    expect_stack(&log_, EV_STACK_ALLOC, M + 0x20000, 65536);
    trace_writer_stack_free(w, M + 0x20000);
    expect_stack(&log_, EV_STACK_FREE, M + 0x20000, 0);

    /* Odd arguments: unaligned, below min_heap_addr, a stack size that is
     * not a power of two. Recorded exactly (long form), out of line. */
    trace_writer_heap_object_alloc(w, M + 70, 5, 0);
    expect_heap_object(&log_, EV_HEAP_OBJECT_ALLOC, M + 70, 5, 0);
    trace_writer_heap_object_alloc(w, 0x1000, 8, 0);
    expect_heap_object(&log_, EV_HEAP_OBJECT_ALLOC, 0x1000, 8, 0);
    trace_writer_heap_object_free(w, 0x1000);
    expect_heap_object(&log_, EV_HEAP_OBJECT_FREE, 0x1000, 0, 0);
    trace_writer_stack_alloc(w, M + 0x30000, 12345);
    expect_stack(&log_, EV_STACK_ALLOC, M + 0x30000, 12345);

    /* Many events: buffers fill and refill, inline and out of line. */
    for (uint64_t i = 0; i < 100000; i++) {
        trace_writer_heap_object_alloc(w, M + 0x100000 + 16 * (i % 4096), 16 + i % 200, 0);
        expect_heap_object(&log_, EV_HEAP_OBJECT_ALLOC, M + 0x100000 + 16 * (i % 4096), 16 + i % 200, 0);
        trace_writer_heap_object_free(w, M + 0x100000 + 16 * (i % 4096));
        expect_heap_object(&log_, EV_HEAP_OBJECT_FREE, M + 0x100000 + 16 * (i % 4096), 0, 0);
    }

    /* Across an advance: the old generation's batch is gone, the next
     * event starts generation 2. */
    CHECK_RESULT(trace_advance(), TRACE_OK);
    log_.gen = 2;
    trace_writer_heap_object_alloc(w, M + 0x80, 32, 0);
    expect_heap_object(&log_, EV_HEAP_OBJECT_ALLOC, M + 0x80, 32, 0);

    /* The main thread's handle on another thread. The coarse clock orders
     * events of different threads only when the time was published between
     * them: an advance publishes it (a sleep did not always, on a loaded
     * machine: both threads' events then had one time and either order). */
    if (clock == TRACE_CLOCK_COARSE) {
        CHECK_RESULT(trace_advance(), TRACE_OK);
        log_.gen++;
    }
    main_writer = w;
    pthread_t t;
    CHECK(pthread_create(&t, NULL, other_thread, NULL) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK(tid_other != tid_main);
    log_.thread = tid_main;
    if (clock == TRACE_CLOCK_COARSE) {
        CHECK_RESULT(trace_advance(), TRACE_OK);
        log_.gen++;
    }

    /* A NULL handle. */
    trace_writer_heap_object_alloc(NULL, M + 0x90, 8, 0);
    expect_heap_object(&log_, EV_HEAP_OBJECT_ALLOC, M + 0x90, 8, 0);

    /* A handle kept past trace_thread_destroy: the thread's next events
     * have a new thread ID, whichever way they go. */
    trace_thread_destroy();
    const uint64_t tid_main2 = trace_thread_id();
    CHECK(tid_main2 != tid_main);
    log_.thread = tid_main2;
    trace_writer_heap_object_free(w, M + 0x80);
    expect_heap_object(&log_, EV_HEAP_OBJECT_FREE, M + 0x80, 0, 0);
    trace_writer_heap_object_free(w, M + 0x90);
    expect_heap_object(&log_, EV_HEAP_OBJECT_FREE, M + 0x90, 0, 0);

    CHECK_RESULT(trace_stop(), TRACE_OK);
    /* After stop: nothing recorded, nothing breaks. */
    trace_writer_heap_object_alloc(w, M + 0xA0, 8, 0);

    trace_dump d;
    dump_read(path, &d);
    EXPECT_MATCH_DUMP(&log_, &d);
    dump_free(&d);
    CHECK_EQ_U64(cli_check(path), 0);
    char *json = cli_stats_json(path);
    CHECK_EQ_U64(JSON_U64(json, "lost_events"), 0);
    free(json);
    expect_free(&log_);
}

/* A fork while tracing: the child starts with tracing off; the thread that
 * forked keeps its writer, which records inline into the child's own trace
 * once it starts one. The parent's trace is untouched by the child. */
static void fork_child_keeps_writer(void)
{
    char parent_path[PATH_BUF_LEN], child_path[PATH_BUF_LEN];
    test_path(parent_path, "writer_fork_parent.trace");
    test_path(child_path, "writer_fork_child.trace");
    trace_config cfg = config(parent_path, TRACE_CLOCK_PRECISE);
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
    trace_writer *w = trace_writer_get();
    trace_writer_heap_object_alloc(w, M + 0x10, 16, 0);

    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* The child: tracing is off until it starts its own trace. */
        trace_writer_heap_object_alloc(w, M + 0x20, 16, 0);
        cfg.path = child_path;
        if (trace_start(&cfg) != TRACE_OK)
            _exit(10);
        trace_writer_heap_object_alloc(w, M + 0x30, 16, 0);
        size_t len = batch_len(w);
        trace_writer_heap_object_free(w, M + 0x30);
        if (ALLOCTRACE_INLINE && batch_len(w) <= len)
            _exit(11); /* not inline: the handle did not stay the thread's */
        _exit(trace_stop() == TRACE_OK ? 0 : 12);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "fork child failed: status %d", status);
    trace_writer_heap_object_free(w, M + 0x10);
    CHECK_RESULT(trace_stop(), TRACE_OK);

    char *json = cli_stats_json(parent_path);
    CHECK_EQ_U64(JSON_U64(json, "events.heap_object_alloc"), 1);
    CHECK_EQ_U64(JSON_U64(json, "events.heap_object_free"), 1);
    free(json);
    json = cli_stats_json(child_path);
    CHECK_EQ_U64(JSON_U64(json, "events.heap_object_alloc"), 1);
    CHECK_EQ_U64(JSON_U64(json, "events.heap_object_free"), 1);
    CHECK_EQ_U64(JSON_U64(json, "lost_events"), 0);
    free(json);
    CHECK_EQ_U64(cli_check(child_path), 0);
}

/* The coarse clock stamps events with the published time: a thread's times
 * never go down (a burst shares one time), move on when the thread sleeps
 * past a publishing period, and the first event after an advance is later
 * than every event before it (the advance publishes the time). */
static void coarse_times(void)
{
    char path[PATH_BUF_LEN];
    test_path(path, "writer_coarse_times.trace");
    trace_config cfg = config(path, TRACE_CLOCK_COARSE);
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
    trace_writer *w = trace_writer_get();
    enum { BURST = 2000 };
    for (uint64_t i = 0; i < BURST; i++)
        trace_writer_heap_object_alloc(w, M + 16 * i, 16, 0);
    usleep(20000); /* 80 publishing periods */
    trace_writer_heap_object_alloc(w, M + 16 * BURST, 16, 0);
    CHECK_RESULT(trace_advance(), TRACE_OK);
    trace_writer_heap_object_alloc(w, M + 16 * (BURST + 1), 16, 0);
    CHECK_RESULT(trace_stop(), TRACE_OK);

    trace_dump d;
    dump_read(path, &d);
    CHECK_EQ_U64(d.nevents, BURST + 2);
    for (size_t i = 1; i < d.nevents; i++) {
        CHECK_MSG(d.events[i].addr == M + 16 * i, "event %zu out of order: addr %#llx", i,
                  (unsigned long long)d.events[i].addr);
        CHECK_MSG(d.events[i].time_ns >= d.events[i - 1].time_ns, "time went down at event %zu", i);
    }
    CHECK_MSG(d.events[BURST].time_ns > d.events[BURST - 1].time_ns, "the time did not move on over a 20 ms sleep");
    CHECK_EQ_U64(d.events[BURST + 1].gen, 2);
    CHECK_MSG(d.events[BURST + 1].time_ns > d.events[BURST].time_ns,
              "the first event after an advance is not later than the one before it");
    dump_free(&d);
    CHECK_EQ_U64(cli_check(path), 0);
}

int main(void)
{
    test_begin("test_writer", 120);
    run(TRACE_CLOCK_PRECISE, "writer_precise.trace");
    run(TRACE_CLOCK_COARSE, "writer_coarse.trace");
    coarse_times();
    fork_child_keeps_writer();
    return test_pass();
}
