/*
 * 8 slots x 1,000,000 events, with trace_advance every millisecond from
 * another thread, and threads exiting mid-run: slots 0-3 are one long-lived
 * thread each; slots 4-7 run their share in RELAY_STEPS short-lived threads
 * in sequence, each of which exits (and gets a new trace thread id).
 *
 * Afterwards `stats --json` must account for every event of every trace
 * thread exactly: nothing lost, nothing invented, no anomaly, several
 * generations, and `check` must accept the file.
 *
 * TEST_SCALE divides the event count (the ASan build sets 10).
 */
#include "common.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SLOTS 8
#define STEADY_SLOTS 4
#define RELAY_STEPS 5
#define WORKERS (STEADY_SLOTS + (SLOTS - STEADY_SLOTS) * RELAY_STEPS)
#define EVENTS_PER_SLOT 1000000u

struct worker {
    int index;       /* unique: picks a private address region */
    uint64_t events; /* to emit, an even number (alloc/free pairs) */
    /* results, written by the worker before it exits */
    uint64_t tid;
    uint64_t emitted[EV_KIND_COUNT];
};

static struct worker workers[WORKERS];
static atomic_bool workers_done;

/* Alloc/free pairs on addresses private to this worker, so the heap stays
 * consistent (no anomaly) whatever the interleaving. Mostly heap objects,
 * with some spans and stacks so every alloc/free kind crosses generations. */
static void *worker_main(void *arg)
{
    struct worker *w = arg;
    w->tid = trace_thread_id();
    CHECK_MSG(w->tid >= 1, "worker %d: trace_thread_id() = 0 while tracing", w->index);

    const uintptr_t base = (uintptr_t)0x100000000000 + (uintptr_t)w->index * 0x10000000;
    for (uint64_t i = 0; i < w->events / 2; i++) {
        if (i % 64 == 63) {
            uintptr_t span = base + 0x8000000 + (i % 1024) * 4096 * 4;
            trace_span_alloc(span, 4, i % 7);
            trace_span_free(span);
            w->emitted[EV_SPAN_ALLOC]++;
            w->emitted[EV_SPAN_FREE]++;
        } else if (i % 256 == 5) {
            uintptr_t stack = base + 0xC000000 + (i % 64) * 65536;
            trace_stack_alloc(stack, 65536);
            trace_stack_free(stack);
            w->emitted[EV_STACK_ALLOC]++;
            w->emitted[EV_STACK_FREE]++;
        } else {
            uintptr_t obj = base + (i % 4096) * 16;
            trace_heap_object_alloc(obj, 16 + i % 48, 0);
            trace_heap_object_free(obj);
            w->emitted[EV_HEAP_OBJECT_ALLOC]++;
            w->emitted[EV_HEAP_OBJECT_FREE]++;
        }
    }
    CHECK_EQ_U64(trace_thread_id(), w->tid);
    return NULL;
}

/* Runs one relay slot: its workers one after another, each exiting before
 * the next starts. The relay thread itself emits nothing. */
static void *relay_main(void *arg)
{
    struct worker *first = arg;
    for (int step = 0; step < RELAY_STEPS; step++) {
        pthread_t t;
        CHECK(pthread_create(&t, NULL, worker_main, &first[step]) == 0);
        CHECK(pthread_join(t, NULL) == 0);
    }
    return NULL;
}

static void *advancer_main(void *arg)
{
    uint64_t *advances = arg;
    const struct timespec one_ms = {0, 1000000};
    while (!atomic_load(&workers_done)) {
        nanosleep(&one_ms, NULL);
        CHECK_RESULT(trace_advance(), TRACE_OK);
        (*advances)++;
    }
    return NULL;
}

int main(void)
{
    test_begin("test_threads_advance", 180);

    const uint64_t per_slot = EVENTS_PER_SLOT / test_scale();
    const uint64_t per_relay_step = per_slot / RELAY_STEPS;
    CHECK(per_relay_step % 2 == 0 && per_relay_step * RELAY_STEPS == per_slot);

    for (int i = 0; i < WORKERS; i++) {
        workers[i].index = i;
        workers[i].events = i < STEADY_SLOTS ? per_slot : per_relay_step;
    }

    char path[PATH_BUF_LEN];
    test_path(path, "threads_advance.trace");
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = path;
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);

    uint64_t t0 = now_ns();
    uint64_t advances = 0;
    pthread_t advancer, slots[SLOTS];
    CHECK(pthread_create(&advancer, NULL, advancer_main, &advances) == 0);
    for (int s = 0; s < SLOTS; s++) {
        if (s < STEADY_SLOTS)
            CHECK(pthread_create(&slots[s], NULL, worker_main, &workers[s]) == 0);
        else
            CHECK(pthread_create(&slots[s], NULL, relay_main,
                                 &workers[STEADY_SLOTS + (s - STEADY_SLOTS) * RELAY_STEPS]) == 0);
    }
    for (int s = 0; s < SLOTS; s++)
        CHECK(pthread_join(slots[s], NULL) == 0);
    atomic_store(&workers_done, true);
    CHECK(pthread_join(advancer, NULL) == 0);
    CHECK_RESULT(trace_stop(), TRACE_OK);
    printf("emitted %" PRIu64 " events in %.2f s with %" PRIu64 " advances\n",
           per_slot * SLOTS, (double)(now_ns() - t0) / 1e9, advances);

    /* Every thread, including each short-lived one, has its own id. */
    uint64_t total = 0, per_kind[EV_KIND_COUNT] = {0};
    for (int i = 0; i < WORKERS; i++) {
        for (int j = 0; j < i; j++)
            CHECK_MSG(workers[i].tid != workers[j].tid,
                      "workers %d and %d share trace thread id %" PRIu64, i, j, workers[i].tid);
        uint64_t sum = 0;
        for (int k = 0; k < EV_KIND_COUNT; k++) {
            sum += workers[i].emitted[k];
            per_kind[k] += workers[i].emitted[k];
        }
        CHECK_EQ_U64(sum, workers[i].events);
        total += sum;
    }
    CHECK_EQ_U64(total, per_slot * SLOTS);

    char *json = cli_stats_json(path);
    CHECK_EQ_U64(JSON_U64(json, "total_events"), total);
    CHECK_EQ_U64(JSON_U64(json, "lost_events"), 0);
    CHECK_EQ_U64(JSON_U64(json, "anomalies"), 0);
    CHECK(!JSON_BOOL(json, "truncated"));
    CHECK_EQ_U64(JSON_U64(json, "live_objects"), 0);
    CHECK_EQ_U64(JSON_U64(json, "live_bytes"), 0);
    CHECK_EQ_U64(JSON_U64(json, "threads"), WORKERS);
    uint64_t generations = JSON_U64(json, "generations");
    CHECK_MSG(generations > 1 && generations >= advances + 1,
              "generations = %" PRIu64 " after %" PRIu64 " advances", generations, advances);
    for (int k = 1; k < EV_KIND_COUNT; k++) {
        char key[64];
        snprintf(key, sizeof key, "events.%s", event_kind_name((event_kind)k));
        CHECK_MSG(JSON_U64(json, key) == per_kind[k], "stats %s = %" PRIu64 ", emitted %" PRIu64,
                  key, JSON_U64(json, key), per_kind[k]);
    }

    /* per_thread: exactly our workers, each with exactly its own count. */
    json_entry entries[WORKERS + 8];
    long n = json_get_u64_entries(json, "per_thread", entries, WORKERS + 8);
    CHECK_MSG(n == WORKERS, "per_thread has %ld entries, want %d:\n%s", n, WORKERS, json);
    for (int i = 0; i < WORKERS; i++) {
        char key[64];
        snprintf(key, sizeof key, "per_thread.%" PRIu64, workers[i].tid);
        uint64_t got;
        CHECK_MSG(json_get_u64(json, key, &got), "per_thread has no thread %" PRIu64, workers[i].tid);
        CHECK_MSG(got == workers[i].events,
                  "thread %" PRIu64 " (worker %d): stats counts %" PRIu64 " events, it emitted %" PRIu64,
                  workers[i].tid, i, got, workers[i].events);
    }
    free(json);

    CHECK_EQ_U64(cli_check(path), 0);
    return test_pass();
}
