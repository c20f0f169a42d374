/*
 * alloctrace_inline.h: the inline event path of alloctrace. Included by
 * alloctrace.h; include that instead.
 *
 * Hand-written (alloctrace.h is generated), but for the per-kind wrappers
 * between the BEGIN and END lines below, which crates/header-gen writes
 * from the format crate's event spec. The trace_writer_* calls record
 * an event through a per-thread handle from trace_writer_get() (and the
 * plain calls get the same path through macros, at the end of this file):
 *
 *     trace_writer *w = trace_writer_get();        // once per thread
 *     ...
 *     trace_writer_heap_object_alloc(w, p, size, type_id);
 *     trace_writer_heap_object_free(w, p);
 *
 * They behave exactly as the trace_* calls of the same names: same events,
 * same trace. Tracing off costs one load and a branch at the call site. On
 * x86-64 Linux with GCC or Clang, an ordinary event is then written inline,
 * without a call or a thread-local lookup; everything else (a full buffer,
 * a new generation, an address or size that needs the long form, a handle
 * used on the wrong thread, a signal handler interrupting an event) goes
 * through the out-of-line call, which
 * handles it as always. Elsewhere, or with ALLOCTRACE_NO_INLINE defined,
 * they are the disabled check plus the out-of-line call.
 *
 * The structs below mirror the library's private layout (asserted in its
 * Rust source: crates/writer/src/{shared,thread,buffer}.rs) and the event
 * encoding of docs/FORMAT.md section 3 (compact events batches), whose
 * numbers (event kinds, address classes, argument counts, MAX_EVENT_LEN,
 * the kind byte's flags; the inline modes and the batch bytes' offset)
 * come from alloctrace_format.h, generated from the format crate and the
 * core; c_tests/test_inline_encoding.c checks that this path and
 * the library write the same bytes. They are not API: use only the
 * functions. The library exports the state under a
 * name that carries the layout's version (alloctrace_inline_v2), so a
 * program built against a header whose layout the library does not have
 * fails to load with "undefined symbol" instead of writing a bad trace.
 */
#ifndef ALLOCTRACE_INLINE_H
#define ALLOCTRACE_INLINE_H

#include <stddef.h>
#include <stdint.h>

#include "alloctrace_format.h"

#define ALLOCTRACE_INLINE_ABI 2 /* the _v2 of alloctrace_inline_v2 */

#if defined(__GNUC__) || defined(__clang__)
#define ALLOCTRACE_ALWAYS_INLINE_ __attribute__((always_inline))
#else
#define ALLOCTRACE_ALWAYS_INLINE_
#endif

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(ALLOCTRACE_NO_INLINE)
#define ALLOCTRACE_INLINE 1
#else
#define ALLOCTRACE_INLINE 0
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Private: the state every event reads (crates/writer/src/shared.rs). */
struct alloctrace_shared_ {
    uint64_t generation; /* 0 while tracing is off */
    uint64_t min_heap_addr;
    uint64_t published_ticks; /* the coarse clock */
    uint32_t page_shift;
    uint32_t heap_shift;
    uint32_t stack_shift;
    uint32_t inline_mode; /* ALLOCTRACE_MODE_*_ */
    uint8_t *call_stack_nodes; /* the call-stack table's nodes, once mapped */
};
extern struct alloctrace_shared_ *const alloctrace_inline_v2;

/* Private: a batch buffer's header; the batch bytes follow at offset 64
 * (crates/writer/src/buffer.rs). */
struct alloctrace_batch_ {
    size_t len;            /* batch bytes written */
    size_t cap;            /* batch bytes available */
    uint64_t last_ticks;   /* base of the next time delta */
    uint64_t prev_id[3];   /* base of the next ID delta: span, heap, stack */
};

/* Private: a thread's writer (crates/writer/src/thread.rs, ThreadSlot). */
struct trace_writer {
    uint64_t seq_;                        /* seqlock: odd inside an event */
    uint64_t last_ticks_;                 /* the thread's last timestamp */
    uint32_t reserved_;                   /* always 0 */
    uint32_t state_;
    uintptr_t owner_;                     /* the owning thread's %fs:0 */
    struct alloctrace_batch_ *batch_[2][2]; /* [generation % 2][stream] */
};


/* Whether tracing is on: one relaxed load. */
static inline int trace_writer_enabled(void)
{
#if defined(__GNUC__) || defined(__clang__)
    return __atomic_load_n(&alloctrace_inline_v2->generation, __ATOMIC_RELAXED) != 0;
#else
    return trace_enabled();
#endif
}

#if ALLOCTRACE_INLINE

static inline __attribute__((always_inline)) uint8_t *alloctrace_put_varint_(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/*
 * Records one short-form event of `kind` (address class `cls`,
 * ALLOCTRACE_CLASS_*_; `nargs` arguments, the address included; `stack_size`
 * when a1 is a stack size written as its log2: the ALLOCTRACE_*_ numbers
 * of the kind in alloctrace_format.h) in w's current batch, exactly as the
 * library's write_event_fast does (crates/writer/src/event/emit.rs, with the
 * format crate's short_form and encode_event). Returns 1 when recorded or
 * tracing is off, 0 when the caller must take the out-of-line path. Changes
 * nothing before it knows it can finish.
 *
 * A kind with a call stack (four arguments, the stack ID `a3` last) is
 * recorded here only when the generation has already marked the stack
 * used, as the library's fast path checks it (call_stack_table.rs,
 * invariant 6: the node's used[g % 2] is 2g + 1); the first event of a
 * stack in a generation goes to the library, which marks it.
 *
 * The seqlock section is the library's (crates/writer/src/session/mod.rs, invariant 1): seq is
 * made odd, a compiler fence (inline mode is on only where the advancer
 * uses membarrier), the generation is loaded, the batch of its parity is
 * written, and seq is made even with release.
 */
static inline ALLOCTRACE_ALWAYS_INLINE_ int alloctrace_record_(struct trace_writer *w, uint8_t kind, unsigned cls,
                                                                    int nargs, int stack_size, uint64_t addr,
                                                                    uint64_t a1, uint64_t a2, uint64_t a3)
{
    struct alloctrace_shared_ *sh = alloctrace_inline_v2;
    uint32_t mode = __atomic_load_n(&sh->inline_mode, __ATOMIC_RELAXED);
    uintptr_t tp;
    __asm__("mov %%fs:0, %0" : "=r"(tp));
    if (w == NULL || mode == ALLOCTRACE_MODE_OUT_OF_LINE_ || __atomic_load_n(&w->owner_, __ATOMIC_RELAXED) != tp)
        return 0;
    uint64_t s = __atomic_load_n(&w->seq_, __ATOMIC_RELAXED);
    if (s & 1)
        return 0; /* a signal handler interrupted an event: counted lost */
    __atomic_store_n(&w->seq_, s + 1, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    uint64_t g = __atomic_load_n(&sh->generation, __ATOMIC_ACQUIRE);
    struct alloctrace_batch_ *b = __atomic_load_n(&w->batch_[g & 1][0], __ATOMIC_RELAXED);
    uint32_t shift = cls == ALLOCTRACE_CLASS_SPAN_          ? __atomic_load_n(&sh->page_shift, __ATOMIC_RELAXED)
                   : cls == ALLOCTRACE_CLASS_HEAP_OBJECT_ ? __atomic_load_n(&sh->heap_shift, __ATOMIC_RELAXED)
                                                          : __atomic_load_n(&sh->stack_shift, __ATOMIC_RELAXED);
    uint64_t min = __atomic_load_n(&sh->min_heap_addr, __ATOMIC_RELAXED);
    uint64_t off = addr - min;
    uint64_t second = a1;
    int ok = g != 0 && b != NULL && b->cap - b->len >= ALLOCTRACE_MAX_EVENT_LEN_ && addr >= min &&
             (off & ((UINT64_C(1) << shift) - 1)) == 0;
    if (stack_size) {
        ok = ok && a1 != 0 && (a1 & (a1 - 1)) == 0;
        second = ok ? (uint64_t)__builtin_ctzll(a1) : 0;
    }
    if (nargs >= 4) {
        const uint8_t *nodes = __atomic_load_n(&sh->call_stack_nodes, __ATOMIC_ACQUIRE);
        ok = ok && a3 != 0 && a3 < ALLOCTRACE_CALL_STACK_MAX_NODES_ && nodes != NULL &&
             __atomic_load_n((const uint64_t *)(nodes + a3 * ALLOCTRACE_CALL_STACK_NODE_SIZE_ +
                                                ALLOCTRACE_CALL_STACK_NODE_USED_ + (g & 1) * 8),
                             __ATOMIC_ACQUIRE) == (g * 2 | 1);
    }
    if (!ok) {
        __atomic_store_n(&w->seq_, s + 2, __ATOMIC_RELEASE);
        return g == 0;
    }
    /* The library's next_ticks: the coarse clock's published time, which
     * only grows (the max with the thread's last time only keeps deltas
     * unsigned), or rdtsc kept strictly above the thread's last time. */
    uint64_t last = w->last_ticks_;
    uint64_t ticks;
    if (mode == ALLOCTRACE_MODE_COARSE_) {
        ticks = __atomic_load_n(&sh->published_ticks, __ATOMIC_RELAXED);
        if (ticks < last)
            ticks = last;
    } else {
        ticks = __builtin_ia32_rdtsc();
        if (ticks <= last)
            ticks = last + 1;
    }
    w->last_ticks_ = ticks;
    uint64_t id = off >> shift;
    uint64_t delta = id - b->prev_id[cls];
    b->prev_id[cls] = id;
    uint8_t *start = (uint8_t *)b + ALLOCTRACE_BATCH_DATA_ + b->len;
    uint8_t *p = start;
    *p++ = kind;
    p = alloctrace_put_varint_(p, ticks - b->last_ticks);
    p = alloctrace_put_varint_(p, (delta << 1) ^ (uint64_t)((int64_t)delta >> 63));
    if (nargs >= 2)
        p = alloctrace_put_varint_(p, second);
    if (nargs >= 3)
        p = alloctrace_put_varint_(p, a2);
    if (nargs >= 4)
        p = alloctrace_put_varint_(p, a3);
    b->len += (size_t)(p - start);
    b->last_ticks = ticks;
    __atomic_store_n(&w->seq_, s + 2, __ATOMIC_RELEASE);
    return 1;
}

#define ALLOCTRACE_RECORD_(w, kind, cls, nargs, stack_size, addr, a1, a2, a3)                              \
    alloctrace_record_((w), (kind), (cls), (nargs), (stack_size), (uint64_t)(addr), (uint64_t)(a1), (uint64_t)(a2), \
                       (uint64_t)(a3))

#else /* !ALLOCTRACE_INLINE */

#define ALLOCTRACE_RECORD_(w, kind, cls, nargs, stack_size, addr, a1, a2, a3) ((void)(w), 0)

#endif /* ALLOCTRACE_INLINE */

/*
 * One function per event kind, the only place that spells the kind's shape
 * (kind byte, address class, arguments): records the event inline through
 * `w`, or calls the library's function (its name in parentheses is never
 * the macro below). Returns 1 when it called the library. Tracing must be
 * on: the callers check. Always inlined, so that each call site gets the
 * kind's constants folded into the inline path.
 */
/* BEGIN per-kind wrappers: generated by crates/header-gen from the format
 * crate's event spec and the C API; do not edit, run `make header`. */
static inline ALLOCTRACE_ALWAYS_INLINE_ int alloctrace_span_exists_(trace_writer *w, uintptr_t base, uintptr_t npages, uint64_t kind_class)
{
    if (ALLOCTRACE_RECORD_(w, ALLOCTRACE_KIND_SPAN_EXISTS_, ALLOCTRACE_CLASS_SPAN_EXISTS_, ALLOCTRACE_ARGS_SPAN_EXISTS_, ALLOCTRACE_LOG2_SIZE_SPAN_EXISTS_,
                           base, npages, kind_class, 0))
        return 0;
    (trace_span_exists)(base, npages, kind_class);
    return 1;
}
static inline ALLOCTRACE_ALWAYS_INLINE_ int alloctrace_span_alloc_(trace_writer *w, uintptr_t base, uintptr_t npages, uint64_t kind_class)
{
    if (ALLOCTRACE_RECORD_(w, ALLOCTRACE_KIND_SPAN_ALLOC_, ALLOCTRACE_CLASS_SPAN_ALLOC_, ALLOCTRACE_ARGS_SPAN_ALLOC_, ALLOCTRACE_LOG2_SIZE_SPAN_ALLOC_,
                           base, npages, kind_class, 0))
        return 0;
    (trace_span_alloc)(base, npages, kind_class);
    return 1;
}
static inline ALLOCTRACE_ALWAYS_INLINE_ int alloctrace_span_free_(trace_writer *w, uintptr_t base)
{
    if (ALLOCTRACE_RECORD_(w, ALLOCTRACE_KIND_SPAN_FREE_, ALLOCTRACE_CLASS_SPAN_FREE_, ALLOCTRACE_ARGS_SPAN_FREE_, ALLOCTRACE_LOG2_SIZE_SPAN_FREE_,
                           base, 0, 0, 0))
        return 0;
    (trace_span_free)(base);
    return 1;
}
static inline ALLOCTRACE_ALWAYS_INLINE_ int alloctrace_heap_object_exists_(trace_writer *w, uintptr_t addr, uint64_t size, uint64_t type_id)
{
    if (ALLOCTRACE_RECORD_(w, ALLOCTRACE_KIND_HEAP_OBJECT_EXISTS_, ALLOCTRACE_CLASS_HEAP_OBJECT_EXISTS_, ALLOCTRACE_ARGS_HEAP_OBJECT_EXISTS_, ALLOCTRACE_LOG2_SIZE_HEAP_OBJECT_EXISTS_,
                           addr, size, type_id, 0))
        return 0;
    (trace_heap_object_exists)(addr, size, type_id);
    return 1;
}
static inline ALLOCTRACE_ALWAYS_INLINE_ int alloctrace_heap_object_alloc_(trace_writer *w, uintptr_t addr, uint64_t size, uint64_t type_id)
{
    if (ALLOCTRACE_RECORD_(w, ALLOCTRACE_KIND_HEAP_OBJECT_ALLOC_, ALLOCTRACE_CLASS_HEAP_OBJECT_ALLOC_, ALLOCTRACE_ARGS_HEAP_OBJECT_ALLOC_, ALLOCTRACE_LOG2_SIZE_HEAP_OBJECT_ALLOC_,
                           addr, size, type_id, 0))
        return 0;
    (trace_heap_object_alloc)(addr, size, type_id);
    return 1;
}
static inline ALLOCTRACE_ALWAYS_INLINE_ int alloctrace_heap_object_free_(trace_writer *w, uintptr_t addr)
{
    if (ALLOCTRACE_RECORD_(w, ALLOCTRACE_KIND_HEAP_OBJECT_FREE_, ALLOCTRACE_CLASS_HEAP_OBJECT_FREE_, ALLOCTRACE_ARGS_HEAP_OBJECT_FREE_, ALLOCTRACE_LOG2_SIZE_HEAP_OBJECT_FREE_,
                           addr, 0, 0, 0))
        return 0;
    (trace_heap_object_free)(addr);
    return 1;
}
static inline ALLOCTRACE_ALWAYS_INLINE_ int alloctrace_stack_exists_(trace_writer *w, uintptr_t base, uintptr_t size)
{
    if (ALLOCTRACE_RECORD_(w, ALLOCTRACE_KIND_STACK_EXISTS_, ALLOCTRACE_CLASS_STACK_EXISTS_, ALLOCTRACE_ARGS_STACK_EXISTS_, ALLOCTRACE_LOG2_SIZE_STACK_EXISTS_,
                           base, size, 0, 0))
        return 0;
    (trace_stack_exists)(base, size);
    return 1;
}
static inline ALLOCTRACE_ALWAYS_INLINE_ int alloctrace_stack_alloc_(trace_writer *w, uintptr_t base, uintptr_t size)
{
    if (ALLOCTRACE_RECORD_(w, ALLOCTRACE_KIND_STACK_ALLOC_, ALLOCTRACE_CLASS_STACK_ALLOC_, ALLOCTRACE_ARGS_STACK_ALLOC_, ALLOCTRACE_LOG2_SIZE_STACK_ALLOC_,
                           base, size, 0, 0))
        return 0;
    (trace_stack_alloc)(base, size);
    return 1;
}
static inline ALLOCTRACE_ALWAYS_INLINE_ int alloctrace_stack_free_(trace_writer *w, uintptr_t base)
{
    if (ALLOCTRACE_RECORD_(w, ALLOCTRACE_KIND_STACK_FREE_, ALLOCTRACE_CLASS_STACK_FREE_, ALLOCTRACE_ARGS_STACK_FREE_, ALLOCTRACE_LOG2_SIZE_STACK_FREE_,
                           base, 0, 0, 0))
        return 0;
    (trace_stack_free)(base);
    return 1;
}
static inline ALLOCTRACE_ALWAYS_INLINE_ int alloctrace_heap_object_alloc_stack_(trace_writer *w, uintptr_t addr, uint64_t size, uint64_t type_id, uint64_t stack_id)
{
    if (ALLOCTRACE_RECORD_(w, ALLOCTRACE_KIND_HEAP_OBJECT_ALLOC_STACK_, ALLOCTRACE_CLASS_HEAP_OBJECT_ALLOC_STACK_, ALLOCTRACE_ARGS_HEAP_OBJECT_ALLOC_STACK_, ALLOCTRACE_LOG2_SIZE_HEAP_OBJECT_ALLOC_STACK_,
                           addr, size, type_id, stack_id))
        return 0;
    (trace_heap_object_alloc_stack)(addr, size, type_id, stack_id);
    return 1;
}
static inline ALLOCTRACE_ALWAYS_INLINE_ int alloctrace_span_alloc_stack_(trace_writer *w, uintptr_t base, uintptr_t npages, uint64_t kind_class, uint64_t stack_id)
{
    if (ALLOCTRACE_RECORD_(w, ALLOCTRACE_KIND_SPAN_ALLOC_STACK_, ALLOCTRACE_CLASS_SPAN_ALLOC_STACK_, ALLOCTRACE_ARGS_SPAN_ALLOC_STACK_, ALLOCTRACE_LOG2_SIZE_SPAN_ALLOC_STACK_,
                           base, npages, kind_class, stack_id))
        return 0;
    (trace_span_alloc_stack)(base, npages, kind_class, stack_id);
    return 1;
}
/* END per-kind wrappers */

/*
 * The event calls through a writer handle. Arguments and meaning as the
 * trace_* call of the same name; `w` from trace_writer_get() on the calling
 * thread (NULL is allowed: the out-of-line call is used).
 */

static inline void trace_writer_span_exists(trace_writer *w, uintptr_t base, uintptr_t npages, uint64_t kind_class)
{
    if (trace_writer_enabled())
        (void)alloctrace_span_exists_(w, base, npages, kind_class);
}

static inline ALLOCTRACE_ALWAYS_INLINE_ void trace_writer_span_alloc(trace_writer *w, uintptr_t base, uintptr_t npages, uint64_t kind_class)
{
    if (trace_writer_enabled())
        (void)alloctrace_span_alloc_(w, base, npages, kind_class);
}

static inline void trace_writer_span_free(trace_writer *w, uintptr_t base)
{
    if (trace_writer_enabled())
        (void)alloctrace_span_free_(w, base);
}

static inline void trace_writer_heap_object_exists(trace_writer *w, uintptr_t addr, uint64_t size, uint64_t type_id)
{
    if (trace_writer_enabled())
        (void)alloctrace_heap_object_exists_(w, addr, size, type_id);
}

static inline ALLOCTRACE_ALWAYS_INLINE_ void trace_writer_heap_object_alloc(trace_writer *w, uintptr_t addr, uint64_t size, uint64_t type_id)
{
    if (trace_writer_enabled())
        (void)alloctrace_heap_object_alloc_(w, addr, size, type_id);
}

static inline void trace_writer_heap_object_free(trace_writer *w, uintptr_t addr)
{
    if (trace_writer_enabled())
        (void)alloctrace_heap_object_free_(w, addr);
}

static inline void trace_writer_stack_exists(trace_writer *w, uintptr_t base, uintptr_t size)
{
    if (trace_writer_enabled())
        (void)alloctrace_stack_exists_(w, base, size);
}

static inline void trace_writer_stack_alloc(trace_writer *w, uintptr_t base, uintptr_t size)
{
    if (trace_writer_enabled())
        (void)alloctrace_stack_alloc_(w, base, size);
}

static inline void trace_writer_stack_free(trace_writer *w, uintptr_t base)
{
    if (trace_writer_enabled())
        (void)alloctrace_stack_free_(w, base);
}

/* Allocations with their call stack: inline once the generation has marked
 * the stack (its first event in a generation goes to the library, which
 * marks the stack's nodes). */
static inline ALLOCTRACE_ALWAYS_INLINE_ void trace_writer_heap_object_alloc_stack(trace_writer *w, uintptr_t addr,
                                                                                 uint64_t size, uint64_t type_id,
                                                                                 uint64_t stack_id)
{
    if (trace_writer_enabled())
        (void)alloctrace_heap_object_alloc_stack_(w, addr, size, type_id, stack_id);
}

static inline void trace_writer_span_alloc_stack(trace_writer *w, uintptr_t base, uintptr_t npages,
                                                 uint64_t kind_class, uint64_t stack_id)
{
    if (trace_writer_enabled())
        (void)alloctrace_span_alloc_stack_(w, base, npages, kind_class, stack_id);
}

/*
 * The plain calls (trace_heap_object_alloc and the rest) get the same
 * treatment, so a program gains it by recompiling: each is a macro for an
 * inline function with the disabled check in the caller. In code built
 * into an executable (not -fPIC, or -fPIE), where thread-local storage is
 * static and never allocates, each translation unit also keeps the
 * thread's writer in a thread-local variable of its own and writes
 * ordinary events inline. In a shared library (-fPIC) a thread-local may
 * be allocated lazily (by malloc, in a dlopen'ed object), so there the
 * enabled path is the out-of-line call. A call written as
 * (trace_heap_object_alloc)(...) or through a function pointer always
 * calls the library. Define ALLOCTRACE_NO_INLINE to turn all of this off.
 */
#if !defined(ALLOCTRACE_NO_INLINE) && (defined(__GNUC__) || defined(__clang__))

#if ALLOCTRACE_INLINE && (defined(__PIE__) || !defined(__PIC__))
/* This translation unit's copy of the calling thread's writer. */
static inline trace_writer **alloctrace_writer_slot_(void)
{
    static __thread trace_writer *w;
    return &w;
}
static inline __attribute__((always_inline)) trace_writer *alloctrace_writer_(void)
{
    trace_writer **slot = alloctrace_writer_slot_();
    if (__builtin_expect(*slot == NULL, 0))
        *slot = trace_writer_get();
    return *slot;
}
/* After a call into the library: ask again next time (the writer may have
 * been given back by trace_thread_destroy; asking is cheap and rare). */
#define ALLOCTRACE_FORGET_WRITER_() (*alloctrace_writer_slot_() = NULL)
#else
#define alloctrace_writer_() ((trace_writer *)0)
#define ALLOCTRACE_FORGET_WRITER_() ((void)0)
#endif

/* Always inline, like the trace_writer_*_alloc calls: with
 * trace_config.stacks on, the library captures its caller's stack, which
 * must be the program's frame, not a copy of these wrappers (-O0). */
static inline ALLOCTRACE_ALWAYS_INLINE_ void alloctrace_plain_span_exists_(uintptr_t base, uintptr_t npages, uint64_t kind_class)
{
    if (trace_writer_enabled() && alloctrace_span_exists_(alloctrace_writer_(), base, npages, kind_class))
        ALLOCTRACE_FORGET_WRITER_();
}
static inline ALLOCTRACE_ALWAYS_INLINE_ void alloctrace_plain_span_alloc_(uintptr_t base, uintptr_t npages, uint64_t kind_class)
{
    if (trace_writer_enabled() && alloctrace_span_alloc_(alloctrace_writer_(), base, npages, kind_class))
        ALLOCTRACE_FORGET_WRITER_();
}
static inline ALLOCTRACE_ALWAYS_INLINE_ void alloctrace_plain_span_free_(uintptr_t base)
{
    if (trace_writer_enabled() && alloctrace_span_free_(alloctrace_writer_(), base))
        ALLOCTRACE_FORGET_WRITER_();
}
static inline ALLOCTRACE_ALWAYS_INLINE_ void alloctrace_plain_heap_object_exists_(uintptr_t addr, uint64_t size, uint64_t type_id)
{
    if (trace_writer_enabled() && alloctrace_heap_object_exists_(alloctrace_writer_(), addr, size, type_id))
        ALLOCTRACE_FORGET_WRITER_();
}
static inline ALLOCTRACE_ALWAYS_INLINE_ void alloctrace_plain_heap_object_alloc_(uintptr_t addr, uint64_t size, uint64_t type_id)
{
    if (trace_writer_enabled() && alloctrace_heap_object_alloc_(alloctrace_writer_(), addr, size, type_id))
        ALLOCTRACE_FORGET_WRITER_();
}
static inline ALLOCTRACE_ALWAYS_INLINE_ void alloctrace_plain_heap_object_free_(uintptr_t addr)
{
    if (trace_writer_enabled() && alloctrace_heap_object_free_(alloctrace_writer_(), addr))
        ALLOCTRACE_FORGET_WRITER_();
}
static inline ALLOCTRACE_ALWAYS_INLINE_ void alloctrace_plain_stack_exists_(uintptr_t base, uintptr_t size)
{
    if (trace_writer_enabled() && alloctrace_stack_exists_(alloctrace_writer_(), base, size))
        ALLOCTRACE_FORGET_WRITER_();
}
static inline ALLOCTRACE_ALWAYS_INLINE_ void alloctrace_plain_stack_alloc_(uintptr_t base, uintptr_t size)
{
    if (trace_writer_enabled() && alloctrace_stack_alloc_(alloctrace_writer_(), base, size))
        ALLOCTRACE_FORGET_WRITER_();
}
static inline ALLOCTRACE_ALWAYS_INLINE_ void alloctrace_plain_stack_free_(uintptr_t base)
{
    if (trace_writer_enabled() && alloctrace_stack_free_(alloctrace_writer_(), base))
        ALLOCTRACE_FORGET_WRITER_();
}
static inline ALLOCTRACE_ALWAYS_INLINE_ void alloctrace_plain_heap_object_alloc_stack_(uintptr_t addr, uint64_t size,
                                                                                     uint64_t type_id, uint64_t stack_id)
{
    if (trace_writer_enabled() && alloctrace_heap_object_alloc_stack_(alloctrace_writer_(), addr, size, type_id, stack_id))
        ALLOCTRACE_FORGET_WRITER_();
}
static inline ALLOCTRACE_ALWAYS_INLINE_ void alloctrace_plain_span_alloc_stack_(uintptr_t base, uintptr_t npages,
                                                                              uint64_t kind_class, uint64_t stack_id)
{
    if (trace_writer_enabled() && alloctrace_span_alloc_stack_(alloctrace_writer_(), base, npages, kind_class, stack_id))
        ALLOCTRACE_FORGET_WRITER_();
}

#define trace_span_exists(base, npages, kind_class) alloctrace_plain_span_exists_((base), (npages), (kind_class))
#define trace_span_alloc(base, npages, kind_class) alloctrace_plain_span_alloc_((base), (npages), (kind_class))
#define trace_span_free(base) alloctrace_plain_span_free_((base))
#define trace_heap_object_exists(addr, size, type_id) alloctrace_plain_heap_object_exists_((addr), (size), (type_id))
#define trace_heap_object_alloc(addr, size, type_id) alloctrace_plain_heap_object_alloc_((addr), (size), (type_id))
#define trace_heap_object_free(addr) alloctrace_plain_heap_object_free_((addr))
#define trace_stack_exists(base, size) alloctrace_plain_stack_exists_((base), (size))
#define trace_stack_alloc(base, size) alloctrace_plain_stack_alloc_((base), (size))
#define trace_stack_free(base) alloctrace_plain_stack_free_((base))
#define trace_heap_object_alloc_stack(addr, size, type_id, stack_id) \
    alloctrace_plain_heap_object_alloc_stack_((addr), (size), (type_id), (stack_id))
#define trace_span_alloc_stack(base, npages, kind_class, stack_id) \
    alloctrace_plain_span_alloc_stack_((base), (npages), (kind_class), (stack_id))

#endif /* plain calls */

#ifdef __cplusplus
}
#endif

#endif /* ALLOCTRACE_INLINE_H */
