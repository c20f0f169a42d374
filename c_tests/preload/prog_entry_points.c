/* Calls every entry point the shim interposes, successes and failures,
 * with a fixed sequence of calls: run under the counting interposer and
 * under the shim, the two counts must be equal. All calls happen in main
 * and in two threads joined before main returns; nothing is printed. A
 * fork at the end checks that fork adds no call of the shim's own to the
 * parent's counts (the child leaves with _exit, which runs no atexit
 * handler, so the counter's report is the parent's). */
#include "common.h"

#include <sys/wait.h>

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <sys/mman.h>

#define PAGE 4096

/* Sizes no allocator can serve, hidden from the compiler's checks. */
static volatile size_t huge = SIZE_MAX - 4096;
static volatile size_t half = SIZE_MAX / 2;

static void heap_calls(uint64_t seed) {
    void *p[64];
    for (int round = 0; round < 50; round++) {
        for (int i = 0; i < 64; i++) p[i] = malloc((size_t)(next_rand(&seed) % 2000) + 1);
        for (int i = 0; i < 64; i += 2) free(p[i]);
        for (int i = 0; i < 64; i += 2) p[i] = calloc(4, (size_t)(next_rand(&seed) % 100) + 1);
        for (int i = 1; i < 64; i += 4) p[i] = realloc(p[i], (size_t)(next_rand(&seed) % 5000) + 1);
        for (int i = 0; i < 64; i++) free(p[i]);
    }
}

static void *thread_main(void *arg) {
    heap_calls((uint64_t)(uintptr_t)arg);
    return NULL;
}

int main(void) {
    /* malloc, calloc, free: success, failure, NULL */
    void *a = malloc(100);
    CHECK(a);
    CHECK(malloc(huge) == NULL);
    void *b = calloc(10, 10);
    CHECK(b);
    CHECK(calloc(half, 4) == NULL); /* overflow */
    free(NULL);
    free(NULL);

    /* realloc: from NULL, grow, shrink, failure, to zero */
    void *r = realloc(NULL, 10);
    CHECK(r);
    r = realloc(r, 100000);
    CHECK(r);
    r = realloc(r, 16);
    CHECK(r);
    CHECK(realloc(r, huge) == NULL && errno == ENOMEM);
    CHECK(realloc(r, 0) == NULL); /* frees r */

    /* reallocarray */
    void *ra = reallocarray(NULL, 10, 10);
    CHECK(ra);
    ra = reallocarray(ra, 100, 100);
    CHECK(ra);
    errno = 0;
    CHECK(reallocarray(ra, half, 3) == NULL && errno == ENOMEM);
    free(ra);

    /* the aligned family */
    void *pm = NULL;
    CHECK(posix_memalign(&pm, 64, 1000) == 0 && pm && (uintptr_t)pm % 64 == 0);
    void *untouched = &pm;
    void *pm2 = untouched;
    CHECK(posix_memalign(&pm2, 3, 10) == EINVAL && pm2 == untouched);
    CHECK(posix_memalign(&pm2, 64, huge) == ENOMEM && pm2 == untouched);
    void *aa = aligned_alloc(256, 512);
    CHECK(aa && (uintptr_t)aa % 256 == 0);
    void *ma = memalign(4096, 100);
    CHECK(ma && (uintptr_t)ma % 4096 == 0);
    CHECK(memalign(64, huge) == NULL);
    void *va = valloc(10);
    CHECK(va && (uintptr_t)va % PAGE == 0);
    void *pv = pvalloc(10);
    CHECK(pv && (uintptr_t)pv % PAGE == 0);
    free(pm);
    free(aa);
    free(ma);
    free(va);
    free(pv);
    free(a);
    free(b);

    /* mmap family: whole, partial, across spans, failures, file mappings */
    char *m = mmap(NULL, 16 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    CHECK(munmap(m, 2 * PAGE) == 0);                   /* head */
    CHECK(munmap(m + 14 * PAGE, 2 * PAGE) == 0);       /* tail */
    CHECK(munmap(m + 6 * PAGE, PAGE) == 0);            /* middle: two pieces left */
    CHECK(munmap(m, 16 * PAGE) == 0);                  /* all that is left, and holes */
    CHECK(mmap(NULL, 0, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED);
    CHECK(munmap((char *)PAGE + 1, PAGE) == -1);       /* EINVAL: unaligned */
    char *m2 = mmap64(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m2 != MAP_FAILED);
    char *m3 = mremap(m2, 4 * PAGE, 64 * PAGE, MREMAP_MAYMOVE);
    CHECK(m3 != MAP_FAILED);
    m3 = mremap(m3, 64 * PAGE, 8 * PAGE, 0);           /* shrink in place */
    CHECK(m3 != MAP_FAILED);
    CHECK(mremap(m3, 8 * PAGE, 0, 0) == MAP_FAILED);   /* EINVAL: new size 0 */
    /* A fixed mapping over the middle of an existing one. */
    char *m4 = mmap(NULL, 8 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m4 != MAP_FAILED);
    CHECK(mmap(m4 + 2 * PAGE, 2 * PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == m4 + 2 * PAGE);
    CHECK(munmap(m4, 8 * PAGE) == 0);
    int fd = open("/proc/self/exe", O_RDONLY);
    CHECK(fd >= 0);
    char *f = mmap(NULL, PAGE, PROT_READ, MAP_PRIVATE, fd, 0);
    CHECK(f != MAP_FAILED);
    close(fd);
    CHECK(munmap(f, PAGE) == 0);
    CHECK(mremap((void *)PAGE, PAGE, 2 * PAGE, 0) == MAP_FAILED); /* nothing mapped there */
    munmap(m3, 8 * PAGE);

    /* Two threads with a fixed sequence of calls each. */
    pthread_t t[2];
    for (int i = 0; i < 2; i++) CHECK(pthread_create(&t[i], NULL, thread_main, (void *)(uintptr_t)(i + 1)) == 0);
    heap_calls(99);
    for (int i = 0; i < 2; i++) CHECK(pthread_join(t[i], NULL) == 0);

    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        free(malloc(10));
        _exit(0);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return 0;
}
