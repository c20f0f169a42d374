/*
 * The header's inline event path and the library write the same bytes.
 *
 * One list of events (every event kind and address class, short form with
 * small and large ID deltas of both signs and multi-byte arguments, and
 * long-form ones the inline path must hand to the library; type IDs 0, as
 * no type is registered; allocations with a call stack, which the inline
 * path records only once the generation has marked the stack, and so
 * also across a trace_advance) is recorded
 * twice, in two traces: once through the inline path (alloctrace_*_ of
 * include/alloctrace_inline.h, which must record each short-form event
 * itself) and once through the library's functions, called as
 * (trace_heap_object_alloc)(...) (the Rust encoder, crates/writer/src/
 * event/emit.rs with crates/format's short_form and encode_event). The test
 * reads both files' compact events batches and compares every event byte
 * for byte, except the time delta, which is the clock's. With the precise
 * and the coarse clock. Where the inline path is off (not x86-64 Linux
 * with GCC/Clang, or no membarrier) there is nothing to compare: it says so.
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define M UINT64_C(0x10000000)

#if ALLOCTRACE_INLINE

enum {
    SPAN_EXISTS,
    SPAN_ALLOC,
    SPAN_FREE,
    HEAP_EXISTS,
    HEAP_ALLOC,
    HEAP_FREE,
    STACK_EXISTS,
    STACK_ALLOC,
    STACK_FREE,
    HEAP_ALLOC_STACK,
    SPAN_ALLOC_STACK,
    ADVANCE /* not an event: trace_advance() */
};

/* The call stacks of the _STACK events: registered anew by each run, so
 * that no generation has marked them yet. */
enum { NO_STACK, OUTER, INNER /* OUTER's frames under one more */, BEYOND_TABLE /* an ID past the table */ };
static uint64_t stack_ids[4];

struct ev {
    int kind;
    uint64_t addr, a1, a2;
    int long_form; /* the inline path must hand it to the library */
    int stack;     /* of the _STACK kinds: a stack_ids index */
};

static const struct ev events[] = {
    {SPAN_EXISTS, M, 4, 7, 0, NO_STACK},
    {SPAN_ALLOC, M + 8192, 2, 3, 0, NO_STACK},
    {SPAN_ALLOC, M + (UINT64_C(1) << 40), UINT64_C(1) << 20, UINT64_C(0xffffffffffff), 0, NO_STACK},
    {SPAN_FREE, M + 8192, 0, 0, 0, NO_STACK},
    {SPAN_EXISTS, M + 100, 1, 1, 1, NO_STACK}, /* off the page grid */
    {SPAN_FREE, M, 0, 0, 0, NO_STACK},
    {HEAP_EXISTS, M + 16, 48, 0, 0, NO_STACK},
    {HEAP_ALLOC, M + 0x100000, UINT64_C(1) << 33, 0, 0, NO_STACK},
    {HEAP_ALLOC, M + 32, 0, 0, 0, NO_STACK},
    {HEAP_ALLOC, M + 1, 8, 0, 1, NO_STACK},  /* off the alignment */
    {HEAP_ALLOC, M - 16, 8, 0, 1, NO_STACK}, /* below min_heap_addr */
    {HEAP_FREE, M + 16, 0, 0, 0, NO_STACK},
    {HEAP_FREE, M + 0x100000, 0, 0, 0, NO_STACK},
    {HEAP_ALLOC, UINT64_MAX - 15, UINT64_MAX, 0, 0, NO_STACK},
    {HEAP_FREE, UINT64_MAX - 15, 0, 0, 0, NO_STACK},
    {STACK_EXISTS, M + 0x7000, 8192, 0, 0, NO_STACK},
    {STACK_ALLOC, M + 0x20000000, UINT64_C(1) << 20, 0, 0, NO_STACK},
    {STACK_ALLOC, M + 4096, UINT64_C(1) << 63, 0, 0, NO_STACK},
    {STACK_ALLOC, M + 8192, 3000, 0, 1, NO_STACK}, /* not a power of two */
    {STACK_ALLOC, M + 0x40000, 0, 0, 1, NO_STACK},
    {STACK_FREE, M + 0x7000, 0, 0, 0, NO_STACK},
    {STACK_FREE, M + 4096, 0, 0, 0, NO_STACK},
    {HEAP_EXISTS, M + 48, 24, 0, 0, NO_STACK},
    /* A stack's first event in a generation goes to the library, which
     * marks the stack; the next ones, of either kind, are inline. */
    {HEAP_ALLOC_STACK, M + 0x300000, 24, 0, 1, OUTER},
    {HEAP_ALLOC_STACK, M + 0x300040, 300, 0, 0, OUTER},
    {SPAN_ALLOC_STACK, M + 0x30000, 4, 0, 0, OUTER},
    {SPAN_ALLOC_STACK, M + 0x50000, 1, 0, 1, INNER}, /* its callers marked, not itself */
    {HEAP_ALLOC_STACK, M + 0x300080, 8, 0, 0, INNER},
    {HEAP_ALLOC_STACK, M + 0x3000c0, 8, 0, 1, NO_STACK},     /* the library writes a plain allocation */
    {HEAP_ALLOC_STACK, M + 0x300100, 8, 0, 1, BEYOND_TABLE}, /* likewise, and counts a lost stack */
    {HEAP_ALLOC_STACK, M + 0x300147, 8, 0, 1, OUTER},          /* off the alignment */
    {ADVANCE, 0, 0, 0, 0, 0},
    {HEAP_ALLOC_STACK, M + 0x300180, 16, 0, 1, OUTER}, /* a new generation marks anew */
    {HEAP_ALLOC_STACK, M + 0x3001c0, 16, 0, 0, OUTER},
    {HEAP_FREE, M + 0x3001c0, 0, 0, 0, NO_STACK},
};
#define N_EVENTS (sizeof events / sizeof events[0])

/* Through the header's inline path: returns 1 when it called the library. */
static int inline_event(trace_writer *w, const struct ev *e)
{
    switch (e->kind) {
    case SPAN_EXISTS: return alloctrace_span_exists_(w, e->addr, e->a1, e->a2);
    case SPAN_ALLOC: return alloctrace_span_alloc_(w, e->addr, e->a1, e->a2);
    case SPAN_FREE: return alloctrace_span_free_(w, e->addr);
    case HEAP_EXISTS: return alloctrace_heap_object_exists_(w, e->addr, e->a1, e->a2);
    case HEAP_ALLOC: return alloctrace_heap_object_alloc_(w, e->addr, e->a1, e->a2);
    case HEAP_FREE: return alloctrace_heap_object_free_(w, e->addr);
    case STACK_EXISTS: return alloctrace_stack_exists_(w, e->addr, e->a1);
    case STACK_ALLOC: return alloctrace_stack_alloc_(w, e->addr, e->a1);
    case HEAP_ALLOC_STACK: return alloctrace_heap_object_alloc_stack_(w, e->addr, e->a1, e->a2, stack_ids[e->stack]);
    case SPAN_ALLOC_STACK: return alloctrace_span_alloc_stack_(w, e->addr, e->a1, e->a2, stack_ids[e->stack]);
    default: return alloctrace_stack_free_(w, e->addr);
    }
}

/* Through the library's exported functions. */
static void library_event(const struct ev *e)
{
    switch (e->kind) {
    case SPAN_EXISTS: (trace_span_exists)(e->addr, e->a1, e->a2); break;
    case SPAN_ALLOC: (trace_span_alloc)(e->addr, e->a1, e->a2); break;
    case SPAN_FREE: (trace_span_free)(e->addr); break;
    case HEAP_EXISTS: (trace_heap_object_exists)(e->addr, e->a1, e->a2); break;
    case HEAP_ALLOC: (trace_heap_object_alloc)(e->addr, e->a1, e->a2); break;
    case HEAP_FREE: (trace_heap_object_free)(e->addr); break;
    case STACK_EXISTS: (trace_stack_exists)(e->addr, e->a1); break;
    case STACK_ALLOC: (trace_stack_alloc)(e->addr, e->a1); break;
    case HEAP_ALLOC_STACK: (trace_heap_object_alloc_stack)(e->addr, e->a1, e->a2, stack_ids[e->stack]); break;
    case SPAN_ALLOC_STACK: (trace_span_alloc_stack)(e->addr, e->a1, e->a2, stack_ids[e->stack]); break;
    default: (trace_stack_free)(e->addr); break;
    }
}

/* Skips one varint at buf[*pos..len); fails the test past the end. */
static size_t varint_end(const uint8_t *buf, size_t pos, size_t len)
{
    while (pos < len && (buf[pos] & 0x80))
        pos++;
    CHECK_MSG(pos < len, "a varint runs past its batch");
    return pos + 1;
}

/* Arguments per event kind, from docs/FORMAT.md section 3 (this test's own
 * copy, not the generated header's: it is what both sides are checked by). */
static const int format_args[13] = {0, 3, 3, 1, 3, 3, 1, 2, 2, 1, 1, 4, 4};

/* The events of `path`'s compact events batches without their time deltas,
 * concatenated into out; returns their bytes and counts events in *count. */
static size_t event_bytes(const char *path, uint8_t *out, size_t cap, size_t *count)
{
    FILE *f = fopen(path, "rb");
    CHECK_MSG(f != NULL, "cannot open %s", path);
    static uint8_t buf[1 << 20];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    CHECK(len > 16 && len < sizeof buf && memcmp(buf, "ALCTRACE", 8) == 0);
    unsigned version = buf[8] | buf[9] << 8;
    size_t trailer = version >= 2 ? 4 : 0;
    size_t n = 0, pos = 16;
    *count = 0;
    while (pos < len) {
        CHECK_MSG(pos + 5 <= len, "batch prefix cut at %zu", pos);
        uint8_t kind = buf[pos];
        size_t plen = (size_t)buf[pos + 1] | (size_t)buf[pos + 2] << 8 | (size_t)buf[pos + 3] << 16 |
                      (size_t)buf[pos + 4] << 24;
        size_t p = pos + 5, end = p + plen;
        CHECK_MSG(end + trailer <= len, "batch at %zu runs past the file", pos);
        CHECK_MSG(kind != 1 && kind != 8 && kind != 9, "batch kind %u at %zu: not what the writer writes", kind,
                  pos);
        if (kind == 7) { /* compact events */
            for (int i = 0; i < 3; i++) /* generation, thread, base time */
                p = varint_end(buf, p, end);
            while (p < end) {
                uint8_t k = buf[p];
                unsigned base = k & 0x3f;
                CHECK_MSG(base >= 1 && base <= 12, "event kind byte 0x%02x at %zu", k, p);
                CHECK(n < cap);
                out[n++] = k;
                p = varint_end(buf, p + 1, end); /* the time delta: the clock's */
                int args = format_args[base] + ((k & 0x40) != 0);
                for (int i = 0; i < args; i++) {
                    size_t q = varint_end(buf, p, end);
                    CHECK(n + (q - p) <= cap);
                    memcpy(out + n, buf + p, q - p);
                    n += q - p;
                    p = q;
                }
                ++*count;
            }
        }
        pos = end + trailer;
    }
    return n;
}

static trace_config config(const char *path, trace_clock clock)
{
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = path;
    cfg.min_heap_addr = M;
    cfg.page_size = 4096;
    cfg.min_heap_align = 16;
    cfg.min_stack_align = 4096;
    cfg.clock = clock;
    return cfg;
}

/* Returns 0 when the inline path is off in this session (nothing compared). */
static int run(trace_clock clock, const char *name)
{
    char inline_path[PATH_BUF_LEN], library_path[PATH_BUF_LEN];
    char file[64];
    snprintf(file, sizeof file, "%s_inline.trace", name);
    test_path(inline_path, file);
    snprintf(file, sizeof file, "%s_library.trace", name);
    test_path(library_path, file);

    uint64_t outer_frame = trace_frame_register(name, strlen(name), "outer.c", 7, 1);
    uint64_t inner_frame = trace_frame_register(name, strlen(name), "inner.c", 7, 2);
    uint64_t frames[2] = {inner_frame, outer_frame};
    stack_ids[OUTER] = trace_stack_register(frames + 1, 1);
    stack_ids[INNER] = trace_stack_register(frames, 2);
    stack_ids[BEYOND_TABLE] = UINT64_C(1) << 32;
    CHECK(stack_ids[OUTER] != 0 && stack_ids[INNER] != 0 && stack_ids[INNER] != stack_ids[OUTER]);

    trace_config cfg = config(inline_path, clock);
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
    if (__atomic_load_n(&alloctrace_inline_v2->inline_mode, __ATOMIC_RELAXED) == 0) {
        CHECK_RESULT(trace_stop(), TRACE_OK);
        return 0;
    }
    trace_writer *w = trace_writer_get();
    CHECK(w != NULL);
    (trace_heap_object_alloc)(M, 16, 0); /* maps the batch (out of line) in both traces */
    size_t n_events = 1;
    for (size_t i = 0; i < N_EVENTS; i++) {
        if (events[i].kind == ADVANCE) {
            CHECK_RESULT(trace_advance(), TRACE_OK);
            (trace_heap_object_alloc)(M + 0x400000, 16, 0); /* maps the new generation's batch */
            n_events++;
            continue;
        }
        n_events++;
        int called = inline_event(w, &events[i]);
        CHECK_MSG(called == events[i].long_form, "event %zu: the inline path %s", i,
                  called ? "called the library" : "recorded a long-form event");
    }
    CHECK_RESULT(trace_stop(), TRACE_OK);

    cfg = config(library_path, clock);
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
    (trace_heap_object_alloc)(M, 16, 0);
    for (size_t i = 0; i < N_EVENTS; i++) {
        if (events[i].kind == ADVANCE) {
            CHECK_RESULT(trace_advance(), TRACE_OK);
            (trace_heap_object_alloc)(M + 0x400000, 16, 0);
        } else {
            library_event(&events[i]);
        }
    }
    CHECK_RESULT(trace_stop(), TRACE_OK);

    CHECK_EQ_U64(cli_check(inline_path), 0);
    CHECK_EQ_U64(cli_check(library_path), 0);

    static uint8_t a[1 << 16], b[1 << 16];
    size_t na_events, nb_events;
    size_t na = event_bytes(inline_path, a, sizeof a, &na_events);
    size_t nb = event_bytes(library_path, b, sizeof b, &nb_events);
    CHECK_EQ_U64(na_events, n_events);
    CHECK_EQ_U64(nb_events, n_events);
    CHECK_EQ_U64(na, nb);
    for (size_t i = 0; i < na; i++)
        CHECK_MSG(a[i] == b[i], "%s clock: byte %zu of the events (time deltas left out): inline 0x%02x, library 0x%02x",
                  name, i, a[i], b[i]);
    return 1;
}

int main(void)
{
    test_begin("test_inline_encoding", 60);
    int compared = run(TRACE_CLOCK_PRECISE, "precise");
    compared += run(TRACE_CLOCK_COARSE, "coarse");
    if (compared == 0)
        printf("test_inline_encoding: the inline path is off here (no membarrier): nothing to compare\n");
    return test_pass();
}

#else /* !ALLOCTRACE_INLINE */

int main(void)
{
    test_begin("test_inline_encoding", 60);
    printf("test_inline_encoding: no inline path on this platform: nothing to compare\n");
    return test_pass();
}

#endif
