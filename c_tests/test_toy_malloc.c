/* alloctrace-test: no-asan */
/*
 * A toy size-class allocator replaces malloc & co. in this program and calls
 * the tracer from inside malloc/free while holding its own lock, exactly as
 * a custom allocator would. The tracing library (and its writer thread)
 * allocates through this same malloc, so the test proves:
 *   - no recursion: the event path never calls malloc (a recursive entry
 *     into the allocator is detected and fails the test with a message);
 *   - no deadlock: no event call waits on something that needs malloc while
 *     the allocator lock is held (a watchdog turns a hang into a failure);
 *   - nothing lost: every traced call the allocator made while tracing was
 *     on is in the trace, per thread and per kind;
 *   - the event path does not allocate at all once a thread is warm;
 *   - the snapshot is consistent with the tracer's own threads' allocations.
 * It cannot run under ASan, whose interceptors own malloc.
 */
#include "common.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* ===================================================================== */
/* The toy allocator                                                      */
/* ===================================================================== */

/* Spans are SPAN_SIZE bytes, SPAN_SIZE-aligned, so a block's span header is
 * found by masking its address. Small classes are powers of two from 16 to
 * 8192 bytes; a block of class c is aligned to its size, which also serves
 * memalign. Bigger requests get a span of their own ("large"). */
#define TOY_PAGE 4096u
#define SPAN_SIZE 65536u
#define SPAN_PAGES (SPAN_SIZE / TOY_PAGE)
#define NCLASSES 10 /* 16 << 0 .. 16 << 9 = 8192 */
#define LARGE_CLASS 100u
#define HEADER_SIZE 1024u
#define SPAN_MAGIC 0x70795370616e2121ull

typedef struct span {
    uint64_t magic;
    struct span *next, *prev; /* every span, for the snapshot */
    uint32_t class_index;     /* LARGE_CLASS for a large span */
    uint32_t nblocks;
    size_t first_offset;      /* small: offset of block 0 */
    size_t map_len;           /* large: bytes mapped */
    size_t large_size;        /* large: usable bytes */
    uintptr_t large_user;     /* large: the user pointer */
    uint64_t live[64];        /* small: one bit per live block */
} span;
_Static_assert(sizeof(span) <= HEADER_SIZE, "span header too big");

/* Everything below is guarded by heap_lock. */
static pthread_mutex_t heap_lock = PTHREAD_MUTEX_INITIALIZER;
static void *free_list[NCLASSES];
static span all_spans = {.next = &all_spans, .prev = &all_spans};
/* Traced calls made while trace_enabled() was true, per event kind, by
 * [OURS] this program's threads and [TRACERS] the tracer's own threads
 * (which the tracer may record or leave out). */
enum { OURS = 0, TRACERS = 1 };
static uint64_t traced[2][EV_KIND_COUNT];
static uint64_t spans_mapped, large_mapped;

/* Per thread: every allocator entry, and every traced call while enabled. */
static __thread uint64_t my_alloc_calls;
static __thread uint64_t my_traced;
/* Threads this program created (main, churn, advancer) set this; any other
 * thread that calls malloc belongs to the tracer. */
static __thread bool is_our_thread;
/* Set while this thread holds heap_lock: re-entry means the tracer called
 * malloc from inside an event call made by the allocator. */
static __thread bool in_allocator;

/* Async-signal-safe and malloc-free: we may be inside malloc. */
static _Noreturn void toy_die(const char *msg)
{
    ssize_t ignored = write(2, "FAIL test_toy_malloc: ", 22);
    ignored = write(2, msg, strlen(msg));
    ignored = write(2, "\n", 1);
    (void)ignored;
    _exit(1);
}

/* Test 3 sets these around trace_start: a tracer thread entering the
 * allocator waits until tracing is on, as if the OS had not scheduled it
 * before (at most 200 ms, since a tracer that waits for its writer to be
 * ready before turning tracing on waits that long here); and the snapshot
 * starts late, as a walk of a big heap would. */
static atomic_bool hold_tracer_threads;
static atomic_uint snapshot_delay_us;

static void hold_if_tracer_thread(void)
{
    if (is_our_thread || !atomic_load(&hold_tracer_threads))
        return;
    for (int i = 0; i < 2000 && !trace_enabled(); i++)
        usleep(100);
}

static void heap_enter(void)
{
    hold_if_tracer_thread();
    my_alloc_calls++;
    if (in_allocator)
        toy_die("recursive call into malloc: the tracer allocated from inside "
                "an event call made by the allocator (while it held its lock)");
    pthread_mutex_lock(&heap_lock);
    in_allocator = true;
}

static void heap_leave(void)
{
    in_allocator = false;
    pthread_mutex_unlock(&heap_lock);
}

/* Count a traced call if tracing is on. Called with heap_lock held, just
 * before the trace_* call. */
static void note_traced(event_kind kind)
{
    if (trace_enabled()) {
        traced[is_our_thread ? OURS : TRACERS][kind]++;
        my_traced++;
    }
}

static size_t class_size(unsigned c)
{
    return (size_t)16 << c;
}

static size_t round_up(size_t x, size_t to)
{
    return (x + to - 1) & ~(to - 1);
}

/* Smallest class holding size bytes aligned to align, or NCLASSES. */
static unsigned class_for(size_t size, size_t align)
{
    size_t need = size > align ? size : align;
    for (unsigned c = 0; c < NCLASSES; c++)
        if (class_size(c) >= need)
            return c;
    return NCLASSES;
}

/* len bytes (a page multiple) at a SPAN_SIZE-aligned address. */
static void *map_aligned(size_t len)
{
    size_t total = len + SPAN_SIZE;
    char *raw = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    uintptr_t base = round_up((uintptr_t)raw, SPAN_SIZE);
    size_t head = base - (uintptr_t)raw, tail = total - head - len;
    if (head != 0)
        munmap(raw, head);
    if (tail != 0)
        munmap((char *)base + len, tail);
    return (void *)base;
}

static void link_span(span *s)
{
    s->magic = SPAN_MAGIC;
    s->next = all_spans.next;
    s->prev = &all_spans;
    all_spans.next->prev = s;
    all_spans.next = s;
}

/* Takes an address, not a pointer: it never reads the block itself. */
static span *span_of(uintptr_t addr)
{
    span *s = (span *)(addr & ~(uintptr_t)(SPAN_SIZE - 1));
    if (s->magic != SPAN_MAGIC)
        toy_die("free/realloc of a pointer this allocator does not own");
    return s;
}

static size_t block_index(const span *s, uintptr_t addr)
{
    size_t off = addr - (uintptr_t)s;
    size_t cs = class_size(s->class_index);
    if (off < s->first_offset || (off - s->first_offset) % cs != 0)
        toy_die("free of a pointer inside a block");
    return (off - s->first_offset) / cs;
}

/* New span for class c; its blocks go on the free list, lowest first. */
static bool refill(unsigned c)
{
    span *s = map_aligned(SPAN_SIZE);
    if (s == NULL)
        return false;
    memset(s, 0, sizeof *s);
    size_t cs = class_size(c);
    s->class_index = c;
    s->first_offset = round_up(HEADER_SIZE, cs);
    s->nblocks = (uint32_t)((SPAN_SIZE - s->first_offset) / cs);
    link_span(s);
    for (size_t i = s->nblocks; i-- > 0;) {
        void **block = (void **)((char *)s + s->first_offset + i * cs);
        *block = free_list[c];
        free_list[c] = block;
    }
    spans_mapped++;
    note_traced(EV_SPAN_ALLOC);
    trace_span_alloc((uintptr_t)s, SPAN_PAGES, c);
    return true;
}

static void *small_alloc(unsigned c)
{
    if (free_list[c] == NULL && !refill(c))
        return NULL;
    void **block = free_list[c];
    free_list[c] = *block;
    span *s = span_of((uintptr_t)block);
    size_t i = block_index(s, (uintptr_t)block);
    s->live[i / 64] |= (uint64_t)1 << (i % 64);
    note_traced(EV_HEAP_OBJECT_ALLOC);
    trace_heap_object_alloc((uintptr_t)block, class_size(c), 0);
    return block;
}

static void *large_alloc(size_t size, size_t align)
{
    size_t off = round_up(HEADER_SIZE, align < 16 ? 16 : align);
    if (off >= SPAN_SIZE || size > ((size_t)1 << 40))
        return NULL;
    size_t len = round_up(off + size, TOY_PAGE);
    span *s = map_aligned(len);
    if (s == NULL)
        return NULL;
    memset(s, 0, sizeof *s);
    s->class_index = LARGE_CLASS;
    s->map_len = len;
    s->large_size = len - off;
    s->large_user = (uintptr_t)s + off;
    link_span(s);
    large_mapped++;
    note_traced(EV_SPAN_ALLOC);
    trace_span_alloc((uintptr_t)s, len / TOY_PAGE, LARGE_CLASS);
    note_traced(EV_HEAP_OBJECT_ALLOC);
    trace_heap_object_alloc(s->large_user, s->large_size, 0);
    return (void *)s->large_user;
}

/* With heap_lock held. */
static void *alloc_locked(size_t size, size_t align)
{
    unsigned c = class_for(size == 0 ? 1 : size, align);
    return c < NCLASSES ? small_alloc(c) : large_alloc(size, align);
}

static void free_locked(void *p)
{
    span *s = span_of((uintptr_t)p);
    if (s->class_index == LARGE_CLASS) {
        if ((uintptr_t)p != s->large_user)
            toy_die("free of a pointer inside a large block");
        note_traced(EV_HEAP_OBJECT_FREE);
        trace_heap_object_free((uintptr_t)p);
        note_traced(EV_SPAN_FREE);
        trace_span_free((uintptr_t)s);
        s->prev->next = s->next;
        s->next->prev = s->prev;
        s->magic = 0;
        munmap(s, s->map_len);
        return;
    }
    size_t i = block_index(s, (uintptr_t)p);
    uint64_t bit = (uint64_t)1 << (i % 64);
    if ((s->live[i / 64] & bit) == 0)
        toy_die("double free");
    s->live[i / 64] &= ~bit;
    note_traced(EV_HEAP_OBJECT_FREE);
    trace_heap_object_free((uintptr_t)p);
    *(void **)p = free_list[s->class_index];
    free_list[s->class_index] = p;
}

static size_t usable_locked(const void *p)
{
    const span *s = span_of((uintptr_t)p);
    return s->class_index == LARGE_CLASS ? s->large_size : class_size(s->class_index);
}

/* The snapshot callback: every span and live block, as *_exists events.
 * Runs inside trace_start; it holds the allocator lock, so another thread's
 * malloc waits, and a malloc by the tracer on this thread is caught. */
static void toy_snapshot(void *ctx)
{
    uint64_t *snapshot_events = ctx;
    if (atomic_load(&snapshot_delay_us) != 0)
        usleep(atomic_load(&snapshot_delay_us));
    heap_enter();
    for (span *s = all_spans.next; s != &all_spans; s = s->next) {
        bool large = s->class_index == LARGE_CLASS;
        traced[OURS][EV_SPAN_EXISTS]++;
        my_traced++;
        trace_span_exists((uintptr_t)s, large ? s->map_len / TOY_PAGE : SPAN_PAGES, s->class_index);
        if (large) {
            traced[OURS][EV_HEAP_OBJECT_EXISTS]++;
            my_traced++;
            trace_heap_object_exists(s->large_user, s->large_size, 0);
            *snapshot_events += 2;
            continue;
        }
        *snapshot_events += 1;
        for (size_t i = 0; i < s->nblocks; i++) {
            if (s->live[i / 64] & ((uint64_t)1 << (i % 64))) {
                traced[OURS][EV_HEAP_OBJECT_EXISTS]++;
                my_traced++;
                trace_heap_object_exists((uintptr_t)s + s->first_offset + i * class_size(s->class_index),
                                         class_size(s->class_index), 0);
                *snapshot_events += 1;
            }
        }
    }
    heap_leave();
}

/* ---- The replaced entry points (glibc's "Replacing malloc" list) ------ */

void *malloc(size_t size)
{
    heap_enter();
    void *p = alloc_locked(size, 16);
    heap_leave();
    if (p == NULL)
        errno = ENOMEM;
    return p;
}

void free(void *p)
{
    if (p == NULL)
        return;
    heap_enter();
    free_locked(p);
    heap_leave();
}

void *calloc(size_t n, size_t size)
{
    if (size != 0 && n > SIZE_MAX / size) {
        my_alloc_calls++;
        errno = ENOMEM;
        return NULL;
    }
    /* Not malloc(): GCC folds malloc() + memset(0) into a call to calloc,
     * which here is this function (endless recursion once malloc is inlined;
     * a real allocator builds with -fno-builtin for the same reason). */
    heap_enter();
    void *p = alloc_locked(n * size, 16);
    heap_leave();
    if (p == NULL)
        errno = ENOMEM;
    else
        memset(p, 0, n * size);
    return p;
}

void *realloc(void *old, size_t size)
{
    if (old == NULL)
        return malloc(size);
    if (size == 0) {
        free(old);
        return NULL;
    }
    heap_enter();
    size_t have = usable_locked(old);
    void *p = old;
    if (size > have || size < have / 4) {
        p = alloc_locked(size, 16);
        if (p != NULL) {
            memcpy(p, old, size < have ? size : have);
            free_locked(old);
        }
    }
    heap_leave();
    if (p == NULL)
        errno = ENOMEM;
    return p;
}

static void *aligned(size_t align, size_t size)
{
    heap_enter();
    void *p = alloc_locked(size, align);
    heap_leave();
    return p;
}

int posix_memalign(void **out, size_t align, size_t size)
{
    if (align < sizeof(void *) || (align & (align - 1)) != 0) {
        my_alloc_calls++;
        return EINVAL;
    }
    void *p = aligned(align, size);
    if (p == NULL)
        return ENOMEM;
    *out = p;
    return 0;
}

void *aligned_alloc(size_t align, size_t size)
{
    if (align == 0 || (align & (align - 1)) != 0) {
        my_alloc_calls++;
        errno = EINVAL;
        return NULL;
    }
    void *p = aligned(align, size);
    if (p == NULL)
        errno = ENOMEM;
    return p;
}

void *memalign(size_t align, size_t size)
{
    return aligned_alloc(align, size);
}

void *valloc(size_t size)
{
    return aligned_alloc(TOY_PAGE, size);
}

void *pvalloc(size_t size)
{
    return aligned_alloc(TOY_PAGE, round_up(size, TOY_PAGE));
}

size_t malloc_usable_size(void *p)
{
    if (p == NULL)
        return 0;
    heap_enter();
    size_t n = usable_locked(p);
    heap_leave();
    return n;
}

static void read_traced(uint64_t out[2][EV_KIND_COUNT])
{
    heap_enter();
    memcpy(out, traced, sizeof traced);
    heap_leave();
}

/* ===================================================================== */
/* The tests                                                              */
/* ===================================================================== */

/* 1. The event path does not allocate once the thread is warm. */
static void test_event_path_does_not_allocate(void)
{
    char path[PATH_BUF_LEN];
    test_path(path, "toy_noalloc.trace");
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = path;
    cfg.buffer_size = 1u << 20; /* 10,000 events fit: no buffer hand-off */
    /* Without a snapshot, a free of a block allocated before the start
     * (the tracer's own, say) would be an unknown free for `check`. */
    uint64_t snapshot_events = 0;
    cfg.snapshot = toy_snapshot;
    cfg.snapshot_ctx = &snapshot_events;
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);

    const uintptr_t base = 0x600000000000;
    CHECK(trace_thread_id() >= 1);
    trace_heap_object_alloc(base, 16, 0); /* warm-up: thread registered */
    trace_heap_object_free(base);

    const uint64_t before = my_alloc_calls;
    for (uintptr_t i = 1; i <= 5000; i++) {
        trace_heap_object_alloc(base + i * 16, 16, 0);
        trace_heap_object_free(base + i * 16);
    }
    const uint64_t after = my_alloc_calls;
    CHECK_MSG(after == before,
              "10,000 event calls made %" PRIu64 " calls into malloc/free on the calling thread",
              after - before);
    CHECK_RESULT(trace_stop(), TRACE_OK);

    char *json = cli_stats_json(path);
    CHECK(JSON_U64(json, "events.heap_object_alloc") >= 5001);
    CHECK(JSON_U64(json, "events.heap_object_free") >= 5001);
    CHECK_EQ_U64(JSON_U64(json, "lost_events"), 0);
    free(json);
    CHECK_EQ_U64(cli_check(path), 0);
}

/* 2. Multi-threaded churn through the allocator, with advances. */
#define CHURN_THREADS 4
#define CHURN_SLOTS 64

struct churn {
    unsigned seed;
    uint64_t ops;
    uint64_t tid;    /* its trace thread id */
    uint64_t traced; /* traced calls it made while tracing was on */
};

static atomic_bool churn_done;

static uint32_t xorshift(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

/* Stamp and verify the first word so overlapping blocks would show. */
static void stamp(void *p, size_t size, uintptr_t tag)
{
    if (size >= sizeof tag)
        memcpy(p, &tag, sizeof tag);
}

static void verify(const void *p, size_t size, uintptr_t tag)
{
    uintptr_t got;
    if (size >= sizeof tag) {
        memcpy(&got, p, sizeof got);
        CHECK_MSG(got == tag, "block %p was overwritten", p);
    }
}

static void *churn_main(void *arg)
{
    struct churn *c = arg;
    static const size_t sizes[] = {1, 8, 16, 24, 40, 100, 256, 500, 1000, 3000, 8000, 9000, 20000, 70000};
    const size_t nsizes = sizeof sizes / sizeof sizes[0];
    void *slot[CHURN_SLOTS] = {0};
    size_t slot_size[CHURN_SLOTS] = {0};
    uint32_t rng = c->seed;

    is_our_thread = true;
    c->tid = trace_thread_id();
    CHECK(c->tid >= 1);
    for (uint64_t op = 0; op < c->ops; op++) {
        uint32_t r = xorshift(&rng);
        size_t i = r % CHURN_SLOTS;
        size_t size = sizes[(r >> 8) % nsizes];
        if (size >= 9000 && (r >> 16) % 8 != 0)
            size = 512; /* keep mmap-backed large blocks occasional */
        if (slot[i] != NULL) {
            verify(slot[i], slot_size[i], (uintptr_t)slot[i]);
            if ((r >> 20) % 4 == 0) {
                void *p = realloc(slot[i], size);
                CHECK(p != NULL);
                slot[i] = p;
                slot_size[i] = size;
                stamp(p, size, (uintptr_t)p);
                continue;
            }
            free(slot[i]);
            slot[i] = NULL;
            continue;
        }
        void *p = NULL;
        switch ((r >> 24) % 4) {
        case 0: p = malloc(size); break;
        case 1: p = calloc(1, size); if (p != NULL && size >= 8) CHECK(*(char *)p == 0); break;
        case 2: CHECK(posix_memalign(&p, 128, size) == 0); CHECK((uintptr_t)p % 128 == 0); break;
        case 3: p = aligned_alloc(64, round_up(size, 64)); CHECK((uintptr_t)p % 64 == 0); break;
        }
        CHECK(p != NULL);
        stamp(p, size, (uintptr_t)p);
        slot[i] = p;
        slot_size[i] = size;
    }
    for (size_t i = 0; i < CHURN_SLOTS; i++)
        free(slot[i]);
    c->traced = my_traced;
    return NULL;
}

static void *advancer_main(void *arg)
{
    uint64_t *advances = arg;
    const struct timespec one_ms = {0, 1000000};
    is_our_thread = true;
    while (!atomic_load(&churn_done)) {
        nanosleep(&one_ms, NULL);
        CHECK_RESULT(trace_advance(), TRACE_OK);
        (*advances)++;
    }
    return NULL;
}

static void test_churn(void)
{
    /* Some live blocks from before the start, for the snapshot. */
    void *early[16];
    for (int i = 0; i < 16; i++)
        early[i] = malloc((size_t)1 << (i % 15));

    char path[PATH_BUF_LEN];
    test_path(path, "toy_churn.trace");
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = path;
    cfg.buffer_size = 4096; /* small: many hand-offs to the writer */
    uint64_t snapshot_events = 0;
    cfg.snapshot = toy_snapshot;
    cfg.snapshot_ctx = &snapshot_events;

    /* The counters run across sessions: count from here. */
    uint64_t counts_before[2][EV_KIND_COUNT];
    read_traced(counts_before);
    const uint64_t main_traced_before = my_traced;
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
    CHECK_MSG(snapshot_events >= 16 + 1, "snapshot emitted only %" PRIu64 " events", snapshot_events);
    const uint64_t main_tid = trace_thread_id();
    CHECK(main_tid >= 1);

    const uint64_t ops = 200000 / test_scale();
    struct churn churn[CHURN_THREADS];
    pthread_t threads[CHURN_THREADS], advancer;
    uint64_t advances = 0;
    atomic_store(&churn_done, false);
    CHECK(pthread_create(&advancer, NULL, advancer_main, &advances) == 0);
    for (int t = 0; t < CHURN_THREADS; t++) {
        churn[t] = (struct churn){.seed = 0x9e3779b9u * (unsigned)(t + 1), .ops = ops};
        CHECK(pthread_create(&threads[t], NULL, churn_main, &churn[t]) == 0);
    }
    for (int t = 0; t < CHURN_THREADS; t++)
        CHECK(pthread_join(threads[t], NULL) == 0);
    atomic_store(&churn_done, true);
    CHECK(pthread_join(advancer, NULL) == 0);
    for (int i = 0; i < 8; i++)
        free(early[i]); /* frees of snapshot objects */
    const uint64_t main_traced = my_traced - main_traced_before;
    CHECK_RESULT(trace_stop(), TRACE_OK);

    uint64_t counts[2][EV_KIND_COUNT], total[2] = {0, 0};
    read_traced(counts);
    for (int who = OURS; who <= TRACERS; who++) {
        for (int k = 1; k < EV_KIND_COUNT; k++) {
            counts[who][k] -= counts_before[who][k];
            total[who] += counts[who][k];
        }
    }
    printf("churn: %" PRIu64 " traced calls (+%" PRIu64 " from tracer threads), %" PRIu64
           " snapshot events, %" PRIu64 " advances, %" PRIu64 " spans, %" PRIu64 " large\n",
           total[OURS], total[TRACERS], snapshot_events, advances, spans_mapped, large_mapped);

    char *json = cli_stats_json(path);
    /* Each churn thread and the main thread: exactly their own calls. */
    for (int t = 0; t < CHURN_THREADS; t++) {
        char key[64];
        snprintf(key, sizeof key, "per_thread.%" PRIu64, churn[t].tid);
        CHECK_MSG(JSON_U64(json, key) == churn[t].traced,
                  "churn thread %d (trace thread %" PRIu64 "): trace has %" PRIu64
                  " events, the allocator made %" PRIu64 " traced calls",
                  t, churn[t].tid, JSON_U64(json, key), churn[t].traced);
    }
    char key[64];
    snprintf(key, sizeof key, "per_thread.%" PRIu64, main_tid);
    CHECK_MSG(JSON_U64(json, key) == main_traced,
              "main thread: trace has %" PRIu64 " events, it made %" PRIu64 " traced calls",
              JSON_U64(json, key), main_traced);
    /* Every thread together, per kind: all of our threads' calls, and
     * those of the tracer's own threads or not, as it chooses. */
    for (int k = 1; k < EV_KIND_COUNT; k++) {
        snprintf(key, sizeof key, "events.%s", event_kind_name((event_kind)k));
        uint64_t got = JSON_U64(json, key);
        CHECK_MSG(got >= counts[OURS][k] && got <= counts[OURS][k] + counts[TRACERS][k],
                  "stats %s = %" PRIu64 ", but while tracing our threads made %" PRIu64
                  " such calls and the tracer's threads %" PRIu64,
                  key, got, counts[OURS][k], counts[TRACERS][k]);
    }
    uint64_t got_total = JSON_U64(json, "total_events");
    CHECK_MSG(got_total >= total[OURS] && got_total <= total[OURS] + total[TRACERS],
              "total_events = %" PRIu64 ", our threads made %" PRIu64
              " traced calls, the tracer's threads %" PRIu64,
              got_total, total[OURS], total[TRACERS]);
    CHECK_EQ_U64(JSON_U64(json, "lost_events"), 0);
    CHECK(!JSON_BOOL(json, "truncated"));
    CHECK(JSON_U64(json, "generations") > 1);
    CHECK_MSG(JSON_U64(json, "anomalies") == 0, "%" PRIu64 " anomalies: %s",
              JSON_U64(json, "anomalies"), json);
    free(json);
    CHECK_EQ_U64(cli_check(path), 0);

    for (int i = 8; i < 16; i++)
        free(early[i]);
}

/* 3. The snapshot stays consistent with what the tracer's own threads do
 * while trace_start runs. The writer thread frees and allocates (Rust's
 * thread start-up) as it starts; if the OS runs it only once tracing is on
 * and before the snapshot walks the heap, its free is of an object the
 * trace has not seen yet, and the snapshot then reports its new object a
 * second time: `check` finds an unknown free and a double alloc. Under load
 * this happened by chance (about 1 run in 100, before the writer thread was
 * made internal before tracing turns on); here it is forced. */
static void test_snapshot_vs_tracer_threads(void)
{
    char path[PATH_BUF_LEN];
    test_path(path, "toy_snapshot_race.trace");
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = path;
    uint64_t snapshot_events = 0;
    cfg.snapshot = toy_snapshot;
    cfg.snapshot_ctx = &snapshot_events;

    atomic_store(&hold_tracer_threads, true);
    atomic_store(&snapshot_delay_us, 50000);
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
    atomic_store(&hold_tracer_threads, false);
    atomic_store(&snapshot_delay_us, 0);
    void *volatile p = malloc(100); /* volatile: the pair must not be elided */
    free(p);
    CHECK_RESULT(trace_stop(), TRACE_OK);

    char *json = cli_stats_json(path);
    CHECK_MSG(JSON_U64(json, "anomalies") == 0,
              "a tracer thread's allocator calls made after tracing was on but before the "
              "snapshot conflict with it: %s", json);
    free(json);
    CHECK_EQ_U64(cli_check(path), 0);
}

int main(void)
{
    test_begin("test_toy_malloc", 120);
    is_our_thread = true;

    /* Sanity: this program's malloc really is the toy. */
    void *p = malloc(100);
    CHECK(p != NULL && span_of((uintptr_t)p)->class_index == class_for(100, 16));
    free(p);

    test_event_path_does_not_allocate();
    test_churn();
    test_snapshot_vs_tracer_threads();
    return test_pass();
}
