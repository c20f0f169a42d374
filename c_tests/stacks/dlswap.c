#define _GNU_SOURCE /* dladdr */
/* dlswap LIB0 LIB1 COUNT: loads LIB0, allocates COUNT blocks through its
 * inner_alloc, unloads it, then the same with LIB1, which the loader most
 * likely maps where LIB0 was. Prints "base NAME ADDRESS" per load. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef void *(*alloc_fn)(size_t);

static int use(const char *lib, long count)
{
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    alloc_fn f = (alloc_fn)dlsym(h, "inner_alloc");
    if (!f) {
        fprintf(stderr, "dlsym: %s\n", dlerror());
        return 1;
    }
    Dl_info info;
    if (dladdr((void *)f, &info))
        printf("base %s %p\n", lib, info.dli_fbase);
    void **blocks = malloc(sizeof(void *) * (size_t)count);
    for (long i = 0; i < count; i++)
        blocks[i] = f(4000 + (size_t)i % 7);
    for (long i = 0; i < count; i++)
        free(blocks[i]);
    free(blocks);
    if (dlclose(h) != 0) {
        fprintf(stderr, "dlclose: %s\n", dlerror());
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: dlswap LIB0 LIB1 COUNT\n");
        return 2;
    }
    long count = atol(argv[3]);
    return use(argv[1], count) || use(argv[2], count);
}
