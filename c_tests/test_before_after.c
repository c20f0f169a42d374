/*
 * Calls made while not tracing do nothing and do not crash: event calls
 * before trace_start and after trace_stop leave no trace; trace_enabled is
 * false / true / false; trace_thread_id is 0 when not tracing;
 * trace_thread_destroy when not tracing is harmless; trace_advance and
 * trace_stop when not started return TRACE_ERR_NOT_STARTED.
 * A second thread lives across the whole run (and exits after the stop) so
 * per-thread state set up while tracing is also exercised after it.
 */
#include "common.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>

/* Events that must never reach a trace (emitted while not tracing). */
static void ignored_events(uintptr_t base)
{
    trace_span_exists(base, 1, 1);
    trace_span_alloc(base + 0x10000, 2, 2);
    trace_span_free(base + 0x10000);
    trace_heap_object_exists(base + 16, 16, 0);
    trace_heap_object_alloc(base + 32, 32, 0);
    trace_heap_object_free(base + 32);
    trace_stack_exists(base + 0x20000, 4096);
    trace_stack_alloc(base + 0x30000, 8192);
    trace_stack_free(base + 0x30000);
}

static void check_not_tracing(void)
{
    CHECK(!trace_enabled());
    CHECK_EQ_U64(trace_thread_id(), 0);
    trace_thread_destroy(); /* harmless */
    CHECK_RESULT(trace_advance(), TRACE_ERR_NOT_STARTED);
    CHECK_RESULT(trace_stop(), TRACE_ERR_NOT_STARTED);
}

/* The second thread walks through phases driven by main. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int phase;      /* set by main */
static int phase_done; /* set by the thread */
static expect_log log_;

static void wait_phase(int p)
{
    pthread_mutex_lock(&mu);
    while (phase < p)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

static void finish_phase(int p)
{
    pthread_mutex_lock(&mu);
    phase_done = p;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

/* Main: move the thread to phase p and wait until it has done it. */
static void run_phase(int p)
{
    pthread_mutex_lock(&mu);
    phase = p;
    pthread_cond_broadcast(&cv);
    while (phase_done < p)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

static void *other_thread(void *arg)
{
    (void)arg;
    wait_phase(1); /* before start */
    check_not_tracing();
    ignored_events(0x710000000000);
    finish_phase(1);

    wait_phase(2); /* while tracing: these are recorded */
    CHECK(trace_enabled());
    uint64_t saved = log_.thread;
    log_.thread = trace_thread_id();
    CHECK(log_.thread >= 1 && log_.thread != saved);
    emit_heap_object_alloc(&log_, 0x720000000000, 100, 0);
    emit_stack_alloc(&log_, 0x720000100000, 65536);
    log_.thread = saved;
    finish_phase(2);

    wait_phase(3); /* after stop */
    check_not_tracing();
    ignored_events(0x730000000000);
    finish_phase(3);
    return NULL; /* exits after the stop: its thread-exit flush is a no-op */
}

static off_t file_size(const char *path)
{
    struct stat st;
    CHECK_MSG(stat(path, &st) == 0, "stat(%s): %s", path, strerror(errno));
    return st.st_size;
}

int main(void)
{
    test_begin("test_before_after", 60);

    pthread_t other;
    CHECK(pthread_create(&other, NULL, other_thread, NULL) == 0);

    /* Before start. */
    check_not_tracing();
    ignored_events(0x700000000000);
    run_phase(1);
    check_not_tracing();

    /* While tracing. */
    char path[PATH_BUF_LEN];
    test_path(path, "before_after.trace");
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = path;
    expect_init(&log_, &cfg);
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
    CHECK(trace_enabled());
    log_.thread = trace_thread_id();
    CHECK(log_.thread >= 1);
    emit_span_alloc(&log_, 0x740000000000, 4, 1);
    emit_heap_object_alloc(&log_, 0x740000000000, 48, 0);
    run_phase(2);
    emit_heap_object_free(&log_, 0x740000000000);
    emit_span_free(&log_, 0x740000000000);
    CHECK_RESULT(trace_stop(), TRACE_OK);

    /* After stop: nothing more reaches the file. */
    off_t size_at_stop = file_size(path);
    check_not_tracing();
    ignored_events(0x750000000000);
    run_phase(3);
    CHECK(pthread_join(other, NULL) == 0);
    check_not_tracing();
    CHECK_MSG(file_size(path) == size_at_stop, "the trace grew after trace_stop");

    trace_dump d;
    dump_read(path, &d);
    EXPECT_MATCH_DUMP(&log_, &d);
    dump_free(&d);
    CHECK_EQ_U64(cli_check(path), 0);

    expect_free(&log_);
    return test_pass();
}
