/*
 * Per-thread buffers are not lost:
 *   A: a thread emits a few events and exits without calling anything; its
 *      events are in the trace (flushed at thread exit).
 *   B: a thread emits, calls trace_thread_destroy(), emits again (as a
 *      runtime freeing a dying thread's stack would), and stays alive,
 *      blocked, until after trace_stop; all its events are in the trace.
 *   C: a thread emits in generation 1, then blocks on a condition variable
 *      across two trace_advance calls; its generation-1 events are still in
 *      generation 1 and what it emits after waking is in generation 3 (its
 *      [gen % 2] buffer must not be mistaken for the old one).
 * The threads run one after another, so the dump order is known.
 */
#include "common.h"

#include <pthread.h>

static expect_log log_;

/* A one-shot signal between two threads. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool open;
} gate;
#define GATE_INIT {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false}

static void gate_open(gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void gate_wait(gate *g)
{
    pthread_mutex_lock(&g->mu);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static gate b_ready = GATE_INIT, b_release = GATE_INIT;
static gate c_ready = GATE_INIT, c_wake = GATE_INIT;
static uint64_t tid_a, tid_b1, tid_b2, tid_c;

static void *thread_a(void *arg)
{
    (void)arg;
    tid_a = trace_thread_id();
    log_.thread = tid_a;
    emit_span_alloc(&log_, 0xA0000000, 1, 1);
    emit_heap_object_alloc(&log_, 0xA0000000, 24, 0);
    emit_stack_alloc(&log_, 0xA0100000, 16384);
    return NULL; /* no trace_thread_destroy: the exit must flush */
}

static void *thread_b(void *arg)
{
    (void)arg;
    tid_b1 = trace_thread_id();
    log_.thread = tid_b1;
    emit_heap_object_alloc(&log_, 0xB0000000, 40, 0);
    emit_heap_object_free(&log_, 0xB0000000);
    emit_stack_alloc(&log_, 0xB0100000, 65536);
    trace_thread_destroy();
    /* Events after the explicit flush still count. */
    tid_b2 = trace_thread_id();
    log_.thread = tid_b2;
    emit_stack_free(&log_, 0xB0100000);
    gate_open(&b_ready);
    gate_wait(&b_release); /* alive past trace_stop */
    return NULL;
}

static void *thread_c(void *arg)
{
    (void)arg;
    tid_c = trace_thread_id();
    log_.thread = tid_c;
    emit_heap_object_alloc(&log_, 0xC0000000, 8, 0);
    emit_span_alloc(&log_, 0xC0001000, 2, 4);
    gate_open(&c_ready);
    gate_wait(&c_wake); /* blocked across two advances */
    CHECK_EQ_U64(trace_thread_id(), tid_c);
    log_.thread = tid_c;
    log_.gen = 3;
    emit_heap_object_free(&log_, 0xC0000000);
    emit_span_free(&log_, 0xC0001000);
    return NULL;
}

int main(void)
{
    test_begin("test_thread_exit_flush", 60);

    char path[PATH_BUF_LEN];
    test_path(path, "thread_exit_flush.trace");
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = path;
    expect_init(&log_, &cfg);
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
    const uint64_t tid_main = trace_thread_id();
    log_.thread = tid_main;
    emit_heap_object_alloc(&log_, 0x10000000, 16, 0);

    pthread_t a, b, c;
    CHECK(pthread_create(&a, NULL, thread_a, NULL) == 0);
    CHECK(pthread_join(a, NULL) == 0);

    CHECK(pthread_create(&b, NULL, thread_b, NULL) == 0);
    gate_wait(&b_ready);

    CHECK(pthread_create(&c, NULL, thread_c, NULL) == 0);
    gate_wait(&c_ready);

    CHECK_RESULT(trace_advance(), TRACE_OK);
    log_.thread = tid_main;
    log_.gen = 2;
    emit_heap_object_free(&log_, 0x10000000);
    CHECK_RESULT(trace_advance(), TRACE_OK);
    gate_open(&c_wake);
    CHECK(pthread_join(c, NULL) == 0);

    log_.thread = tid_main;
    log_.gen = 3;
    emit_heap_object_alloc(&log_, 0x10000040, 16, 0);
    CHECK_RESULT(trace_stop(), TRACE_OK);
    gate_open(&b_release);
    CHECK(pthread_join(b, NULL) == 0);

    CHECK(tid_main >= 1 && tid_a >= 1 && tid_b1 >= 1 && tid_b2 >= 1 && tid_c >= 1);
    CHECK(tid_a != tid_main && tid_b1 != tid_main && tid_c != tid_main);
    CHECK(tid_a != tid_b1 && tid_a != tid_c && tid_b1 != tid_c);

    trace_dump d;
    dump_read(path, &d);
    EXPECT_MATCH_DUMP(&log_, &d);
    dump_free(&d);
    CHECK_EQ_U64(cli_check(path), 0);

    expect_free(&log_);
    return test_pass();
}
