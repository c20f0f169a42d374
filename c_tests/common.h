/*
 * Shared helpers for the C tests: failure reporting, temp paths, running the
 * alloctrace CLI, reading its `dump` and `stats --json` output, and an
 * "expectation log" that records what a test emitted so it can be compared
 * with what the reader sees, field by field.
 *
 * Every test is a standalone program linked with common.c. It runs with
 *   ALLOCTRACE_CLI  absolute path of the alloctrace binary
 *   TEST_TMPDIR     a fresh directory for its traces
 *   TEST_SCALE      optional divisor for the big loops (the ASan build sets 10)
 * and exits 0 after printing "PASS test_name".
 */
#ifndef ALLOCTRACE_C_TESTS_COMMON_H
#define ALLOCTRACE_C_TESTS_COMMON_H

#include "alloctrace.h"

/* Built with -DTEST_WRITER (the c-test-writer suite), every event call of
 * the tests goes through the inline writer path instead, with a handle each
 * thread gets once and keeps: after trace_thread_destroy or in a thread the
 * handle did not come from, the calls must notice and fall back. */
#ifdef TEST_WRITER
static inline trace_writer *test_writer(void)
{
    static _Thread_local trace_writer *w;
    if (w == NULL)
        w = trace_writer_get();
    return w;
}
#undef trace_span_exists
#undef trace_span_alloc
#undef trace_span_free
#undef trace_heap_object_exists
#undef trace_heap_object_alloc
#undef trace_heap_object_free
#undef trace_stack_exists
#undef trace_stack_alloc
#undef trace_stack_free
#define trace_span_exists(b, n, k) trace_writer_span_exists(test_writer(), (b), (n), (k))
#define trace_span_alloc(b, n, k) trace_writer_span_alloc(test_writer(), (b), (n), (k))
#define trace_span_free(b) trace_writer_span_free(test_writer(), (b))
#define trace_heap_object_exists(a, s, t) trace_writer_heap_object_exists(test_writer(), (a), (s), (t))
#define trace_heap_object_alloc(a, s, t) trace_writer_heap_object_alloc(test_writer(), (a), (s), (t))
#define trace_heap_object_free(a) trace_writer_heap_object_free(test_writer(), (a))
#define trace_stack_exists(b, s) trace_writer_stack_exists(test_writer(), (b), (s))
#define trace_stack_alloc(b, s) trace_writer_stack_alloc(test_writer(), (b), (s))
#define trace_stack_free(b) trace_writer_stack_free(test_writer(), (b))
#endif

#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- Failure reporting ------------------------------------------------ */

_Noreturn void test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond))                                                        \
            test_fail(__FILE__, __LINE__, "CHECK(%s) failed", #cond);       \
    } while (0)

#define CHECK_MSG(cond, ...)                                                \
    do {                                                                    \
        if (!(cond))                                                        \
            test_fail(__FILE__, __LINE__, __VA_ARGS__);                     \
    } while (0)

#define CHECK_EQ_U64(a, b)                                                  \
    do {                                                                    \
        uint64_t check_a_ = (uint64_t)(a), check_b_ = (uint64_t)(b);        \
        if (check_a_ != check_b_)                                           \
            test_fail(__FILE__, __LINE__,                                   \
                      "%s == %s failed: %" PRIu64 " != %" PRIu64, #a, #b,   \
                      check_a_, check_b_);                                  \
    } while (0)

#define CHECK_RESULT(expr, want)                                            \
    do {                                                                    \
        trace_result check_got_ = (expr);                                   \
        if (check_got_ != (want))                                           \
            test_fail(__FILE__, __LINE__, "%s returned %s, want %s", #expr, \
                      result_code_name(check_got_),                         \
                      result_code_name(want));                              \
    } while (0)

/* Our own names for result codes, so failure messages do not depend on the
 * library's trace_result_str (which test_bad_config tests). */
const char *result_code_name(trace_result r);

/* ---- Test lifecycle --------------------------------------------------- */

/* Remember the test's name and arm a watchdog: a hang (deadlock) becomes a
 * failure with a message after timeout_seconds instead of a stuck build. */
void test_begin(const char *name, unsigned timeout_seconds);
/* Print "PASS name" and return 0, for `return test_pass();` in main. */
int test_pass(void);

/* The directory for this test's files (TEST_TMPDIR, or a new /tmp dir). */
const char *test_tmpdir(void);
/* Write "<tmpdir>/<file>" into buf (PATH_BUF_LEN bytes). */
#define PATH_BUF_LEN 4096
void test_path(char *buf, const char *file);
/* TEST_SCALE from the environment (default 1, never 0). */
uint64_t test_scale(void);
/* Monotonic clock in ns. */
uint64_t now_ns(void);

/* ---- Running the CLI -------------------------------------------------- */

/* Run `$ALLOCTRACE_CLI <subcommand> '<trace_path>' <extra>` and return its
 * exit status. Its stdout is returned in *out (malloc'd, NUL-terminated)
 * when out is not NULL; stderr passes through to ours. A CLI killed by a
 * signal fails the test. extra may be NULL. */
int cli_run(const char *subcommand, const char *trace_path, const char *extra,
            char **out);
/* `alloctrace stats PATH --json`, which must exit 0; returns malloc'd JSON. */
char *cli_stats_json(const char *trace_path);
/* `alloctrace check PATH` exit status (0 ok, 2 malformed, 3 truncated,
 * 4 inconsistent). */
int cli_check(const char *trace_path);

/* ---- Tiny JSON reader for `stats --json` ----------------------------- */

/* Look up a dotted path ("total_events", "events.span_alloc",
 * "per_thread.7") of nested objects. Return false when it is missing or not
 * of the asked type. */
bool json_get_u64(const char *json, const char *path, uint64_t *out);
bool json_get_bool(const char *json, const char *path, bool *out);

typedef struct json_entry {
    char key[64];
    uint64_t value;
} json_entry;
/* The members of the object at path whose values are unsigned integers;
 * returns how many there are (fills at most max). -1 if no such object. */
long json_get_u64_entries(const char *json, const char *path, json_entry *out,
                          size_t max);

uint64_t json_require_u64(const char *json, const char *path,
                          const char *file, int line);
bool json_require_bool(const char *json, const char *path, const char *file,
                       int line);
#define JSON_U64(json, path) json_require_u64((json), (path), __FILE__, __LINE__)
#define JSON_BOOL(json, path) json_require_bool((json), (path), __FILE__, __LINE__)

/* ---- Events, as the dump prints them --------------------------------- */

typedef enum event_kind {
    EV_NONE = 0,
    EV_SPAN_EXISTS = 1,
    EV_SPAN_ALLOC = 2,
    EV_SPAN_FREE = 3,
    EV_HEAP_OBJECT_EXISTS = 4,
    EV_HEAP_OBJECT_ALLOC = 5,
    EV_HEAP_OBJECT_FREE = 6,
    EV_STACK_EXISTS = 7,
    EV_STACK_ALLOC = 8,
    EV_STACK_FREE = 9,
    EV_CALL = 10,       /* a call that changed no memory (always entry-tagged) */
    EV_PAGE_ALLOC = 11, /* page tracer (trace_page_alloc) */
    EV_PAGE_FREE = 12,
    EV_PAGE_SCAV = 13,
} event_kind;
#define EV_KIND_COUNT 14

/* "span_exists", ..., "call", "page_alloc", ... as in dump lines and
 * stats' "events" object. */
const char *event_kind_name(event_kind kind);

typedef struct trace_event {
    uint64_t time_ns;
    uint64_t gen;     /* 0 in an expectation: do not compare */
    uint64_t thread;  /* 0 in an expectation: do not compare */
    event_kind kind;
    uint64_t addr;
    uint64_t size;    /* heap objects and stacks (bytes) */
    uint64_t npages;  /* spans and page events */
    uint64_t kind_class; /* spans */
    uint64_t type_id; /* heap objects */
    bool long_form;
    char entry[16];   /* " entry=NAME" (LD_PRELOAD shim traces), "" if untagged */
} trace_event;

typedef struct trace_type {
    uint64_t gen, id, size, ptr_bytes;
    char name[256];
} trace_type;

typedef struct trace_dump {
    trace_event *events;
    size_t nevents, events_cap;
    trace_type *types;
    size_t ntypes, types_cap;
} trace_dump;

/* Run `alloctrace dump PATH` (must exit 0) and parse every line; a line
 * that is neither a type nor an event fails the test. */
void dump_read(const char *trace_path, trace_dump *out);
void dump_free(trace_dump *dump);
/* Render an event like a dump line, for failure messages. */
void event_format(const trace_event *ev, char *buf, size_t len);

/* ---- Expectations: what a test emitted ------------------------------- */

/* Each emit_* helper calls the library and appends the event the reader
 * should report, with the generation and thread set in the log. long_form
 * is derived from the config exactly as docs/FORMAT.md section 3 says. */
typedef struct expect_log {
    trace_event *events;
    size_t n, cap;
    uint64_t min_heap_addr, page_size, heap_align, stack_align;
    uint64_t gen;    /* generation of the next events */
    uint64_t thread; /* trace thread id of the next events, 0 = unknown */
} expect_log;

void expect_init(expect_log *log, const trace_config *cfg);
void expect_free(expect_log *log);
void emit_span_exists(expect_log *log, uintptr_t base, uintptr_t npages, uint64_t kind_class);
void emit_span_alloc(expect_log *log, uintptr_t base, uintptr_t npages, uint64_t kind_class);
void emit_span_free(expect_log *log, uintptr_t base);
void emit_heap_object_exists(expect_log *log, uintptr_t addr, uint64_t size, uint64_t type_id);
void emit_heap_object_alloc(expect_log *log, uintptr_t addr, uint64_t size, uint64_t type_id);
void emit_heap_object_free(expect_log *log, uintptr_t addr);
void emit_stack_exists(expect_log *log, uintptr_t base, uintptr_t size);
void emit_stack_alloc(expect_log *log, uintptr_t base, uintptr_t size);
void emit_stack_free(expect_log *log, uintptr_t base);
/* Log an event without emitting it (the test emits it its own way); frees
 * pass 0 for the sizes. */
void expect_span(expect_log *log, event_kind kind, uintptr_t base, uintptr_t npages, uint64_t kind_class);
void expect_heap_object(expect_log *log, event_kind kind, uintptr_t addr, uint64_t size, uint64_t type_id);
void expect_stack(expect_log *log, event_kind kind, uintptr_t base, uintptr_t size);
/* Page tracer: long form when base is off the page grid or at or above
 * 2^48 (docs/FORMAT.md section 7). */
void emit_page_alloc(expect_log *log, uintptr_t base, uintptr_t npages);
void emit_page_free(expect_log *log, uintptr_t base, uintptr_t npages);
void emit_page_scav(expect_log *log, uintptr_t base, uintptr_t npages);

/* The dump must hold exactly the logged events, in order, every field
 * equal (gen/thread only where the expectation is non-zero). */
void expect_match_dump(const expect_log *want, const trace_dump *got,
                       const char *file, int line);
#define EXPECT_MATCH_DUMP(want, got) expect_match_dump((want), (got), __FILE__, __LINE__)

#endif
