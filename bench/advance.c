/*
 * Generation advance under load (issue 5, item 7).
 *
 *   advance TRACE_PATH [EMITTERS [MILLISECONDS [INTERVAL_MS]]]
 *
 * EMITTERS threads emit heap object alloc/free events as fast as they can
 * and time every event call with rdtsc. The main thread calls trace_advance
 * every INTERVAL_MS and times each call.
 *
 * An event "overlaps an advance" when an advance was in progress at any
 * point of it (the main thread bumps a sequence number, odd while it is in
 * trace_advance). For every event longer than SLOW_NS the emitter asks the
 * kernel (getrusage RUSAGE_THREAD) what happened to the thread since it
 * last asked: an involuntary switch (the scheduler preempted it: on a
 * 2-core machine with more runnable threads than cores; note that a
 * sched_yield that switches counts here too), a voluntary switch (it slept
 * or waited: blocked), or page faults. Reported, in microseconds:
 *   worst_adv_us         the longest event overlapping an advance
 *   worst_adv_nosw_us    the same among events without any context switch:
 *                        the latency the tracer itself causes
 *   worst_adv_clean_us   ... and without page faults either
 *   worst_idle_*         the same with no advance in progress
 *   blocked_adv, preempted_adv, faulted_adv: slow events (over SLOW_NS)
 *                        overlapping an advance, by cause
 */
#include "alloctrace.h"
#include "bench.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <unistd.h>

#define MAX_EMITTERS 8
#define MAX_ADVANCES 100000
#define RING 4096
#define HEAP_BASE ((uintptr_t)0x7f3a00000000ull)
#define SLOW_NS 5000

static _Atomic uint64_t advance_seq; /* odd while an advance runs */
static _Atomic bool stop;
static double tpn;                   /* ticks per ns */

struct emitter {
    int index;
    uint64_t events;
    uint64_t worst[2];           /* [overlaps an advance] */
    uint64_t worst_nosw[2];      /* the same, no context switch */
    uint64_t worst_clean[2];     /* no context switch, no page fault */
    uint64_t blocked[2];         /* voluntary switches */
    uint64_t preempted[2];       /* involuntary switches */
    uint64_t faulted[2];         /* page faults, no switch */
    uint64_t slow[2];            /* events over SLOW_NS */
    uint64_t over50[2];          /* over 50 us without a context switch */
    long vol, invol, flt;        /* the counters when last read */
    pthread_barrier_t *barrier;
};

/* Reads the thread's switch and fault counters; returns which moved. */
enum { SW_VOL = 1, SW_INVOL = 2, FAULT = 4 };
static int thread_events(struct emitter *e) {
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    int what = (ru.ru_nvcsw != e->vol ? SW_VOL : 0) | (ru.ru_nivcsw != e->invol ? SW_INVOL : 0) |
               (ru.ru_minflt + ru.ru_majflt != e->flt ? FAULT : 0);
    e->vol = ru.ru_nvcsw;
    e->invol = ru.ru_nivcsw;
    e->flt = ru.ru_minflt + ru.ru_majflt;
    return what;
}

/* One event call, timed; classifies it if slow. */
static inline void account(struct emitter *e, uint64_t t0, uint64_t t1, uint64_t seq0) {
    uint64_t seq1 = atomic_load_explicit(&advance_seq, memory_order_relaxed);
    int adv = (seq0 & 1) || seq1 != seq0;
    uint64_t d = t1 - t0;
    if (d > e->worst[adv])
        e->worst[adv] = d;
    if (d < (uint64_t)(SLOW_NS * tpn)) {
        if (d > e->worst_nosw[adv])
            e->worst_nosw[adv] = d;
        if (d > e->worst_clean[adv])
            e->worst_clean[adv] = d;
        return;
    }
    e->slow[adv]++;
    int what = thread_events(e);
    if (what & SW_VOL)
        e->blocked[adv]++;
    if (what & SW_INVOL)
        e->preempted[adv]++;
    if (what & (SW_VOL | SW_INVOL))
        return;
    if (d > e->worst_nosw[adv])
        e->worst_nosw[adv] = d;
    if (d > (uint64_t)(50000 * tpn))
        e->over50[adv]++;
    if (what & FAULT)
        e->faulted[adv]++;
    else if (d > e->worst_clean[adv])
        e->worst_clean[adv] = d;
}

static void *emit(void *arg) {
    struct emitter *e = arg;
    uintptr_t base = HEAP_BASE + (uintptr_t)e->index * RING * 64;
    pthread_barrier_wait(e->barrier);
    thread_events(e);
    uint64_t n = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        for (int i = 0; i < RING; i++) {
            uintptr_t a = base + (uintptr_t)i * 64;
            uint64_t seq = atomic_load_explicit(&advance_seq, memory_order_relaxed);
            uint64_t t0 = ticks();
            trace_heap_object_alloc(a, 64, 0);
            uint64_t t1 = ticks();
            account(e, t0, t1, seq);
            seq = atomic_load_explicit(&advance_seq, memory_order_relaxed);
            t0 = ticks();
            trace_heap_object_free(a);
            t1 = ticks();
            account(e, t0, t1, seq);
        }
        n += 2 * RING;
    }
    e->events = n;
    return NULL;
}

static uint64_t advance_ns[MAX_ADVANCES];

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: advance TRACE_PATH [EMITTERS [MILLISECONDS [INTERVAL_MS]]]\n");
        return 2;
    }
    int emitters = (int)arg_long(argc, argv, 2, 2);
    long ms = arg_long(argc, argv, 3, 1000);
    long interval_ms = arg_long(argc, argv, 4, 5);
    if (emitters < 1 || emitters > MAX_EMITTERS || ms < 1 || interval_ms < 1) {
        fprintf(stderr, "advance: bad arguments\n");
        return 2;
    }
    tpn = ticks_per_ns(20);

    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = argv[1];
    cfg.min_heap_addr = HEAP_BASE;
    cfg.min_heap_align = 16;
    trace_result r = trace_start(&cfg);
    if (r != TRACE_OK) {
        fprintf(stderr, "trace_start: %s: %s\n", trace_result_str(r), trace_last_error_detail());
        return 1;
    }

    pthread_t t[MAX_EMITTERS];
    struct emitter e[MAX_EMITTERS];
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)emitters + 1);
    for (int i = 0; i < emitters; i++) {
        e[i] = (struct emitter){.index = i, .barrier = &barrier};
        if (pthread_create(&t[i], NULL, emit, &e[i]) != 0) {
            perror("pthread_create");
            return 1;
        }
    }
    pthread_barrier_wait(&barrier);
    usleep(20000); /* let the emitters reach full speed */

    uint64_t start = mono_ns(), end = start + (uint64_t)ms * 1000000u;
    int n = 0;
    while (mono_ns() < end && n < MAX_ADVANCES) {
        usleep((useconds_t)interval_ms * 1000);
        atomic_fetch_add(&advance_seq, 1);
        uint64_t a0 = mono_ns();
        r = trace_advance();
        uint64_t a1 = mono_ns();
        atomic_fetch_add(&advance_seq, 1);
        if (r != TRACE_OK) {
            fprintf(stderr, "trace_advance: %s\n", trace_result_str(r));
            return 1;
        }
        advance_ns[n++] = a1 - a0;
    }
    atomic_store(&stop, true);
    uint64_t events = 0, worst[2] = {0, 0}, worst_nosw[2] = {0, 0}, worst_clean[2] = {0, 0};
    uint64_t blocked[2] = {0, 0}, preempted[2] = {0, 0}, faulted[2] = {0, 0}, slow[2] = {0, 0};
    uint64_t over50[2] = {0, 0};
    for (int i = 0; i < emitters; i++) {
        pthread_join(t[i], NULL);
        events += e[i].events;
        for (int k = 0; k < 2; k++) {
            if (e[i].worst[k] > worst[k])
                worst[k] = e[i].worst[k];
            if (e[i].worst_nosw[k] > worst_nosw[k])
                worst_nosw[k] = e[i].worst_nosw[k];
            if (e[i].worst_clean[k] > worst_clean[k])
                worst_clean[k] = e[i].worst_clean[k];
            faulted[k] += e[i].faulted[k];
            over50[k] += e[i].over50[k];
            blocked[k] += e[i].blocked[k];
            preempted[k] += e[i].preempted[k];
            slow[k] += e[i].slow[k];
        }
    }
    double elapsed_s = (double)(mono_ns() - start) / 1e9;
    r = trace_stop();
    if (r != TRACE_OK) {
        fprintf(stderr, "trace_stop: %s\n", trace_result_str(r));
        return 1;
    }

    double advancing_s = 0;
    for (int i = 0; i < n; i++)
        advancing_s += (double)advance_ns[i] / 1e9;
    qsort(advance_ns, (size_t)n, sizeof advance_ns[0], cmp_u64);
    double us = 1.0 / (tpn * 1000.0);
    json_begin();
    json_num("emitters", emitters);
    json_num("advances", n);
    json_num("advance_median_us", n ? (double)advance_ns[n / 2] / 1000.0 : 0);
    json_num("advance_p99_us", n ? (double)advance_ns[(size_t)(n * 0.99)] / 1000.0 : 0);
    json_num("advance_max_us", n ? (double)advance_ns[n - 1] / 1000.0 : 0);
    json_num("events", (double)events);
    json_num("events_per_s_per_thread", (double)events / elapsed_s / emitters);
    json_num("worst_adv_us", (double)worst[1] * us);
    json_num("worst_adv_nosw_us", (double)worst_nosw[1] * us);
    json_num("worst_adv_clean_us", (double)worst_clean[1] * us);
    json_num("worst_idle_us", (double)worst[0] * us);
    json_num("worst_idle_nosw_us", (double)worst_nosw[0] * us);
    json_num("worst_idle_clean_us", (double)worst_clean[0] * us);
    json_num("slow_adv", (double)slow[1]);
    json_num("blocked_adv", (double)blocked[1]);
    json_num("preempted_adv", (double)preempted[1]);
    json_num("faulted_adv", (double)faulted[1]);
    json_num("faulted_idle", (double)faulted[0]);
    json_num("blocked_idle", (double)blocked[0]);
    json_num("preempted_idle", (double)preempted[0]);
    /* Events over 50 us without a switch, per second of each kind of time
     * (per emitter): if advances caused them, the first would be higher. */
    json_num("over50_adv", (double)over50[1]);
    json_num("over50_idle", (double)over50[0]);
    json_num("over50_adv_per_s", advancing_s > 0 ? (double)over50[1] / advancing_s / emitters : 0);
    json_num("over50_idle_per_s", (double)over50[0] / (elapsed_s - advancing_s) / emitters);
    json_num("advancing_s", advancing_s);
    json_num("ticks_per_ns", tpn);
    json_end();
    return 0;
}
