/*
 * The plugin of behaviour.c's `plugin` and `dlrace` scenarios
 * (crates/cli/tests/behaviour.rs): built at -O2 without frame pointers, so
 * that only its own unwind tables can unwind through it.
 */
#include <stdlib.h>
#include <string.h>

#define BH_NOINLINE __attribute__((noinline, noclone))

void *volatile bh_plugin_sink;
static void *keep[4096];

/* n blocks of `size` from this function itself, kept until all are made,
 * then freed. Returns the number made. */
BH_NOINLINE int bh_plugin_alloc_many(int n, size_t size)
{
    int made = 0;
    if (n > 4096)
        n = 4096;
    for (int i = 0; i < n; i++) {
        keep[i] = malloc(size);
        if (keep[i]) {
            memset(keep[i], i & 0xff, 8);
            made++;
        }
        __asm__ volatile("" ::: "memory");
    }
    for (int i = 0; i < n; i++)
        free(keep[i]);
    return made;
}

/* A little work that allocates: the sum of a block's bytes. */
BH_NOINLINE long bh_plugin_work(int i)
{
    size_t n = 64 + (size_t)(i % 50);
    unsigned char *p = malloc(n);
    if (!p)
        return -1;
    for (size_t k = 0; k < n; k++)
        p[k] = (unsigned char)(k + (size_t)i);
    long sum = 0;
    for (size_t k = 0; k < n; k++)
        sum += p[k];
    bh_plugin_sink = p;
    free(p);
    return sum;
}
