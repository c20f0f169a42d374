/* The reports' test program: known leak sites, temporaries and a known peak.
 *
 * Every allocation below is made by a named, never-inlined function, so its
 * call stack's innermost frame is that function; the counts are distinct.
 *
 *   function      | allocations | bytes each | freed                      | at the peak
 *   make_name     | 100         | 32         | never (leaked: 3,200 B)    | 100 objects, 3,200 B
 *   scratch       | 50          | 64         | at once (50 temporaries)   | 0
 *   fill_cache    | 20          | 65,536     | by drain_cache             | 20 objects, 1,310,720 B
 *   build_table   | 7           | 1,000      | never (leaked: 7,000 B)    | 0 (made after the peak)
 *
 * The whole program's peak of live heap bytes is right after fill_cache
 * (1,313,920 B from these sites; the C library's own blocks come on top).
 * Built twice by the tests: -O0 -fno-omit-frame-pointer and -O2
 * -fomit-frame-pointer, both with -g.
 */
#include <stdlib.h>
#include <string.h>

#define NOINLINE __attribute__((noinline))

static char *names[100];
static char *cache[20];
static char *table[7];
volatile char sink;

/* Keeps the compiler from eliding a malloc/free pair. */
NOINLINE void touch(char *p, size_t n) {
    memset(p, 1, n);
    sink = p[n - 1];
}

NOINLINE char *make_name(int i) {
    char *p = malloc(32);
    touch(p, 32);
    p[0] = (char)i;
    return p;
}

NOINLINE void scratch(void) {
    char *p = malloc(64);
    touch(p, 64);
    free(p);
}

NOINLINE void fill_cache(void) {
    for (int i = 0; i < 20; i++) {
        cache[i] = malloc(65536);
        touch(cache[i], 65536);
    }
}

NOINLINE void drain_cache(void) {
    for (int i = 0; i < 20; i++) {
        free(cache[i]);
        cache[i] = 0;
    }
}

NOINLINE void build_table(void) {
    for (int i = 0; i < 7; i++) {
        table[i] = malloc(1000);
        touch(table[i], 1000);
    }
}

int main(void) {
    for (int i = 0; i < 100; i++)
        names[i] = make_name(i);
    for (int i = 0; i < 50; i++)
        scratch();
    fill_cache();
    drain_cache();
    build_table();
    return names[7][0] == 7 && table[3] != 0 ? 0 : 1;
}
