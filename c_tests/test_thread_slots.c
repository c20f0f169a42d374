/*
 * A full slot table (16384 slots, thread.rs): the main thread and 16388 live
 * threads each record two events; 16383 of those threads get a slot and
 * the last 5 find none, so exactly their 10 events are counted lost (a
 * claim on a full table checks slots whose thread may be gone, and must
 * never take a live thread's). Then those threads end, and 4100 more, 100
 * at a time, reuse the slots of the dead ones: nothing more is lost, and
 * the trace has one thread ID per thread that had a slot.
 */
/* alloctrace-test: no-asan (16388 threads at once) */
#include "common.h"

#include <pthread.h>
#include <stdlib.h>

#define MAX_SLOTS 16384
#define LIVE (MAX_SLOTS + 4)
#define LATER 4100
#define BATCH 100

static pthread_barrier_t all_recorded;
static const uintptr_t M = 0x10000000u;

static void record_two(uintptr_t i)
{
    trace_heap_object_alloc(M + 16 * i, 16, 0);
    trace_heap_object_free(M + 16 * i);
}

static void *live_thread(void *arg)
{
    record_two((uintptr_t)arg);
    /* Stay alive until every thread has recorded. */
    pthread_barrier_wait(&all_recorded);
    return NULL;
}

static void *later_thread(void *arg)
{
    record_two((uintptr_t)arg);
    return NULL;
}

int main(void)
{
    test_begin("test_thread_slots", 300);
    char path[PATH_BUF_LEN];
    test_path(path, "thread_slots.trace");
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = path;
    cfg.min_heap_align = 16;
    cfg.buffer_size = 4096;
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
    record_two(0);

    pthread_attr_t attr;
    CHECK(pthread_attr_init(&attr) == 0);
    CHECK(pthread_attr_setstacksize(&attr, 64 << 10) == 0);
    static pthread_t threads[LIVE];
    CHECK(pthread_barrier_init(&all_recorded, NULL, LIVE + 1) == 0);
    for (uintptr_t i = 0; i < LIVE; i++)
        CHECK_MSG(pthread_create(&threads[i], &attr, live_thread, (void *)(i + 1)) == 0,
                  "pthread_create of live thread %zu", (size_t)i);
    pthread_barrier_wait(&all_recorded);
    for (size_t i = 0; i < LIVE; i++) CHECK(pthread_join(threads[i], NULL) == 0);

    for (uintptr_t done = 0; done < LATER; done += BATCH) {
        for (uintptr_t i = 0; i < BATCH; i++)
            CHECK(pthread_create(&threads[i], &attr, later_thread, (void *)(LIVE + 1 + done + i)) == 0);
        for (size_t i = 0; i < BATCH; i++) CHECK(pthread_join(threads[i], NULL) == 0);
    }
    CHECK_RESULT(trace_stop(), TRACE_OK);

    char *json = cli_stats_json(path);
    const uint64_t slotless = LIVE - (MAX_SLOTS - 1);
    CHECK_EQ_U64(JSON_U64(json, "lost_events"), 2 * slotless);
    CHECK_EQ_U64(JSON_U64(json, "threads"), 1 + (MAX_SLOTS - 1) + LATER);
    free(json);
    CHECK_EQ_U64(cli_check(path), 0);
    pthread_attr_destroy(&attr);
    return test_pass();
}
