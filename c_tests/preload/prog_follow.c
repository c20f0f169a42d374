/* The run follows every exec and spawn. `prog_follow MODE [LIB]` makes
 * 1000 allocations (events the parent's trace must hold), then starts
 * `prog_follow child` with:
 *
 *   preload LIB  execve, an environment whose LD_PRELOAD is LIB only
 *   execve       execve, a custom environment
 *   spawn        posix_spawn, a custom environment (waits for the child)
 *   spawnp       posix_spawnp, a custom environment (waits for the child)
 *   execl        execl (the process environment)
 *   execlp       execlp (the process environment)
 *   execle       execle, a custom environment
 *   disable      execve, a custom environment with ALLOCTRACE_DISABLE=1
 *
 * Each custom environment also sets ALLOCTRACE_OUTPUT to a directory that
 * does not exist and ALLOCTRACE_OVERWRITE=1: the run's values must win
 * (and overwrite must not reach a child). The child makes 100 allocations
 * and prints "child LD_PRELOAD=<its LD_PRELOAD>" and "argc N last A" (the
 * execl* modes pass 8 more arguments, "1" to "8": some of them, and
 * execle's envp, are passed on the stack). */
#include "common.h"

#include <errno.h>
#include <spawn.h>
#include <sys/wait.h>

extern char **environ;

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "child") == 0) {
        for (int i = 0; i < 100; i++) free(malloc(10));
        const char *p = getenv("LD_PRELOAD");
        const char *o = getenv("ALLOCTRACE_OVERWRITE");
        printf("child LD_PRELOAD=%s%s\n", p ? p : "(unset)", o ? " ALLOCTRACE_OVERWRITE is set" : "");
        /* execl* pass 8 more arguments, so some go on the stack. */
        printf("argc %d last %s\n", argc, argv[argc - 1]);
        return 0;
    }
    if (argc < 2) {
        fprintf(stderr, "usage: prog_follow preload LIB|execve|spawn|spawnp|execl|execlp|execle|disable\n");
        return 2;
    }
    for (int i = 0; i < 1000; i++) keep(malloc(16));
    const char *mode = argv[1];
    char preload[4096];
    snprintf(preload, sizeof preload, "LD_PRELOAD=%s", argc > 2 ? argv[2] : "");
    char *env[] = {"PATH=/usr/bin:/bin", "ALLOCTRACE_OUTPUT=/nonexistent/dir/x.%p.trace", "ALLOCTRACE_OVERWRITE=1",
                   NULL, NULL};
    if (strcmp(mode, "preload") == 0) env[3] = preload;
    if (strcmp(mode, "disable") == 0) env[3] = "ALLOCTRACE_DISABLE=1";
    char *child_argv[] = {argv[0], "child", NULL};

    if (strcmp(mode, "spawn") == 0 || strcmp(mode, "spawnp") == 0) {
        pid_t pid;
        int rc = mode[5] == 'p' ? posix_spawnp(&pid, argv[0], NULL, NULL, child_argv, env)
                                : posix_spawn(&pid, "/proc/self/exe", NULL, NULL, child_argv, env);
        CHECK(rc == 0);
        int status;
        CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
        return 0;
    }
    fflush(stdout);
    if (strcmp(mode, "execl") == 0) {
        execl("/proc/self/exe", argv[0], "child", "1", "2", "3", "4", "5", "6", "7", "8", (char *)NULL);
    } else if (strcmp(mode, "execlp") == 0) {
        execlp(argv[0], argv[0], "child", "1", "2", "3", "4", "5", "6", "7", "8", (char *)NULL);
    } else if (strcmp(mode, "execle") == 0) {
        execle("/proc/self/exe", argv[0], "child", "1", "2", "3", "4", "5", "6", "7", "8", (char *)NULL, env);
    } else {
        execve("/proc/self/exe", child_argv, env);
    }
    die(strerror(errno), __LINE__);
}
