/* Records COUNT allocations (argv[2]) on the main thread and on THREADS
 * more threads (argv[3], default 0; they then block, or with argv[4]
 * "busy" go on allocating and freeing), and then ends as argv[1] says:
 *   segv         writes through a null pointer (SIGSEGV)
 *   abort        abort() (SIGABRT)
 *   double_free  frees a block twice: glibc aborts (SIGABRT)
 *   raise_term   raise(SIGTERM)
 *   pipe         writes to a pipe whose reader is gone (SIGPIPE)
 *   spew         writes lines to stdout until that fails (`| head -1`:
 *                SIGPIPE)
 *   wait         resets SIGINT and SIGQUIT to SIG_DFL (a background job
 *                inherits them ignored), prints "ready" and waits to be
 *                killed by another process
 *   quick_exit   quick_exit(3), after an at_quick_exit handler that allocates
 *   handler      catches SIGSEGV with a handler that counts, unprotects the
 *                page and returns, 100 times; prints the count; exits 0
 *   reporter     a crash reporter: its SIGSEGV handler prints a line, resets
 *                SIGSEGV to SIG_DFL with signal() and raises it again
 *   resethand    the same with SA_RESETHAND: the handler prints and returns,
 *                and the fault repeats under SIG_DFL
 *   ignore_pipe  ignores SIGPIPE, writes to a closed pipe, prints the errno;
 *                exits 0
 *   inherited_ignore  as ignore_pipe, with SIGPIPE ignored by the parent
 *   views        prints what sigaction reports for every signal, before and
 *                after setting handlers, SIG_IGN and SIG_DFL through
 *                sigaction, signal, sysv_signal and sigset: the output must
 *                be the same with and without the shim
 * Every line goes out with write(2). */
#include "common.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/mman.h>

/* Still exported by glibc, no longer declared by its headers. */
extern __sighandler_t bsd_signal(int, __sighandler_t);

static long count;

static void allocate(void) {
    for (long i = 0; i < count; i++) keep(malloc(24));
}

static volatile int threads_done;

static int busy;

static void *worker(void *arg) {
    (void)arg;
    allocate();
    __atomic_add_fetch(&threads_done, 1, __ATOMIC_SEQ_CST);
    if (busy)
        for (;;) free(malloc(48)); /* still allocating when main crashes */
    for (;;) pause();
    return NULL;
}

static void line(const char *s) {
    if (write(1, s, strlen(s)) < 0) { /* nothing to do */ }
}

/* printf to stdout through write(2), in one call. */
__attribute__((format(printf, 1, 2))) static void out(const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0 && write(1, buf, (size_t)n) < 0) { /* nothing to do */ }
}

/* --- handler: a SIGSEGV handler that fixes the fault and returns ------- */

static char *page;
static long page_size;
static volatile long faults;

static void fix_fault(int sig, siginfo_t *info, void *ctx) {
    (void)sig;
    (void)ctx;
    if ((char *)info->si_addr < page || (char *)info->si_addr >= page + page_size) _exit(70);
    faults++;
    mprotect(page, (size_t)page_size, PROT_READ | PROT_WRITE);
}

static void handler_mode(void) {
    page_size = sysconf(_SC_PAGESIZE);
    page = mmap(NULL, (size_t)page_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(page != MAP_FAILED);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = fix_fault;
    sa.sa_flags = SA_SIGINFO;
    CHECK(sigaction(SIGSEGV, &sa, NULL) == 0);
    struct sigaction now;
    CHECK(sigaction(SIGSEGV, NULL, &now) == 0);
    CHECK(now.sa_sigaction == fix_fault && (now.sa_flags & SA_SIGINFO));
    for (int i = 0; i < 100; i++) {
        ((volatile char *)page)[i] = 1;
        CHECK(mprotect(page, (size_t)page_size, PROT_NONE) == 0);
    }
    out("handled %ld faults\n", faults);
}

/* --- reporter and resethand ---------------------------------------------- */

static void reporter(int sig) {
    line("reporter ran\n");
    signal(sig, SIG_DFL);
    raise(sig);
}

static void reset_reporter(int sig) {
    (void)sig;
    line("reset reporter ran\n");
}

/* --- views ------------------------------------------------------------- */

static void fake_handler(int sig) { (void)sig; }

static void print_views(const char *when) {
    for (int sig = 1; sig < 32; sig++) {
        struct sigaction sa;
        memset(&sa, 0x5a, sizeof sa);
        if (sigaction(sig, NULL, &sa) != 0) continue;
        const char *h = sa.sa_handler == SIG_DFL ? "DFL" : sa.sa_handler == SIG_IGN ? "IGN"
                       : sa.sa_handler == fake_handler ? "fake" : "other";
        unsigned long mask = 0;
        for (int s = 1; s < 64; s++)
            if (sigismember(&sa.sa_mask, s) == 1) mask |= 1ul << s;
        out("%s %d %s flags=%#x mask=%#lx restorer=%s\n", when, sig, h, (unsigned)sa.sa_flags, mask,
            sa.sa_restorer ? "set" : "none");
    }
}

static void views_mode(void) {
    print_views("start");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sa.sa_flags = SA_RESTART | SA_NODEFER;
    sigaddset(&sa.sa_mask, SIGUSR2);
    CHECK(sigaction(SIGTERM, &sa, NULL) == 0);
    sa.sa_handler = SIG_IGN;
    CHECK(sigaction(SIGHUP, &sa, NULL) == 0);
    sa.sa_handler = fake_handler;
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
    sa.sa_flags = SA_RESETHAND;
    CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
    struct sigaction old;
    memset(&old, 0, sizeof old);
    sa.sa_handler = SIG_DFL;
    sa.sa_flags = 0;
    CHECK(sigaction(SIGQUIT, &sa, &old) == 0);
    out("old SIGQUIT %s flags=%#x\n", old.sa_handler == SIG_DFL ? "DFL" : "not DFL", (unsigned)old.sa_flags);
    out("signal SIGINT was %s\n", signal(SIGINT, fake_handler) == SIG_DFL ? "DFL" : "not DFL");
    out("signal SIGINT was %s\n", signal(SIGINT, SIG_DFL) == fake_handler ? "fake" : "not fake");
    out("sysv_signal SIGUSR2 was %s\n", sysv_signal(SIGUSR2, fake_handler) == SIG_DFL ? "DFL" : "not DFL");
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    out("sigset SIGXCPU was %s\n", sigset(SIGXCPU, SIG_IGN) == SIG_DFL ? "DFL" : "not DFL");
#pragma GCC diagnostic pop
    out("bsd_signal SIGPIPE was %s\n", bsd_signal(SIGPIPE, SIG_DFL) == SIG_DFL ? "DFL" : "not DFL");
    print_views("after");
}

static void at_quick(void) {
    keep(malloc(40));
    line("at_quick_exit handler ran\n");
}

int main(int argc, char **argv) {
    CHECK(argc >= 3);
    const char *mode = argv[1];
    count = atol(argv[2]);
    int threads = argc > 3 ? atoi(argv[3]) : 0;
    busy = argc > 4 && strcmp(argv[4], "busy") == 0;
    if (strcmp(mode, "views") == 0) {
        views_mode();
        return 0;
    }
    if (strcmp(mode, "wait") == 0) {
        signal(SIGINT, SIG_DFL);
        signal(SIGQUIT, SIG_DFL);
    }
    for (int i = 0; i < threads; i++) {
        pthread_t t;
        CHECK(pthread_create(&t, NULL, worker, NULL) == 0);
    }
    while (__atomic_load_n(&threads_done, __ATOMIC_SEQ_CST) < threads) usleep(1000);
    allocate();
    if (strcmp(mode, "segv") == 0) {
        *(volatile int *)sink = 0; /* sink holds a block: the write is fine */
        *(volatile int *)(uintptr_t)(count < 0) = 1;
    } else if (strcmp(mode, "abort") == 0) {
        abort();
    } else if (strcmp(mode, "double_free") == 0) {
        void *p = malloc(64);
        free(p);
        free(p);
    } else if (strcmp(mode, "raise_term") == 0) {
        raise(SIGTERM);
    } else if (strcmp(mode, "pipe") == 0 || strcmp(mode, "ignore_pipe") == 0 ||
               strcmp(mode, "inherited_ignore") == 0) {
        if (strcmp(mode, "ignore_pipe") == 0) signal(SIGPIPE, SIG_IGN);
        int fds[2];
        CHECK(pipe(fds) == 0);
        close(fds[0]);
        ssize_t n = write(fds[1], "x", 1);
        out("write returned %ld, errno %s\n", (long)n, errno == EPIPE ? "EPIPE" : "other");
        return 0;
    } else if (strcmp(mode, "spew") == 0) {
        for (long i = 0;; i++) out("line %ld\n", i);
    } else if (strcmp(mode, "wait") == 0) {
        line("ready\n");
        for (;;) pause();
    } else if (strcmp(mode, "quick_exit") == 0) {
        CHECK(at_quick_exit(at_quick) == 0);
        quick_exit(3);
    } else if (strcmp(mode, "handler") == 0) {
        handler_mode();
        return 0;
    } else if (strcmp(mode, "reporter") == 0) {
        signal(SIGSEGV, reporter);
        *(volatile int *)(uintptr_t)(count < 0) = 1;
    } else if (strcmp(mode, "resethand") == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = reset_reporter;
        sa.sa_flags = SA_RESETHAND;
        CHECK(sigaction(SIGSEGV, &sa, NULL) == 0);
        *(volatile int *)(uintptr_t)(count < 0) = 1;
    } else {
        die("unknown mode", __LINE__);
    }
    line("still alive\n");
    return 99;
}
