/* Shared helpers for the C tests; see common.h. */
#include "common.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- Failure reporting ------------------------------------------------ */

static const char *current_test = "test";

void test_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "%s:%d: FAIL %s: ", file, line, current_test);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

const char *result_code_name(trace_result r)
{
    switch (r) {
    case TRACE_OK: return "TRACE_OK";
    case TRACE_ERR_NULL_ARGUMENT: return "TRACE_ERR_NULL_ARGUMENT";
    case TRACE_ERR_BAD_CONFIG: return "TRACE_ERR_BAD_CONFIG";
    case TRACE_ERR_ALREADY_STARTED: return "TRACE_ERR_ALREADY_STARTED";
    case TRACE_ERR_NOT_STARTED: return "TRACE_ERR_NOT_STARTED";
    case TRACE_ERR_IO: return "TRACE_ERR_IO";
    case TRACE_ERR_OUT_OF_MEMORY: return "TRACE_ERR_OUT_OF_MEMORY";
    case TRACE_ERR_PANIC: return "TRACE_ERR_PANIC";
    case TRACE_ERR_BUSY: return "TRACE_ERR_BUSY";
    }
    return "(unknown trace_result)";
}

/* ---- Test lifecycle --------------------------------------------------- */


/* Async-signal-safe: only write() and _exit(). */
static void on_watchdog(int sig)
{
    static const char msg[] = "FAIL: watchdog fired: the test hung "
                              "(deadlock or livelock suspected)\n";
    (void)sig;
    ssize_t ignored = write(2, msg, sizeof msg - 1);
    (void)ignored;
    _exit(1);
}

void test_begin(const char *name, unsigned timeout_seconds)
{
    current_test = name;
    /* Unbuffered so progress and failure text interleave correctly. */
    setvbuf(stdout, NULL, _IONBF, 0);
    signal(SIGALRM, on_watchdog);
    alarm(timeout_seconds);
}

int test_pass(void)
{
    printf("PASS %s\n", current_test);
    return 0;
}

const char *test_tmpdir(void)
{
    static char made[64];
    const char *dir = getenv("TEST_TMPDIR");
    if (dir != NULL && dir[0] != '\0')
        return dir;
    if (made[0] == '\0') {
        strcpy(made, "/tmp/alloctrace-test-XXXXXX");
        if (mkdtemp(made) == NULL)
            test_fail(__FILE__, __LINE__, "mkdtemp: %s", strerror(errno));
    }
    return made;
}

void test_path(char *buf, const char *file)
{
    int n = snprintf(buf, PATH_BUF_LEN, "%s/%s", test_tmpdir(), file);
    CHECK(n > 0 && n < PATH_BUF_LEN);
}

uint64_t test_scale(void)
{
    const char *s = getenv("TEST_SCALE");
    if (s == NULL || s[0] == '\0')
        return 1;
    unsigned long long v = strtoull(s, NULL, 10);
    return v == 0 ? 1 : (uint64_t)v;
}

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- Running the CLI -------------------------------------------------- */

static const char *cli_path(void)
{
    const char *cli = getenv("ALLOCTRACE_CLI");
    if (cli != NULL && cli[0] != '\0')
        return cli;
    if (access("target/release/alloctrace", X_OK) == 0)
        return "target/release/alloctrace";
    test_fail(__FILE__, __LINE__, "ALLOCTRACE_CLI is not set");
}

/* Append s to the command, single-quoted for the shell. */
static void append_quoted(char *cmd, size_t cap, const char *s)
{
    size_t n = strlen(cmd);
    CHECK(n + 1 < cap);
    cmd[n++] = '\'';
    for (; *s != '\0'; s++) {
        if (*s == '\'') {
            CHECK(n + 5 < cap);
            memcpy(cmd + n, "'\\''", 4);
            n += 4;
        } else {
            CHECK(n + 2 < cap);
            cmd[n++] = *s;
        }
    }
    CHECK(n + 2 < cap);
    cmd[n++] = '\'';
    cmd[n] = '\0';
}

int cli_run(const char *subcommand, const char *trace_path, const char *extra,
            char **out)
{
    char cmd[3 * PATH_BUF_LEN] = "";
    append_quoted(cmd, sizeof cmd, cli_path());
    strcat(cmd, " ");
    strcat(cmd, subcommand);
    strcat(cmd, " ");
    append_quoted(cmd, sizeof cmd, trace_path);
    if (extra != NULL) {
        CHECK(strlen(cmd) + strlen(extra) + 2 < sizeof cmd);
        strcat(cmd, " ");
        strcat(cmd, extra);
    }

    fflush(NULL); /* the child must not repeat our buffered output */
    FILE *pipe = popen(cmd, "r");
    CHECK_MSG(pipe != NULL, "popen(%s): %s", cmd, strerror(errno));

    size_t len = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    CHECK(buf != NULL);
    for (;;) {
        if (cap - len < 4096) {
            cap *= 2;
            buf = realloc(buf, cap);
            CHECK(buf != NULL);
        }
        size_t got = fread(buf + len, 1, cap - len - 1, pipe);
        if (got == 0)
            break;
        len += got;
    }
    buf[len] = '\0';

    int status = pclose(pipe);
    CHECK_MSG(status != -1, "pclose: %s", strerror(errno));
    CHECK_MSG(WIFEXITED(status), "`%s` was killed by signal %d", cmd,
              WIFSIGNALED(status) ? WTERMSIG(status) : -1);
    int code = WEXITSTATUS(status);
    CHECK_MSG(code != 127, "`%s`: the shell could not run the CLI", cmd);

    if (out != NULL)
        *out = buf;
    else
        free(buf);
    return code;
}

char *cli_stats_json(const char *trace_path)
{
    char *out = NULL;
    int code = cli_run("stats", trace_path, "--json", &out);
    CHECK_MSG(code == 0, "`alloctrace stats %s --json` exited %d; stdout:\n%s",
              trace_path, code, out);
    return out;
}

int cli_check(const char *trace_path)
{
    return cli_run("check", trace_path, NULL, NULL);
}

/* ---- Tiny JSON reader ------------------------------------------------- */

static const char *json_ws(const char *p)
{
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')
        p++;
    return p;
}

/* p at '"': return the position after the closing quote, or NULL. */
static const char *json_skip_string(const char *p)
{
    for (p++; *p != '\0'; p++) {
        if (*p == '\\' && p[1] != '\0')
            p++;
        else if (*p == '"')
            return p + 1;
    }
    return NULL;
}

static const char *json_skip_value(const char *p)
{
    p = json_ws(p);
    if (*p == '"')
        return json_skip_string(p);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        p = json_ws(p + 1);
        if (*p == close)
            return p + 1;
        for (;;) {
            if (close == '}') {
                if (*p != '"' || (p = json_skip_string(p)) == NULL)
                    return NULL;
                p = json_ws(p);
                if (*p++ != ':')
                    return NULL;
            }
            if ((p = json_skip_value(p)) == NULL)
                return NULL;
            p = json_ws(p);
            if (*p == ',')
                p = json_ws(p + 1);
            else if (*p == close)
                return p + 1;
            else
                return NULL;
        }
    }
    /* number, true, false, null */
    const char *start = p;
    while (*p != '\0' && strchr(",}] \n\r\t", *p) == NULL)
        p++;
    return p == start ? NULL : p;
}

/* obj at '{': return the value of member key (length keylen), or NULL. */
static const char *json_member(const char *obj, const char *key, size_t keylen)
{
    const char *p = json_ws(obj);
    if (*p != '{')
        return NULL;
    p = json_ws(p + 1);
    while (*p == '"') {
        const char *kstart = p + 1;
        const char *kend = json_skip_string(p);
        if (kend == NULL)
            return NULL;
        size_t klen = (size_t)(kend - 1 - kstart);
        p = json_ws(kend);
        if (*p++ != ':')
            return NULL;
        p = json_ws(p);
        if (klen == keylen && memcmp(kstart, key, keylen) == 0)
            return p;
        if ((p = json_skip_value(p)) == NULL)
            return NULL;
        p = json_ws(p);
        if (*p != ',')
            return NULL;
        p = json_ws(p + 1);
    }
    return NULL;
}

static const char *json_lookup(const char *json, const char *path)
{
    const char *value = json;
    while (value != NULL) {
        const char *dot = strchr(path, '.');
        size_t len = dot != NULL ? (size_t)(dot - path) : strlen(path);
        value = json_member(value, path, len);
        if (dot == NULL)
            return value;
        path = dot + 1;
    }
    return NULL;
}

static bool json_parse_u64(const char *p, uint64_t *out)
{
    if (p == NULL || *p < '0' || *p > '9')
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(p, &end, 10);
    if (errno != 0 || *end == '.' || *end == 'e' || *end == 'E')
        return false;
    *out = (uint64_t)v;
    return true;
}

bool json_get_u64(const char *json, const char *path, uint64_t *out)
{
    return json_parse_u64(json_lookup(json, path), out);
}

bool json_get_bool(const char *json, const char *path, bool *out)
{
    const char *p = json_lookup(json, path);
    if (p == NULL)
        return false;
    if (strncmp(p, "true", 4) == 0) {
        *out = true;
        return true;
    }
    if (strncmp(p, "false", 5) == 0) {
        *out = false;
        return true;
    }
    return false;
}

long json_get_u64_entries(const char *json, const char *path, json_entry *out,
                          size_t max)
{
    const char *p = json_lookup(json, path);
    if (p == NULL || *p != '{')
        return -1;
    long count = 0;
    p = json_ws(p + 1);
    while (*p == '"') {
        const char *kstart = p + 1;
        const char *kend = json_skip_string(p);
        if (kend == NULL)
            return -1;
        size_t klen = (size_t)(kend - 1 - kstart);
        p = json_ws(kend);
        if (*p++ != ':')
            return -1;
        p = json_ws(p);
        uint64_t v;
        if (json_parse_u64(p, &v)) {
            if ((size_t)count < max) {
                size_t n = klen < sizeof out[count].key - 1 ? klen : sizeof out[count].key - 1;
                memcpy(out[count].key, kstart, n);
                out[count].key[n] = '\0';
                out[count].value = v;
            }
            count++;
        }
        if ((p = json_skip_value(p)) == NULL)
            return -1;
        p = json_ws(p);
        if (*p != ',')
            break;
        p = json_ws(p + 1);
    }
    return count;
}

uint64_t json_require_u64(const char *json, const char *path, const char *file,
                          int line)
{
    uint64_t v;
    if (!json_get_u64(json, path, &v))
        test_fail(file, line, "stats JSON has no unsigned integer at \"%s\":\n%s",
                  path, json);
    return v;
}

bool json_require_bool(const char *json, const char *path, const char *file,
                       int line)
{
    bool v;
    if (!json_get_bool(json, path, &v))
        test_fail(file, line, "stats JSON has no boolean at \"%s\":\n%s", path,
                  json);
    return v;
}

/* ---- Dump parsing ----------------------------------------------------- */

static const char *const kind_names[EV_KIND_COUNT] = {
    "none", "span_exists", "span_alloc", "span_free",
    "heap_object_exists", "heap_object_alloc", "heap_object_free",
    "stack_exists", "stack_alloc", "stack_free", "call",
    "page_alloc", "page_free", "page_scav",
};

const char *event_kind_name(event_kind kind)
{
    return (unsigned)kind < EV_KIND_COUNT ? kind_names[kind] : "invalid";
}

static event_kind kind_from_name(const char *s, size_t len)
{
    for (int k = 1; k < EV_KIND_COUNT; k++)
        if (strlen(kind_names[k]) == len && memcmp(kind_names[k], s, len) == 0)
            return (event_kind)k;
    return EV_NONE;
}

static bool kind_has_size(event_kind k)
{
    return k == EV_HEAP_OBJECT_EXISTS || k == EV_HEAP_OBJECT_ALLOC ||
           k == EV_STACK_EXISTS || k == EV_STACK_ALLOC;
}

static bool kind_is_span_start(event_kind k)
{
    return k == EV_SPAN_EXISTS || k == EV_SPAN_ALLOC;
}

static bool kind_is_object_start(event_kind k)
{
    return k == EV_HEAP_OBJECT_EXISTS || k == EV_HEAP_OBJECT_ALLOC;
}

static bool kind_is_page(event_kind k)
{
    return k == EV_PAGE_ALLOC || k == EV_PAGE_FREE || k == EV_PAGE_SCAV;
}

/* Parse an unsigned decimal (or 0x-prefixed hex) value of exactly len bytes. */
static bool parse_u64_token(const char *s, size_t len, uint64_t *out)
{
    char tmp[32];
    if (len == 0 || len >= sizeof tmp)
        return false;
    memcpy(tmp, s, len);
    tmp[len] = '\0';
    int base = 10;
    const char *digits = tmp;
    if (len > 2 && tmp[0] == '0' && tmp[1] == 'x') {
        base = 16;
        digits = tmp + 2;
    }
    if (*digits == '\0' || *digits == '-' || *digits == '+')
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(digits, &end, base);
    if (errno != 0 || *end != '\0')
        return false;
    *out = (uint64_t)v;
    return true;
}

static void *grow(void *arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return arr;
    size_t new_cap = *cap ? *cap * 2 : 64;
    while (new_cap < need)
        new_cap *= 2;
    void *p = realloc(arr, new_cap * elem);
    CHECK(p != NULL);
    *cap = new_cap;
    return p;
}

/* Parse "type gen=G id=ID size=S ptr_bytes=P name=NAME" (NAME runs to the
 * end of the line). */
static bool parse_type_line(const char *line, size_t len, trace_type *t)
{
    memset(t, 0, sizeof *t);
    bool have[5] = {false};
    const char *p = line + 4, *end = line + len;
    while (p < end) {
        while (p < end && *p == ' ')
            p++;
        if (p >= end)
            break;
        if ((size_t)(end - p) >= 5 && memcmp(p, "name=", 5) == 0) {
            size_t n = (size_t)(end - p - 5);
            if (n >= sizeof t->name)
                return false;
            memcpy(t->name, p + 5, n);
            t->name[n] = '\0';
            have[4] = true;
            break;
        }
        const char *tok = p;
        while (p < end && *p != ' ')
            p++;
        const char *eq = memchr(tok, '=', (size_t)(p - tok));
        if (eq == NULL)
            return false;
        size_t klen = (size_t)(eq - tok), vlen = (size_t)(p - eq - 1);
        uint64_t v;
        if (!parse_u64_token(eq + 1, vlen, &v))
            return false;
        if (klen == 3 && memcmp(tok, "gen", 3) == 0) { t->gen = v; have[0] = true; }
        else if (klen == 2 && memcmp(tok, "id", 2) == 0) { t->id = v; have[1] = true; }
        else if (klen == 4 && memcmp(tok, "size", 4) == 0) { t->size = v; have[2] = true; }
        else if (klen == 9 && memcmp(tok, "ptr_bytes", 9) == 0) { t->ptr_bytes = v; have[3] = true; }
        /* Unknown keys are tolerated so the CLI may add fields. */
    }
    return have[0] && have[1] && have[2] && have[3] && have[4];
}

/* Parse "TIME gen=G thread=T KIND addr=0xHEX [fields] [long]". */
static bool parse_event_line(const char *line, size_t len, trace_event *ev)
{
    memset(ev, 0, sizeof *ev);
    const char *p = line, *end = line + len;
    bool have_time = false, have_gen = false, have_thread = false, have_addr = false;
    bool have_size = false, have_npages = false, have_class = false, have_type = false;
    while (p < end) {
        while (p < end && *p == ' ')
            p++;
        if (p >= end)
            break;
        const char *tok = p;
        while (p < end && *p != ' ')
            p++;
        size_t tlen = (size_t)(p - tok);
        const char *eq = memchr(tok, '=', tlen);
        if (!have_time) {
            if (!parse_u64_token(tok, tlen, &ev->time_ns))
                return false;
            have_time = true;
            continue;
        }
        if (eq == NULL) {
            if (tlen == 4 && memcmp(tok, "long", 4) == 0) {
                ev->long_form = true;
            } else {
                if (ev->kind != EV_NONE)
                    return false;
                ev->kind = kind_from_name(tok, tlen);
                if (ev->kind == EV_NONE)
                    return false;
            }
            continue;
        }
        size_t klen = (size_t)(eq - tok), vlen = (size_t)(p - eq - 1);
#define KEY_IS(s) (klen == sizeof(s) - 1 && memcmp(tok, s, klen) == 0)
        if (KEY_IS("entry")) { /* a name, not a number */
            if (vlen == 0 || vlen >= sizeof ev->entry || ev->entry[0] != '\0')
                return false;
            memcpy(ev->entry, eq + 1, vlen);
            ev->entry[vlen] = '\0';
            continue;
        }
        uint64_t v;
        if (!parse_u64_token(eq + 1, vlen, &v))
            return false;
        if (KEY_IS("gen")) { ev->gen = v; have_gen = true; }
        else if (KEY_IS("thread")) { ev->thread = v; have_thread = true; }
        else if (KEY_IS("addr")) {
            if (vlen < 3 || eq[1] != '0' || eq[2] != 'x')
                return false; /* addresses are printed in hex */
            ev->addr = v;
            have_addr = true;
        }
        else if (KEY_IS("size")) { ev->size = v; have_size = true; }
        else if (KEY_IS("npages")) { ev->npages = v; have_npages = true; }
        else if (KEY_IS("class")) { ev->kind_class = v; have_class = true; }
        else if (KEY_IS("type")) { ev->type_id = v; have_type = true; }
#undef KEY_IS
    }
    if (!have_gen || !have_thread || !have_addr || ev->kind == EV_NONE)
        return false;
    /* Each kind prints exactly its own fields. */
    if (have_size != kind_has_size(ev->kind) ||
        have_npages != (kind_is_span_start(ev->kind) || kind_is_page(ev->kind)) ||
        have_class != kind_is_span_start(ev->kind) ||
        have_type != kind_is_object_start(ev->kind))
        return false;
    return true;
}

void dump_read(const char *trace_path, trace_dump *out)
{
    memset(out, 0, sizeof *out);
    char *text = NULL;
    int code = cli_run("dump", trace_path, NULL, &text);
    CHECK_MSG(code == 0, "`alloctrace dump %s` exited %d", trace_path, code);

    unsigned lineno = 0;
    for (char *line = text; *line != '\0';) {
        char *nl = strchr(line, '\n');
        size_t len = nl != NULL ? (size_t)(nl - line) : strlen(line);
        lineno++;
        if (len > 0 && line[len - 1] == '\r')
            len--;
        if (len == 0) {
            /* blank line: tolerated */
        } else if (len > 5 && memcmp(line, "type ", 5) == 0) {
            out->types = grow(out->types, &out->types_cap, out->ntypes + 1,
                              sizeof *out->types);
            if (!parse_type_line(line, len, &out->types[out->ntypes]))
                test_fail(__FILE__, __LINE__, "dump line %u is not a valid type line: %.*s",
                          lineno, (int)len, line);
            out->ntypes++;
        } else {
            out->events = grow(out->events, &out->events_cap, out->nevents + 1,
                               sizeof *out->events);
            if (!parse_event_line(line, len, &out->events[out->nevents]))
                test_fail(__FILE__, __LINE__, "dump line %u is not a valid event line: %.*s",
                          lineno, (int)len, line);
            out->nevents++;
        }
        if (nl == NULL)
            break;
        line = nl + 1;
    }
    free(text);
}

void dump_free(trace_dump *dump)
{
    free(dump->events);
    free(dump->types);
    memset(dump, 0, sizeof *dump);
}

void event_format(const trace_event *ev, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%" PRIu64 " gen=%" PRIu64 " thread=%" PRIu64 " %s addr=0x%" PRIx64,
                     ev->time_ns, ev->gen, ev->thread, event_kind_name(ev->kind), ev->addr);
    if (n < 0 || (size_t)n >= len)
        return;
    if (kind_is_span_start(ev->kind))
        n += snprintf(buf + n, len - (size_t)n, " npages=%" PRIu64 " class=%" PRIu64,
                      ev->npages, ev->kind_class);
    else if (kind_is_object_start(ev->kind))
        n += snprintf(buf + n, len - (size_t)n, " size=%" PRIu64 " type=%" PRIu64,
                      ev->size, ev->type_id);
    else if (kind_has_size(ev->kind))
        n += snprintf(buf + n, len - (size_t)n, " size=%" PRIu64, ev->size);
    else if (kind_is_page(ev->kind))
        n += snprintf(buf + n, len - (size_t)n, " npages=%" PRIu64, ev->npages);
    if (ev->entry[0] != '\0' && n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, " entry=%s", ev->entry);
    if (ev->long_form && n > 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, " long");
}

/* ---- Expectations ----------------------------------------------------- */

void expect_init(expect_log *log, const trace_config *cfg)
{
    memset(log, 0, sizeof *log);
    log->min_heap_addr = cfg->min_heap_addr;
    log->page_size = cfg->page_size;
    log->heap_align = cfg->min_heap_align;
    log->stack_align = cfg->min_stack_align;
    log->gen = 1;
}

void expect_free(expect_log *log)
{
    free(log->events);
    memset(log, 0, sizeof *log);
}

/* The writer's rule (docs/FORMAT.md section 3): long form when the short
 * form would not be exact. */
static bool addr_needs_long(uint64_t addr, uint64_t base, uint64_t align)
{
    return addr < base || (addr - base) % align != 0;
}

static bool is_pow2(uint64_t x)
{
    return x != 0 && (x & (x - 1)) == 0;
}

static trace_event *expect_push(expect_log *log, event_kind kind, uint64_t addr)
{
    log->events = grow(log->events, &log->cap, log->n + 1, sizeof *log->events);
    trace_event *ev = &log->events[log->n++];
    memset(ev, 0, sizeof *ev);
    ev->kind = kind;
    ev->addr = addr;
    ev->gen = log->gen;
    ev->thread = log->thread;
    return ev;
}

static void push_span(expect_log *log, event_kind kind, uintptr_t base, uintptr_t npages, uint64_t cls)
{
    trace_event *ev = expect_push(log, kind, base);
    ev->npages = npages;
    ev->kind_class = cls;
    ev->long_form = addr_needs_long(base, log->min_heap_addr, log->page_size);
}

void emit_span_exists(expect_log *log, uintptr_t base, uintptr_t npages, uint64_t kind_class)
{
    trace_span_exists(base, npages, kind_class);
    push_span(log, EV_SPAN_EXISTS, base, npages, kind_class);
}

void emit_span_alloc(expect_log *log, uintptr_t base, uintptr_t npages, uint64_t kind_class)
{
    trace_span_alloc(base, npages, kind_class);
    push_span(log, EV_SPAN_ALLOC, base, npages, kind_class);
}

void emit_span_free(expect_log *log, uintptr_t base)
{
    trace_span_free(base);
    trace_event *ev = expect_push(log, EV_SPAN_FREE, base);
    ev->long_form = addr_needs_long(base, log->min_heap_addr, log->page_size);
}

static void push_object(expect_log *log, event_kind kind, uintptr_t addr, uint64_t size, uint64_t type_id)
{
    trace_event *ev = expect_push(log, kind, addr);
    ev->size = size;
    ev->type_id = type_id;
    ev->long_form = addr_needs_long(addr, log->min_heap_addr, log->heap_align);
}

void emit_heap_object_exists(expect_log *log, uintptr_t addr, uint64_t size, uint64_t type_id)
{
    trace_heap_object_exists(addr, size, type_id);
    push_object(log, EV_HEAP_OBJECT_EXISTS, addr, size, type_id);
}

void emit_heap_object_alloc(expect_log *log, uintptr_t addr, uint64_t size, uint64_t type_id)
{
    trace_heap_object_alloc(addr, size, type_id);
    push_object(log, EV_HEAP_OBJECT_ALLOC, addr, size, type_id);
}

void emit_heap_object_free(expect_log *log, uintptr_t addr)
{
    trace_heap_object_free(addr);
    trace_event *ev = expect_push(log, EV_HEAP_OBJECT_FREE, addr);
    ev->long_form = addr_needs_long(addr, log->min_heap_addr, log->heap_align);
}

static void push_stack(expect_log *log, event_kind kind, uintptr_t base, uintptr_t size)
{
    trace_event *ev = expect_push(log, kind, base);
    ev->size = size;
    ev->long_form = addr_needs_long(base, log->min_heap_addr, log->stack_align) || !is_pow2(size);
}

void emit_stack_exists(expect_log *log, uintptr_t base, uintptr_t size)
{
    trace_stack_exists(base, size);
    push_stack(log, EV_STACK_EXISTS, base, size);
}

void emit_stack_alloc(expect_log *log, uintptr_t base, uintptr_t size)
{
    trace_stack_alloc(base, size);
    push_stack(log, EV_STACK_ALLOC, base, size);
}

void emit_stack_free(expect_log *log, uintptr_t base)
{
    trace_stack_free(base);
    trace_event *ev = expect_push(log, EV_STACK_FREE, base);
    ev->long_form = addr_needs_long(base, log->min_heap_addr, log->stack_align);
}

void expect_span(expect_log *log, event_kind kind, uintptr_t base, uintptr_t npages, uint64_t kind_class)
{
    push_span(log, kind, base, npages, kind_class);
}

void expect_heap_object(expect_log *log, event_kind kind, uintptr_t addr, uint64_t size, uint64_t type_id)
{
    push_object(log, kind, addr, size, type_id);
}

void expect_stack(expect_log *log, event_kind kind, uintptr_t base, uintptr_t size)
{
    if (kind == EV_STACK_FREE) {
        trace_event *ev = expect_push(log, kind, base);
        ev->long_form = addr_needs_long(base, log->min_heap_addr, log->stack_align);
    } else {
        push_stack(log, kind, base, size);
    }
}

static void push_page(expect_log *log, event_kind kind, uintptr_t base, uintptr_t npages)
{
    trace_event *ev = expect_push(log, kind, base);
    ev->npages = npages;
    ev->long_form = base % log->page_size != 0 || (uint64_t)base >> 48 != 0;
}

void emit_page_alloc(expect_log *log, uintptr_t base, uintptr_t npages)
{
    trace_page_alloc(base, npages);
    push_page(log, EV_PAGE_ALLOC, base, npages);
}

void emit_page_free(expect_log *log, uintptr_t base, uintptr_t npages)
{
    trace_page_free(base, npages);
    push_page(log, EV_PAGE_FREE, base, npages);
}

void emit_page_scav(expect_log *log, uintptr_t base, uintptr_t npages)
{
    trace_page_scav(base, npages);
    push_page(log, EV_PAGE_SCAV, base, npages);
}

static bool event_matches(const trace_event *want, const trace_event *got)
{
    if (want->kind != got->kind || want->addr != got->addr ||
        want->long_form != got->long_form || strcmp(want->entry, got->entry) != 0)
        return false;
    if (want->gen != 0 && want->gen != got->gen)
        return false;
    if (want->thread != 0 && want->thread != got->thread)
        return false;
    if (kind_has_size(want->kind) && want->size != got->size)
        return false;
    if (kind_is_span_start(want->kind) &&
        (want->npages != got->npages || want->kind_class != got->kind_class))
        return false;
    if (kind_is_object_start(want->kind) && want->type_id != got->type_id)
        return false;
    if (kind_is_page(want->kind) && want->npages != got->npages)
        return false;
    return true;
}

void expect_match_dump(const expect_log *want, const trace_dump *got,
                       const char *file, int line)
{
    char wbuf[256], gbuf[256];
    size_t n = want->n < got->nevents ? want->n : got->nevents;
    for (size_t i = 0; i < n; i++) {
        if (!event_matches(&want->events[i], &got->events[i])) {
            event_format(&want->events[i], wbuf, sizeof wbuf);
            event_format(&got->events[i], gbuf, sizeof gbuf);
            test_fail(file, line,
                      "event #%zu differs\n  emitted: %s\n  dumped:  %s\n"
                      "(time, and gen/thread when 0, are not compared)",
                      i, wbuf, gbuf);
        }
        if (i > 0 && got->events[i].time_ns < got->events[i - 1].time_ns)
            test_fail(file, line, "dump times go backwards at event #%zu", i);
    }
    if (want->n != got->nevents) {
        if (got->nevents > n) {
            event_format(&got->events[n], gbuf, sizeof gbuf);
            test_fail(file, line, "dump has %zu events, %zu were emitted; first extra: %s",
                      got->nevents, want->n, gbuf);
        }
        event_format(&want->events[n], wbuf, sizeof wbuf);
        test_fail(file, line, "dump has %zu events, %zu were emitted; first missing: %s",
                  got->nevents, want->n, wbuf);
    }
}
