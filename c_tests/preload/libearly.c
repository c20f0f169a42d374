/* A library whose constructor allocates: ld.so runs it before the shim's
 * constructor, so the shim sees these calls before tracing starts. */
#include <stdlib.h>

void *early_blocks[5];

__attribute__((constructor)) static void early_init(void) {
    for (int i = 0; i < 5; i++) early_blocks[i] = malloc(100 * ((size_t)i + 1));
}
