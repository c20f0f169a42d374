/* Failing reallocs, for the sampling mode's exact totals
 * (crates/preload/tests/shim/sampling.rs): allocates N (argv[1]) blocks of
 * 64 bytes, asks each FAILS (argv[2]) times to grow to a size no allocator
 * grants (the block stays, unchanged), then frees them all. Two runs that
 * differ only in FAILS differ in the trace's totals by the failed calls
 * alone. Prints nothing. */
#include "common.h"

#include <errno.h>

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000;
    long fails = argc > 2 ? atol(argv[2]) : 1;
    /* volatile: the compiler neither warns about nor folds the size. */
    volatile size_t huge = SIZE_MAX / 2;
    void **blocks = calloc((size_t)n, sizeof *blocks);
    CHECK(blocks);
    for (long i = 0; i < n; i++) {
        blocks[i] = malloc(64);
        CHECK(blocks[i]);
    }
    for (long f = 0; f < fails; f++) {
        for (long i = 0; i < n; i++) {
            errno = 0;
            void *q = realloc(blocks[i], huge);
            CHECK(q == NULL && errno == ENOMEM);
        }
    }
    for (long i = 0; i < n; i++)
        free(blocks[i]);
    free(blocks);
    return 0;
}
