/* fork while another thread allocates and maps memory. Each of the
 * FORKS (argv[1]) children frees 3 blocks it inherited, unmaps a mapping
 * it inherited, allocates and frees 100 blocks of its own, and exits. The
 * parent then frees what it kept. Parent and children each write a trace
 * of their own, and each must be consistent. */
#include "common.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>

static volatile int stop_helper;

static void *helper(void *arg) {
    (void)arg;
    uint64_t s = 3;
    while (!stop_helper) {
        void *p = malloc((size_t)(next_rand(&s) % 1000) + 1);
        void *m = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(p && m != MAP_FAILED);
        free(p);
        munmap(m, 8192);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 5;
    void *kept[10];
    for (int i = 0; i < 10; i++) kept[i] = malloc(100 + (size_t)i);
    char *region = mmap(NULL, 4 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(region != MAP_FAILED);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, helper, NULL) == 0);
    for (int f = 0; f < forks; f++) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            for (int i = 0; i < 3; i++) free(kept[i]);
            CHECK(munmap(region, 4 * 4096) == 0);
            for (int i = 0; i < 100; i++) {
                void *p = malloc(50);
                CHECK(p);
                free(p);
            }
            exit(0);
        }
        int status;
        CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    stop_helper = 1;
    CHECK(pthread_join(t, NULL) == 0);
    for (int i = 0; i < 10; i++) free(kept[i]);
    munmap(region, 4 * 4096);
    say("forks %ld\n", forks, 0);
    return 0;
}
