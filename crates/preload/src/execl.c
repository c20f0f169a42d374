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

/* Most arguments (argv[0] included) an execl call may pass; more is E2BIG.
 * (Each call uses a stack array of exactly its own number.) */
#define EXECL_MAX_ARGS 65536

#define HIDDEN __attribute__((visibility("hidden")))

/* how: 0 execv(file, argv), 1 execvp(file, argv), 2 execve(file, argv, envp). */
typedef int (*exec_target)(int how, const char *file, char *const argv[], char *const envp[]);

static exec_target target;

HIDDEN void alloctrace_execl_init(exec_target t) { __atomic_store_n(&target, t, __ATOMIC_RELEASE); }

/* The number of arguments from arg to the NULL that ends the list
 * (argv[0] included, the NULL not), or -1 (errno E2BIG) if there are more
 * than EXECL_MAX_ARGS. Reads a copy of the caller's list. */
static int count(const char *arg, va_list *ap) {
    int n = 0;
    va_list copy;
    va_copy(copy, *ap);
    for (const char *a = arg; a != NULL; a = va_arg(copy, const char *)) {
        if (++n > EXECL_MAX_ARGS) {
            n = -1;
            errno = E2BIG;
            break;
        }
    }
    va_end(copy);
    return n;
}

/* Stores arg and the next n - 1 arguments, then NULL, into argv[0..n],
 * and reads the NULL that ends the list (a pointer to the caller's list,
 * so the caller may go on reading it: execle's envp comes next). */
static void collect(char **argv, int n, const char *arg, va_list *ap) {
    argv[0] = (char *)arg;
    for (int i = 1; i < n; i++) argv[i] = va_arg(*ap, char *);
    argv[n] = NULL;
    if (n > 0) (void)va_arg(*ap, char *);
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

/* Each collects its arguments into an array on its own stack of exactly
 * their number (as glibc's do), then execs through the shim. */
HIDDEN int alloctrace_execl(const char *path, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    int n = count(arg, &ap);
    if (n < 0) {
        va_end(ap);
        return -1;
    }
    char *argv[n + 1];
    collect(argv, n, arg, &ap);
    va_end(ap);
    return run(0, path, argv, NULL);
}

HIDDEN int alloctrace_execlp(const char *file, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    int n = count(arg, &ap);
    if (n < 0) {
        va_end(ap);
        return -1;
    }
    char *argv[n + 1];
    collect(argv, n, arg, &ap);
    va_end(ap);
    return run(1, file, argv, NULL);
}

HIDDEN int alloctrace_execle(const char *path, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    int n = count(arg, &ap);
    if (n < 0) {
        va_end(ap);
        return -1;
    }
    char *argv[n + 1];
    collect(argv, n, arg, &ap);
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    return run(2, path, argv, envp);
}
