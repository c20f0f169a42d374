/*
 * The allocating call paths of paths.h. Built three ways by
 * crates/cli/tests/stacks.rs: with main.c at -O0 with frame pointers, with
 * main.c at -O2 without them, and as libpaths.so (with paths_cxx.cpp,
 * -DWITH_CXX) that main.c links against.
 */
#define _GNU_SOURCE /* reallocarray, valloc */
#include "paths.h"

#include <malloc.h>
#include <stdlib.h>

/* Where blocks go, so no allocation is optimised away. */
void *volatile sp_sink;
static volatile unsigned sp_after;

SP_NOINLINE void *sp_leaf(size_t n)
{
    char *p = malloc(n);
    SP_BARRIER();
    if (p)
        p[n - 1] = 1; /* touch the block: work after the call */
    sp_sink = p;
    return p;
}

SP_NOINLINE void sp_path_a(void)
{
    void *p = sp_leaf(SP_SIZE_A);
    SP_BARRIER();
    free(p);
    sp_after++;
}

SP_NOINLINE void *sp_mid(size_t n)
{
    void *p = sp_leaf(n);
    SP_BARRIER();
    sp_after++;
    return p;
}

/* One call of sp_path_b allocates through sp_leaf and through sp_mid. */
SP_NOINLINE void sp_path_b(int with_mid)
{
    void *p = with_mid ? sp_mid(SP_SIZE_MID) : sp_leaf(SP_SIZE_B);
    SP_BARRIER();
    free(p);
    sp_after++;
}

/* depth calls of sp_rec, the innermost calling sp_leaf. */
SP_NOINLINE void *sp_rec(int depth, size_t n)
{
    void *p = depth > 1 ? sp_rec(depth - 1, n) : sp_leaf(n);
    SP_BARRIER();
    sp_after++;
    return p;
}

SP_NOINLINE void sp_path_c(void)
{
    char *p = calloc(1, SP_SIZE_CALLOC);
    SP_BARRIER();
    if (p)
        p[1] = 2;
    sp_sink = p;
    free(p);
    sp_after++;
}

/* Keeps a block (touched), then frees it. */
static void sp_use(void *p)
{
    SP_BARRIER();
    if (p)
        ((char *)p)[0] = 4;
    sp_sink = p;
    free(p);
}

/* One block from each other entry point, called from here. */
SP_NOINLINE void sp_entries(int which)
{
    void *p = NULL;
    switch (which) {
    case 0:
        p = realloc(NULL, SP_SIZE_REALLOC);
        break;
    case 1:
        if (posix_memalign(&p, 64, SP_SIZE_MEMALIGN_P) != 0)
            p = NULL;
        break;
    case 2:
        p = aligned_alloc(64, SP_SIZE_ALIGNED);
        break;
    case 3:
        p = memalign(64, SP_SIZE_MEMALIGN);
        break;
    case 4:
        p = valloc(SP_SIZE_VALLOC);
        break;
    default:
        p = reallocarray(NULL, 1, SP_SIZE_REALLOCARRAY);
        break;
    }
    sp_use(p);
    sp_after++;
}

#ifdef WITH_CXX
SP_NOINLINE void sp_path_cxx(void)
{
    void *p = sp_cxx_leaf(SP_SIZE_CXX);
    SP_BARRIER();
    sp_cxx_free(p);
    sp_after++;
}
#endif

SP_NOINLINE void sp_run(void)
{
    for (int i = 0; i < SP_COUNT_A; i++)
        sp_path_a();
    for (int i = 0; i < SP_COUNT_B; i++)
        sp_path_b(0);
    for (int i = 0; i < SP_COUNT_MID; i++)
        sp_path_b(1);
    for (int i = 0; i < SP_COUNT_REC; i++)
        free(sp_rec(SP_REC_DEPTH, SP_SIZE_REC));
    for (int i = 0; i < SP_COUNT_CALLOC; i++)
        sp_path_c();
    static const int entry_counts[] = {SP_COUNT_REALLOC, SP_COUNT_MEMALIGN_P, SP_COUNT_ALIGNED,
                                       SP_COUNT_MEMALIGN, SP_COUNT_VALLOC, SP_COUNT_REALLOCARRAY};
    for (int e = 0; e < 6; e++)
        for (int i = 0; i < entry_counts[e]; i++)
            sp_entries(e);
#ifdef WITH_CXX
    for (int i = 0; i < SP_COUNT_CXX; i++)
        sp_path_cxx();
#endif
    SP_BARRIER();
    sp_after++;
}
