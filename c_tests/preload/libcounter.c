/* A tiny counting interposer, written for the tests: counts the calls a
 * program makes to each entry point the alloctrace shim interposes, and
 * writes "name count" lines to $COUNT_OUTPUT when the program exits.
 *
 * It shares no code with the shim. Its window is the shim's: from its
 * constructor (an LD_PRELOAD library is initialised after the program's
 * libraries, as the shim is) to its atexit handler (registered in the
 * constructor, as the shim's is). mmap64 is the same function as mmap on
 * 64-bit glibc and is counted as mmap, as the shim does. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);

enum { MALLOC, CALLOC, REALLOC, FREE, POSIX_MEMALIGN, ALIGNED_ALLOC, MEMALIGN, VALLOC, PVALLOC,
       REALLOCARRAY, MMAP, MUNMAP, MREMAP, N_ENTRIES };
static const char *const names[N_ENTRIES] = {
    "malloc", "calloc", "realloc", "free", "posix_memalign", "aligned_alloc", "memalign",
    "valloc", "pvalloc", "reallocarray", "mmap", "munmap", "mremap"};
static unsigned long counts[N_ENTRIES];
static volatile int counting;

static void count(int e) {
    if (counting) __atomic_fetch_add(&counts[e], 1, __ATOMIC_RELAXED);
}

static void report(void) {
    counting = 0;
    const char *path = getenv("COUNT_OUTPUT");
    if (!path) return;
    char buf[1024];
    size_t n = 0;
    for (int e = 0; e < N_ENTRIES; e++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s %lu\n", names[e], counts[e]);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
        if (write(fd, buf, n) != (ssize_t)n) { /* nothing to do */ }
        close(fd);
    }
}

__attribute__((constructor)) static void start(void) {
    atexit(report);
    counting = 1;
}

void *malloc(size_t n) { count(MALLOC); return __libc_malloc(n); }
void *calloc(size_t n, size_t m) { count(CALLOC); return __libc_calloc(n, m); }
void *realloc(void *p, size_t n) { count(REALLOC); return __libc_realloc(p, n); }
void free(void *p) { count(FREE); __libc_free(p); }
void *memalign(size_t a, size_t n) { count(MEMALIGN); return __libc_memalign(a, n); }
void *aligned_alloc(size_t a, size_t n) { count(ALIGNED_ALLOC); return __libc_memalign(a, n); }
void *valloc(size_t n) { count(VALLOC); return __libc_valloc(n); }
void *pvalloc(size_t n) { count(PVALLOC); return __libc_pvalloc(n); }

int posix_memalign(void **out, size_t a, size_t n) {
    count(POSIX_MEMALIGN);
    if (a % sizeof(void *) != 0 || (a & (a - 1)) != 0 || a == 0) return EINVAL;
    void *p = __libc_memalign(a, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}

void *reallocarray(void *p, size_t n, size_t m) {
    count(REALLOCARRAY);
    size_t bytes;
    if (__builtin_mul_overflow(n, m, &bytes)) { errno = ENOMEM; return NULL; }
    return __libc_realloc(p, bytes);
}

static void *raw_mmap(void *a, size_t n, int prot, int flags, int fd, off_t off) {
    return (void *)syscall(SYS_mmap, a, n, prot, flags, fd, off);
}
void *mmap(void *a, size_t n, int prot, int flags, int fd, off_t off) {
    count(MMAP);
    return raw_mmap(a, n, prot, flags, fd, off);
}
void *mmap64(void *a, size_t n, int prot, int flags, int fd, off_t off) {
    count(MMAP);
    return raw_mmap(a, n, prot, flags, fd, off);
}
int munmap(void *a, size_t n) { count(MUNMAP); return (int)syscall(SYS_munmap, a, n); }
void *mremap(void *old, size_t old_n, size_t new_n, int flags, ...) {
    count(MREMAP);
    void *new_addr = NULL;
    if (flags & MREMAP_FIXED) {
        va_list ap;
        va_start(ap, flags);
        new_addr = va_arg(ap, void *);
        va_end(ap);
    }
    return (void *)syscall(SYS_mremap, old, old_n, new_n, flags, new_addr);
}
