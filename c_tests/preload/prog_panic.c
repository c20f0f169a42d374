/* One call of every kind the shim records, each answer used: the malloc
 * family (each block written and read back, alignments and zeroing
 * checked), mmap, mremap and munmap, a thread that allocates, and a
 * dlopen'd library's function. Prints what it computed, then "ok".
 *
 * crates/preload/tests/shim/panic.rs runs it under the panic-test shim with
 * ALLOCTRACE_TEST_PANIC naming each kind (boundary.rs): the output and
 * exit status must be the untraced run's. */
#include "common.h"

#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <sys/mman.h>

/* Fills n bytes with c and returns their sum, read back. */
static long fill(void *p, int c, size_t n) {
    unsigned char *b = p;
    memset(b, c, n);
    long sum = 0;
    for (size_t i = 0; i < n; i++) sum += b[i];
    return sum;
}

static int aligned(const void *p, size_t align) { return ((uintptr_t)p & (align - 1)) == 0; }

static void *worker(void *arg) {
    size_t n = (size_t)arg;
    char *p = malloc(n);
    CHECK(p != NULL);
    long sum = fill(p, 'w', n);
    free(p);
    return (void *)sum;
}

int main(void) {
    long page = sysconf(_SC_PAGESIZE);
    long sum = 0;

    char *a = malloc(100);
    CHECK(a != NULL);
    sum += fill(a, 'a', 100);
    int *c = calloc(25, sizeof(int));
    CHECK(c != NULL);
    for (int i = 0; i < 25; i++) CHECK(c[i] == 0);
    a = realloc(a, 4000);
    CHECK(a != NULL);
    for (int i = 0; i < 100; i++) CHECK(a[i] == 'a');
    sum += fill(a, 'r', 4000);
    c = reallocarray(c, 50, sizeof(int));
    CHECK(c != NULL);
    sum += fill(c, 'y', 50 * sizeof(int));
    void *pm = NULL;
    CHECK(posix_memalign(&pm, 64, 200) == 0 && aligned(pm, 64));
    sum += fill(pm, 'p', 200);
    void *al = aligned_alloc(128, 256);
    CHECK(al != NULL && aligned(al, 128));
    sum += fill(al, 'l', 256);
    void *me = memalign(256, 300);
    CHECK(me != NULL && aligned(me, 256));
    sum += fill(me, 'm', 300);
    void *va = valloc(1000);
    CHECK(va != NULL && aligned(va, (size_t)page));
    sum += fill(va, 'v', 1000);
    void *pv = pvalloc(1000);
    CHECK(pv != NULL && aligned(pv, (size_t)page));
    sum += fill(pv, 'P', (size_t)page);
    free(a);
    free(c);
    free(pm);
    free(al);
    free(me);
    free(va);
    free(pv);

    size_t len = 16 * (size_t)page;
    char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    long msum = fill(m, 'M', len);
    m = mremap(m, len, 2 * len, MREMAP_MAYMOVE);
    CHECK(m != MAP_FAILED);
    for (size_t i = 0; i < len; i++) CHECK(m[i] == 'M');
    msum += fill(m + len, 'N', len);
    CHECK(munmap(m, 2 * len) == 0);
    say("heap %ld, mappings %ld\n", sum, msum);

    pthread_t t;
    void *ret = NULL;
    CHECK(pthread_create(&t, NULL, worker, (void *)1000) == 0);
    CHECK(pthread_join(t, &ret) == 0);

    void *lib = dlopen("libm.so.6", RTLD_NOW);
    CHECK(lib != NULL);
    void *sym = dlsym(lib, "cos");
    CHECK(sym != NULL);
    double (*cosine)(double);
    memcpy(&cosine, &sym, sizeof cosine); /* ISO C has no pointer cast for it */
    say("thread %ld, cos(0) %ld\n", (long)ret, (long)cosine(0.0));
    CHECK(dlclose(lib) == 0);

    /* stdio allocates its buffer: one more call after the others. */
    printf("ok\n");
    return 0;
}
