/* The program of crates/cli/tests/exit_frees.rs: every block it allocates
 * is freed at exit, none by main. EXIT_BLOCKS blocks of EXIT_BLOCK_SIZE
 * bytes each by: its own atexit handler; libexitfree's atexit handler
 * (registered by the library's constructor, before the shim's);
 * libexitfree's destructor; with WITH_CXX, libexitcxx's static object's
 * destructor. So 3 or 4 times EXIT_BLOCKS allocations and as many frees,
 * and no leak. Then LATE_BLOCKS blocks of LATE_BLOCK_SIZE bytes that
 * libexitfree frees in an exit handler that runs after the shim's, once
 * the session has ended: their frees are not in the trace, and are
 * counted in its lost events. */
#include <stdlib.h>

#include "exitfree.h"

static void *mine[EXIT_BLOCKS];

static void frees_mine(void) {
    for (int i = 0; i < EXIT_BLOCKS; i++) free(mine[i]);
}

static void *block(void) {
    void *p = malloc(EXIT_BLOCK_SIZE);
    if (!p) abort();
    return p;
}

int main(void) {
    atexit(frees_mine);
    for (int i = 0; i < EXIT_BLOCKS; i++) {
        mine[i] = block();
        exitfree_at_handler(i, block());
        exitfree_at_destructor(i, block());
#ifdef WITH_CXX
        exitcxx_keep(i, block());
#endif
    }
    for (int i = 0; i < LATE_BLOCKS; i++) {
        void *p = malloc(LATE_BLOCK_SIZE);
        if (!p) abort();
        exitfree_after_end(i, p);
    }
    return 0;
}
