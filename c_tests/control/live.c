/* A program with a known live heap, for the control socket's tests
 * (crates/cli/tests/control.rs): allocates 3 blocks of 1000 bytes in
 * site_a and 2 of 5000 in site_b, keeps them, and frees 4 of 777 it also
 * allocated. Options (argv[2...]): "close" closes every descriptor above
 * 2 first (as daemons do), "fork" forks a child that allocates 1 block of
 * 3000 and waits like its parent (its pid goes into READY_FILE.child),
 * "churn" keeps allocating and freeing (64 blocks of 100 bytes, freed at
 * once, every few milliseconds) while it waits, so that a flight
 * recorder's ring turns over; "long" makes the trace long before the
 * heap is in place (another thread's 100 blocks of 123 bytes, allocated
 * there and freed here, and 300,000 malloc/free pairs).
 * Writes its pid to READY_FILE (argv[1]) once its heap is in place, then
 * waits until READY_FILE.go exists (the child: or its parent has exited),
 * and exits 0. Synchronised by files
 * only. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void *volatile kept[16];
static int nkept;

__attribute__((noinline)) static void site_a(void) { kept[nkept++] = malloc(1000); }
__attribute__((noinline)) static void site_b(void) { kept[nkept++] = malloc(5000); }
__attribute__((noinline)) static void site_c(void) { kept[nkept++] = malloc(3000); }

static void *volatile churned[100];
static volatile int churn_ready;

__attribute__((noinline)) static void site_t(int i) { churned[i] = malloc(123); }

/* Allocates site_t's blocks, then stays until the process exits. */
static void *churn_thread(void *arg) {
    (void)arg;
    for (int i = 0; i < 100; i++) site_t(i);
    __atomic_store_n(&churn_ready, 1, __ATOMIC_RELEASE);
    for (;;) pause();
    return NULL;
}

static void long_trace(void) {
    pthread_t t;
    if (pthread_create(&t, NULL, churn_thread, NULL) != 0) exit(4);
    while (!__atomic_load_n(&churn_ready, __ATOMIC_ACQUIRE)) usleep(1000);
    for (int i = 0; i < 100; i++) free(churned[i]);
    for (int i = 0; i < 300000; i++) {
        void *volatile p = malloc(16 + i % 200);
        free(p);
    }
}

static void write_pid(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) exit(2);
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
    rename(tmp, path);
}

/* Waits until `path` exists, or (parent > 0) until the parent has
 * exited: a child never outlives the test's scratch directory. */
static int do_churn;

__attribute__((noinline)) static void churn(void) {
    void *volatile blocks[64];
    for (int i = 0; i < 64; i++) blocks[i] = malloc(100);
    for (int i = 0; i < 64; i++) free(blocks[i]);
}

static void wait_for(const char *path, pid_t parent) {
    struct stat st;
    while (stat(path, &st) != 0 && (parent == 0 || getppid() == parent)) {
        if (do_churn) churn();
        usleep(do_churn ? 1000 : 10000);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: live READY_FILE [close] [fork] [churn] [long]\n");
        return 2;
    }
    int do_close = 0, do_fork = 0, do_long = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "close")) do_close = 1;
        if (!strcmp(argv[i], "fork")) do_fork = 1;
        if (!strcmp(argv[i], "churn")) do_churn = 1;
        if (!strcmp(argv[i], "long")) do_long = 1;
    }
    if (do_close)
        for (int fd = 3; fd < 65536; fd++) close(fd);
    if (do_long) long_trace();
    for (int i = 0; i < 4; i++) free(malloc(777));
    for (int i = 0; i < 3; i++) site_a();
    for (int i = 0; i < 2; i++) site_b();
    char go[4096], child_ready[4096];
    snprintf(go, sizeof go, "%s.go", argv[1]);
    snprintf(child_ready, sizeof child_ready, "%s.child", argv[1]);
    if (do_fork) {
        pid_t pid = fork();
        if (pid < 0) return 3;
        if (pid == 0) {
            site_c();
            write_pid(child_ready);
            wait_for(go, getppid());
            return 0;
        }
    }
    write_pid(argv[1]);
    wait_for(go, 0);
    return 0;
}
