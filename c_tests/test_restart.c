/*
 * Tracing can be stopped and started again, to a new file or to a caller's
 * file descriptor, and each trace holds exactly its own events:
 *   session 1: path A;  session 2: fd B;  session 3: path C, other config.
 * A helper thread that lives across all three sessions emits in each, so
 * per-thread state left by one session must not leak into the next.
 * trace_stop closes a file it opened but never the caller's descriptor.
 */
#include "common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- A helper thread that runs one job at a time on request ----------- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static void (*job)(expect_log *);
static expect_log *job_log;
static bool job_done, quit;

static void *helper_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (job == NULL && !quit)
            pthread_cond_wait(&cv, &mu);
        if (job == NULL)
            break;
        void (*j)(expect_log *) = job;
        pthread_mutex_unlock(&mu);
        j(job_log);
        pthread_mutex_lock(&mu);
        job = NULL;
        job_done = true;
        pthread_cond_broadcast(&cv);
    }
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* Run j on the helper thread and wait until it is done. */
static void on_helper(void (*j)(expect_log *), expect_log *log)
{
    pthread_mutex_lock(&mu);
    job = j;
    job_log = log;
    job_done = false;
    pthread_cond_broadcast(&cv);
    while (!job_done)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

/* The helper's events; it tags them with its own trace thread id. */
static void helper_events(expect_log *log)
{
    uint64_t saved = log->thread;
    log->thread = trace_thread_id();
    CHECK(log->thread >= 1);
    CHECK(log->thread != saved);
    uintptr_t base = (uintptr_t)0x500000000000 + (uintptr_t)log->n * 0x10000;
    emit_span_alloc(log, base, 1, 9);
    emit_heap_object_alloc(log, base + 64, 64, 0);
    emit_heap_object_free(log, base + 64);
    log->thread = saved;
}

/* ---- Open descriptors ------------------------------------------------- */

/* Does any descriptor of this process refer to the file at path? */
static bool fd_open_on(const char *path)
{
    struct stat want;
    CHECK_MSG(stat(path, &want) == 0, "stat(%s): %s", path, strerror(errno));
    DIR *dir = opendir("/proc/self/fd");
    CHECK(dir != NULL);
    bool found = false;
    struct dirent *de;
    while ((de = readdir(dir)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        int fd = atoi(de->d_name);
        struct stat st;
        if (fd != dirfd(dir) && fstat(fd, &st) == 0 && st.st_dev == want.st_dev &&
            st.st_ino == want.st_ino)
            found = true;
    }
    closedir(dir);
    return found;
}

/* ---- Sessions ---------------------------------------------------------- */

static void main_events(expect_log *log, uintptr_t base, int count)
{
    for (int i = 0; i < count; i++) {
        uintptr_t a = base + (uintptr_t)i * 4096;
        emit_span_alloc(log, a, 1, (uint64_t)i);
        emit_heap_object_alloc(log, a, 32, 0);
        emit_stack_alloc(log, a + 0x10000000, 8192);
        emit_heap_object_free(log, a);
        emit_stack_free(log, a + 0x10000000);
        emit_span_free(log, a);
    }
}

/* Start a session, emit from main and the helper, stop. */
static void session(const trace_config *cfg, expect_log *log, uintptr_t base)
{
    expect_init(log, cfg);
    CHECK_RESULT(trace_start(cfg), TRACE_OK);
    log->thread = trace_thread_id();
    CHECK(log->thread >= 1);
    main_events(log, base, 5);
    on_helper(helper_events, log);
    main_events(log, base + 0x1000000, 3);
    if (cfg->path != NULL)
        CHECK_MSG(fd_open_on(cfg->path), "no descriptor open on %s while tracing", cfg->path);
    CHECK_RESULT(trace_stop(), TRACE_OK);
    CHECK(!trace_enabled());
}

static void check_trace(const char *path, const expect_log *log)
{
    trace_dump d;
    dump_read(path, &d);
    EXPECT_MATCH_DUMP(log, &d);
    dump_free(&d);
    CHECK_EQ_U64(cli_check(path), 0);
}

int main(void)
{
    test_begin("test_restart", 60);

    pthread_t helper;
    CHECK(pthread_create(&helper, NULL, helper_main, NULL) == 0);

    char path_a[PATH_BUF_LEN], path_b[PATH_BUF_LEN], path_c[PATH_BUF_LEN];
    test_path(path_a, "restart_a.trace");
    test_path(path_b, "restart_b_fd.trace");
    test_path(path_c, "restart_c.trace");

    /* Session 1: to a path. */
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = path_a;
    expect_log log_a;
    session(&cfg, &log_a, 0x100000000);
    CHECK_MSG(!fd_open_on(path_a), "trace_stop left the file it opened (%s) open", path_a);

    /* Session 2: to a descriptor we own. */
    int fd = open(path_b, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    CHECK_MSG(fd >= 0, "open(%s): %s", path_b, strerror(errno));
    trace_config_init(&cfg);
    cfg.path = NULL;
    cfg.fd = fd;
    expect_log log_b;
    session(&cfg, &log_b, 0x200000000);
    CHECK_MSG(fcntl(fd, F_GETFD) != -1, "trace_stop closed the caller's fd %d", fd);
    CHECK(fd_open_on(path_b));
    CHECK(close(fd) == 0);

    /* Session 3: a path again, with a different address layout. */
    trace_config_init(&cfg);
    cfg.path = path_c;
    cfg.min_heap_addr = 0x300000000;
    cfg.page_size = 65536;
    cfg.min_heap_align = 32;
    expect_log log_c;
    session(&cfg, &log_c, 0x300000000);
    CHECK(!fd_open_on(path_c));

    pthread_mutex_lock(&mu);
    quit = true;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    CHECK(pthread_join(helper, NULL) == 0);

    check_trace(path_a, &log_a);
    check_trace(path_b, &log_b);
    check_trace(path_c, &log_c);

    expect_free(&log_a);
    expect_free(&log_b);
    expect_free(&log_c);
    return test_pass();
}
