/*
 * Scenario programs of the stack tests (crates/cli/tests/stacks.rs), one per
 * first argument; built at -O0 with frame pointers. Each allocates blocks
 * of sizes no other path uses on known call paths (functions sp_*), which
 * the test finds in the trace by size and checks the stacks of:
 *
 *   gens ROUNDS CHURN    ROUNDS rounds of CHURN malloc/free pairs (enough
 *                        trace for several generations) and 3 marker blocks
 *   threads              two waves of 4 threads that allocate and exit, the
 *                        second on stacks of another size
 *   many N               N threads alive at once (64 KiB stacks), each
 *                        allocating one block before any exits
 *   fork                 parent and child allocate on paths of their own
 *   dlopen LIB           a library loaded, used and unloaded, twice;
 *                        prints "dl SIZE BASE" for each load
 *   signal               a signal handler allocates while the main thread
 *                        spins in sp_sig_spin
 *   altstack             a signal handler on an alternate stack allocates
 *   deep                 allocations 300 calls deep
 *   corrupt              allocations from a function whose saved frame
 *                        pointer is garbage; exits 23
 */
#define _GNU_SOURCE /* dladdr */
#include "paths.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define SIZE_GEN_MARK 5003
#define SIZE_GEN_CHURN 24
#define SIZE_THREAD 5011
#define SIZE_FORK_PARENT 5021
#define SIZE_FORK_CHILD 5023
#define SIZE_DL_FIRST 5039
#define SIZE_DL_SECOND 5051
#define SIZE_SIGNAL 5059
#define SIZE_DEEP 5077
#define SIZE_CORRUPT 5081
#define SIZE_AFTER_CORRUPT 5087
#define SIZE_ALTSTACK 5101
#define SIZE_MANY 5107

void *volatile sp_sink;
static volatile unsigned sp_after;

static void die(const char *what)
{
    perror(what);
    exit(99);
}

SP_NOINLINE void *sp_leaf(size_t n)
{
    char *p = malloc(n);
    SP_BARRIER();
    if (!p)
        die("malloc");
    p[n - 1] = 1;
    sp_sink = p;
    return p;
}

/* n blocks of `size` from sp_leaf, freed. */
SP_NOINLINE void sp_alloc_n(size_t size, int n)
{
    for (int i = 0; i < n; i++)
        free(sp_leaf(size));
    SP_BARRIER();
    sp_after++;
}

/* --- gens ---------------------------------------------------------------- */

SP_NOINLINE void sp_gen_churn(long n)
{
    for (long i = 0; i < n; i++) {
        char *p = malloc(SIZE_GEN_CHURN);
        SP_BARRIER();
        sp_sink = p;
        free(p);
    }
    sp_after++;
}

SP_NOINLINE void sp_gen_mark(void)
{
    sp_alloc_n(SIZE_GEN_MARK, 3);
    sp_after++;
}

SP_NOINLINE static int sp_scn_gens(long rounds, long churn)
{
    for (long r = 0; r < rounds; r++) {
        sp_gen_churn(churn);
        sp_gen_mark();
    }
    sp_after++;
    return 0;
}

/* --- threads ------------------------------------------------------------- */

SP_NOINLINE void *sp_thread_body(void *arg)
{
    (void)arg;
    sp_alloc_n(SIZE_THREAD, 3);
    sp_after++;
    return NULL;
}

/* The second wave's threads take the slots the first wave's left, on
 * stacks of another size (so elsewhere: glibc's cache of stacks cannot
 * hand them the first wave's). */
SP_NOINLINE static int sp_scn_threads(void)
{
    for (int wave = 0; wave < 2; wave++) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        if (wave == 1 && pthread_attr_setstacksize(&attr, 1 << 20) != 0)
            die("pthread_attr_setstacksize");
        pthread_t t[4];
        for (int i = 0; i < 4; i++)
            if (pthread_create(&t[i], &attr, sp_thread_body, NULL) != 0)
                die("pthread_create");
        pthread_attr_destroy(&attr);
        for (int i = 0; i < 4; i++)
            pthread_join(t[i], NULL);
    }
    sp_after++;
    return 0;
}

/* --- many threads at once ------------------------------------------------- */

static pthread_barrier_t sp_many_barrier;

SP_NOINLINE void *sp_many_body(void *arg)
{
    (void)arg;
    sp_alloc_n(SIZE_MANY, 1);
    pthread_barrier_wait(&sp_many_barrier);
    sp_after++;
    return NULL;
}

/* Every thread allocates, then waits until all have: all n are alive at
 * once when they allocate, and none exits before the last has. */
SP_NOINLINE static int sp_scn_many(int n)
{
    pthread_t *t = calloc((size_t)n, sizeof *t);
    if (!t)
        die("calloc");
    if (pthread_barrier_init(&sp_many_barrier, NULL, (unsigned)n + 1) != 0)
        die("pthread_barrier_init");
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (pthread_attr_setstacksize(&attr, 64 << 10) != 0)
        die("pthread_attr_setstacksize");
    for (int i = 0; i < n; i++)
        if (pthread_create(&t[i], &attr, sp_many_body, NULL) != 0)
            die("pthread_create");
    pthread_attr_destroy(&attr);
    pthread_barrier_wait(&sp_many_barrier);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    free(t);
    sp_after++;
    return 0;
}

/* --- fork ---------------------------------------------------------------- */

SP_NOINLINE void sp_fork_parent(void)
{
    sp_alloc_n(SIZE_FORK_PARENT, 3);
    sp_after++;
}

SP_NOINLINE void sp_fork_child(void)
{
    sp_alloc_n(SIZE_FORK_CHILD, 5);
    sp_after++;
}

SP_NOINLINE static int sp_scn_fork(void)
{
    sp_fork_parent();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        sp_fork_child();
        exit(0);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        die("child");
    sp_fork_parent();
    sp_after++;
    return 0;
}

/* --- dlopen -------------------------------------------------------------- */

SP_NOINLINE static void sp_dl_use(const char *lib, size_t size, int n)
{
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        exit(99);
    }
    void (*entry)(size_t, int) = (void (*)(size_t, int))dlsym(h, "sp_dl_entry");
    if (!entry)
        die("dlsym");
    /* Where this load put the library, for the test to symbolize its
     * frames without the trace's modules batch. */
    Dl_info info;
    if (!dladdr((void *)entry, &info))
        die("dladdr");
    printf("dl %zu %p\n", size, info.dli_fbase);
    fflush(stdout);
    entry(size, n);
    SP_BARRIER();
    if (dlclose(h) != 0)
        die("dlclose");
    sp_after++;
}

SP_NOINLINE static int sp_scn_dlopen(const char *lib)
{
    sp_dl_use(lib, SIZE_DL_FIRST, 3);
    sp_dl_use(lib, SIZE_DL_SECOND, 5);
    sp_after++;
    return 0;
}

/* --- signal -------------------------------------------------------------- */

static volatile sig_atomic_t handled;
static volatile sig_atomic_t spinning;

SP_NOINLINE void sp_sig_handler(int sig)
{
    (void)sig;
    sp_alloc_n(SIZE_SIGNAL, 3);
    handled = 1;
}

/* Spins until the handler has run: the signal interrupts this function. */
SP_NOINLINE void sp_sig_spin(void)
{
    spinning = 1;
    while (!handled)
        SP_BARRIER();
    sp_after++;
}

static void *signaller(void *arg)
{
    pthread_t target = *(pthread_t *)arg;
    while (!spinning)
        usleep(1000);
    pthread_kill(target, SIGALRM);
    return NULL;
}

SP_NOINLINE static int sp_scn_signal(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = sp_sig_handler;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGALRM, &sa, NULL) != 0)
        die("sigaction");
    pthread_t self = pthread_self(), t;
    if (pthread_create(&t, NULL, signaller, &self) != 0)
        die("pthread_create");
    sp_sig_spin();
    pthread_join(t, NULL);
    sp_after++;
    return 0;
}

/* --- altstack ------------------------------------------------------------ */

SP_NOINLINE void sp_alt_handler(int sig)
{
    (void)sig;
    sp_alloc_n(SIZE_ALTSTACK, 3);
    sp_after++;
}

/* A handler on an alternate signal stack allocates: its stack pointer is
 * outside the thread's stack. */
SP_NOINLINE static int sp_scn_altstack(void)
{
    stack_t ss;
    memset(&ss, 0, sizeof ss);
    ss.ss_size = 1 << 16;
    ss.ss_sp = malloc(ss.ss_size);
    if (!ss.ss_sp || sigaltstack(&ss, NULL) != 0)
        die("sigaltstack");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = sp_alt_handler;
    sa.sa_flags = SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, NULL) != 0)
        die("sigaction");
    raise(SIGUSR1);
    sp_after++;
    return 0;
}

/* --- deep ---------------------------------------------------------------- */

SP_NOINLINE void sp_deep(int depth)
{
    if (depth > 1)
        sp_deep(depth - 1);
    else
        sp_alloc_n(SIZE_DEEP, 2);
    SP_BARRIER();
    sp_after++;
}

SP_NOINLINE static int sp_scn_deep(void)
{
    sp_deep(300);
    sp_after++;
    return 0;
}

/* --- corrupt ------------------------------------------------------------- */

/* Allocates with this frame's saved frame pointer (its caller's rbp, at
 * [rbp]) replaced by `garbage`, then puts it back. -O0 with frame
 * pointers: rbp is this frame's record. */
SP_NOINLINE void sp_corrupt(uintptr_t garbage)
{
    uintptr_t *volatile record = __builtin_frame_address(0);
    uintptr_t saved = record[0];
    if (garbage == 1)
        garbage = (uintptr_t)record; /* a cycle: the record names itself */
    else if (garbage == 2)
        garbage = (uintptr_t)&saved; /* below this frame: not increasing */
    record[0] = garbage;
    SP_BARRIER();
    char *p = malloc(SIZE_CORRUPT);
    SP_BARRIER();
    record[0] = saved;
    SP_BARRIER();
    if (!p)
        die("malloc");
    p[0] = 1;
    free(p);
}

SP_NOINLINE void sp_after_corrupt(void)
{
    sp_alloc_n(SIZE_AFTER_CORRUPT, 2);
    sp_after++;
}

SP_NOINLINE static int sp_scn_corrupt(void)
{
    static const uintptr_t garbage[] = {
        0x1234567,                  /* misaligned, not on the stack */
        UINT64_C(0xdeadbeefdeadbee8), /* aligned, not canonical */
        UINT64_C(0x10000),          /* aligned, below any stack */
        1,                          /* a cycle */
        2,                          /* below the frame */
    };
    for (size_t i = 0; i < sizeof garbage / sizeof garbage[0]; i++)
        sp_corrupt(garbage[i]);
    sp_after_corrupt();
    sp_after++;
    return 23;
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "";
    int rc;
    if (!strcmp(what, "gens") && argc == 4)
        rc = sp_scn_gens(atol(argv[2]), atol(argv[3]));
    else if (!strcmp(what, "threads"))
        rc = sp_scn_threads();
    else if (!strcmp(what, "many") && argc == 3)
        rc = sp_scn_many(atoi(argv[2]));
    else if (!strcmp(what, "fork"))
        rc = sp_scn_fork();
    else if (!strcmp(what, "dlopen") && argc == 3)
        rc = sp_scn_dlopen(argv[2]);
    else if (!strcmp(what, "signal"))
        rc = sp_scn_signal();
    else if (!strcmp(what, "altstack"))
        rc = sp_scn_altstack();
    else if (!strcmp(what, "deep"))
        rc = sp_scn_deep();
    else if (!strcmp(what, "corrupt"))
        rc = sp_scn_corrupt();
    else {
        fprintf(stderr, "usage: scenarios gens ROUNDS CHURN | threads | many N | fork | dlopen LIB | signal | altstack | deep | corrupt\n");
        return 2;
    }
    SP_BARRIER();
    return rc;
}
