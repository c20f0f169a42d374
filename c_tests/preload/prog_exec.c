/* exec: first an exec that fails (the trace must go on, in a new file),
 * then an exec of itself with an environment that names neither the shim
 * nor any ALLOCTRACE_ variable: the shim carries them, so the new program
 * is traced too. The new program prints "child traced" when LD_PRELOAD
 * reached it. */
#include "common.h"

#include <errno.h>

int main(int argc, char **argv) {
    for (int i = 0; i < 100; i++) free(malloc(10));
    if (argc > 1 && strcmp(argv[1], "child") == 0) {
        say(getenv("LD_PRELOAD") ? "child traced\n" : "child untraced\n", 0, 0);
        return 0;
    }
    char *const bad_argv[] = {"nonexistent", NULL};
    CHECK(execv("/nonexistent/program", bad_argv) == -1 && errno == ENOENT);
    void *kept = malloc(1000);
    for (int i = 0; i < 100; i++) free(malloc(20));
    free(kept);
    char *const child_argv[] = {argv[0], "child", NULL};
    char *const clean_env[] = {"PATH=/usr/bin:/bin", NULL};
    execve("/proc/self/exe", child_argv, clean_env);
    die("execve", __LINE__);
}
