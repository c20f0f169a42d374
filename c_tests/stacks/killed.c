/* A program killed mid-run (crates/cli/tests/stack_correctness.rs): it
 * allocates from killed_alloc_site in a loop, prints "ready" on stdout
 * after N allocations, and goes on until it is killed. Its trace, cut by
 * the SIGKILL, must keep the stacks of the allocations it holds. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((noinline)) static void *killed_alloc_site(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("" : : "r"(p) : "memory");
    return p;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 100000;
    for (long i = 0;; i++) {
        void *p = killed_alloc_site(24 + (size_t)(i & 7) * 8);
        free(p);
        if (i + 1 == n) {
            printf("ready\n");
            fflush(stdout);
        }
        if (i >= n)
            usleep(100);
    }
}
