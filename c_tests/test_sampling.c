/*
 * Sampling mode through the C API (trace_config.sample_bytes, issue 22):
 * with a fixed seed (trace_config.sample_seed), the bytes `alloctrace top
 * --by type` estimates for each type of known size and count fall within
 * statistical bounds of the exact ones; `stats` shows the exact totals of
 * every allocation, byte and free; no free is unknown, threads that exit
 * while the main thread frees their sampled objects included; the plain
 * calls of the header's inline path sample too. A config whose
 * struct_size ends before sample_bytes records everything.
 */
#include "common.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define MEAN 65536.0
#define THREADS 4
#define PER_THREAD 5000

struct site {
    const char *name;
    uint64_t size, count, type, base;
};

static struct site sites[] = {
    {"small", 48, 100000, 0, 0x100000000},
    {"medium", 3000, 10000, 0, 0x200000000},
    {"large", 1 << 20, 20, 0, 0x300000000},
};
#define NSITES (sizeof sites / sizeof sites[0])

static uint64_t thread_type;

static void *thread_body(void *arg)
{
    uintptr_t base = (uintptr_t)arg;
    for (uint64_t i = 0; i < PER_THREAD; i++)
        trace_heap_object_alloc(base + i * 256, 256, thread_type);
    return NULL;
}

/* The "bytes" of the site whose "key" is `name` in top's JSON. */
static double site_bytes(const char *json, const char *name)
{
    char key[80];
    snprintf(key, sizeof key, "\"key\":\"%s\"", name);
    const char *at = strstr(json, key);
    CHECK_MSG(at != NULL, "no site %s in %s", name, json);
    const char *open = at;
    while (open > json && *open != '{')
        open--;
    const char *close = strchr(at, '}');
    const char *b = strstr(open, "\"bytes\":");
    CHECK(b != NULL && b < close);
    return strtod(b + 8, NULL);
}

static void run(const char *path, uint32_t struct_size)
{
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = path;
    cfg.sample_bytes = (uint64_t)MEAN;
    cfg.sample_seed = 99;
    if (struct_size)
        cfg.struct_size = struct_size;
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
    for (size_t s = 0; s < NSITES; s++) {
        for (uint64_t i = 0; i < sites[s].count; i++) {
            uintptr_t a = (uintptr_t)(sites[s].base + i * 64);
            trace_heap_object_alloc(a, sites[s].size, sites[s].type);
            if (i % 2 == 0)
                trace_heap_object_free(a);
        }
    }
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        CHECK(pthread_create(&t[i], NULL, thread_body,
                             (void *)(0x400000000 + i * PER_THREAD * 256)) == 0);
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
    /* Their threads are gone: the frees come from this one. */
    for (uintptr_t i = 0; i < THREADS * PER_THREAD; i++)
        trace_heap_object_free(0x400000000 + i * 256);
    for (size_t s = 0; s < NSITES; s++)
        for (uint64_t i = 1; i < sites[s].count; i += 2)
            trace_heap_object_free((uintptr_t)(sites[s].base + i * 64));
    CHECK_RESULT(trace_stop(), TRACE_OK);
}

int main(void)
{
    test_begin("test_sampling", 120);
    for (size_t s = 0; s < NSITES; s++)
        sites[s].type = trace_type_register(sites[s].name, strlen(sites[s].name),
                                            sites[s].size, 0);
    thread_type = trace_type_register("thread", 6, 256, 0);

    char path[PATH_BUF_LEN];
    test_path(path, "sampled.trace");
    run(path, 0);
    CHECK_EQ_U64(cli_check(path), 0);
    char *stats = cli_stats_json(path);
    uint64_t allocs = THREADS * PER_THREAD, bytes = THREADS * PER_THREAD * 256;
    for (size_t s = 0; s < NSITES; s++) {
        allocs += sites[s].count;
        bytes += sites[s].count * sites[s].size;
    }
    CHECK_EQ_U64(JSON_U64(stats, "sampled.sample_bytes"), (uint64_t)MEAN);
    CHECK_EQ_U64(JSON_U64(stats, "sampled.total_allocs"), allocs);
    CHECK_EQ_U64(JSON_U64(stats, "sampled.total_alloc_bytes"), bytes);
    CHECK_EQ_U64(JSON_U64(stats, "sampled.total_frees"), allocs);
    CHECK_EQ_U64(JSON_U64(stats, "anomaly_kinds.unknown_free"), 0);
    /* Only samples in the trace; every sampled object freed. */
    uint64_t recorded = JSON_U64(stats, "events.heap_object_alloc");
    CHECK_MSG(recorded > 100 && recorded < allocs / 20, "%" PRIu64 " recorded", recorded);
    CHECK_EQ_U64(JSON_U64(stats, "events.heap_object_free"), recorded);
    free(stats);

    char *top = NULL;
    CHECK_EQ_U64(cli_run("top", path, "--by type --json", &top), 0);
    CHECK_MSG(strstr(top, "\"sampled\":{\"estimated\":true,\"sample_bytes\":65536}") != NULL,
              "no sampled key: %s", top);
    struct site all[NSITES + 1];
    memcpy(all, sites, sizeof sites);
    all[NSITES] = (struct site){"thread", 256, THREADS * PER_THREAD, 0, 0};
    for (size_t s = 0; s < NSITES + 1; s++) {
        double size = (double)all[s].size, count = (double)all[s].count;
        double p = 1.0 - exp(-size / MEAN);
        double sd = sqrt(count * size * size * (1.0 - p) / p);
        double want = size * count, got = site_bytes(top, all[s].name);
        CHECK_MSG(fabs(got - want) <= 4.0 * sd + 1.0,
                  "%s: estimated %.0f, exact %.0f, sd %.0f", all[s].name, got, want, sd);
    }
    free(top);

    /* A caller compiled before sample_bytes existed records everything. */
    test_path(path, "old_config.trace");
    run(path, (uint32_t)offsetof(trace_config, sample_bytes));
    stats = cli_stats_json(path);
    CHECK_EQ_U64(JSON_U64(stats, "events.heap_object_alloc"), allocs);
    uint64_t unused;
    CHECK(!json_get_u64(stats, "sampled.sample_bytes", &unused));
    free(stats);
    return test_pass();
}
