/* Known numbers of calls of each function the shim interposes besides the
 * allocator, for libchain.c (a counting interposer that forwards to the
 * next definition), preloaded alone, before the shim and after it.
 *
 * usage: prog_chain main | tail | spawned
 *   main     500 mmap, mremap and munmap, 20 mmap64 (and munmap), 4
 *            threads, the signal functions, dlopen, dlmopen and dlclose,
 *            3 spawns of `prog_chain spawned`, every exec function once on
 *            a missing file (each fails), then execv of `prog_chain tail`.
 *            crates/preload/tests/shim/chain.rs holds the same numbers.
 *   tail     _exit(0);  spawned: _Exit(0). */
#include "common.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>

extern char **environ;
int __sigaction(int, const struct sigaction *, struct sigaction *);
sighandler_t bsd_signal(int, sighandler_t);
sighandler_t ssignal(int, sighandler_t);
sighandler_t __sysv_signal(int, sighandler_t);
sighandler_t sigset(int, sighandler_t);

static void *thread_main(void *arg) { return arg; }
static void on_usr(int sig) { (void)sig; }

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "tail") == 0) _exit(0);
    if (argc > 1 && strcmp(argv[1], "spawned") == 0) _Exit(0);
    CHECK(argc > 1 && strcmp(argv[1], "main") == 0);
    long page = sysconf(_SC_PAGESIZE);

    for (int i = 0; i < 500; i++) {
        void *p = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(p != MAP_FAILED);
        void *q = mremap(p, (size_t)page, 2 * (size_t)page, MREMAP_MAYMOVE);
        CHECK(q != MAP_FAILED);
        CHECK(munmap(q, 2 * (size_t)page) == 0);
    }
    for (int i = 0; i < 20; i++) {
        void *p = mmap64(NULL, (size_t)page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(p != MAP_FAILED);
        CHECK(munmap(p, (size_t)page) == 0);
    }

    pthread_t t[4];
    for (int i = 0; i < 4; i++) CHECK(pthread_create(&t[i], NULL, thread_main, NULL) == 0);
    for (int i = 0; i < 4; i++) CHECK(pthread_join(t[i], NULL) == 0);

    /* sigaction 6, __sigaction 2, each signal function once (SIGUSR1 and
     * SIGUSR2 are fatal by default: the shim keeps its view of them). */
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr;
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
    CHECK(sigaction(SIGUSR1, NULL, &old) == 0 && old.sa_handler == on_usr);
    CHECK(sigaction(SIGUSR2, &sa, &old) == 0 && old.sa_handler == SIG_DFL);
    sa.sa_handler = SIG_DFL;
    CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
    CHECK(sigaction(SIGUSR2, &sa, NULL) == 0);
    CHECK(sigaction(SIGHUP, NULL, &old) == 0);
    CHECK(__sigaction(SIGUSR1, NULL, &old) == 0 && old.sa_handler == SIG_DFL);
    CHECK(__sigaction(SIGUSR1, &sa, NULL) == 0);
    CHECK(signal(SIGUSR1, on_usr) == SIG_DFL);
    CHECK(bsd_signal(SIGUSR1, SIG_DFL) == on_usr);
    CHECK(ssignal(SIGUSR2, on_usr) == SIG_DFL);
    CHECK(sysv_signal(SIGUSR2, SIG_DFL) == on_usr);
    CHECK(__sysv_signal(SIGUSR1, on_usr) == SIG_DFL);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    CHECK(sigset(SIGUSR1, SIG_DFL) == on_usr);
#pragma GCC diagnostic pop

    /* dlopen 3, dlmopen 1, dlclose 4. */
    void *h[4];
    for (int i = 0; i < 3; i++) CHECK((h[i] = dlopen("libm.so.6", RTLD_NOW)) != NULL);
    CHECK((h[3] = dlmopen(LM_ID_BASE, "libm.so.6", RTLD_NOW)) != NULL);
    for (int i = 0; i < 4; i++) CHECK(dlclose(h[i]) == 0);

    /* posix_spawn 2, posix_spawnp 1 (a path: no search), each child
     * `prog_chain spawned`. */
    char *const spawned_argv[] = {argv[0], "spawned", NULL};
    pid_t pid[3];
    CHECK(posix_spawn(&pid[0], "/proc/self/exe", NULL, NULL, spawned_argv, environ) == 0);
    CHECK(posix_spawn(&pid[1], "/proc/self/exe", NULL, NULL, spawned_argv, environ) == 0);
    CHECK(posix_spawnp(&pid[2], argv[0], NULL, NULL, spawned_argv, environ) == 0);
    for (int i = 0; i < 3; i++) {
        int status;
        CHECK(waitpid(pid[i], &status, 0) == pid[i] && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }

    /* Every exec function once, failing; then execv of `prog_chain tail`. */
    const char *missing = "/nonexistent/prog_chain";
    char *const missing_argv[] = {"missing", NULL};
    CHECK(execve(missing, missing_argv, environ) == -1 && errno == ENOENT);
    CHECK(execv(missing, missing_argv) == -1 && errno == ENOENT);
    CHECK(execvp(missing, missing_argv) == -1 && errno == ENOENT);
    CHECK(execvpe(missing, missing_argv, environ) == -1 && errno == ENOENT);
    CHECK(fexecve(-1, missing_argv, environ) == -1);
    CHECK(execl(missing, "missing", (char *)NULL) == -1 && errno == ENOENT);
    CHECK(execlp(missing, "missing", (char *)NULL) == -1 && errno == ENOENT);
    CHECK(execle(missing, "missing", (char *)NULL, environ) == -1 && errno == ENOENT);
    say("main done\n", 0, 0);
    char *const tail_argv[] = {argv[0], "tail", NULL};
    execv("/proc/self/exe", tail_argv);
    die("execv", __LINE__);
}
