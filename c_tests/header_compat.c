/*
 * The header in other builds than the tests': compiled by `make c-test`
 * as a -fPIC shared object (the plain calls must not use a thread-local
 * there) and, when g++ is installed, as C++. Nothing runs.
 */
#include "alloctrace.h"

void header_compat_calls(uintptr_t a);

void header_compat_calls(uintptr_t a)
{
    trace_writer *w = trace_writer_get();
    trace_writer_heap_object_alloc(w, a, 16, 0);
    trace_writer_heap_object_free(w, a);
    trace_writer_span_alloc(w, a, 1, 0);
    trace_writer_span_free(w, a);
    trace_writer_stack_alloc(w, a, 4096);
    trace_writer_stack_free(w, a);
    trace_heap_object_alloc(a, 16, 0);
    trace_heap_object_free(a);
    trace_span_exists(a, 1, 0);
    trace_stack_exists(a, 4096);
    (trace_heap_object_alloc)(a, 16, 0);
}
