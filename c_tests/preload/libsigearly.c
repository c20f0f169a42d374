/* A library whose constructor installs a SIGTERM handler before the shim's
 * constructor runs (preloaded after the shim, it is initialised first):
 * the shim must leave it in place. The handler says so and exits 7. */
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void on_term(int sig) {
    (void)sig;
    static const char msg[] = "early handler ran\n";
    if (write(1, msg, sizeof msg - 1) < 0) { /* nothing to do */ }
    _exit(7);
}

__attribute__((constructor)) static void install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
}
