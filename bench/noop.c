/*
 * libbenchnoop.so: the least a disabled event call can cost when it lives
 * in a shared library (issue 5, item 3, for context): a call through the
 * PLT to a function that does one relaxed atomic load and a branch, as
 * trace_heap_object_alloc/free do when tracing is off.
 */
#include <stdatomic.h>
#include <stdint.h>

void bench_noop_alloc(uintptr_t addr, uint64_t size, uint64_t type_id);
void bench_noop_free(uintptr_t addr);

static _Atomic uint64_t generation; /* always 0 */
static volatile uint64_t sink;

__attribute__((noinline)) static void record(uintptr_t addr, uint64_t size, uint64_t type_id) {
    sink = addr + size + type_id;
}

void bench_noop_alloc(uintptr_t addr, uint64_t size, uint64_t type_id) {
    if (atomic_load_explicit(&generation, memory_order_relaxed))
        record(addr, size, type_id);
}

void bench_noop_free(uintptr_t addr) {
    if (atomic_load_explicit(&generation, memory_order_relaxed))
        record(addr, 0, 0);
}
