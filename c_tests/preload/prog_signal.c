/* A signal handler that allocates, firing every 20 microseconds while the
 * main thread makes interposed calls that change no heap state (free(NULL)
 * and failing mallocs: glibc returns before touching its arenas, so the
 * handler's malloc is safe). Many signals land while the main thread is
 * inside an event of the tracer: those events must be counted as lost,
 * never written into a half-written one. Prints "M H": main iterations and
 * handler runs; each makes one free and one malloc call. */
#include "common.h"

#include <signal.h>
#include <time.h>

static volatile long handled;
static volatile size_t huge = SIZE_MAX - 4096;

static void on_alarm(int sig) {
    (void)sig;
    void *p = malloc(32);
    keep(p);
    free(p);
    handled++;
}

int main(int argc, char **argv) {
    long iterations = argc > 1 ? atol(argv[1]) : 1000000;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
    timer_t timer;
    struct sigevent ev;
    memset(&ev, 0, sizeof ev);
    ev.sigev_notify = SIGEV_SIGNAL;
    ev.sigev_signo = SIGALRM;
    CHECK(timer_create(CLOCK_MONOTONIC, &ev, &timer) == 0);
    /* glibc sets its arena up in the process's first malloc; a handler
     * that mallocs while that runs crashes inside glibc, traced or not
     * (seen once in 300 runs). Set it up before the timer fires, with
     * calls the test does not count (it counts the malloc and free tags). */
    void *warm = calloc(1, 1);
    CHECK(warm != NULL);
    keep(realloc(warm, 0)); /* glibc frees it and returns NULL */
    struct itimerspec its = {{0, 20000}, {0, 20000}};
    CHECK(timer_settime(timer, 0, &its, NULL) == 0);
    for (long i = 0; i < iterations; i++) {
        free(NULL);
        keep(malloc(huge));
    }
    struct itimerspec off = {{0, 0}, {0, 0}};
    CHECK(timer_settime(timer, 0, &off, NULL) == 0);
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGALRM);
    sigprocmask(SIG_BLOCK, &block, NULL);
    say("%ld %ld\n", iterations, handled);
    return 0;
}
