/* A library of crates/cli/tests/exit_frees.rs whose exit-time code frees
 * what the program gave it. Its constructor runs before the shim's (ld.so
 * initialises the libraries a program links before the preloaded ones),
 * so the atexit handler it registers runs after the shim's atexit
 * handlers; its destructor runs in ld.so's _dl_fini, after the program's
 * atexit handlers and the shim's own destructor. */
#include <stdlib.h>

#include "exitfree.h"

static void *in_destructor[EXIT_BLOCKS];
static void *in_handler[EXIT_BLOCKS];

void exitfree_at_destructor(int i, void *p) { in_destructor[i] = p; }
void exitfree_at_handler(int i, void *p) { in_handler[i] = p; }

static void handler(void) {
    for (int i = 0; i < EXIT_BLOCKS; i++) free(in_handler[i]);
}

__attribute__((constructor)) static void registers_early(void) { atexit(handler); }

__attribute__((destructor)) static void frees_late(void) {
    for (int i = 0; i < EXIT_BLOCKS; i++) free(in_destructor[i]);
}
