/*
 * Every event kind and the type table, from one thread, read back through
 * `alloctrace dump` and compared field by field, in order.
 *
 * The config uses a non-zero min_heap_addr and non-default page size and
 * alignments, so IDs really are compressed and restored; odd arguments
 * (unaligned, below min_heap_addr, a stack size that is not a power of two)
 * must come back exact and marked ` long`.
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define M 0x10000000u /* min_heap_addr */
#define PAGE 8192u
#define HEAP_ALIGN 16u
#define STACK_ALIGN 2048u

struct snapshot_state {
    expect_log *log;
    uint64_t type_id;
    int calls;
};

/* Called inside trace_start: the "heap" that already exists. Registering a
 * type here is what a runtime that discovers types while walking its heap
 * would do. */
static void snapshot(void *ctx)
{
    struct snapshot_state *st = ctx;
    st->calls++;
    st->type_id = trace_type_register("preexisting", 11, 48, 8);
    emit_span_exists(st->log, M, 4, 7);
    emit_heap_object_exists(st->log, M + 3 * HEAP_ALIGN, 48, st->type_id);
    emit_heap_object_exists(st->log, M + 5 * HEAP_ALIGN + 4, 12, 0); /* unaligned: long */
    emit_stack_exists(st->log, M + 10 * STACK_ALIGN, 8192);
    emit_stack_exists(st->log, M + 11 * STACK_ALIGN, 12345); /* not a power of two: long */
    emit_span_exists(st->log, 0x3000, 1, 0); /* below min_heap_addr: long */
}

struct want_type {
    uint64_t id, size, ptr_bytes;
    const char *name;
};

/* The dump's type table of generation gen must be exactly want[0..n). */
static void check_types(const trace_dump *d, uint64_t gen, const struct want_type *want, size_t n)
{
    size_t seen = 0;
    for (size_t i = 0; i < d->ntypes; i++) {
        const trace_type *t = &d->types[i];
        if (t->gen != gen)
            continue;
        seen++;
        size_t j = 0;
        while (j < n && want[j].id != t->id)
            j++;
        CHECK_MSG(j < n, "gen %" PRIu64 " has unexpected type id %" PRIu64 " (%s)",
                  gen, t->id, t->name);
        CHECK_EQ_U64(t->size, want[j].size);
        CHECK_EQ_U64(t->ptr_bytes, want[j].ptr_bytes);
        CHECK_MSG(strcmp(t->name, want[j].name) == 0, "type %" PRIu64 ": name=%s, want %s",
                  t->id, t->name, want[j].name);
    }
    CHECK_MSG(seen == n, "gen %" PRIu64 " type table has %zu entries, want %zu", gen, seen, n);
}

int main(void)
{
    test_begin("test_events_single", 60);

    char path[PATH_BUF_LEN];
    test_path(path, "events_single.trace");

    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = path;
    cfg.min_heap_addr = M;
    cfg.page_size = PAGE;
    cfg.min_heap_align = HEAP_ALIGN;
    cfg.min_stack_align = STACK_ALIGN;

    expect_log log;
    expect_init(&log, &cfg);
    struct snapshot_state snap = {.log = &log};
    cfg.snapshot = snapshot;
    cfg.snapshot_ctx = &snap;

    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
    CHECK(trace_enabled());
    CHECK_EQ_U64(snap.calls, 1);
    CHECK_MSG(snap.type_id >= 1, "trace_type_register inside the snapshot returned 0");

    uint64_t tid = trace_thread_id();
    CHECK(tid >= 1);
    CHECK_EQ_U64(trace_thread_id(), tid); /* stable for the thread */
    /* The snapshot ran on this thread, inside trace_start. */
    for (size_t i = 0; i < log.n; i++)
        log.events[i].thread = tid;
    log.thread = tid;

    /* name_len is honoured: the name is not NUL-terminated at 4. */
    uint64_t node = trace_type_register("node_extra", 4, 32, 16);
    uint64_t blob = trace_type_register("blob", 4, 4096, 0);
    CHECK(node >= 1 && blob >= 1);
    CHECK(node != blob && node != snap.type_id && blob != snap.type_id);

    /* Plain short-form events of every kind. */
    uintptr_t span = M + 16 * PAGE;
    emit_span_alloc(&log, span, 2, 3);
    emit_heap_object_alloc(&log, span, 32, node);
    emit_heap_object_alloc(&log, span + 32, 4096, blob);
    emit_heap_object_alloc(&log, M, 16, 0); /* ID 0, no type */
    emit_heap_object_free(&log, span);
    emit_stack_alloc(&log, M + 100 * STACK_ALIGN, 8192);
    emit_stack_free(&log, M + 100 * STACK_ALIGN);
    emit_span_free(&log, span);
    emit_heap_object_free(&log, M + 3 * HEAP_ALIGN); /* free of a snapshot object */
    emit_stack_free(&log, M + 10 * STACK_ALIGN);

    /* Odd arguments: recorded exactly, in long form. */
    emit_heap_object_alloc(&log, M + 5 * HEAP_ALIGN + 8, 24, node); /* unaligned */
    emit_heap_object_free(&log, M + 5 * HEAP_ALIGN + 8);
    emit_heap_object_alloc(&log, 0x1000, 64, 0); /* below min_heap_addr */
    emit_heap_object_free(&log, 0x1000);
    emit_stack_alloc(&log, M + 200 * STACK_ALIGN, 12345); /* size not a power of two */
    emit_stack_free(&log, M + 200 * STACK_ALIGN);          /* ...but its address is fine */
    emit_stack_alloc(&log, 0x2000, 4096);                  /* below min_heap_addr */
    emit_stack_free(&log, 0x2000);
    emit_stack_alloc(&log, M + 7 * STACK_ALIGN + 512, 4096); /* unaligned stack */
    emit_stack_free(&log, M + 7 * STACK_ALIGN + 512);
    emit_span_alloc(&log, M + 100, 1, 0); /* unaligned span */
    emit_span_free(&log, M + 100);
    emit_span_alloc(&log, 0x4000, 3, 1); /* below min_heap_addr */
    emit_span_free(&log, 0x4000);

    /* Wide values: multi-byte varints must survive. */
    emit_span_alloc(&log, M + (uintptr_t)0x1000000 * PAGE, (uintptr_t)1 << 40, 0xdeadbeefcafeULL);
    emit_heap_object_alloc(&log, 0x7ffffffff000, (uint64_t)1 << 40, blob);
    emit_heap_object_free(&log, 0x7ffffffff000);
    emit_stack_alloc(&log, M + 300 * STACK_ALIGN, (uintptr_t)1 << 63);
    emit_stack_free(&log, M + 300 * STACK_ALIGN);
    emit_span_free(&log, M + (uintptr_t)0x1000000 * PAGE);

    /* Generation 2: the type table is repeated, plus the new type. */
    CHECK_RESULT(trace_advance(), TRACE_OK);
    log.gen = 2;
    uint64_t late = trace_type_register("late type", 9, 8, 8);
    CHECK(late >= 1 && late != node && late != blob && late != snap.type_id);
    emit_heap_object_alloc(&log, M + 1000 * HEAP_ALIGN, 8, late);
    emit_heap_object_free(&log, span + 32); /* allocated in generation 1 */
    emit_span_alloc(&log, M + 40 * PAGE, 1, 2);
    emit_stack_alloc(&log, M + 400 * STACK_ALIGN, 65536);
    emit_heap_object_alloc(&log, M + 2000 * HEAP_ALIGN + 2, 3, late); /* long in gen 2 too */

    CHECK_RESULT(trace_stop(), TRACE_OK);
    CHECK(!trace_enabled());

    trace_dump d;
    dump_read(path, &d);
    EXPECT_MATCH_DUMP(&log, &d);

    const struct want_type gen1[] = {
        {snap.type_id, 48, 8, "preexisting"},
        {node, 32, 16, "node"},
        {blob, 4096, 0, "blob"},
    };
    const struct want_type gen2[] = {
        {snap.type_id, 48, 8, "preexisting"},
        {node, 32, 16, "node"},
        {blob, 4096, 0, "blob"},
        {late, 8, 8, "late type"},
    };
    check_types(&d, 1, gen1, 3);
    check_types(&d, 2, gen2, 4);
    CHECK_EQ_U64(d.ntypes, 7);

    /* The per-kind counts of `stats` agree with the dump. */
    char *json = cli_stats_json(path);
    uint64_t per_kind[EV_KIND_COUNT] = {0};
    for (size_t i = 0; i < log.n; i++)
        per_kind[log.events[i].kind]++;
    for (int k = 1; k < EV_KIND_COUNT; k++) {
        char key[64];
        snprintf(key, sizeof key, "events.%s", event_kind_name((event_kind)k));
        CHECK_MSG(JSON_U64(json, key) == per_kind[k], "stats %s = %" PRIu64 ", emitted %" PRIu64,
                  key, JSON_U64(json, key), per_kind[k]);
    }
    CHECK_EQ_U64(JSON_U64(json, "total_events"), log.n);
    CHECK_EQ_U64(JSON_U64(json, "generations"), 2);
    CHECK_EQ_U64(JSON_U64(json, "threads"), 1);
    CHECK_EQ_U64(JSON_U64(json, "lost_events"), 0);
    CHECK(!JSON_BOOL(json, "truncated"));
    free(json);

    CHECK_EQ_U64(cli_check(path), 0);

    dump_free(&d);
    expect_free(&log);
    return test_pass();
}
