// The C++ path of paths.h: operator new[] (libstdc++, built without frame
// pointers) calls malloc, so the stack crosses a frame a frame-pointer walk
// cannot see.
#include "paths.h"

extern "C" {

SP_NOINLINE void *sp_cxx_leaf(size_t n)
{
    char *p = new char[n];
    SP_BARRIER();
    p[n - 1] = 3;
    return p;
}

SP_NOINLINE void sp_cxx_free(void *p)
{
    delete[] static_cast<char *>(p);
    SP_BARRIER();
}
}
