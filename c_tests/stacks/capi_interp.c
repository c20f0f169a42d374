/*
 * A toy interpreter that records its allocations with their call stacks
 * through the C API (crates/cli/tests/stacks.rs, capi_* tests).
 *
 * Its "script" functions are frames registered with trace_frame_register
 * (name, file, line of the call site); its allocator toy_alloc (a bump
 * allocator over a static arena: its own malloc) interns, from inside the
 * allocation, the current mixed stack with trace_stack_register: innermost
 * first, the native return address into toy_alloc's caller, then the
 * script frames, with the native return address of each native builtin
 * the script called between them, then the native return address into
 * main. It records each block with trace_heap_object_alloc_stack and
 * prints it, for the test to compare with what the reader gives back:
 *
 *   frame VALUE FUNC FILE LINE      one per registered frame
 *   alloc ADDR SIZE STACK_ID F0 F1 ... (frames as passed, hex)
 *   gen                             trace_advance was called here
 *
 * usage: capi_interp TRACE
 */
#include <alloctrace.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOINLINE __attribute__((noinline, noipa))
#define BARRIER() __asm__ volatile("" ::: "memory")
#define MAX_DEPTH 64

/* The interpreter's call stack: registered frames and native return
 * addresses, outermost first. */
static uint64_t vm_stack[MAX_DEPTH];
static int vm_depth;
/* Where main called the interpreter. */
static uint64_t vm_entry;

static _Alignas(16) unsigned char arena[1 << 20];
static size_t arena_used;

static void die(const char *what)
{
    fprintf(stderr, "capi_interp: %s\n", what);
    exit(99);
}

static uint64_t reg(const char *func, const char *file, uint32_t line)
{
    uint64_t v = trace_frame_register(func, strlen(func), file, strlen(file), line);
    if (v == 0)
        die("trace_frame_register");
    printf("frame %#llx %s %s %u\n", (unsigned long long)v, func, file, line);
    return v;
}

static void push(uint64_t frame)
{
    if (vm_depth == MAX_DEPTH)
        die("interpreter stack overflow");
    vm_stack[vm_depth++] = frame;
}

static void pop(void)
{
    vm_depth--;
}

/* The interpreter's malloc. */
NOINLINE static void *toy_alloc(size_t size)
{
    size_t rounded = (size + 15) & ~(size_t)15;
    if (arena_used + rounded > sizeof arena)
        die("arena full");
    void *p = &arena[arena_used];
    arena_used += rounded;

    uint64_t frames[MAX_DEPTH + 2];
    size_t n = 0;
    frames[n++] = (uint64_t)(uintptr_t)__builtin_return_address(0);
    for (int i = vm_depth - 1; i >= 0; i--)
        frames[n++] = vm_stack[i];
    frames[n++] = vm_entry;
    uint64_t id = trace_stack_register(frames, n);
    if (id == 0)
        die("trace_stack_register");
    trace_heap_object_alloc_stack((uintptr_t)p, size, 0, id);
    printf("alloc %#llx %zu %#llx", (unsigned long long)(uintptr_t)p, size, (unsigned long long)id);
    for (size_t i = 0; i < n; i++)
        printf(" %#llx", (unsigned long long)frames[i]);
    printf("\n");
    return p;
}

static uint64_t f_main, f_fib_left, f_fib_right, f_show;

/* A native builtin the script calls: its own return address goes on the
 * interpreter's stack while it runs. */
NOINLINE static void *builtin_tostring(long v)
{
    push((uint64_t)(uintptr_t)__builtin_return_address(0));
    push(f_show);
    char *s = toy_alloc(24);
    BARRIER();
    snprintf(s, 24, "%ld", v);
    pop();
    pop();
    return s;
}

/* fib(n) in the "script": every call allocates a number object; fib(1)
 * also a string through the builtin. */
NOINLINE static long script_fib(long n)
{
    long *obj = toy_alloc(16);
    BARRIER();
    if (n <= 1) {
        builtin_tostring(n);
        *obj = n;
        return n;
    }
    push(f_fib_left);
    long a = script_fib(n - 1);
    pop();
    push(f_fib_right);
    long b = script_fib(n - 2);
    pop();
    *obj = a + b;
    BARRIER();
    return *obj;
}

NOINLINE static long run_script(long n)
{
    vm_entry = (uint64_t)(uintptr_t)__builtin_return_address(0);
    push(f_main);
    long r = script_fib(n);
    pop();
    BARRIER();
    return r;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        die("usage: capi_interp TRACE");
    /* Frames registered before tracing starts, and one while tracing. */
    f_main = reg("main", "toy.lua", 1);
    f_fib_left = reg("fib", "toy.lua", 4);
    f_fib_right = reg("fib", "toy.lua", 5);
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = argv[1];
    if (trace_start(&cfg) != TRACE_OK)
        die("trace_start");
    f_show = reg("tostring", "[builtin]", 0);
    if (run_script(4) != 3)
        die("fib(4)");
    /* The same stacks again in a new generation: its frames and stacks
     * batches must hold them again. */
    if (trace_advance() != TRACE_OK)
        die("trace_advance");
    printf("gen\n");
    if (run_script(3) != 2)
        die("fib(3)");
    if (trace_stop() != TRACE_OK)
        die("trace_stop");
    return 0;
}
