/*
 * Native stacks captured by liballoctrace itself (trace_config.stacks and
 * trace_stack_capture) across generations that trace_advance forces
 * (crates/cli/tests/stacks.rs, capi_native_stacks_across_generations).
 * Built at -O0 with frame pointers.
 *
 * In each of 3 generations, blocks of sizes no other path uses:
 *   6007 x3  sp_cap_path_a -> sp_cap_leaf -> trace_heap_object_alloc (captures)
 *   6011 x5  sp_cap_path_b -> sp_cap_leaf -> trace_heap_object_alloc
 *   6029 x2  sp_cap_explicit: trace_stack_capture(0) + trace_heap_object_alloc_stack
 * and, from the second generation on,
 *   6037 x7  sp_cap_path_c -> sp_cap_path_a -> sp_cap_leaf
 * Each block is freed before the next generation. The addresses are made
 * up (nothing is allocated).
 *
 * With TRACE2, a second session then writes one more generation (as the
 * second) into TRACE2.
 *
 * usage: capi_capture TRACE fast|full [TRACE2]
 */
#include <alloctrace.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SP_NOINLINE __attribute__((noinline, noipa))
#define SP_BARRIER() __asm__ volatile("" ::: "memory")

static uintptr_t next_addr = 0x10000000;
static volatile unsigned sp_after;

static void die(const char *what)
{
    fprintf(stderr, "capi_capture: %s\n", what);
    exit(99);
}

SP_NOINLINE void sp_cap_leaf(uint64_t size)
{
    uintptr_t addr = next_addr;
    next_addr += 0x2000;
    trace_heap_object_alloc(addr, size, 0);
    SP_BARRIER();
    trace_heap_object_free(addr);
    sp_after++;
}

SP_NOINLINE void sp_cap_path_a(uint64_t size)
{
    sp_cap_leaf(size);
    SP_BARRIER();
    sp_after++;
}

SP_NOINLINE void sp_cap_path_b(void)
{
    sp_cap_leaf(6011);
    SP_BARRIER();
    sp_after++;
}

SP_NOINLINE void sp_cap_path_c(void)
{
    sp_cap_path_a(6037);
    SP_BARRIER();
    sp_after++;
}

SP_NOINLINE void sp_cap_explicit(void)
{
    uint64_t id = trace_stack_capture(0);
    SP_BARRIER();
    if (id == 0)
        die("trace_stack_capture gave no stack");
    uintptr_t addr = next_addr;
    next_addr += 0x2000;
    trace_heap_object_alloc_stack(addr, 6029, 0, id);
    trace_heap_object_free(addr);
    sp_after++;
}

SP_NOINLINE void sp_cap_generation(int generation)
{
    for (int i = 0; i < 3; i++)
        sp_cap_path_a(6007);
    for (int i = 0; i < 5; i++)
        sp_cap_path_b();
    for (int i = 0; i < 2; i++)
        sp_cap_explicit();
    if (generation > 1)
        for (int i = 0; i < 7; i++)
            sp_cap_path_c();
    SP_BARRIER();
    sp_after++;
}

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 4)
        die("usage: capi_capture TRACE fast|full [TRACE2]");
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = argv[1];
    cfg.stacks = strcmp(argv[2], "fast") == 0 ? TRACE_STACKS_FAST : TRACE_STACKS_FULL;
    if (trace_start(&cfg) != TRACE_OK)
        die(trace_last_error_detail());
    for (int g = 1; g <= 3; g++) {
        sp_cap_generation(g);
        if (g < 3 && trace_advance() != TRACE_OK)
            die("trace_advance");
    }
    if (trace_stop() != TRACE_OK)
        die("trace_stop");
    if (argc == 4) {
        /* A second session, into its own file: the same paths again. */
        cfg.path = argv[3];
        if (trace_start(&cfg) != TRACE_OK)
            die(trace_last_error_detail());
        sp_cap_generation(2);
        if (trace_stop() != TRACE_OK)
            die("trace_stop");
    }
    SP_BARRIER();
    return 0;
}
