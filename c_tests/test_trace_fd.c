/*
 * The trace's descriptor is the tracer's, never the program's (issue 10,
 * item 1), for a trace started with trace_config.path:
 *   - it sits at a high number (>= 1024 when RLIMIT_NOFILE allows, else
 *     7/8 of the soft limit), close-on-exec, never 0, 1 or 2;
 *   - a program that closes every descriptor 3..1023 and opens a file gets
 *     its own file, untouched by the tracer: with a soft limit of 1024 the
 *     trace's number is among those closed, yet the writer writes through
 *     a descriptor table of its own, so the trace is complete (where
 *     unshare(CLONE_FILES) is refused: the tracer stops writing, says so
 *     once on stderr, leaves the trace cut and trace_stop says
 *     TRACE_ERR_IO); with a higher limit the number is out of reach;
 *   - a descriptor dup2'ed over the trace's number is never written to and
 *     never closed by trace_stop; the same for a caller's descriptor
 *     (trace_config.fd), which keeps its number;
 *   - a program started with stdout closed prints into its own file, not
 *     into the trace;
 *   - the trace is mode 0600 under a umask of 0777 (and an existing 0644
 *     file becomes 0600);
 *   - an existing FIFO without a reader fails at once instead of hanging,
 *     and one with a reader gets the trace.
 */
#include "common.h"

#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* Where this test keeps its own stdout/stderr while it closes descriptors:
 * above every soft limit it sets, below the hard limit. */
#define SAVED_STDOUT 1500
#define SAVED_STDERR 1501

static rlim_t original_soft;

/* Whether a thread may have a descriptor table of its own here (the writer
 * thread's protection); else the tracer falls back to checking. */
static bool private_tables;

static void *probe_unshare(void *arg)
{
    *(bool *)arg = unshare(CLONE_FILES) == 0;
    return NULL;
}

static void set_soft_limit(rlim_t soft)
{
    struct rlimit lim;
    CHECK(getrlimit(RLIMIT_NOFILE, &lim) == 0);
    lim.rlim_cur = soft;
    CHECK_MSG(setrlimit(RLIMIT_NOFILE, &lim) == 0, "setrlimit(%lu): %s", (unsigned long)soft, strerror(errno));
}

/* The descriptor of this process open on path, or -1. */
static int fd_of(const char *path)
{
    struct stat want;
    CHECK_MSG(stat(path, &want) == 0, "stat(%s): %s", path, strerror(errno));
    DIR *dir = opendir("/proc/self/fd");
    CHECK(dir != NULL);
    int found = -1;
    struct dirent *de;
    while ((de = readdir(dir)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        int fd = atoi(de->d_name);
        struct stat st;
        if (fd != dirfd(dir) && fstat(fd, &st) == 0 && st.st_dev == want.st_dev && st.st_ino == want.st_ino)
            found = fd;
    }
    closedir(dir);
    return found;
}

static off_t file_size(const char *path)
{
    struct stat st;
    CHECK_MSG(stat(path, &st) == 0, "stat(%s): %s", path, strerror(errno));
    return st.st_size;
}

/* Enough events, with advances, that every thread buffer is handed to the
 * writer several times over. */
static void emit_lots(uintptr_t base)
{
    uint64_t n = 200000 / test_scale();
    for (uint64_t i = 0; i < n; i++) {
        uintptr_t a = base + (uintptr_t)(i % 4096) * 64;
        trace_heap_object_alloc(a, 48, 0);
        trace_heap_object_free(a);
        if (i % 20000 == 0)
            CHECK_RESULT(trace_advance(), TRACE_OK);
    }
    CHECK_RESULT(trace_advance(), TRACE_OK);
}

/* Emits and advances until the writer has put batches in the file: the
 * trace has something before the cut the test makes. (No time limit: the
 * watchdog catches a writer that never writes.) */
static void wait_for_batches(const char *path)
{
    while (file_size(path) <= 16) {
        emit_lots(0x600000000000);
        usleep(1000);
    }
}

static void write_file(const char *path, const char *text, int *fd_out)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK_MSG(fd >= 0, "open(%s): %s", path, strerror(errno));
    CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    *fd_out = fd;
}

/* The file holds exactly `text`. */
static void check_content(const char *path, const char *text)
{
    char buf[4096];
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    CHECK_MSG(n == (ssize_t)strlen(text) && memcmp(buf, text, (size_t)n) == 0,
              "%s: %zd bytes instead of the %zu the program wrote: the tracer wrote into it", path, n, strlen(text));
}

static void start(const char *path)
{
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = path;
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
}

/* Closes every descriptor 3..1023, as daemons and test runners do. */
static void close_inherited(void)
{
    for (int fd = 3; fd < 1024; fd++)
        close(fd);
}

/* Soft limit 1024: the trace's descriptor is closed by the program's loop;
 * the file it opens next gets no trace bytes, and the trace is cut. */
static void closed_by_the_program(void)
{
    char path[PATH_BUF_LEN], data[PATH_BUF_LEN], err[PATH_BUF_LEN];
    test_path(path, "closed.trace");
    test_path(data, "closed.data");
    test_path(err, "closed.stderr");
    set_soft_limit(1024);
    start(path);
    int fd = fd_of(path);
    CHECK_MSG(fd >= 896 && fd < 1024, "trace descriptor %d, want 896..1023 under a soft limit of 1024", fd);
    wait_for_batches(path);

    int err_fd = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(err_fd >= 0 && dup2(err_fd, 2) == 2);
    close_inherited();
    int data_fd;
    write_file(data, "the program's data\n", &data_fd);
    emit_lots(0x600000000000);
    trace_result r = trace_stop();
    CHECK(dup2(SAVED_STDERR, 2) == 2);
    CHECK(close(data_fd) == 0);
    check_content(data, "the program's data\n");
    char buf[4096] = {0};
    int efd = open(err, O_RDONLY);
    CHECK(efd >= 0 && read(efd, buf, sizeof buf) >= 0);
    close(efd);
    if (private_tables) {
        /* The writer's own copy was out of the program's reach. */
        CHECK_RESULT(r, TRACE_OK);
        CHECK_MSG(buf[0] == '\0', "stderr: %s", buf);
        CHECK_EQ_U64(cli_check(path), 0);
        set_soft_limit(original_soft);
        return;
    }
    CHECK_RESULT(r, TRACE_ERR_IO);
    /* One line, once, naming the descriptor and the cut. */
    char want[128];
    snprintf(want, sizeof want, "alloctrace: the trace file's descriptor %d was closed or replaced by the program", fd);
    const char *at = strstr(buf, want);
    CHECK_MSG(at != NULL && strstr(at + strlen(want), "closed or replaced") == NULL, "stderr: %s", buf);
    CHECK_MSG(strstr(buf, "the trace is cut at byte ") != NULL, "stderr: %s", buf);
    CHECK_EQ_U64(cli_check(path), 3); /* readable, reported cut */
    set_soft_limit(original_soft);
}

/* Soft limit above 2048: the descriptor is at 1024 or above, out of the
 * loop's reach; the trace is complete and the program's file untouched. */
static void out_of_reach(void)
{
    char path[PATH_BUF_LEN], data[PATH_BUF_LEN];
    test_path(path, "reach.trace");
    test_path(data, "reach.data");
    start(path);
    int fd = fd_of(path);
    CHECK_MSG(fd >= 1024, "trace descriptor %d, want >= 1024 under a soft limit of %lu", fd,
              (unsigned long)original_soft);
    int flags = fcntl(fd, F_GETFD);
    CHECK_MSG(flags >= 0 && (flags & FD_CLOEXEC), "trace descriptor %d is not close-on-exec", fd);
    close_inherited();
    int data_fd;
    write_file(data, "more data\n", &data_fd);
    emit_lots(0x600000000000);
    CHECK_RESULT(trace_stop(), TRACE_OK);
    CHECK(fd_of(path) == -1);
    close(data_fd);
    check_content(data, "more data\n");
    CHECK_EQ_U64(cli_check(path), 0);
}

/* Another file dup2'ed over the trace's number: never written, never
 * closed by trace_stop. */
static void replaced_by_the_program(void)
{
    char path[PATH_BUF_LEN], victim[PATH_BUF_LEN];
    test_path(path, "replaced.trace");
    test_path(victim, "replaced.victim");
    start(path);
    int fd = fd_of(path);
    CHECK(fd >= 1024);
    wait_for_batches(path);
    int victim_fd;
    write_file(victim, "victim\n", &victim_fd);
    int err_fd = open("/dev/null", O_WRONLY);
    CHECK(err_fd >= 0 && dup2(err_fd, 2) == 2);
    close(err_fd);
    CHECK(dup2(victim_fd, fd) == fd);
    emit_lots(0x600000000000);
    trace_result r = trace_stop();
    CHECK(dup2(SAVED_STDERR, 2) == 2);
    CHECK_MSG(fcntl(fd, F_GETFD) >= 0, "trace_stop closed descriptor %d, which the program had replaced", fd);
    close(fd);
    close(victim_fd);
    check_content(victim, "victim\n");
    /* Without private tables, a batch checked just before the dup2 may
     * still land in the victim: only the private table rules that out. */
    CHECK_RESULT(r, private_tables ? TRACE_OK : TRACE_ERR_IO);
    CHECK_EQ_U64(cli_check(path), private_tables ? 0 : 3);
}

/* The caller's descriptor (trace_config.fd) keeps its number but is
 * checked the same way: a file dup2'ed over it is never written to, and
 * trace_stop leaves the number open (it is the caller's). */
static void borrowed_replaced(void)
{
    char path[PATH_BUF_LEN], victim[PATH_BUF_LEN];
    test_path(path, "borrowed.trace");
    test_path(victim, "borrowed.victim");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0);
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.fd = fd;
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
    wait_for_batches(path);
    int victim_fd;
    write_file(victim, "victim\n", &victim_fd);
    int err_fd = open("/dev/null", O_WRONLY);
    CHECK(err_fd >= 0 && dup2(err_fd, 2) == 2);
    close(err_fd);
    CHECK(dup2(victim_fd, fd) == fd);
    emit_lots(0x600000000000);
    trace_result r = trace_stop();
    CHECK(dup2(SAVED_STDERR, 2) == 2);
    CHECK(fcntl(fd, F_GETFD) >= 0);
    close(fd);
    close(victim_fd);
    check_content(victim, "victim\n");
    CHECK_RESULT(r, private_tables ? TRACE_OK : TRACE_ERR_IO);
    CHECK_EQ_U64(cli_check(path), private_tables ? 0 : 3);
}

/* Started with stdout closed: the trace does not take descriptor 1, so
 * what the program prints goes to the file it opens next. */
static void stdout_closed(void)
{
    char path[PATH_BUF_LEN], out[PATH_BUF_LEN];
    test_path(path, "stdout.trace");
    test_path(out, "stdout.out");
    fflush(stdout);
    close(1);
    start(path);
    CHECK(fcntl(1, F_GETFD) == -1);
    int out_fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(out_fd == 1);
    emit_lots(0x600000000000);
    printf("printed while tracing\n");
    fflush(stdout);
    emit_lots(0x600000000000);
    CHECK_RESULT(trace_stop(), TRACE_OK);
    CHECK(dup2(SAVED_STDOUT, 1) == 1);
    check_content(out, "printed while tracing\n");
    CHECK_EQ_U64(cli_check(path), 0);
}

/* Mode 0600 whatever the umask, for a new file and an existing one. */
static void mode_0600(void)
{
    char path[PATH_BUF_LEN];
    test_path(path, "umask.trace");
    mode_t old = umask(0777);
    start(path);
    CHECK_RESULT(trace_stop(), TRACE_OK);
    umask(old);
    struct stat st;
    CHECK(stat(path, &st) == 0);
    CHECK_MSG((st.st_mode & 07777) == 0600, "mode %o under umask 0777", (unsigned)(st.st_mode & 07777));
    CHECK_EQ_U64(cli_check(path), 0);
    CHECK(chmod(path, 0644) == 0);
    start(path);
    CHECK_RESULT(trace_stop(), TRACE_OK);
    CHECK(stat(path, &st) == 0);
    CHECK_MSG((st.st_mode & 07777) == 0600, "an overwritten 0644 file is mode %o", (unsigned)(st.st_mode & 07777));
}

/* A FIFO without a reader fails at once (ENXIO), one with a reader gets the
 * trace. The watchdog turns a hang into a failure. */
static void fifo(void)
{
    char path[PATH_BUF_LEN], copy[PATH_BUF_LEN];
    test_path(path, "trace.fifo");
    test_path(copy, "fifo.trace");
    CHECK(mkfifo(path, 0600) == 0);
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = path;
    CHECK_RESULT(trace_start(&cfg), TRACE_ERR_IO); /* ENXIO */
    int reader = open(path, O_RDONLY | O_NONBLOCK);
    CHECK(reader >= 0);
    CHECK_RESULT(trace_start(&cfg), TRACE_OK);
    trace_heap_object_alloc(0x600000000040, 48, 0);
    CHECK_RESULT(trace_stop(), TRACE_OK);
    /* A small trace: it fits in the pipe. */
    static char buf[1 << 16];
    ssize_t n = read(reader, buf, sizeof buf);
    CHECK(n > 16);
    close(reader);
    int out = open(copy, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(out >= 0 && write(out, buf, (size_t)n) == n);
    close(out);
    CHECK_EQ_U64(cli_check(copy), 0);
}

int main(void)
{
    test_begin("test_trace_fd", 120);
    struct rlimit lim;
    CHECK(getrlimit(RLIMIT_NOFILE, &lim) == 0);
    if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max <= SAVED_STDERR + 1) {
        printf("SKIP test_trace_fd: RLIMIT_NOFILE hard limit %lu is too low\n", (unsigned long)lim.rlim_max);
        return test_pass();
    }
    /* The high-limit cases need a soft limit of at least 2048. */
    original_soft = lim.rlim_cur < 4096 ? 4096 : lim.rlim_cur;
    if (lim.rlim_max != RLIM_INFINITY && original_soft > lim.rlim_max)
        original_soft = lim.rlim_max;
    set_soft_limit(original_soft);
    pthread_t probe;
    CHECK(pthread_create(&probe, NULL, probe_unshare, &private_tables) == 0);
    CHECK(pthread_join(probe, NULL) == 0);
    if (!private_tables)
        printf("test_trace_fd: unshare(CLONE_FILES) refused: testing the checked fallback\n");
    CHECK(fcntl(1, F_DUPFD_CLOEXEC, SAVED_STDOUT) == SAVED_STDOUT);
    CHECK(fcntl(2, F_DUPFD_CLOEXEC, SAVED_STDERR) == SAVED_STDERR);

    /* TEST_CASE=name runs one case (to see each fail on its own). */
    static const struct {
        const char *name;
        void (*run)(void);
    } cases[] = {
        {"mode_0600", mode_0600},
        {"fifo", fifo},
        {"out_of_reach", out_of_reach},
        {"replaced_by_the_program", replaced_by_the_program},
        {"borrowed_replaced", borrowed_replaced},
        {"stdout_closed", stdout_closed},
        {"closed_by_the_program", closed_by_the_program},
    };
    const char *only = getenv("TEST_CASE");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (only == NULL || strcmp(only, cases[i].name) == 0)
            cases[i].run();
    return test_pass();
}
