/*
 * Programs that must behave exactly as without the tracer
 * (crates/cli/tests/behaviour.rs), one per first argument. Each prints
 * only what is the same on every run (no addresses, no timings) and exits
 * 0 unless something went wrong:
 *
 *   longjmp          longjmp and siglongjmp out of nested calls that
 *                    allocate, siglongjmp out of a signal handler
 *   signals          a SIGUSR1 handler that allocates, raised in a loop
 *                    between allocations; a SIGALRM timer whose handler
 *                    maps and unmaps while the main code allocates
 *   fibers           makecontext/swapcontext fibers allocating on their
 *                    own (heap) stacks
 *   deep             allocations 300 calls deep (size 5333)
 *   corrupt          malloc called with a garbage frame pointer, and from
 *                    a frame whose saved frame pointer is garbage
 *   plugin LIB N     LIB dlopened, then its bh_plugin_alloc_many makes N
 *                    blocks of 7019 bytes at once
 *   dlrace LIB N     LIB dlopened, used and dlclosed N times while two
 *                    threads allocate
 *   mmap             bh_map_region maps 13 pages three times, and
 *                    bh_remap_region grows one mapping to 17 pages
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <ucontext.h>
#include <unistd.h>

#define BH_NOINLINE __attribute__((noinline, noclone))
#define BH_BARRIER() __asm__ volatile("" ::: "memory")

void *volatile bh_sink;

static void die(const char *what)
{
    perror(what);
    exit(99);
}

BH_NOINLINE static void *bh_alloc(size_t n)
{
    char *p = malloc(n);
    if (!p)
        die("malloc");
    p[0] = 1;
    p[n - 1] = 2;
    bh_sink = p;
    BH_BARRIER();
    return p;
}

/* --- longjmp --------------------------------------------------------------- */

static jmp_buf bh_jb;
static sigjmp_buf bh_sjb;
static void *bh_held[64];
static int bh_nheld;

/* Allocates at every level on the way down and jumps out at the bottom:
 * how 0 longjmp, 1 siglongjmp, 2 raise a signal whose handler
 * siglongjmps. The blocks are freed after the jump. */
BH_NOINLINE static void bh_jump_down(int depth, int how)
{
    bh_held[bh_nheld++] = bh_alloc(48 + (size_t)depth);
    if (depth == 0) {
        if (how == 0)
            longjmp(bh_jb, 1);
        if (how == 1)
            siglongjmp(bh_sjb, 2);
        raise(SIGUSR2);
        die("raise returned");
    }
    bh_jump_down(depth - 1, how);
    BH_BARRIER();
}

static void bh_on_usr2(int sig)
{
    (void)sig;
    bh_held[bh_nheld++] = bh_alloc(77);
    siglongjmp(bh_sjb, 3);
}

static void bh_free_held(void)
{
    while (bh_nheld > 0)
        free(bh_held[--bh_nheld]);
}

static int scn_longjmp(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = bh_on_usr2;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR2, &sa, NULL))
        die("sigaction");
    long jumps[4] = {0};
    for (int i = 0; i < 3000; i++) {
        int how = i % 3;
        int r = how == 0 ? setjmp(bh_jb) : sigsetjmp(bh_sjb, 1);
        if (r == 0) {
            bh_jump_down(10 + i % 20, how);
            die("no jump");
        }
        jumps[r]++;
        bh_free_held();
    }
    printf("longjmp %ld siglongjmp %ld from-handler %ld\n", jumps[1], jumps[2], jumps[3]);
    return 0;
}

/* --- signals --------------------------------------------------------------- */

static volatile sig_atomic_t bh_usr1, bh_alarms;

static void bh_on_usr1(int sig)
{
    (void)sig;
    void *p = bh_alloc(91);
    void *q = calloc(3, 33);
    free(p);
    free(q);
    bh_usr1++;
}

/* Interrupts the main code anywhere, inside malloc and the tracer
 * included: maps and unmaps (async-signal-safe). */
static void bh_on_alarm(int sig)
{
    (void)sig;
    void *p = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
        ((char *)p)[0] = 1;
        munmap(p, 8192);
    }
    bh_alarms++;
}

static int scn_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sa.sa_handler = bh_on_usr1;
    if (sigaction(SIGUSR1, &sa, NULL))
        die("sigaction");
    sa.sa_handler = bh_on_alarm;
    if (sigaction(SIGALRM, &sa, NULL))
        die("sigaction");

    for (int i = 0; i < 5000; i++) {
        void *p = bh_alloc(16 + (size_t)(i % 100));
        raise(SIGUSR1);
        free(p);
    }

    struct itimerval it = {{0, 200}, {0, 200}};
    if (setitimer(ITIMER_REAL, &it, NULL))
        die("setitimer");
    long rounds = 0;
    void *ring[64] = {0};
    while (rounds < 200000 || bh_alarms < 50) {
        size_t k = (size_t)rounds % 64;
        free(ring[k]);
        ring[k] = (rounds % 7) ? bh_alloc(32 + (size_t)(rounds % 500)) : NULL;
        if (rounds % 101 == 0) {
            void *r = realloc(NULL, 100);
            r = realloc(r, 5000);
            free(r);
        }
        rounds++;
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    for (int k = 0; k < 64; k++)
        free(ring[k]);
    printf("usr1 %d alarms-seen %s\n", (int)bh_usr1, bh_alarms >= 50 ? "yes" : "no");
    return 0;
}

/* --- fibers ---------------------------------------------------------------- */

#define NFIBERS 4
#define FIBER_STACK (128 * 1024)
static ucontext_t bh_main_ctx, bh_fiber_ctx[NFIBERS];
static long bh_fiber_sum[NFIBERS];

BH_NOINLINE static void bh_fiber_step(int id, int round)
{
    char *p = bh_alloc(100 + (size_t)(id * 10 + round % 7));
    bh_fiber_sum[id] += (long)(100 + id * 10 + round % 7);
    free(p);
}

static void bh_fiber(int id)
{
    for (int round = 0; round < 500; round++) {
        bh_fiber_step(id, round);
        if (swapcontext(&bh_fiber_ctx[id], &bh_main_ctx))
            die("swapcontext");
    }
}

static int scn_fibers(void)
{
    void *stacks[NFIBERS];
    for (int i = 0; i < NFIBERS; i++) {
        stacks[i] = malloc(FIBER_STACK);
        if (!stacks[i] || getcontext(&bh_fiber_ctx[i]))
            die("fiber");
        bh_fiber_ctx[i].uc_stack.ss_sp = stacks[i];
        bh_fiber_ctx[i].uc_stack.ss_size = FIBER_STACK;
        bh_fiber_ctx[i].uc_link = &bh_main_ctx;
        makecontext(&bh_fiber_ctx[i], (void (*)(void))bh_fiber, 1, i);
    }
    /* 500 rounds each, plus the return through uc_link. */
    for (int round = 0; round < 501; round++)
        for (int i = 0; i < NFIBERS; i++)
            if (swapcontext(&bh_main_ctx, &bh_fiber_ctx[i]))
                die("swapcontext");
    long total = 0;
    for (int i = 0; i < NFIBERS; i++) {
        total += bh_fiber_sum[i];
        free(stacks[i]);
    }
    printf("fibers %d total %ld\n", NFIBERS, total);
    return 0;
}

/* --- deep ------------------------------------------------------------------ */

BH_NOINLINE static long bh_deep(int depth)
{
    if (depth == 0) {
        void *p = bh_alloc(5333);
        free(p);
        return 1;
    }
    long r = bh_deep(depth - 1) + 1;
    BH_BARRIER();
    return r;
}

static int scn_deep(void)
{
    long r = 0;
    for (int i = 0; i < 3; i++)
        r += bh_deep(300);
    printf("deep %ld\n", r);
    return 0;
}

/* --- corrupt --------------------------------------------------------------- */

#if defined(__x86_64__)
/* malloc(n) called with rbp = garbage (the CFI is right: rbp is saved). */
void *bh_malloc_bad_rbp(size_t n, uintptr_t garbage);
__asm__(".text\n"
        ".globl bh_malloc_bad_rbp\n"
        ".type bh_malloc_bad_rbp, @function\n"
        "bh_malloc_bad_rbp:\n"
        ".cfi_startproc\n"
        "push %rbp\n"
        ".cfi_def_cfa_offset 16\n"
        ".cfi_offset %rbp, -16\n"
        "mov %rsi, %rbp\n"
        "call malloc@PLT\n"
        "pop %rbp\n"
        ".cfi_def_cfa_offset 8\n"
        "ret\n"
        ".cfi_endproc\n"
        ".size bh_malloc_bad_rbp, .-bh_malloc_bad_rbp\n");
#endif

/* Allocates with this frame's saved frame pointer overwritten (built with
 * frame pointers: the attribute below). */
__attribute__((noinline, noclone, optimize("no-omit-frame-pointer"))) static int
bh_corrupt_saved(uintptr_t garbage)
{
    void **fp = __builtin_frame_address(0);
    void *saved = fp[0];
    fp[0] = (void *)garbage;
    BH_BARRIER();
    void *p = malloc(5347);
    BH_BARRIER();
    fp[0] = saved;
    if (!p)
        return 0;
    free(p);
    return 1;
}

static int scn_corrupt(void)
{
    uintptr_t local = 0;
    uintptr_t garbage[] = {
        0,
        1,
        0xdeadbeefdeadbeefULL,
        0x00007ffffffff000ULL,
        (uintptr_t)&local, /* inside the stack, pointing at 0 */
        (uintptr_t)&garbage, /* inside the stack, a loop */
        (uintptr_t)bh_sink,
    };
    int n = (int)(sizeof garbage / sizeof garbage[0]);
    int ok = 0;
    for (int round = 0; round < 100; round++)
        for (int i = 0; i < n; i++) {
#if defined(__x86_64__)
            void *p = bh_malloc_bad_rbp(5341, garbage[i]);
            if (p) {
                ok++;
                free(p);
            }
#else
            ok++;
#endif
            ok += bh_corrupt_saved(garbage[i]);
        }
    printf("corrupt %d\n", ok);
    return 0;
}

/* --- plugin and dlrace ----------------------------------------------------- */

static void *bh_open(const char *lib)
{
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        exit(98);
    }
    return h;
}

BH_NOINLINE static int bh_call_plugin(const char *lib, int n)
{
    void *h = bh_open(lib);
    int (*many)(int, size_t) = (int (*)(int, size_t))dlsym(h, "bh_plugin_alloc_many");
    if (!many)
        die("dlsym");
    int made = many(n, 7019);
    BH_BARRIER();
    if (dlclose(h))
        die("dlclose");
    return made;
}

static int scn_plugin(const char *lib, int n)
{
    printf("plugin made %d\n", bh_call_plugin(lib, n));
    return 0;
}

static atomic_int bh_stop;

BH_NOINLINE static long bh_churn_inner(long i)
{
    void *a = bh_alloc(24 + (size_t)(i % 300));
    void *b = calloc(1, 40 + (size_t)(i % 70));
    long r = (long)(i % 300);
    free(a);
    free(b);
    return r;
}

static void *bh_churn(void *arg)
{
    (void)arg;
    long sum = 0;
    for (long i = 0; !atomic_load(&bh_stop) || i < 10000; i++)
        sum += bh_churn_inner(i);
    return (void *)(intptr_t)(sum != 0);
}

static int scn_dlrace(const char *lib, int n)
{
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        if (pthread_create(&t[i], NULL, bh_churn, NULL))
            die("pthread_create");
    long total = 0;
    for (int i = 0; i < n; i++) {
        void *h = bh_open(lib);
        long (*work)(int) = (long (*)(int))dlsym(h, "bh_plugin_work");
        if (!work)
            die("dlsym");
        total += work(i);
        if (dlclose(h))
            die("dlclose");
    }
    atomic_store(&bh_stop, 1);
    int ok = 1;
    for (int i = 0; i < 2; i++) {
        void *r;
        pthread_join(t[i], &r);
        ok &= r != NULL;
    }
    printf("dlrace %d total %ld threads %s\n", n, total, ok ? "ok" : "bad");
    return 0;
}

/* --- mmap ------------------------------------------------------------------ */

BH_NOINLINE static char *bh_map_region(size_t pages)
{
    size_t len = pages * (size_t)sysconf(_SC_PAGESIZE);
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        die("mmap");
    p[0] = 1;
    BH_BARRIER();
    return p;
}

BH_NOINLINE static char *bh_remap_region(char *p, size_t from, size_t to)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *q = mremap(p, from * page, to * page, MREMAP_MAYMOVE);
    if (q == MAP_FAILED)
        die("mremap");
    q[to * page - 1] = 1;
    BH_BARRIER();
    return q;
}

static int scn_mmap(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *m[3];
    for (int i = 0; i < 3; i++)
        m[i] = bh_map_region(13);
    m[0] = bh_remap_region(m[0], 13, 17);
    munmap(m[0], 17 * page);
    munmap(m[1], 13 * page);
    munmap(m[2], 13 * page);
    printf("mmap ok\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    const char *s = argv[1];
    if (!strcmp(s, "longjmp"))
        return scn_longjmp();
    if (!strcmp(s, "signals"))
        return scn_signals();
    if (!strcmp(s, "fibers"))
        return scn_fibers();
    if (!strcmp(s, "deep"))
        return scn_deep();
    if (!strcmp(s, "corrupt"))
        return scn_corrupt();
    if (!strcmp(s, "plugin") && argc > 3)
        return scn_plugin(argv[2], atoi(argv[3]));
    if (!strcmp(s, "dlrace") && argc > 3)
        return scn_dlrace(argv[2], atoi(argv[3]));
    if (!strcmp(s, "mmap"))
        return scn_mmap();
    return 2;
}
