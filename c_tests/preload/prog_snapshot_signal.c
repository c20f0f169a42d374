/* prog_snapshot_signal MODE DIR SUFFIX: the snapshot signal under the shim.
 *
 * Keeps 100 blocks of 4000 bytes live, then sends itself SIGUSR2 with
 * the disposition MODE leaves:
 *   dfl     SIG_DFL: the shim asks for a snapshot; waits (up to 60 s)
 *           until a file whose name ends with SUFFIX is in DIR, exits 0;
 *   handler its own handler, which must run; exits 0;
 *   ignore  SIG_IGN: nothing happens; exits 0.
 * Untraced, or with ALLOCTRACE_SNAPSHOT_SIGNAL=off, `dfl` dies by SIGUSR2
 * as any program would. */
#include <dirent.h>
#include <signal.h>
#include <time.h>

#include "common.h"

static volatile sig_atomic_t handled;
static void on_usr2(int sig) { (void)sig; handled = 1; }

static int found(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    size_t n = strlen(suffix);
    int yes = 0;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len >= n && strcmp(e->d_name + len - n, suffix) == 0) yes = 1;
    }
    closedir(d);
    return yes;
}

int main(int argc, char **argv) {
    CHECK(argc == 4);
    const char *mode = argv[1];
    static void *live[100];
    for (int i = 0; i < 100; i++) live[i] = malloc(4000);
    if (strcmp(mode, "handler") == 0) {
        CHECK(signal(SIGUSR2, on_usr2) != SIG_ERR);
    } else if (strcmp(mode, "ignore") == 0) {
        CHECK(signal(SIGUSR2, SIG_IGN) != SIG_ERR);
    } else {
        CHECK(strcmp(mode, "dfl") == 0);
    }
    CHECK(raise(SIGUSR2) == 0);
    if (strcmp(mode, "handler") == 0) CHECK(handled);
    if (strcmp(mode, "dfl") == 0) {
        struct timespec ms = {0, 10 * 1000 * 1000};
        int i = 0;
        while (!found(argv[2], argv[3])) {
            CHECK(++i < 6000);
            nanosleep(&ms, NULL);
        }
    }
    /* Still the program's own: a second signal acts the same. */
    if (strcmp(mode, "handler") == 0) {
        handled = 0;
        CHECK(raise(SIGUSR2) == 0);
        CHECK(handled);
    }
    for (int i = 0; i < 100; i++) keep(live[i]);
    say("done %ld %ld\n", 0, 0);
    return 0;
}
