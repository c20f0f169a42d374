/* The program keeps its own allocator under the shim: run with the name of
 * the allocator it links or has preloaded (jemalloc, tcmalloc, mimalloc),
 * it checks through that allocator's own API that the malloc family's
 * blocks are that allocator's:
 *
 *   jemalloc: mallctl("thread.allocated") grows by what was allocated,
 *             malloc_usable_size(p) == sallocx(p, 0) for every entry point's
 *             block; with a second argument "mallocx" it only checks that
 *             free(mallocx(64, 0)) works (a block the trace never saw
 *             allocated: its free is an anomaly for `check`);
 *   tcmalloc: MallocExtension_GetOwnership(p) says tcmalloc owns p, and
 *             malloc_usable_size(p) == tc_malloc_size(p);
 *   mimalloc: mi_check_owned(p), malloc_usable_size(p) == mi_usable_size(p).
 *
 * The allocator's functions are looked up with dlsym (no -dev headers).
 * Prints "ALLOCS N" (the number of successful allocation calls it made) and
 * "ok" at the end. */
#include "common.h"

#include <dlfcn.h>
#include <malloc.h>

typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);
typedef size_t (*sallocx_fn)(const void *, int);
typedef void *(*mallocx_fn)(size_t, int);
typedef size_t (*size_fn)(const void *);
typedef int (*ownership_fn)(const void *);
typedef int (*owned_fn)(const void *);

static const char *which;
static long allocs;

/* Stores the function `name` into *fn (a function pointer's address):
 * ISO C has no cast from dlsym's void * to a function pointer. */
static void need(const char *name, void *fn) {
    void *f = dlsym(RTLD_DEFAULT, name);
    if (!f) {
        fprintf(stderr, "FAIL: %s not found: is %s linked or preloaded?\n", name, which);
        exit(1);
    }
    memcpy(fn, &f, sizeof f);
}

/* Whether p is a block of the allocator under test, with its size agreeing. */
static void check_block(void *p, size_t requested, int line) {
    if (!p) die("allocation failed", line);
    allocs++;
    size_t usable = malloc_usable_size(p);
    if (usable < requested) die("malloc_usable_size below the requested size", line);
    if (strcmp(which, "jemalloc") == 0) {
        sallocx_fn sallocx;
        need("sallocx", &sallocx);
        if (sallocx(p, 0) != usable) die("malloc_usable_size != sallocx", line);
    } else if (strcmp(which, "tcmalloc") == 0) {
        /* MallocExtension::kOwned is 1. */
        ownership_fn ownership;
        size_fn tc_malloc_size;
        need("MallocExtension_GetOwnership", &ownership);
        need("tc_malloc_size", &tc_malloc_size);
        if (ownership(p) != 1) die("block not owned by tcmalloc", line);
        if (tc_malloc_size(p) != usable) die("malloc_usable_size != tc_malloc_size", line);
    } else {
        owned_fn mi_check_owned;
        size_fn mi_usable_size;
        need("mi_check_owned", &mi_check_owned);
        need("mi_usable_size", &mi_usable_size);
        if (!mi_check_owned(p)) die("block not owned by mimalloc", line);
        if (mi_usable_size(p) != usable) die("malloc_usable_size != mi_usable_size", line);
    }
}

static uint64_t jemalloc_allocated(void) {
    uint64_t v = 0;
    size_t len = sizeof v;
    mallctl_fn mallctl;
    need("mallctl", &mallctl);
    if (mallctl("thread.allocated", &v, &len, NULL, 0) != 0) die("mallctl thread.allocated", __LINE__);
    return v;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s jemalloc|tcmalloc|mimalloc [mallocx]\n", argv[0]);
        return 2;
    }
    which = argv[1];
    if (argc > 2 && strcmp(argv[2], "mallocx") == 0) {
        /* A block of jemalloc's own API, freed with free. */
        mallocx_fn mallocx;
        need("mallocx", &mallocx);
        void *x = mallocx(64, 0);
        check_block(x, 64, __LINE__);
        free(x);
        say("ok\n", 0, 0);
        return 0;
    }
    uint64_t before = strcmp(which, "jemalloc") == 0 ? jemalloc_allocated() : 0;

    enum { N = 1000, SIZE = 1000 };
    static void *blocks[N];
    for (int i = 0; i < N; i++) {
        blocks[i] = malloc(SIZE);
        check_block(blocks[i], SIZE, __LINE__);
    }
    if (strcmp(which, "jemalloc") == 0) {
        uint64_t grown = jemalloc_allocated() - before;
        if (grown < (uint64_t)N * SIZE) die("thread.allocated did not grow by what malloc allocated", __LINE__);
        say("jemalloc thread.allocated grew by %ld for %ld bytes\n", (long)grown, (long)N * SIZE);
    }
    for (int i = 0; i < N; i++) {
        blocks[i] = realloc(blocks[i], SIZE * 3);
        check_block(blocks[i], SIZE * 3, __LINE__);
        free(blocks[i]);
    }

    void *p = calloc(10, 100);
    check_block(p, 1000, __LINE__);
    for (int i = 0; i < 1000; i++) CHECK(((char *)p)[i] == 0);
    free(p);
    CHECK(posix_memalign(&p, 256, 1000) == 0);
    check_block(p, 1000, __LINE__);
    CHECK(((uintptr_t)p & 255) == 0);
    free(p);
    p = aligned_alloc(64, 640);
    check_block(p, 640, __LINE__);
    free(p);
    p = memalign(128, 100);
    check_block(p, 100, __LINE__);
    free(p);
    p = valloc(100);
    check_block(p, 100, __LINE__);
    free(p);
    p = realloc(NULL, 50);
    check_block(p, 50, __LINE__);
    free(p);
    free(NULL);

    say("ALLOCS %ld\nok\n", allocs, 0);
    return 0;
}
