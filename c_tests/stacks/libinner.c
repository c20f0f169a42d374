/* Built twice (crates/cli/tests/stack_correctness.rs): libinner0.so with
 * -DINNER=inner0, libinner1.so with -DINNER=inner1. The same code under
 * two names, so both loads put their function at the same offset and,
 * loaded in turn, at the same address. */
#include <stdlib.h>

__attribute__((noinline)) void *INNER(size_t n)
{
    void *p = malloc(n);
    __asm__ volatile("" : : "r"(p) : "memory");
    return p;
}

void *inner_alloc(size_t n)
{
    void *p = INNER(n);
    __asm__ volatile("" : : "r"(p) : "memory");
    return p;
}
