// A C++ library of crates/cli/tests/exit_frees.rs: a static object whose
// destructor (registered with __cxa_atexit by the library's constructor,
// run by its __cxa_finalize in ld.so's _dl_fini) frees what the program
// gave it.
#include <cstdlib>

#include "exitfree.h"

namespace {
struct Holder {
    void *blocks[EXIT_BLOCKS] = {};
    ~Holder() {
        for (void *p : blocks) std::free(p);
    }
};
Holder holder;
}  // namespace

extern "C" void exitcxx_keep(int i, void *p) { holder.blocks[i] = p; }
