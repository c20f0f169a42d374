/*
 * demo.c: a tiny "runtime" that reports its memory to alloctrace.
 *
 * The runtime owns one arena. It hands out spans (runs of pages) and thread
 * stacks from it, and each thread bump-allocates objects of one type from
 * its current span. Every step calls the matching trace_* function.
 *
 *   make demo                      (or: cc -Iinclude examples/demo.c
 *                                    -Ltarget/release -lalloctrace -lpthread)
 *   ./demo out.trace && alloctrace stats out.trace
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS and pthread_attr_setstack under -std=c11 */

#include "alloctrace.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define PAGE 4096u
#define ARENA_SIZE (16u << 20)
#define STACK_SIZE (256u << 10) /* a power of two: recorded in short form */
#define WORKERS 3
#define OBJECTS_PER_WORKER 200

static char *arena;              /* all of the runtime's memory */
static atomic_size_t arena_used; /* bump pointer into it, in bytes */

/* Untraced: raw pages, which the caller reports as a span or a stack. */
static char *arena_take(size_t npages)
{
    size_t offset = atomic_fetch_add(&arena_used, npages * PAGE);
    if (offset + npages * PAGE > ARENA_SIZE) {
        fputs("demo: arena exhausted\n", stderr);
        exit(1);
    }
    return arena + offset;
}

/* A heap hands out objects of one size and type from its current span. */
struct heap {
    char *span, *next;
    uint64_t size, type;
};

static void *object_alloc(struct heap *h)
{
    if (h->span == NULL || h->next + h->size > h->span + PAGE) {
        h->span = h->next = arena_take(1);
        trace_span_alloc((uintptr_t)h->span, 1, h->size); /* class: the object size */
    }
    void *obj = h->next;
    h->next += h->size;
    trace_heap_object_alloc((uintptr_t)obj, h->size, h->type);
    return obj;
}

static void object_free(void *obj)
{
    trace_heap_object_free((uintptr_t)obj); /* a real runtime would reuse it */
}

/* Called inside trace_start: report what was live before tracing began, so
 * the trace knows the whole heap (the *_exists events). */
static void snapshot(void *ctx)
{
    const struct heap *h = ctx;
    trace_span_exists((uintptr_t)h->span, 1, h->size);
    for (const char *p = h->span; p < h->next; p += h->size)
        trace_heap_object_exists((uintptr_t)p, h->size, h->type);
}

struct worker {
    pthread_t thread;
    char *stack;
    struct heap heap;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    void *objects[OBJECTS_PER_WORKER];
    for (int i = 0; i < OBJECTS_PER_WORKER; i++)
        objects[i] = object_alloc(&w->heap);
    for (int i = 0; i < OBJECTS_PER_WORKER; i += 2)
        object_free(objects[i]); /* free half; the rest stays live */
    return NULL; /* the thread's buffered events are flushed as it exits */
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "demo.trace";
    arena = mmap(NULL, ARENA_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (arena == MAP_FAILED) {
        perror("demo: mmap");
        return 1;
    }

    /* Types are registered once, at runtime start-up. */
    uint64_t point = trace_type_register("point", 5, 16, 0);
    uint64_t node = trace_type_register("node", 4, 32, 16); /* two pointers */
    uint64_t buffer = trace_type_register("buffer", 6, 256, 0);

    /* Some objects exist before tracing starts: these calls do nothing. */
    struct heap early = {.size = 32, .type = node};
    void *config[10];
    for (int i = 0; i < 10; i++)
        config[i] = object_alloc(&early);

    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = path;
    cfg.min_heap_addr = (uintptr_t)arena; /* IDs count from the arena's base */
    cfg.min_heap_align = 16;              /* every object size is a multiple */
    cfg.snapshot = snapshot;
    cfg.snapshot_ctx = &early;
    trace_result r = trace_start(&cfg);
    if (r != TRACE_OK) {
        fprintf(stderr, "demo: trace_start: %s: %s\n", trace_result_str(r), trace_last_error_detail());
        return 1;
    }

    /* Threads run on stacks from the arena, reported as stacks. */
    struct worker workers[WORKERS];
    const uint64_t types[WORKERS] = {point, node, buffer};
    const uint64_t sizes[WORKERS] = {16, 32, 256};
    for (int i = 0; i < WORKERS; i++) {
        workers[i] = (struct worker){.heap = {.size = sizes[i], .type = types[i]}};
        workers[i].stack = arena_take(STACK_SIZE / PAGE);
        trace_stack_alloc((uintptr_t)workers[i].stack, STACK_SIZE);
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstack(&attr, workers[i].stack, STACK_SIZE);
        if (pthread_create(&workers[i].thread, &attr, worker_main, &workers[i]) != 0) {
            fputs("demo: pthread_create failed\n", stderr);
            return 1;
        }
        pthread_attr_destroy(&attr);
    }
    for (int i = 0; i < WORKERS; i++) {
        pthread_join(workers[i].thread, NULL);
        trace_stack_free((uintptr_t)workers[i].stack);
    }

    /* A long-running program advances every so often; each generation can
     * be read on its own. */
    trace_advance();
    for (int i = 0; i < 5; i++)
        object_free(config[i]); /* objects from the snapshot die too */

    r = trace_stop();
    if (r != TRACE_OK) {
        fprintf(stderr, "demo: trace_stop: %s: %s\n", trace_result_str(r), trace_last_error_detail());
        return 1;
    }
    printf("demo: wrote %s; try: alloctrace stats %s\n", path, path);
    return 0;
}
