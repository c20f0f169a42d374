/*
 * The call paths of the stack tests (crates/cli/tests/stacks.rs): each path
 * allocates a known number of blocks of a size no other path uses, so a
 * block's size says which path made it and its recorded stack must say the
 * same. Counts are distinct primes: a stack attributed to the wrong path
 * changes two counts by amounts no other path could explain.
 *
 * Every function of a path is named sp_*: the test keeps, of a stack's
 * symbolized frames, exactly those (and main), innermost first.
 */
#ifndef STACKS_PATHS_H
#define STACKS_PATHS_H

#include <stddef.h>

/* Keep each function a function of its own, called (not inlined, cloned
 * or merged), whatever the optimisation level. */
#define SP_NOINLINE __attribute__((noinline, noipa))
/* A compiler barrier: work after a call stays after it, so the call is
 * never a tail call (a jmp, which would drop the caller's frame). */
#define SP_BARRIER() __asm__ volatile("" ::: "memory")

/* Sizes (bytes) and counts of each path; stacks.rs has the same table. */
#define SP_SIZE_A 4001    /* sp_path_a -> sp_leaf */
#define SP_COUNT_A 3
#define SP_SIZE_B 4003    /* sp_path_b -> sp_leaf */
#define SP_COUNT_B 5
#define SP_SIZE_MID 4007  /* sp_path_b -> sp_mid -> sp_leaf */
#define SP_COUNT_MID 11
#define SP_SIZE_REC 4013  /* sp_rec x10 -> sp_leaf */
#define SP_COUNT_REC 7
#define SP_REC_DEPTH 10
#define SP_SIZE_CALLOC 4019 /* sp_path_c -> calloc */
#define SP_COUNT_CALLOC 13
#define SP_SIZE_CXX 4021  /* sp_path_cxx -> sp_cxx_leaf -> operator new[] (only WITH_CXX) */
#define SP_COUNT_CXX 17
/* Every other allocating entry point of the shim, each called directly by
 * sp_entries: its wrapper must drop exactly its own frames. */
#define SP_SIZE_REALLOC 4027 /* realloc(NULL, n) */
#define SP_COUNT_REALLOC 19
#define SP_SIZE_MEMALIGN_P 4049 /* posix_memalign */
#define SP_COUNT_MEMALIGN_P 23
#define SP_SIZE_ALIGNED 4051 /* aligned_alloc */
#define SP_COUNT_ALIGNED 29
#define SP_SIZE_MEMALIGN 4057 /* memalign */
#define SP_COUNT_MEMALIGN 31
#define SP_SIZE_VALLOC 4073 /* valloc */
#define SP_COUNT_VALLOC 37
#define SP_SIZE_REALLOCARRAY 4091 /* reallocarray(NULL, 1, n) */
#define SP_COUNT_REALLOCARRAY 41

#ifdef __cplusplus
extern "C" {
#endif
/* Runs every path (the C++ one when built WITH_CXX). */
void sp_run(void);
/* sp_cxx_leaf: n bytes from operator new[], touched (paths_cxx.cpp). */
void *sp_cxx_leaf(size_t n);
void sp_cxx_free(void *p);
#ifdef __cplusplus
}
#endif

#endif
