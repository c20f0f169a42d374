/* A counting interposer that chains, written for the tests: it defines
 * every function the alloctrace shim interposes besides the allocator
 * (libcounter.c counts those), counts each call by name, and forwards it
 * to the next definition, dlsym(RTLD_NEXT), as sandboxing, fake-time,
 * fake-root and tracing libraries do. Preloaded before the shim it sees the
 * program's calls and hands them to the shim; after it, it sees what the
 * shim forwards.
 *
 * Each process image appends one line to $CHAIN_OUTPUT when it ends (exit,
 * _exit, _Exit) and one before every exec call it forwards (exec discards
 * the atexit handler; the line of the last exec tried is the image's last):
 *     LABEL REASON name=count name=count ...
 * LABEL is argv[1] of the image (prog_chain's mode) or its argv[0].
 * mmap64 is counted apart from mmap. The variadic execl, execlp and
 * execle are forwarded as glibc builds them: as one execv, execvp and
 * execve. Nothing here calls a function it counts. */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ENTRIES(X)                                                                              \
    X(mmap) X(mmap64) X(munmap) X(mremap) X(pthread_create) X(sigaction) X(__sigaction)         \
    X(signal) X(bsd_signal) X(ssignal) X(sysv_signal) X(__sysv_signal) X(sigset) X(dlopen)     \
    X(dlmopen) X(dlclose) X(execve) X(execv) X(execvp) X(execvpe) X(fexecve) X(execl)          \
    X(execlp) X(execle) X(posix_spawn) X(posix_spawnp) X(_exit) X(_Exit)

#define ENUM(name) E_##name,
enum { ENTRIES(ENUM) N_ENTRIES };
#define NAME(name) #name,
static const char *const names[N_ENTRIES] = {ENTRIES(NAME)};
static unsigned long counts[N_ENTRIES];
static void *next_fn[N_ENTRIES];
static char label[64] = "?";

/* The next definition of entry e (cached; two threads store the same). */
static void *next(int e) {
    void *p = __atomic_load_n(&next_fn[e], __ATOMIC_ACQUIRE);
    if (!p) {
        p = dlsym(RTLD_NEXT, names[e]);
        if (!p) {
            static const char msg[] = "libchain: no next definition\n";
            if (write(2, msg, sizeof msg - 1) < 0) { /* nothing to do */ }
            syscall(SYS_exit_group, 127);
        }
        __atomic_store_n(&next_fn[e], p, __ATOMIC_RELEASE);
    }
    return p;
}

#define COUNT(e) __atomic_fetch_add(&counts[E_##e], 1, __ATOMIC_RELAXED)
/* (A data pointer to a function pointer, as dlsym(3) says to.) */
#define NEXT(e, type) (__extension__(type) next(E_##e))

/* Appends this image's line to $CHAIN_OUTPUT, in one write. */
static void dump(const char *reason) {
    const char *path = getenv("CHAIN_OUTPUT");
    if (!path) return;
    char buf[2048];
    int n = snprintf(buf, sizeof buf, "%s %s", label, reason);
    for (int e = 0; e < N_ENTRIES && n > 0 && (size_t)n < sizeof buf; e++)
        n += snprintf(buf + n, sizeof buf - (size_t)n, " %s=%lu", names[e],
                      __atomic_load_n(&counts[e], __ATOMIC_RELAXED));
    if (n <= 0 || (size_t)n + 1 >= sizeof buf) return;
    buf[n++] = '\n';
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd >= 0) {
        if (write(fd, buf, (size_t)n) != n) { /* nothing to do */ }
        close(fd);
    }
}

static void at_exit(void) { dump("exit"); }

__attribute__((constructor)) static void start(int argc, char **argv, char **envp) {
    (void)envp;
    const char *l = argc > 1 ? argv[1] : argc > 0 ? argv[0] : "?";
    snprintf(label, sizeof label, "%s", l);
    atexit(at_exit);
}

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);
void *mmap(void *a, size_t n, int prot, int flags, int fd, off_t off) {
    COUNT(mmap);
    return NEXT(mmap, mmap_fn)(a, n, prot, flags, fd, off);
}
void *mmap64(void *a, size_t n, int prot, int flags, int fd, off_t off) {
    COUNT(mmap64);
    return NEXT(mmap64, mmap_fn)(a, n, prot, flags, fd, off);
}
int munmap(void *a, size_t n) {
    COUNT(munmap);
    return NEXT(munmap, int (*)(void *, size_t))(a, n);
}
void *mremap(void *old, size_t old_n, size_t new_n, int flags, ...) {
    COUNT(mremap);
    void *new_addr = NULL;
    if (flags & MREMAP_FIXED) {
        va_list ap;
        va_start(ap, flags);
        new_addr = va_arg(ap, void *);
        va_end(ap);
    }
    return NEXT(mremap, void *(*)(void *, size_t, size_t, int, ...))(old, old_n, new_n, flags,
                                                                     new_addr);
}

int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*f)(void *), void *arg) {
    COUNT(pthread_create);
    return NEXT(pthread_create, int (*)(pthread_t *, const pthread_attr_t *, void *(*)(void *),
                                        void *))(t, attr, f, arg);
}

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    COUNT(sigaction);
    return NEXT(sigaction, sigaction_fn)(sig, act, old);
}
int __sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    COUNT(__sigaction);
    return NEXT(__sigaction, sigaction_fn)(sig, act, old);
}

typedef sighandler_t (*signal_fn)(int, sighandler_t);
#define SIGNAL_LIKE(name)                                \
    sighandler_t name(int sig, sighandler_t handler) {   \
        COUNT(name);                                     \
        return NEXT(name, signal_fn)(sig, handler);      \
    }
sighandler_t bsd_signal(int, sighandler_t);
sighandler_t ssignal(int, sighandler_t);
sighandler_t __sysv_signal(int, sighandler_t);
sighandler_t sigset(int, sighandler_t);
SIGNAL_LIKE(signal)
SIGNAL_LIKE(bsd_signal)
SIGNAL_LIKE(ssignal)
SIGNAL_LIKE(sysv_signal)
SIGNAL_LIKE(__sysv_signal)
SIGNAL_LIKE(sigset)

void *dlopen(const char *file, int mode) {
    COUNT(dlopen);
    return NEXT(dlopen, void *(*)(const char *, int))(file, mode);
}
void *dlmopen(Lmid_t lmid, const char *file, int mode) {
    COUNT(dlmopen);
    return NEXT(dlmopen, void *(*)(Lmid_t, const char *, int))(lmid, file, mode);
}
int dlclose(void *handle) {
    COUNT(dlclose);
    return NEXT(dlclose, int (*)(void *))(handle);
}

typedef int (*execve_fn)(const char *, char *const[], char *const[]);
typedef int (*execv_fn)(const char *, char *const[]);
int execve(const char *path, char *const argv[], char *const envp[]) {
    COUNT(execve);
    dump("exec");
    return NEXT(execve, execve_fn)(path, argv, envp);
}
int execv(const char *path, char *const argv[]) {
    COUNT(execv);
    dump("exec");
    return NEXT(execv, execv_fn)(path, argv);
}
int execvp(const char *file, char *const argv[]) {
    COUNT(execvp);
    dump("exec");
    return NEXT(execvp, execv_fn)(file, argv);
}
int execvpe(const char *file, char *const argv[], char *const envp[]) {
    COUNT(execvpe);
    dump("exec");
    return NEXT(execvpe, execve_fn)(file, argv, envp);
}
int fexecve(int fd, char *const argv[], char *const envp[]) {
    COUNT(fexecve);
    dump("exec");
    return NEXT(fexecve, int (*)(int, char *const[], char *const[]))(fd, argv, envp);
}

/* The argument list of an execl call (at most 63 arguments here). */
static int collect(char **argv, const char *arg, va_list *ap) {
    int n = 0;
    for (const char *a = arg; a; a = va_arg(*ap, const char *)) {
        if (n == 63) return -1;
        argv[n++] = (char *)a;
    }
    argv[n] = NULL;
    return n;
}
int execl(const char *path, const char *arg, ...) {
    COUNT(execl);
    dump("exec");
    char *argv[64];
    va_list ap;
    va_start(ap, arg);
    int n = collect(argv, arg, &ap);
    va_end(ap);
    if (n < 0) return -1;
    return NEXT(execv, execv_fn)(path, argv);
}
int execlp(const char *file, const char *arg, ...) {
    COUNT(execlp);
    dump("exec");
    char *argv[64];
    va_list ap;
    va_start(ap, arg);
    int n = collect(argv, arg, &ap);
    va_end(ap);
    if (n < 0) return -1;
    return NEXT(execvp, execv_fn)(file, argv);
}
int execle(const char *path, const char *arg, ...) {
    COUNT(execle);
    dump("exec");
    char *argv[64];
    va_list ap;
    va_start(ap, arg);
    int n = collect(argv, arg, &ap);
    char *const *envp = n < 0 ? NULL : va_arg(ap, char *const *);
    va_end(ap);
    if (n < 0) return -1;
    return NEXT(execve, execve_fn)(path, argv, envp);
}

typedef int (*spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                        const posix_spawnattr_t *, char *const[], char *const[]);
int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *actions,
                const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    COUNT(posix_spawn);
    return NEXT(posix_spawn, spawn_fn)(pid, path, actions, attr, argv, envp);
}
int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *actions,
                 const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    COUNT(posix_spawnp);
    return NEXT(posix_spawnp, spawn_fn)(pid, file, actions, attr, argv, envp);
}

void _exit(int status) {
    COUNT(_exit);
    dump("_exit");
    NEXT(_exit, void (*)(int))(status);
    for (;;) syscall(SYS_exit_group, status);
}
void _Exit(int status) {
    COUNT(_Exit);
    dump("_Exit");
    NEXT(_Exit, void (*)(int))(status);
    for (;;) syscall(SYS_exit_group, status);
}
