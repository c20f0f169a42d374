/* execl, execlp and execle for liballoctrace_preload.so (exec.rs).
 *
 * They are variadic, which Rust cannot define: these collect the argument
 * list into an array on the stack (no malloc: they may run in a vfork
 * child) and hand it to the shim's execv, execvp or execve wrapper, which
 * stops the session before the exec and carries the run into the new
 * program. The symbols are hidden: exec.rs exports execl, execlp and
 * execle as jumps to them. */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>

/* Most arguments (argv[0] included) an execl call may pass; more is E2BIG. */
#define EXECL_MAX_ARGS 4096

#define HIDDEN __attribute__((visibility("hidden")))

/* how: 0 execv(file, argv), 1 execvp(file, argv), 2 execve(file, argv, envp). */
typedef int (*exec_target)(int how, const char *file, char *const argv[], char *const envp[]);

static exec_target target;

HIDDEN void alloctrace_execl_init(exec_target t) { __atomic_store_n(&target, t, __ATOMIC_RELEASE); }

/* Collects arg, then the va_list up to its NULL, into argv; with `envp`,
 * reads the environment after the NULL. Returns the argument count, or -1
 * (errno E2BIG) if there are more than EXECL_MAX_ARGS. */
static int collect(char *argv[EXECL_MAX_ARGS + 1], const char *arg, va_list ap, char *const **envp) {
    int n = 0;
    argv[n] = (char *)arg;
    while (argv[n] != NULL) {
        if (++n == EXECL_MAX_ARGS) {
            errno = E2BIG;
            return -1;
        }
        argv[n] = va_arg(ap, char *);
    }
    if (envp) *envp = va_arg(ap, char *const *);
    return n;
}

static int run(int how, const char *file, char *const argv[], char *const envp[]) {
    exec_target t = __atomic_load_n(&target, __ATOMIC_ACQUIRE);
    if (t) return t(how, file, argv, envp);
    /* Before the shim's constructor: the exec functions by name. */
    switch (how) {
    case 0: return execv(file, argv);
    case 1: return execvp(file, argv);
    default: return execve(file, argv, envp);
    }
}

HIDDEN int alloctrace_execl(const char *path, const char *arg, ...) {
    char *argv[EXECL_MAX_ARGS + 1];
    va_list ap;
    va_start(ap, arg);
    int n = collect(argv, arg, ap, NULL);
    va_end(ap);
    return n < 0 ? -1 : run(0, path, argv, NULL);
}

HIDDEN int alloctrace_execlp(const char *file, const char *arg, ...) {
    char *argv[EXECL_MAX_ARGS + 1];
    va_list ap;
    va_start(ap, arg);
    int n = collect(argv, arg, ap, NULL);
    va_end(ap);
    return n < 0 ? -1 : run(1, file, argv, NULL);
}

HIDDEN int alloctrace_execle(const char *path, const char *arg, ...) {
    char *argv[EXECL_MAX_ARGS + 1];
    char *const *envp = NULL;
    va_list ap;
    va_start(ap, arg);
    int n = collect(argv, arg, ap, &envp);
    va_end(ap);
    return n < 0 ? -1 : run(2, path, argv, envp);
}
