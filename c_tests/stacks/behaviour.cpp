/*
 * C++ exceptions under the tracer (crates/cli/tests/behaviour.rs): thrown
 * through several frames that own heap objects, caught (some rethrown),
 * every object destroyed. Prints what it counted; the output must be the
 * same with and without tracing.
 */
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#define BH_NOINLINE __attribute__((noinline))

static long live, destroyed;

struct Tracked {
    std::string s;
    std::vector<int> v;
    explicit Tracked(int i) : s(100 + i, 'x'), v(i + 1, i) { live++; }
    ~Tracked()
    {
        live--;
        destroyed++;
    }
};

BH_NOINLINE void bh_level(int depth, int n)
{
    Tracked t(depth);
    std::unique_ptr<int[]> buf(new int[64 + depth]);
    buf[0] = n;
    if (depth == 0)
        throw std::runtime_error("boom " + std::to_string(n));
    bh_level(depth - 1, n);
}

BH_NOINLINE void bh_middle(int n)
{
    std::vector<std::string> names(5, std::string(40, 'n'));
    try {
        bh_level(6, n);
    } catch (const std::runtime_error &) {
        names.push_back("rethrown");
        throw;
    }
}

int main()
{
    long caught = 0, good = 0;
    for (int n = 0; n < 2000; n++) {
        try {
            if (n % 2)
                bh_middle(n);
            else
                bh_level(8, n);
        } catch (const std::exception &e) {
            caught++;
            if (std::string(e.what()) == "boom " + std::to_string(n))
                good++;
        }
    }
    std::printf("caught %ld good %ld destroyed %ld live %ld\n", caught, good, destroyed, live);
    return live == 0 ? 0 : 1;
}
