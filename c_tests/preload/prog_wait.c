/* Waits for SIGINT, SIGTERM or SIGHUP (handlers installed over whatever
 * disposition it inherited, SIG_IGN included), then exits with
 * 10 + the signal number (12 INT, 15 TERM, 11 HUP), or with argv[2] when
 * given. Writes its pid to the file argv[1] once the handlers are in place,
 * so a test sends its signal only then. Allocates before and after waiting. */
#include "common.h"

#include <signal.h>
#include <unistd.h>

static volatile sig_atomic_t got;

static void handler(int sig) { got = sig; }

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: prog_wait READY_FILE [EXIT_CODE]\n");
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (int i = 0; i < 3; i++) sigaction(sigs[i], &sa, NULL);
    keep(malloc(100));
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", argv[1]);
    FILE *f = fopen(tmp, "w");
    if (!f) return 2;
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
    rename(tmp, argv[1]);
    while (!got) pause();
    keep(malloc(200));
    return argc > 2 ? atoi(argv[2]) : 10 + got;
}
