/* Allocates COUNT (argv[2]) blocks on the main thread and a second thread,
 * then ends as argv[1] says:
 *   return      return from main
 *   exit        exit() from the second thread while main still allocates
 *   _exit       _exit(0)
 *   _Exit       _Exit(0)
 *   exit_group  the raw exit_group system call (no library code runs)
 *   kill        SIGKILL to itself
 * The last two give the writer a moment to write every full buffer. */
#include "common.h"

#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>

static long count;
static const char *mode;

static void allocate(void) {
    for (long i = 0; i < count; i++) keep(malloc(24));
}

static void *second(void *arg) {
    (void)arg;
    allocate();
    if (strcmp(mode, "exit") == 0) exit(0);
    return NULL;
}

int main(int argc, char **argv) {
    CHECK(argc == 3);
    mode = argv[1];
    count = atol(argv[2]);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, second, NULL) == 0);
    if (strcmp(mode, "exit") == 0) {
        for (;;) free(malloc(16)); /* until the second thread exits the process */
    }
    allocate();
    CHECK(pthread_join(t, NULL) == 0);
    if (strcmp(mode, "_exit") == 0) _exit(0);
    if (strcmp(mode, "_Exit") == 0) _Exit(0);
    if (strcmp(mode, "exit_group") == 0 || strcmp(mode, "kill") == 0) {
        usleep(200000);
        if (strcmp(mode, "kill") == 0) raise(SIGKILL);
        syscall(SYS_exit_group, 0);
    }
    return 0;
}
