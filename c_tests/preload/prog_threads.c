/* Short-lived threads: N threads in all (argv[1]), AT_ONCE of them running
 * together (argv[2]: 1 for one after another), each allocating and freeing
 * a few blocks (none with a third argument "idle": then the only events a
 * thread makes are glibc's as it ends). Prints "threads N" and, when N >= 2000, the resident
 * memory (VmRSS, kB) after the first 2000 threads and at the end, and the
 * peak (VmHWM): "rss_2000 A rss_end B hwm_end C". */
#include "common.h"

#include <fcntl.h>
#include <pthread.h>

/* A thread that allocates nothing itself. */
static void *idle(void *arg) {
    keep(arg);
    return NULL;
}

static void *work(void *arg) {
    uint64_t s = (uint64_t)(uintptr_t)arg * 2654435761u + 1;
    void *p[4];
    for (int i = 0; i < 4; i++) {
        p[i] = malloc((size_t)(next_rand(&s) % 512) + 1);
        CHECK(p[i]);
        keep(p[i]);
    }
    for (int i = 0; i < 4; i++) free(p[i]);
    return NULL;
}

/* A line of /proc/self/status ("VmRSS:" ...) in kB, read with read(2)
 * into a stack buffer: no stdio, so no allocation of its own. */
static long status_kb(const char *key) {
    char buf[8192];
    int fd = open("/proc/self/status", O_RDONLY);
    CHECK(fd >= 0);
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    CHECK(n > 0);
    buf[n] = '\0';
    char *line = strstr(buf, key);
    CHECK(line != NULL);
    return atol(line + strlen(key));
}

int main(int argc, char **argv) {
    long total = argc > 1 ? atol(argv[1]) : 20000;
    long at_once = argc > 2 ? atol(argv[2]) : 1;
    void *(*body)(void *) = argc > 3 && strcmp(argv[3], "idle") == 0 ? idle : work;
    CHECK(total > 0 && at_once > 0 && at_once <= 256);
    pthread_t t[256];
    long rss_2000 = -1;
    for (long done = 0; done < total;) {
        long n = total - done < at_once ? total - done : at_once;
        for (long i = 0; i < n; i++)
            CHECK(pthread_create(&t[i], NULL, body, (void *)(uintptr_t)(done + i)) == 0);
        for (long i = 0; i < n; i++) CHECK(pthread_join(t[i], NULL) == 0);
        done += n;
        if (done == 2000) rss_2000 = status_kb("VmRSS:");
    }
    say("threads %ld\n", total, 0);
    if (rss_2000 >= 0) {
        char line[128];
        int len = snprintf(line, sizeof line, "rss_2000 %ld rss_end %ld hwm_end %ld\n", rss_2000,
                           status_kb("VmRSS:"), status_kb("VmHWM:"));
        CHECK(write(1, line, (size_t)len) == len);
    }
    return 0;
}
