/*
 * The page tracer end to end: 8 slots drive trace_page_alloc, _free and
 * _scav with small (1-16 pages) and large (1024-4096 pages) runs at
 * page-aligned bases, with trace_advance every millisecond from another
 * thread. Slots 0-3 are one long-lived thread each; slots 4-7 run their
 * share in short-lived threads in sequence, each of which exits mid-run.
 *
 * Two phases, separated by a barrier of all slots, make the peak exact
 * whatever the interleaving:
 *   1. grow: every slot only allocates (and scavenges pages it never
 *      allocated), so the pages in use only grow: the peak is their sum at
 *      the barrier;
 *   2. churn: a slot frees a run, scavenges it, and may allocate a run no
 *      larger at the same base, so no slot ever has more in use than at
 *      the barrier.
 * Slots use disjoint address regions, so nothing is an anomaly.
 *
 * Checked: `dump` gives back every page event with its exact base, npages,
 * kind and thread (trace_thread_id()), in each thread's order, never long
 * form, times never going back; `pages --json` has the pages in use, peak,
 * largest run and totals the program computed, and no anomaly; `stats
 * --json` counts each page event kind; `check` accepts the file.
 *
 * TEST_SCALE divides the run counts (the ASan build sets 10).
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
#define RELAY_STEPS 4 /* threads per phase in a relay slot */
#define GROW_RUNS 3000u
#define CHURN_OPS 6000u
#define PAGE_SIZE 4096u
#define REGION_BYTES ((uintptr_t)1 << 38) /* per slot; 8 slots stay below 2^48 */

/* One thread's page events, as it emitted them. */
struct thread_log {
    uint64_t tid;
    trace_event *events;
    size_t n, cap;
    size_t next; /* matching cursor while reading the dump */
    uint64_t last_gen, last_time;
};

struct run {
    uintptr_t base;
    uint64_t npages;
    bool live;
};

struct slot {
    int index;
    uint64_t seed;
    uint64_t grow_runs, churn_ops; /* this slot's share */
    struct run *runs;              /* every run it allocated in phase 1 */
    size_t nruns;
    uintptr_t next_base;           /* bump pointer in the slot's region */
    uint64_t in_use, in_use_at_barrier, largest_run;
    uint64_t totals[3][2];         /* alloc/free/scav x events/pages */
    struct thread_log *logs;       /* one per thread that ran the slot */
    int nlogs;
};

static struct slot slots[SLOTS];
static pthread_barrier_t phase_barrier;
static atomic_bool workers_done;

static uint64_t next_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* The calling thread's log: a steady slot's thread keeps one for both
 * phases; each thread of a relay slot gets its own. */
static struct thread_log *log_begin(struct slot *sl)
{
    uint64_t tid = trace_thread_id();
    CHECK_MSG(tid >= 1, "slot %d: trace_thread_id() = 0 while tracing", sl->index);
    if (sl->nlogs > 0 && sl->logs[sl->nlogs - 1].tid == tid)
        return &sl->logs[sl->nlogs - 1];
    struct thread_log *l = &sl->logs[sl->nlogs++];
    memset(l, 0, sizeof *l);
    l->tid = tid;
    return l;
}

static void emit(struct slot *sl, struct thread_log *l, event_kind kind, uintptr_t base,
                 uint64_t npages)
{
    switch (kind) {
    case EV_PAGE_ALLOC: trace_page_alloc(base, (uintptr_t)npages); break;
    case EV_PAGE_FREE: trace_page_free(base, (uintptr_t)npages); break;
    default: trace_page_scav(base, (uintptr_t)npages); break;
    }
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 1024;
        l->events = realloc(l->events, l->cap * sizeof *l->events);
        CHECK(l->events != NULL);
    }
    trace_event *ev = &l->events[l->n++];
    memset(ev, 0, sizeof *ev);
    ev->kind = kind;
    ev->addr = base;
    ev->npages = npages;
    ev->thread = l->tid;
    int k = kind - EV_PAGE_ALLOC;
    sl->totals[k][0]++;
    sl->totals[k][1] += npages;
}

static uint64_t random_npages(struct slot *sl)
{
    uint64_t r = next_rand(&sl->seed);
    return r % 4 == 0 ? 1024 + (r >> 8) % 3073 : 1 + (r >> 8) % 16;
}

/* Phase 1: `count` allocations at fresh bases, and scavenges of pages
 * never allocated (the gap left before some runs). */
static void grow(struct slot *sl, uint64_t count)
{
    struct thread_log *l = log_begin(sl);
    for (uint64_t i = 0; i < count; i++) {
        uint64_t npages = random_npages(sl);
        if (next_rand(&sl->seed) % 8 == 0) {
            emit(sl, l, EV_PAGE_SCAV, sl->next_base, 3); /* a gap: never allocated */
            sl->next_base += 3 * PAGE_SIZE;
        }
        struct run *r = &sl->runs[sl->nruns++];
        *r = (struct run){sl->next_base, npages, true};
        sl->next_base += npages * PAGE_SIZE;
        CHECK(sl->next_base - ((uintptr_t)(sl->index + 1) * REGION_BYTES) < REGION_BYTES);
        emit(sl, l, EV_PAGE_ALLOC, r->base, npages);
        sl->in_use += npages;
        if (npages > sl->largest_run)
            sl->largest_run = npages;
    }
    CHECK_EQ_U64(trace_thread_id(), l->tid);
}

/* Phase 2: free a live run, scavenge it, and maybe allocate a run no
 * larger at its base; or allocate again a freed run no larger. */
static void churn(struct slot *sl, uint64_t count)
{
    struct thread_log *l = log_begin(sl);
    for (uint64_t i = 0; i < count; i++) {
        struct run *r = &sl->runs[next_rand(&sl->seed) % sl->nruns];
        if (r->live) {
            emit(sl, l, EV_PAGE_FREE, r->base, r->npages);
            emit(sl, l, EV_PAGE_SCAV, r->base, r->npages);
            sl->in_use -= r->npages;
            r->live = false;
        } else {
            /* The run's original size bounds it: never above the barrier. */
            uint64_t npages = 1 + next_rand(&sl->seed) % r->npages;
            emit(sl, l, EV_PAGE_ALLOC, r->base, npages);
            sl->in_use += npages;
            r->npages = npages;
            r->live = true;
        }
        CHECK(sl->in_use <= sl->in_use_at_barrier);
    }
    CHECK_EQ_U64(trace_thread_id(), l->tid);
}

struct step {
    struct slot *sl;
    bool grow;
    uint64_t count;
};

static void *step_main(void *arg)
{
    struct step *st = arg;
    if (st->grow)
        grow(st->sl, st->count);
    else
        churn(st->sl, st->count);
    return NULL; /* exits: its buffers must be flushed */
}

/* Runs a phase of a relay slot in RELAY_STEPS threads, one after another. */
static void relay_phase(struct slot *sl, bool is_grow, uint64_t total)
{
    for (int s = 0; s < RELAY_STEPS; s++) {
        struct step st = {sl, is_grow, total / RELAY_STEPS + (s == 0 ? total % RELAY_STEPS : 0)};
        pthread_t t;
        CHECK(pthread_create(&t, NULL, step_main, &st) == 0);
        CHECK(pthread_join(t, NULL) == 0);
    }
}

static void *slot_main(void *arg)
{
    struct slot *sl = arg;
    bool relay = sl->index >= STEADY_SLOTS;
    if (relay)
        relay_phase(sl, true, sl->grow_runs);
    else
        grow(sl, sl->grow_runs);
    sl->in_use_at_barrier = sl->in_use;
    int rc = pthread_barrier_wait(&phase_barrier);
    CHECK(rc == 0 || rc == PTHREAD_BARRIER_SERIAL_THREAD);
    if (relay)
        relay_phase(sl, false, sl->churn_ops);
    else
        churn(sl, sl->churn_ops);
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

static struct thread_log *log_of(uint64_t tid)
{
    for (int s = 0; s < SLOTS; s++)
        for (int i = 0; i < slots[s].nlogs; i++)
            if (slots[s].logs[i].tid == tid)
                return &slots[s].logs[i];
    return NULL;
}

int main(void)
{
    test_begin("test_pages", 180);

    const uint64_t grow_runs = GROW_RUNS / test_scale(), churn_ops = CHURN_OPS / test_scale();
    for (int s = 0; s < SLOTS; s++) {
        struct slot *sl = &slots[s];
        sl->index = s;
        sl->seed = 0x9e3779b97f4a7c15u * (uint64_t)(s + 1);
        sl->grow_runs = grow_runs;
        sl->churn_ops = churn_ops;
        sl->runs = calloc(grow_runs, sizeof *sl->runs);
        sl->logs = calloc(2 * RELAY_STEPS, sizeof *sl->logs);
        CHECK(sl->runs != NULL && sl->logs != NULL);
        sl->next_base = (uintptr_t)(s + 1) * REGION_BYTES;
    }
    CHECK(pthread_barrier_init(&phase_barrier, NULL, SLOTS) == 0);

    char path[PATH_BUF_LEN];
    test_path(path, "pages.trace");
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = path;
    CHECK_EQ_U64(cfg.page_size, PAGE_SIZE);
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);

    uint64_t advances = 0;
    pthread_t advancer, threads[SLOTS];
    CHECK(pthread_create(&advancer, NULL, advancer_main, &advances) == 0);
    for (int s = 0; s < SLOTS; s++)
        CHECK(pthread_create(&threads[s], NULL, slot_main, &slots[s]) == 0);
    for (int s = 0; s < SLOTS; s++)
        CHECK(pthread_join(threads[s], NULL) == 0);
    atomic_store(&workers_done, true);
    CHECK(pthread_join(advancer, NULL) == 0);
    CHECK_RESULT(trace_stop(), TRACE_OK);
    pthread_barrier_destroy(&phase_barrier);

    /* What the program computed. */
    uint64_t in_use = 0, peak = 0, largest = 0, totals[3][2] = {{0}}, nevents = 0;
    int nthreads = 0;
    for (int s = 0; s < SLOTS; s++) {
        struct slot *sl = &slots[s];
        in_use += sl->in_use;
        peak += sl->in_use_at_barrier;
        if (sl->largest_run > largest)
            largest = sl->largest_run;
        for (int k = 0; k < 3; k++)
            for (int j = 0; j < 2; j++)
                totals[k][j] += sl->totals[k][j];
        for (int i = 0; i < sl->nlogs; i++)
            nevents += sl->logs[i].n;
        nthreads += sl->nlogs;
    }
    CHECK(largest >= 1024 && peak > in_use);
    printf("%" PRIu64 " page events from %d threads, %" PRIu64 " advances; peak %" PRIu64
           " pages, %" PRIu64 " in use at the end\n",
           nevents, nthreads, advances, peak, in_use);

    /* Every thread has its own trace thread id: the first log with it is
     * its own. */
    for (int s = 0; s < SLOTS; s++)
        for (int i = 0; i < slots[s].nlogs; i++)
            CHECK_MSG(log_of(slots[s].logs[i].tid) == &slots[s].logs[i],
                      "trace thread id %" PRIu64 " used by two threads", slots[s].logs[i].tid);

    /* The dump: each event is the next one its thread emitted. */
    trace_dump dump;
    dump_read(path, &dump);
    CHECK_EQ_U64(dump.nevents, nevents);
    char wbuf[256], gbuf[256];
    for (size_t i = 0; i < dump.nevents; i++) {
        const trace_event *got = &dump.events[i];
        struct thread_log *l = log_of(got->thread);
        event_format(got, gbuf, sizeof gbuf);
        CHECK_MSG(l != NULL, "dump event #%zu of an unknown thread: %s", i, gbuf);
        CHECK_MSG(l->next < l->n, "dump event #%zu: thread %" PRIu64 " emitted only %zu: %s",
                  i, l->tid, l->n, gbuf);
        const trace_event *want = &l->events[l->next++];
        event_format(want, wbuf, sizeof wbuf);
        CHECK_MSG(got->kind == want->kind && got->addr == want->addr &&
                      got->npages == want->npages && !got->long_form &&
                      got->entry[0] == '\0',
                  "dump event #%zu is not thread %" PRIu64 "'s next (#%zu)\n"
                  "  emitted: %s\n  dumped:  %s", i, l->tid, l->next - 1, wbuf, gbuf);
        /* Time never goes back for a thread: generations in order, and
         * times in order within one. */
        CHECK_MSG(got->gen > l->last_gen || (got->gen == l->last_gen && got->time_ns >= l->last_time),
                  "dump event #%zu: thread %" PRIu64 " goes back in time: %s", i, l->tid, gbuf);
        l->last_gen = got->gen;
        l->last_time = got->time_ns;
    }
    uint64_t max_gen = dump.nevents ? dump.events[dump.nevents - 1].gen : 0;
    CHECK_MSG(max_gen > 1, "only %" PRIu64 " generation(s) with page events", max_gen);
    dump_free(&dump);

    /* `pages --json`: the program's numbers. */
    char *json = NULL;
    int code = cli_run("pages", path, "--json", &json);
    CHECK_MSG(code == 0, "`alloctrace pages %s --json` exited %d:\n%s", path, code, json);
    CHECK_EQ_U64(JSON_U64(json, "anomalies"), 0);
    CHECK_EQ_U64(JSON_U64(json, "pages_in_use"), in_use);
    CHECK_EQ_U64(JSON_U64(json, "peak_pages_in_use"), peak);
    CHECK_EQ_U64(JSON_U64(json, "largest_run"), largest);
    CHECK_EQ_U64(JSON_U64(json, "page_size"), PAGE_SIZE);
    CHECK_EQ_U64(JSON_U64(json, "bytes_in_use"), in_use * PAGE_SIZE);
    CHECK(!JSON_BOOL(json, "truncated"));
    static const char *const names[3] = {"page_alloc", "page_free", "page_scav"};
    for (int k = 0; k < 3; k++) {
        char key[64];
        snprintf(key, sizeof key, "%s.events", names[k]);
        CHECK_MSG(JSON_U64(json, key) == totals[k][0], "pages %s = %" PRIu64 ", emitted %" PRIu64,
                  key, JSON_U64(json, key), totals[k][0]);
        snprintf(key, sizeof key, "%s.pages", names[k]);
        CHECK_MSG(JSON_U64(json, key) == totals[k][1], "pages %s = %" PRIu64 ", emitted %" PRIu64,
                  key, JSON_U64(json, key), totals[k][1]);
    }
    free(json);

    /* `stats --json`: page events counted per kind, nothing else. */
    json = cli_stats_json(path);
    CHECK_EQ_U64(JSON_U64(json, "total_events"), nevents);
    CHECK_EQ_U64(JSON_U64(json, "lost_events"), 0);
    CHECK_EQ_U64(JSON_U64(json, "anomalies"), 0);
    CHECK_EQ_U64(JSON_U64(json, "page_anomalies"), 0);
    CHECK_EQ_U64(JSON_U64(json, "threads"), (uint64_t)nthreads);
    for (int k = EV_PAGE_ALLOC; k <= EV_PAGE_SCAV; k++) {
        char key[64];
        snprintf(key, sizeof key, "events.%s", event_kind_name((event_kind)k));
        CHECK_MSG(JSON_U64(json, key) == totals[k - EV_PAGE_ALLOC][0],
                  "stats %s = %" PRIu64 ", emitted %" PRIu64, key, JSON_U64(json, key),
                  totals[k - EV_PAGE_ALLOC][0]);
    }
    free(json);

    CHECK_EQ_U64(cli_check(path), 0);
    for (int s = 0; s < SLOTS; s++) {
        for (int i = 0; i < slots[s].nlogs; i++)
            free(slots[s].logs[i].events);
        free(slots[s].logs);
        free(slots[s].runs);
    }
    return test_pass();
}
