/* A library of crates/cli/tests/exit_frees.rs whose exit-time code frees
 * what the program gave it. Its constructor runs before the shim's (ld.so
 * initialises the libraries a program links before the preloaded ones),
 * so the exit handlers it registers were registered before the shim's:
 * the atexit one runs at the library's turn in ld.so's _dl_fini (its
 * __cxa_finalize), like its destructor, after the program's atexit
 * handlers and the shim's own destructor; the one registered for the
 * process (no DSO handle) runs after the shim's exit handler, after the
 * session ended. */
#include <stdlib.h>

#include "exitfree.h"

/* glibc's; atexit is __cxa_atexit(f, NULL, the library's DSO handle). */
extern int __cxa_atexit(void (*f)(void *), void *arg, void *dso);

static void *in_destructor[EXIT_BLOCKS];
static void *in_handler[EXIT_BLOCKS];
static void *after_end[LATE_BLOCKS];

void exitfree_at_destructor(int i, void *p) { in_destructor[i] = p; }
void exitfree_at_handler(int i, void *p) { in_handler[i] = p; }
void exitfree_after_end(int i, void *p) { after_end[i] = p; }

static void handler(void) {
    for (int i = 0; i < EXIT_BLOCKS; i++) free(in_handler[i]);
}

static void last_handler(void *arg) {
    (void)arg;
    for (int i = 0; i < LATE_BLOCKS; i++) free(after_end[i]);
}

__attribute__((constructor)) static void registers_early(void) {
    __cxa_atexit(last_handler, NULL, NULL);
    atexit(handler);
}

__attribute__((destructor)) static void frees_late(void) {
    for (int i = 0; i < EXIT_BLOCKS; i++) free(in_destructor[i]);
}
