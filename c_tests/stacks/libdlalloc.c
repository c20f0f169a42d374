/*
 * The library scenarios.c dlopens, uses and dlcloses (twice): n blocks of
 * `size` through sp_dl_entry -> sp_dl_leaf -> malloc.
 */
#include "paths.h"

#include <stdlib.h>

void *volatile sp_dl_sink;
static volatile unsigned sp_dl_after;

SP_NOINLINE void *sp_dl_leaf(size_t n)
{
    char *p = malloc(n);
    SP_BARRIER();
    if (p)
        p[n - 1] = 1;
    sp_dl_sink = p;
    return p;
}

SP_NOINLINE void sp_dl_entry(size_t size, int n)
{
    for (int i = 0; i < n; i++)
        free(sp_dl_leaf(size));
    SP_BARRIER();
    sp_dl_after++;
}
