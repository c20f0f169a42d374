/* Frees the blocks libearly's constructor allocated before the shim's
 * constructor ran: the trace must know them ("exists"), so no free is of
 * an unknown object. */
#include "common.h"

extern void *early_blocks[5];

int main(void) {
    for (int i = 0; i < 5; i++) {
        CHECK(early_blocks[i]);
        free(early_blocks[i]);
    }
    return 0;
}
