/*
 * alloctrace._alloctrace: CPython's allocators reported through
 * alloctrace's C API (include/alloctrace.h).
 *
 * ## Design
 * - All three PyMem domains (RAW, MEM, OBJ) are wrapped with
 *   PyMem_SetAllocator: every block they return is a heap object
 *   (trace_writer_heap_object_alloc_stack with its size; realloc is a free and
 *   an allocation; calloc's size is nelem * elsize). pymalloc's arenas are
 *   wrapped with PyObject_SetArenaAllocator and recorded as spans
 *   (trace_writer_span_alloc_stack / trace_span_free), so pymalloc's small
 *   objects are heap objects inside spans.
 * - Python call stacks on CPython 3.11 (walk_mode) come from a walk of
 *   the thread's running frames at each allocation (alloctrace_walk, in
 *   _alloctrace_frame.c, which sees CPython's internal frame): no profile
 *   function, which would make 3.11 run unspecialized and create a frame
 *   object per call. A walk that meets the last walk's frames at the same
 *   instructions reuses its stack ID; another pushes only the frames
 *   inside the outermost ones the last walk shares (`walk_memo`).
 * - Elsewhere, with --native, or with ALLOCTRACE_PYTHON_PROFILE_STACKS=1,
 *   they come from a shadow stack per thread, kept by a C
 *   profile function (PyEval_SetProfile): a Python function's call pushes
 *   its frame, its return (also when an exception unwinds it) pops it. An
 *   allocation reads each frame's current instruction (PyFrame_GetLasti)
 *   and line (PyCode_Addr2Line): neither allocates, unlike
 *   PyThreadState_GetFrame / PyFrame_GetBack, which may create frame
 *   objects on 3.11.
 * - Each (code object, line) is registered once with trace_frame_register
 *   (function: co_qualname, file: co_filename, encoded to UTF-8 here into a
 *   buffer on the C stack) and kept in a hash table of this file's own
 *   (mmap'd, never Python memory). A call stack's ID is one
 *   trace_stack_push of the innermost frame onto the stack ID of the
 *   frames outside it, which each shadow-stack entry keeps (`prefix`,
 *   computed on the first allocation that needs it, one push a frame from
 *   the nearest entry below that has one; valid while the entry is on the
 *   shadow stack, its callers being suspended at their calls meanwhile).
 *   A per-thread site table answers the push by (callers' stack ID,
 *   code, instruction) while the frame table pins the code objects.
 *   A stack deeper than the format's 1024 frames goes whole to
 *   trace_stack_register (truncated under its mark). The last stack ID
 *   is reused while the thread made no call or return and its innermost
 *   frame stays at one instruction, and found by instruction in a small
 *   per-thread cache while the frames below stay the same.
 * - Frees and allocations go through the header's inline path with the
 *   thread's writer handle (`this_writer`): an allocation is written
 *   there without a call once its stack is marked in the generation (its
 *   first event of a generation calls the library, which marks it); the
 *   thread-locals are initial-exec (static TLS,
 *   no __tls_get_addr call, never allocated lazily inside a hook).
 * - --native (native_on): an allocation's call stack is its native walk
 *   (trace_stack_walk, innermost first) with each return address into
 *   _PyEval_EvalFrameDefault replaced by the shadow stack's frames that
 *   eval call runs: from the innermost not yet placed out to the next
 *   entry frame (one C call of the eval loop runs its entry frame and the
 *   Python functions called from it inline; `is_entry`, read by
 *   _alloctrace_frame.c at the call event). Frames running when the
 *   profile function is installed are pushed hidden: they take their
 *   eval calls and show nowhere. Frames CPython is calling whose call
 *   event has not reached the profile function yet (it allocates their
 *   frame objects first) are read from the thread's current interpreter
 *   frame and placed innermost. The stack ID is reused while the walk and
 *   the Python frames are the previous allocation's, and otherwise found
 *   in a per-thread cache by the merged frames' 128-bit hash before
 *   trace_stack_register interns them.
 * - Only the frees of blocks this session recorded are recorded (blocks
 *   allocated before trace_start are freed while tracing): a bitmap of
 *   16-byte granules, lock-free, says which (`blocks_insert`). There are
 *   two: MEM and OBJ blocks', written with plain loads and stores under
 *   the GIL, and RAW blocks', written with atomic read-modify-writes (a
 *   locked instruction per allocation and per free, which the GIL-held
 *   domains, nearly all of a program's blocks, do without).
 *
 * ## Invariants
 * 1. A hook MUST NOT allocate through Python while it records: its own
 *    work (frame names, the hash table, the tracer's calls) uses no PyMem
 *    call. Otherwise the hook would recurse into itself. As a second line,
 *    a thread-local guard makes any allocation made while a hook records
 *    pass straight through, unrecorded.
 * 2. The shadow stack and the frame table are read and written only with
 *    the GIL held (MEM and OBJ are always called with it; RAW is checked
 *    with PyGILState_Check). Otherwise two threads could insert into the
 *    table at once. A RAW allocation without the GIL is recorded without
 *    a call stack.
 * 3. A registered code object is kept alive (one reference, never
 *    dropped), so its address never names another code object in the
 *    table. Otherwise a later function could show an earlier one's name.
 * 4. `gil_blocks` is written only with the GIL held (MEM and OBJ hooks,
 *    start), so its words are updated with plain loads and stores;
 *    `raw_blocks` (RAW hooks, with or without the GIL) with atomic
 *    read-modify-writes. A block is freed or reallocated in the domain it
 *    was allocated in (CPython's rule), so its bit is always in the map
 *    of its domain. Otherwise two threads updating one word could lose
 *    each other's bits. A build without the GIL uses atomics for both.
 *
 * ## Corner cases
 * - fork: the tracer turns itself off in the child (docs/C-API.md); the
 *   hooks stay and only forward. The child is not traced.
 * - Threads: threading.setprofile installs `thread_profile`, which
 *   replaces itself by the C profile function on the thread's first event
 *   (walk_mode: removes itself and sets up the thread's walk state).
 * - Subinterpreters: this module refuses to load in one; the runner makes
 *   creating one raise (alloctrace/__main__.py).
 * - Frames already running when the profile function is installed are
 *   not on the shadow stack; their returns find no match and are ignored.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "alloctrace.h"
#include "_alloctrace_walk.h"

#if PY_VERSION_HEX < 0x030B0000
#error "alloctrace needs CPython 3.11 or later"
#endif

/* kind_class of pymalloc's arenas in span events. */
#define ARENA_KIND 1
#define MAX_DEPTH 1024
/* --native: native frames per walk, at most (the tracer's depth limit,
 * trace_config.stack_depth, applies too). */
#define NATIVE_MAX 256
#define NAME_MAX_BYTES 1024

/* ---- the reentrancy guard ---- */

/* Set while a hook records on this thread (invariant 1). */
/* Initial-exec: a load at a fixed offset from the thread pointer, where
 * the default model for a shared object calls __tls_get_addr at every
 * hook. Its few bytes come from the static TLS space the C library keeps
 * for modules loaded later. */
static __thread int in_hook __attribute__((tls_model("initial-exec")));

/* ---- the frame table: (code, line) -> frame value ---- */

typedef struct {
    PyCodeObject *code; /* NULL: empty slot */
    int line;
    uint64_t frame;
} frame_slot;

#define FRAME_SLOTS (1u << 20)
/* Written and read only with the GIL held (invariant 2). */
static frame_slot *frame_table;
static size_t frame_table_used;

static size_t utf8_of(PyObject *s, char *buf, size_t cap)
{
    /* Must not allocate: runs inside the allocator hooks. */
    if (s == NULL || !PyUnicode_Check(s)) {
        return 0;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (!PyUnicode_IS_READY(s)) {
        return 0;
    }
#endif
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    size_t out = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        char tmp[4];
        size_t len;
        if (c < 0x80) {
            tmp[0] = (char)c;
            len = 1;
        } else if (c < 0x800) {
            tmp[0] = (char)(0xC0 | (c >> 6));
            tmp[1] = (char)(0x80 | (c & 0x3F));
            len = 2;
        } else if (c < 0x10000) {
            if (c >= 0xD800 && c <= 0xDFFF) {
                c = 0xFFFD; /* a lone surrogate (surrogateescape'd path) */
            }
            tmp[0] = (char)(0xE0 | (c >> 12));
            tmp[1] = (char)(0x80 | ((c >> 6) & 0x3F));
            tmp[2] = (char)(0x80 | (c & 0x3F));
            len = 3;
        } else {
            tmp[0] = (char)(0xF0 | (c >> 18));
            tmp[1] = (char)(0x80 | ((c >> 12) & 0x3F));
            tmp[2] = (char)(0x80 | ((c >> 6) & 0x3F));
            tmp[3] = (char)(0x80 | (c & 0x3F));
            len = 4;
        }
        if (out + len > cap) {
            break;
        }
        memcpy(buf + out, tmp, len);
        out += len;
    }
    return out;
}

static uint64_t register_frame(PyCodeObject *code, int line)
{
    /* Must not allocate: runs inside the allocator hooks. */
    char func[NAME_MAX_BYTES];
    char file[NAME_MAX_BYTES];
    size_t func_len = utf8_of(code->co_qualname, func, sizeof func);
    size_t file_len = utf8_of(code->co_filename, file, sizeof file);
    return trace_frame_register(func, func_len, file, file_len, line > 0 ? (uint32_t)line : 0);
}

static uint64_t frame_value(PyCodeObject *code, int line)
{
    /* Must not allocate: runs inside the allocator hooks; GIL held. */
    if (frame_table == NULL) {
        return register_frame(code, line);
    }
    uintptr_t h = ((uintptr_t)code >> 4) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uint32_t)line * 0xC2B2AE3D27D4EB4Full;
    h ^= h >> 29;
    for (size_t probe = 0; probe < FRAME_SLOTS; probe++) {
        frame_slot *s = &frame_table[(h + probe) & (FRAME_SLOTS - 1)];
        if (s->code == code && s->line == line) {
            return s->frame;
        }
        if (s->code == NULL) {
            uint64_t frame = register_frame(code, line);
            /* Keep 1/4 free so that probes stay short; past that, frames
             * are registered at every use (the tracer's frame table is
             * full by then anyway: 1 Mi frames). */
            if (frame != 0 && frame_table_used < FRAME_SLOTS / 4 * 3) {
                Py_INCREF(code); /* invariant 3 */
                s->code = code;
                s->line = line;
                s->frame = frame;
                frame_table_used++;
            }
            return frame;
        }
    }
    return register_frame(code, line);
}

/* ---- native frames (--native) ---- */

/* _alloctrace_frame.c: the only code that reads CPython's internal frame. */
int alloctrace_frame_is_entry(PyFrameObject *f);
int alloctrace_native_supported(void);
int alloctrace_unseen_frames(PyThreadState *ts, PyFrameObject *top, PyCodeObject **code, int *lasti, char *entry,
                             int max);
int alloctrace_walk_supported(void);
const void *alloctrace_current_frame(PyThreadState *ts);
/* Frames not yet on the shadow stack that a merge takes into account. */
#define UNSEEN_MAX 8

/* Set once by native_on, before tracing starts: allocations' stacks are
 * native walks with each eval call's return address replaced by the
 * Python frames it runs. */
static int native_mode;
/* _PyEval_EvalFrameDefault's code: a return address `ra` is inside it when
 * ra - eval_lo - 1 < eval_len (a return address follows its call). */
static uint64_t eval_lo, eval_len;

/* ---- the shadow stack ---- */

/* --native: a merged stack's hash and its ID; `stack` 0: empty. A
 * thread's cache is 1.5 MiB of address space, mapped (pages touched as
 * used) and kept for the process. */
typedef struct {
    uint64_t h1, h2;
    uint64_t stack;
} stack_cache_slot;

#define STACK_CACHE 65536

/* Python-only stacks: the stack ID of an allocation by (the innermost
 * frame's callers' stack ID, its code, its instruction), which fix it
 * while the code object lives: a site called again from the same callers
 * skips the line, the frame lookup and the push. `code` NULL: empty. A
 * thread's table is 256 KiB of address space, mapped (pages touched as
 * used) and kept for the process. */
typedef struct {
    uint64_t prefix;
    PyCodeObject *code;
    int lasti;
    uint64_t stack;
} site_slot;

#define SITE_CACHE 8192

typedef struct {
    PyFrameObject *frame; /* a reference, dropped at its pop */
    PyCodeObject *code;   /* borrowed from the frame */
    int lasti;            /* the instruction `fv` was computed for */
    uint64_t fv;          /* its frame value; 0: not computed */
    char is_entry;        /* --native: its eval call's entry frame */
    char hidden;          /* --native: running before the profile function: in no stack */
    char settled;         /* --native: `fv` was computed while a frame ran above this one */
    char prefix_ok;       /* `prefix` is computed */
    /* The stack ID of the frames outside this one (the entries below it,
     * each at its line), 0 for none, PREFIX_NONE when trace_stack_push
     * could not give it: computed once, on the first allocation that needs
     * it, and valid while this entry is on the shadow stack (the frames
     * below are suspended at their calls meanwhile). */
    uint64_t prefix;
} shadow_entry;

/* An entry's `prefix` that trace_stack_push could not give (deeper than
 * the format's 1024 frames, or a full table): its stacks are registered
 * whole. */
#define PREFIX_NONE UINT64_MAX

typedef struct {
    shadow_entry *entries; /* outermost first; libc memory, never PyMem */
    size_t depth;
    size_t cap;
    /* The last stack ID computed and what it was computed for: reused while
     * no call or return happened since (`changed` clear) and the innermost
     * frame is at the same instruction, as in a loop that allocates. */
    int changed;
    int last_lasti;
    uint64_t last_stack;
    /* Stack IDs by the innermost frame's instruction while the frames
     * below it stay the same (`epoch` counts calls and returns): a loop
     * body that allocates on several lines. Direct-mapped. */
    uint64_t epoch;
    struct {
        uint64_t epoch; /* 0: empty */
        int lasti;
        uint64_t stack;
    } by_lasti[16];
    /* --native: the last two native walks (`native[cur]` the latest) and
     * their lengths; the last stack ID is reused while the Python frames
     * are as above and the walk is the previous one. */
    int cur;
    size_t native_n[2];
    uint64_t native[2][NATIVE_MAX];
    /* --native: stack IDs by the merged frames' 128-bit hash, direct-
     * mapped (STACK_CACHE slots; NULL: none could be had): most
     * allocations repeat a stack seen before, and finding it here costs a
     * fraction of trace_stack_register's interning of every frame. */
    stack_cache_slot *cache;
    /* Python-only stacks: by site (site_slot; NULL: none could be had). */
    site_slot *sites;
    int sites_tried;
    uint64_t frames[MAX_DEPTH + NATIVE_MAX]; /* innermost first, for trace_stack_register */
    /* Walked stacks (walk_mode): NULL on a thread the walk does not
     * serve (see thread_state). */
    struct walk_memo *walk;
} shadow_stack;

/* walk_mode: the thread's last walk (innermost first) and its frames
 * again outermost first, with the stack ID of each frame and those
 * outside it: a walk of the same frames at the same instructions reuses
 * `stack`, and another one pushes only the frames inside the outermost
 * ones it shares with the last. Both hold only code objects the frame
 * table keeps alive (invariant 3), so equal addresses are equal code
 * objects; otherwise they are dropped (`walked.raw_n` -1, `outer_n` 0,
 * `stack_ok` 0). */
struct walk_memo {
    struct walked walked;
    PyCodeObject *outer_code[WALK_MAX];
    int outer_lasti[WALK_MAX];
    uint64_t outer_stack[WALK_MAX];
    size_t outer_n;
    uint64_t stack;
    int stack_ok;
};

/* Python-only stacks on CPython 3.11 come from a walk of the running
 * frames at each allocation (alloctrace_walk), with no profile function:
 * a profile function makes 3.11 run every instruction unspecialized,
 * which costs more than the walk. Set by profile_on, before the hooks
 * record. `walk_stop` is the frame profile_on ran in (the runner's, which
 * runs the program): the main thread's walks end there, so that the
 * stacks start at the program's own code. */
static int walk_mode;
static const void *walk_stop;
static PyThreadState *walk_stop_ts;

/* This thread's stack; written by the profile function, read by the hooks. */
static __thread shadow_stack *shadow __attribute__((tls_model("initial-exec")));

/* This thread's writer handle, for the header's inline event path (an
 * event is then written here without a call); NULL until the thread's first
 * event asks for it. It stays the thread's (across sessions, and in a fork
 * child), and a stale one makes the calls take the library's path. */
static __thread trace_writer *writer __attribute__((tls_model("initial-exec")));

static inline trace_writer *this_writer(void)
{
    trace_writer *w = writer;
    if (__builtin_expect(w == NULL, 0)) {
        w = writer = trace_writer_get();
    }
    return w;
}

/* The site tables are unmapped at thread exit (a program that starts
 * many threads would otherwise keep a table per thread it ever ran). */
static pthread_key_t sites_key;
static int sites_key_ok;

static void sites_release(void *arg)
{
    shadow_stack *s = arg;
    site_slot *t = s->sites;
    s->sites = NULL; /* a hook running later on this thread finds none */
    if (t != NULL) {
        munmap(t, SITE_CACHE * sizeof *t);
    }
}

/* The calling thread's state, made if need be (libc memory, never
 * PyMem: called by the profile function, profile_on and thread_profile,
 * and in walk_mode by a hook on a thread none of those saw); NULL when it
 * cannot be had. */
static shadow_stack *thread_state(void)
{
    shadow_stack *s = shadow;
    if (s == NULL) {
        s = calloc(1, sizeof *s);
        if (s == NULL) {
            return NULL;
        }
        shadow = s;
    }
    if (walk_mode && s->walk == NULL) {
        s->walk = calloc(1, sizeof *s->walk);
        if (s->walk != NULL) {
            s->walk->walked.raw_n = -1;
        }
    }
    if (!native_mode && !s->sites_tried && sites_key_ok) {
        /* Outside the hooks (the profile function): libc memory, given
         * back when the thread exits (sites_release). */
        s->sites_tried = 1;
        void *m = mmap(NULL, SITE_CACHE * sizeof *s->sites, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m != MAP_FAILED && pthread_setspecific(sites_key, s) != 0) {
            munmap(m, SITE_CACHE * sizeof *s->sites);
            m = MAP_FAILED;
        }
        s->sites = m != MAP_FAILED ? m : NULL;
    }
    if (native_mode && s->cache == NULL) {
        /* Outside the hooks (the profile function): libc memory. */
        void *m = mmap(NULL, STACK_CACHE * sizeof *s->cache, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        s->cache = m != MAP_FAILED ? m : NULL;
    }
    return s;
}

static void shadow_push(PyFrameObject *frame, int hidden)
{
    shadow_stack *s = thread_state();
    if (s == NULL) {
        return;
    }
    if (s->depth == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        shadow_entry *e = realloc(s->entries, cap * sizeof *e);
        if (e == NULL) {
            return;
        }
        s->entries = e;
        s->cap = cap;
    }
    shadow_entry *e = &s->entries[s->depth++];
    /* A reference of our own: if another profile function replaces ours
     * (sys.setprofile, cProfile), pops stop and the entries go stale, but
     * they stay valid objects to read (their stacks are then wrong, never
     * a crash). */
    Py_INCREF(frame);
    s->changed = 1;
    s->epoch++;
    e->frame = frame;
    e->code = PyFrame_GetCode(frame);
    if (e->code != NULL) {
        Py_DECREF(e->code); /* the frame holds it while it runs */
    }
    e->lasti = -2;
    e->fv = 0;
    e->settled = 0;
    e->prefix_ok = 0;
    e->is_entry = native_mode ? (char)alloctrace_frame_is_entry(frame) : 0;
    e->hidden = (char)hidden;
}

/* --native: pushes the frames already running below `frame` (its callers,
 * outermost first), hidden: they show in no stack, but their eval calls
 * are matched, so that those native frames do not stay either. Outside
 * the hooks (the profile function's installation). */
static void shadow_push_callers(PyFrameObject *frame)
{
    PyFrameObject *chain[MAX_DEPTH];
    size_t n = 0;
    PyFrameObject *f = frame != NULL ? PyFrame_GetBack(frame) : NULL;
    while (f != NULL && n < MAX_DEPTH) {
        chain[n++] = f;
        f = PyFrame_GetBack(f);
    }
    Py_XDECREF(f);
    while (n > 0) {
        n--;
        shadow_push(chain[n], 1);
        Py_DECREF(chain[n]);
    }
}

static void shadow_pop(PyFrameObject *frame)
{
    shadow_stack *s = shadow;
    if (s == NULL) {
        return;
    }
    /* The innermost entry, normally; a frame deeper down means entries
     * above it were missed (never seen returning): drop them too. A frame
     * that is not there at all started before the profile function. */
    for (size_t i = s->depth; i > 0; i--) {
        if (s->entries[i - 1].frame == frame) {
            size_t top = s->depth;
            s->depth = i - 1;
            if (s->depth > 0) {
                s->entries[s->depth - 1].settled = 0; /* it runs again */
            }
            s->changed = 1;
            s->epoch++;
            /* After the depth is cut: a frame's dealloc frees memory
             * (through the hooks, which read the stack). */
            for (size_t j = top; j > i - 1; j--) {
                Py_DECREF(s->entries[j - 1].frame);
            }
            return;
        }
    }
}

static int profile(PyObject *obj, PyFrameObject *frame, int what, PyObject *arg)
{
    (void)obj;
    (void)arg;
    if (what == PyTrace_CALL) {
        shadow_push(frame, 0);
    } else if (what == PyTrace_RETURN) {
        shadow_pop(frame);
    }
    return 0;
}

/* The frame value of a shadow-stack entry at its current line; 0 for none
 * (a hidden entry, or no code). */
static uint64_t entry_value_at(shadow_entry *e, int lasti);

static uint64_t entry_value(shadow_entry *e)
{
    /* Must not allocate: runs inside the allocator hooks; GIL held. */
    if (e->code == NULL || e->hidden) {
        return 0;
    }
    return entry_value_at(e, PyFrame_GetLasti(e->frame));
}

/* entry_value with the frame's instruction already read (`lasti`, from
 * PyFrame_GetLasti; e->code is not NULL). */
static uint64_t entry_value_at(shadow_entry *e, int lasti)
{
    /* Must not allocate: runs inside the allocator hooks; GIL held. */
    if (e->hidden) {
        return 0;
    }
    if (lasti != e->lasti || e->fv == 0) {
        e->fv = frame_value(e->code, PyCode_Addr2Line(e->code, lasti));
        e->lasti = lasti;
    }
    return e->fv;
}

/* trace_stack_register(frames, n), looked up first in the thread's cache
 * by a 128-bit hash of the frames and their count (two independent
 * multiplicative hashes; two stacks that collide in both would share an
 * ID, which at a million distinct stacks has odds of about 1e-26). */
static uint64_t cached_register(shadow_stack *s, const uint64_t *frames, size_t n)
{
    /* Must not allocate: runs inside the allocator hooks. */
    if (s->cache == NULL) {
        return trace_stack_register(frames, n);
    }
    /* Two frames a step, each into both hashes, whose chains run side by
     * side: the hashing is on every allocation's path. */
    uint64_t h1 = 0x243F6A8885A308D3ull ^ n, h2 = 0x13198A2E03707344ull + n;
    size_t i = 0;
    for (; i + 1 < n; i += 2) {
        h1 = (h1 ^ frames[i]) * 0x9E3779B97F4A7C15ull + frames[i + 1];
        h2 = (h2 ^ frames[i + 1]) * 0xC2B2AE3D27D4EB4Full + frames[i];
    }
    if (i < n) {
        h1 = (h1 ^ frames[i]) * 0x9E3779B97F4A7C15ull;
        h2 = (h2 ^ frames[i]) * 0xC2B2AE3D27D4EB4Full;
    }
    h1 ^= h1 >> 29;
    h1 *= 0xBF58476D1CE4E5B9ull;
    h1 ^= h1 >> 32;
    h2 ^= h2 >> 31;
    h2 *= 0x94D049BB133111EBull;
    h2 ^= h2 >> 29;
    stack_cache_slot *slot = &s->cache[(h1 ^ (h2 >> 17)) & (STACK_CACHE - 1)];
    if (slot->stack != 0 && slot->h1 == h1 && slot->h2 == h2) {
        return slot->stack;
    }
    uint64_t stack = trace_stack_register(frames, n);
    if (stack != 0) {
        slot->h1 = h1;
        slot->h2 = h2;
        slot->stack = stack;
    }
    return stack;
}

/* --native: the call stack of the native walk, innermost first, with each
 * return address into _PyEval_EvalFrameDefault replaced by the Python
 * frames its call runs: from the innermost frame not yet placed out to
 * and including the next entry frame. A walk with more eval calls than
 * the shadow stack has groups (the walk cut by the depth limit, calls
 * from code the profile function does not see) keeps its extra eval
 * frames native; Python frames left over go outermost. */
static uint64_t native_stack(shadow_stack *s, PyThreadState *ts, int top_lasti)
{
    /* Must not allocate: runs inside the allocator hooks; GIL held. */
    int cur = s->cur ^ 1;
    uint64_t *native = s->native[cur];
    size_t n = trace_stack_walk(native, NATIVE_MAX, 0);
    int prev = s->cur;
    s->cur = cur;
    s->native_n[cur] = n;
    /* Frames running inside the shadow stack's top that the profile
     * function has not seen called yet (an allocation of CPython's while
     * it prepares their call event): innermost, each with its eval call
     * when it is an entry frame. */
    PyCodeObject *ucode[UNSEEN_MAX];
    int ulasti[UNSEEN_MAX];
    char uentry[UNSEEN_MAX];
    int u = alloctrace_unseen_frames(ts, s->entries[s->depth - 1].frame, ucode, ulasti, uentry, UNSEEN_MAX);
    if (u < 0) {
        u = 0;
    }
    if (u == 0 && !s->changed && top_lasti == s->last_lasti && n == s->native_n[prev] &&
        memcmp(native, s->native[prev], n * sizeof *native) == 0) {
        return s->last_stack;
    }
    const size_t cap = MAX_DEPTH + NATIVE_MAX;
    size_t out = 0;
    int ui = 0;           /* ucode[ui]: the innermost unseen frame not placed */
    size_t py = s->depth; /* entries[py - 1]: the innermost entry not placed */
    for (size_t k = 0; k <= n && out < cap; k++) {
        /* k == n: the Python frames left over go outermost. */
        if (k < n) {
            uint64_t ra = native[k];
            if (ra - eval_lo - 1 >= eval_len || (ui == u && py == 0)) {
                s->frames[out++] = ra;
                continue;
            }
        }
        while ((ui < u || py > 0) && out < cap) {
            uint64_t fv;
            int entry;
            if (ui < u) {
                fv = frame_value(ucode[ui], PyCode_Addr2Line(ucode[ui], ulasti[ui]));
                entry = uentry[ui];
                ui++;
            } else {
                shadow_entry *e = &s->entries[--py];
                /* A frame below the top is suspended in its call: its line
                 * stays until it is the top again (shadow_pop). */
                if (e->settled) {
                    fv = e->fv;
                } else {
                    fv = entry_value(e);
                    e->settled = py + 1 < s->depth;
                }
                entry = e->is_entry;
            }
            if (fv != 0) {
                s->frames[out++] = fv;
            }
            if (entry && k < n) {
                break;
            }
        }
    }
    s->last_stack = out ? cached_register(s, s->frames, out) : 0;
    s->last_lasti = top_lasti;
    /* Unseen frames: the next allocation merges again. */
    s->changed = u != 0;
    return s->last_stack;
}

/* The thread state running on this thread: callers hold the GIL, so it is
 * the GIL holder's, one load (PyGILState_GetThisThreadState is a
 * pthread_getspecific). */
static inline PyThreadState *current_tstate(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return PyThreadState_GetUnchecked();
#else
    return _PyThreadState_UncheckedGet();
#endif
}

static site_slot *site_of(shadow_stack *s, uint64_t prefix, PyCodeObject *code, int lasti)
{
    if (s->sites == NULL) {
        return NULL;
    }
    uint64_t h = prefix * 0x9E3779B97F4A7C15ull ^ ((uintptr_t)code >> 4) * 0xC2B2AE3D27D4EB4Full ^
                 (uint64_t)(uint32_t)lasti * 0x165667B19E3779F9ull;
    h ^= h >> 31;
    return &s->sites[h & (SITE_CACHE - 1)];
}

/* Whether the frame table keeps every code object it names alive
 * (invariant 3): a code object's address then never names another, and
 * what is keyed by code addresses (the site table, the previous walk)
 * stays true. */
static int code_objects_kept(void)
{
    return frame_table != NULL && frame_table_used < FRAME_SLOTS / 4 * 3;
}

/* `prefix` with frame value `fv` of `code` at `lasti` pushed (one
 * trace_stack_push), noted in `site` (site_of's) while code objects are
 * kept; `prefix` for `fv` 0, PREFIX_NONE when the push could not give it. */
static uint64_t site_push(site_slot *site, uint64_t prefix, PyCodeObject *code, int lasti, uint64_t fv)
{
    if (fv == 0) {
        return prefix;
    }
    uint64_t stack = trace_stack_push(prefix, fv);
    if (stack == 0) {
        return PREFIX_NONE;
    }
    /* `fv` is in the frame table once code objects are kept. */
    if (site != NULL && code_objects_kept()) {
        site->prefix = prefix;
        site->code = code;
        site->lasti = lasti;
        site->stack = stack;
    }
    return stack;
}

/* The stack ID of entry `e`'s frame at instruction `lasti` (its current
 * one) inside the stack `prefix` of its callers (not PREFIX_NONE): one
 * trace_stack_push, unless the site table has it. `prefix` when `e` shows
 * no frame; PREFIX_NONE when the push could not give it. */
static uint64_t site_stack(shadow_stack *s, shadow_entry *e, uint64_t prefix, int lasti)
{
    /* Must not allocate: runs inside the allocator hooks; GIL held. */
    if (e->code == NULL || e->hidden) {
        return prefix;
    }
    site_slot *site = site_of(s, prefix, e->code, lasti);
    if (site != NULL && site->code == e->code && site->prefix == prefix && site->lasti == lasti) {
        return site->stack;
    }
    return site_push(site, prefix, e->code, lasti, entry_value_at(e, lasti));
}

/* site_stack for a walked frame: `code` at `lasti` inside `prefix`. */
static uint64_t walked_site_stack(shadow_stack *s, uint64_t prefix, PyCodeObject *code, int lasti)
{
    /* Must not allocate: runs inside the allocator hooks; GIL held. */
    site_slot *site = site_of(s, prefix, code, lasti);
    if (site != NULL && site->code == code && site->prefix == prefix && site->lasti == lasti) {
        return site->stack;
    }
    return site_push(site, prefix, code, lasti, frame_value(code, PyCode_Addr2Line(code, lasti)));
}

/* walk_mode: the stack of the last walk's frames (`n` of them, innermost
 * first; more than MAX_DEPTH: trace_stack_register keeps the innermost
 * 1023 under a truncation mark), registered whole. */
static uint64_t walked_register(shadow_stack *s, struct walk_memo *m, size_t n)
{
    size_t out = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t fv = frame_value(m->walked.code[i], PyCode_Addr2Line(m->walked.code[i], m->walked.lasti[i]));
        if (fv != 0) {
            s->frames[out++] = fv;
        }
    }
    m->outer_n = 0;
    m->stack = out ? trace_stack_register(s->frames, out) : 0;
    m->stack_ok = code_objects_kept();
    if (!m->stack_ok) {
        m->walked.raw_n = -1;
    }
    return m->stack;
}

/* walk_mode: the current Python call stack's ID, 0 when there is none:
 * one walk of the running frames; then, unless they are the last walk's
 * at the same instructions, one push per frame inside the outermost ones
 * the last walk had at the same instructions. */
static uint64_t walked_stack_new(shadow_stack *s, struct walk_memo *m);

static inline uint64_t walked_stack(shadow_stack *s)
{
    /* Must not allocate: runs inside the allocator hooks; GIL held. */
    struct walk_memo *m = s->walk;
    PyThreadState *ts = current_tstate();
    if (m == NULL || ts == NULL) {
        return 0;
    }
    if (alloctrace_walk(ts, ts == walk_stop_ts ? walk_stop : NULL, &m->walked) && m->stack_ok) {
        return m->stack;
    }
    return walked_stack_new(s, m);
}

/* walked_stack's rest: a walk that is not the last one. Out of line, so
 * that the common case saves few registers. */
__attribute__((noinline)) static uint64_t walked_stack_new(shadow_stack *s, struct walk_memo *m)
{
    /* Must not allocate: runs inside the allocator hooks; GIL held. */
    struct walked *w = &m->walked;
    size_t n = (size_t)w->n;
    if (n > WALK_MAX) {
        return walked_register(s, m, WALK_MAX);
    }
    size_t shared = 0;
    while (shared < n && shared < m->outer_n && w->code[n - 1 - shared] == m->outer_code[shared] &&
           w->lasti[n - 1 - shared] == m->outer_lasti[shared]) {
        shared++;
    }
    uint64_t stack = shared ? m->outer_stack[shared - 1] : 0;
    for (size_t j = shared; j < n; j++) {
        PyCodeObject *code = w->code[n - 1 - j];
        int lasti = w->lasti[n - 1 - j];
        stack = walked_site_stack(s, stack, code, lasti);
        if (stack == PREFIX_NONE) {
            /* Deeper than the format allows (or a full table). */
            return walked_register(s, m, n);
        }
        m->outer_code[j] = code;
        m->outer_lasti[j] = lasti;
        m->outer_stack[j] = stack;
    }
    int kept = code_objects_kept();
    m->outer_n = kept ? n : 0;
    m->stack = stack;
    m->stack_ok = kept;
    if (!kept) {
        w->raw_n = -1;
    }
    return stack;
}

/* The `prefix` of entry `i`: the stack ID of entries[0..i), computed from
 * the nearest entry below that has one, one trace_stack_push a visible
 * frame. */
static uint64_t prefix_of(shadow_stack *s, size_t i)
{
    /* Must not allocate: runs inside the allocator hooks; GIL held. */
    size_t j = i;
    while (j > 0 && !s->entries[j].prefix_ok) {
        j--;
    }
    uint64_t p = j > 0 ? s->entries[j].prefix : 0;
    for (; j < i; j++) {
        shadow_entry *e = &s->entries[j];
        if (p != PREFIX_NONE && e->code != NULL && !e->hidden) {
            p = site_stack(s, e, p, PyFrame_GetLasti(e->frame));
        }
        s->entries[j + 1].prefix = p;
        s->entries[j + 1].prefix_ok = 1;
    }
    return p;
}

static uint64_t shadow_stack_id(shadow_stack *s);

/* The current Python call stack's ID, 0 when there is none. */
static inline uint64_t current_stack(void)
{
    /* Must not allocate: runs inside the allocator hooks; GIL held. */
    shadow_stack *s = shadow;
    if (__builtin_expect(s == NULL, 0)) {
        if (!walk_mode) {
            return 0;
        }
        /* A thread that started without thread_profile (made by C code,
         * or by _thread.start_new_thread): its walk state made now, of
         * libc memory, never PyMem (invariant 1). */
        s = thread_state();
        if (s == NULL) {
            return 0;
        }
    }
    return walk_mode ? walked_stack(s) : shadow_stack_id(s);
}

/* The shadow stack's ID (not walk_mode), 0 when it is empty. */
__attribute__((noinline)) static uint64_t shadow_stack_id(shadow_stack *s)
{
    /* Must not allocate: runs inside the allocator hooks; GIL held. */
    if (s->depth == 0) {
        return 0;
    }
    /* A program that sets a profile function of its own (sys.setprofile,
     * cProfile, a debugger) takes the thread over: the shadow stack no
     * longer follows its calls, so its allocations get no call stack. */
    PyThreadState *ts = current_tstate();
    if (ts == NULL || ts->c_profilefunc != profile) {
        return 0;
    }
    shadow_entry *top = &s->entries[s->depth - 1];
    int top_lasti = top->code != NULL ? PyFrame_GetLasti(top->frame) : -1;
    if (native_mode) {
        return native_stack(s, ts, top_lasti);
    }
    if (!s->changed && top_lasti == s->last_lasti) {
        return s->last_stack;
    }
    unsigned slot = ((unsigned)top_lasti >> 1) & 15; /* lasti counts bytes of 2-byte code units */
    if (s->by_lasti[slot].epoch == s->epoch && s->by_lasti[slot].lasti == top_lasti) {
        s->last_stack = s->by_lasti[slot].stack;
        s->last_lasti = top_lasti;
        s->changed = 0;
        return s->last_stack;
    }
    /* One push of the innermost frame onto its callers' stack ID, unless
     * the site table has the result. */
    uint64_t prefix = prefix_of(s, s->depth - 1);
    uint64_t stack = prefix == PREFIX_NONE ? PREFIX_NONE : site_stack(s, top, prefix, top_lasti);
    if (stack == PREFIX_NONE) {
        /* Deeper than the format allows (or a full table): the whole
         * stack, which trace_stack_register keeps the innermost 1023
         * frames of, under a truncation mark. */
        size_t n = 0;
        for (size_t i = s->depth; i > 0 && n < MAX_DEPTH + 1; i--) {
            uint64_t v = entry_value(&s->entries[i - 1]);
            if (v != 0) {
                s->frames[n++] = v;
            }
        }
        stack = n ? trace_stack_register(s->frames, n) : 0;
    }
    s->last_stack = stack;
    s->last_lasti = top_lasti;
    s->changed = 0;
    s->by_lasti[slot].epoch = s->epoch;
    s->by_lasti[slot].lasti = top_lasti;
    s->by_lasti[slot].stack = s->last_stack;
    return s->last_stack;
}

/* ---- the address sets: what this session recorded as live ---- */

/* Blocks allocated before trace_start are freed while tracing; the trace
 * never saw them allocated, so their frees are left out (otherwise
 * `alloctrace check` sees frees of addresses that are not live). An open-
 * addressing set of the addresses recorded live, linear probing with
 * backward-shift deletion (no tombstones), in mmap'd memory (never
 * Python's), grown under its lock at half full. One spinlock: MEM and OBJ
 * calls hold the GIL anyway, RAW calls may not. Touched only while tracing
 * is on, so a child forked while another thread held the lock never waits
 * for it (its tracer is off; the lock is reset after fork too). */
typedef struct {
    uintptr_t *slots; /* 0: empty */
    size_t cap;       /* a power of two, or 0 before the first insert */
    size_t len;
    int lock;
} addr_set;

static addr_set live_arenas;

static void set_lock(addr_set *s)
{
    while (__atomic_exchange_n(&s->lock, 1, __ATOMIC_ACQUIRE)) {
        while (__atomic_load_n(&s->lock, __ATOMIC_RELAXED)) {
            __builtin_ia32_pause();
        }
    }
}

static void set_unlock(addr_set *s)
{
    __atomic_store_n(&s->lock, 0, __ATOMIC_RELEASE);
}

static size_t slot_of(uintptr_t a, size_t cap)
{
    uint64_t h = (uint64_t)a * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & (cap - 1);
}

static void set_place(uintptr_t *slots, size_t cap, uintptr_t a)
{
    size_t i = slot_of(a, cap);
    while (slots[i] != 0) {
        i = (i + 1) & (cap - 1);
    }
    slots[i] = a;
}

/* Adds `a`; 0 when memory for the set could not be had (the block is then
 * recorded all the same, and its free is left out). Caller holds the lock. */
static int set_insert_locked(addr_set *s, uintptr_t a)
{
    if ((s->len + 1) * 2 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1u << 16;
        uintptr_t *slots = mmap(NULL, cap * sizeof *slots, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (slots == MAP_FAILED) {
            return 0;
        }
        for (size_t i = 0; i < s->cap; i++) {
            if (s->slots[i] != 0) {
                set_place(slots, cap, s->slots[i]);
            }
        }
        if (s->slots != NULL) {
            munmap(s->slots, s->cap * sizeof *s->slots);
        }
        s->slots = slots;
        s->cap = cap;
    }
    size_t i = slot_of(a, s->cap);
    while (s->slots[i] != 0) {
        if (s->slots[i] == a) {
            return 1; /* already there: recorded twice, left as it is */
        }
        i = (i + 1) & (s->cap - 1);
    }
    s->slots[i] = a;
    __atomic_store_n(&s->len, s->len + 1, __ATOMIC_RELAXED); /* read unlocked by blocks_remove */
    return 1;
}

/* Removes `a`; whether it was there. Caller holds the lock. */
static int set_remove_locked(addr_set *s, uintptr_t a)
{
    if (s->cap == 0) {
        return 0;
    }
    size_t mask = s->cap - 1;
    size_t i = slot_of(a, s->cap);
    while (s->slots[i] != a) {
        if (s->slots[i] == 0) {
            return 0;
        }
        i = (i + 1) & mask;
    }
    /* Backward shift: move later entries of the run into the hole when
     * their home slot does not lie cyclically in (hole, j]. */
    size_t hole = i;
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (s->slots[j] == 0) {
            break;
        }
        size_t home = slot_of(s->slots[j], s->cap);
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            s->slots[hole] = s->slots[j];
            hole = j;
        }
    }
    s->slots[hole] = 0;
    __atomic_store_n(&s->len, s->len - 1, __ATOMIC_RELAXED);
    return 1;
}

static void set_insert(addr_set *s, uintptr_t a)
{
    set_lock(s);
    set_insert_locked(s, a);
    set_unlock(s);
}

static int set_remove(addr_set *s, uintptr_t a)
{
    set_lock(s);
    int was = set_remove_locked(s, a);
    set_unlock(s);
    return was;
}

static void set_clear(addr_set *s)
{
    set_lock(s);
    if (s->slots != NULL) {
        munmap(s->slots, s->cap * sizeof *s->slots);
    }
    s->slots = NULL;
    s->cap = 0;
    __atomic_store_n(&s->len, 0, __ATOMIC_RELAXED);
    set_unlock(s);
}


/* The blocks' set, fast: a bit per 16-byte granule of the address space
 * (every block CPython's allocators return is 16-byte aligned on 64-bit,
 * and two live blocks never start in one granule), in chunks of 2 MiB of
 * bits per 256 MiB of addresses, mapped on first use and installed with a
 * compare-and-swap: lock-free, one atomic operation per allocation and per
 * free. Addresses it cannot hold (not 16-byte aligned, above 2^47, or when
 * a chunk cannot be mapped) go to the locked set `other_blocks`. */
#define GRANULE_SHIFT 4
#define CHUNK_SHIFT 28
#define ADDRESS_BITS 47
#define CHUNK_BYTES ((size_t)1 << (CHUNK_SHIFT - GRANULE_SHIFT - 3))
#define TOP_ENTRIES ((size_t)1 << (ADDRESS_BITS - CHUNK_SHIFT))

typedef struct {
    uint64_t **top; /* TOP_ENTRIES chunk pointers, mmap'd at install */
    int shared;     /* written without the GIL too: atomic updates (invariant 4) */
} block_map;

#ifdef Py_GIL_DISABLED
static block_map gil_blocks = {NULL, 1};
#else
static block_map gil_blocks = {NULL, 0};
#endif
static block_map raw_blocks = {NULL, 1};
static addr_set other_blocks;

static uint64_t *bitmap_chunk(block_map *m, uintptr_t a, int create)
{
    uint64_t **slot = &m->top[a >> CHUNK_SHIFT];
    uint64_t *chunk = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (chunk != NULL || !create) {
        return chunk;
    }
    void *fresh = mmap(NULL, CHUNK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (fresh == MAP_FAILED) {
        return NULL;
    }
    uint64_t *expected = NULL;
    if (!__atomic_compare_exchange_n(slot, &expected, (uint64_t *)fresh, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        munmap(fresh, CHUNK_BYTES);
        return expected;
    }
    return fresh;
}

static int bitmap_holds(block_map *m, uintptr_t a)
{
    return m->top != NULL && (a & ((1u << GRANULE_SHIFT) - 1)) == 0 && (a >> ADDRESS_BITS) == 0;
}

static inline void blocks_insert(block_map *m, uintptr_t a)
{
    /* Must not allocate through Python: runs inside the allocator hooks. */
    uint64_t *chunk = bitmap_holds(m, a) ? bitmap_chunk(m, a, 1) : NULL;
    if (chunk == NULL) {
        set_insert(&other_blocks, a);
        return;
    }
    size_t granule = (a & (((uintptr_t)1 << CHUNK_SHIFT) - 1)) >> GRANULE_SHIFT;
    uint64_t *word = &chunk[granule >> 6];
    uint64_t bit = (uint64_t)1 << (granule & 63);
    if (m->shared) {
        __atomic_fetch_or(word, bit, __ATOMIC_RELAXED);
    } else {
        __atomic_store_n(word, __atomic_load_n(word, __ATOMIC_RELAXED) | bit, __ATOMIC_RELAXED);
    }
}

/* Removes `a`; whether it was there. */
static inline int blocks_remove(block_map *m, uintptr_t a)
{
    /* Must not allocate through Python: runs inside the allocator hooks. */
    uint64_t *chunk = bitmap_holds(m, a) ? bitmap_chunk(m, a, 0) : NULL;
    if (chunk != NULL) {
        size_t granule = (a & (((uintptr_t)1 << CHUNK_SHIFT) - 1)) >> GRANULE_SHIFT;
        uint64_t *word = &chunk[granule >> 6];
        uint64_t bit = (uint64_t)1 << (granule & 63);
        uint64_t was;
        if (m->shared) {
            was = __atomic_fetch_and(word, ~bit, __ATOMIC_RELAXED);
        } else {
            was = __atomic_load_n(word, __ATOMIC_RELAXED);
            if (was & bit) {
                __atomic_store_n(word, was & ~bit, __ATOMIC_RELAXED);
            }
        }
        if (was & bit) {
            return 1;
        }
    }
    return __atomic_load_n(&other_blocks.len, __ATOMIC_RELAXED) != 0 && set_remove(&other_blocks, a);
}

static void bitmap_clear(block_map *m)
{
    if (m->top != NULL) {
        for (size_t i = 0; i < TOP_ENTRIES; i++) {
            if (m->top[i] != NULL) {
                munmap(m->top[i], CHUNK_BYTES);
                m->top[i] = NULL;
            }
        }
    }
}

/* Empties the blocks' sets; at trace_start, before any hook records. */
static void blocks_clear(void)
{
    bitmap_clear(&gil_blocks);
    bitmap_clear(&raw_blocks);
    set_clear(&other_blocks);
}

static void reset_locks_in_child(void)
{
    other_blocks.lock = 0;
    live_arenas.lock = 0;
}

/* ---- the allocator hooks ---- */

typedef struct {
    PyMemAllocatorEx orig;
    int needs_gil_check; /* RAW: may be called without the GIL */
    block_map *blocks;   /* the domain's recorded blocks (invariant 4) */
} domain_hook;

static domain_hook hooks[3];
static PyObjectArenaAllocator orig_arena;
static int hooks_installed;

static uint64_t stack_here(domain_hook *d)
{
    if (d->needs_gil_check && !PyGILState_Check()) {
        return 0; /* invariant 2 */
    }
    return current_stack();
}

/* Records a block the wrapped allocator returned. */
static void record_alloc(domain_hook *d, void *p, size_t size)
{
    /* Must not allocate through Python: runs inside the allocator hooks. */
    blocks_insert(d->blocks, (uintptr_t)p);
    uint64_t stack = stack_here(d);
    trace_writer_heap_object_alloc_stack(this_writer(), (uintptr_t)p, size, 0, stack);
}

/* Records a block's free, if this session recorded the block. */
static void record_free(domain_hook *d, void *p)
{
    /* Must not allocate through Python: runs inside the allocator hooks. */
    if (blocks_remove(d->blocks, (uintptr_t)p)) {
        trace_writer_heap_object_free(this_writer(), (uintptr_t)p);
    }
}

/* Every hook forwards at once when tracing is off or when it is called
 * from inside another hook's call (pymalloc serves blocks over 512 bytes
 * from the RAW domain: the outer domain records them, once). The guard is
 * held across the wrapped call for that reason, and across recording
 * (invariant 1). */

static void *hook_malloc(void *ctx, size_t size)
{
    domain_hook *d = ctx;
    if (in_hook || !trace_writer_enabled()) {
        return d->orig.malloc(d->orig.ctx, size);
    }
    in_hook = 1;
    void *p = d->orig.malloc(d->orig.ctx, size);
    if (p != NULL) {
        record_alloc(d, p, size);
    }
    in_hook = 0;
    return p;
}

static void *hook_calloc(void *ctx, size_t nelem, size_t elsize)
{
    domain_hook *d = ctx;
    if (in_hook || !trace_writer_enabled()) {
        return d->orig.calloc(d->orig.ctx, nelem, elsize);
    }
    in_hook = 1;
    void *p = d->orig.calloc(d->orig.ctx, nelem, elsize);
    if (p != NULL) {
        record_alloc(d, p, nelem * elsize);
    }
    in_hook = 0;
    return p;
}

static void *hook_realloc(void *ctx, void *old, size_t size)
{
    domain_hook *d = ctx;
    if (in_hook || !trace_writer_enabled()) {
        return d->orig.realloc(d->orig.ctx, old, size);
    }
    in_hook = 1;
    /* The free is recorded first: once realloc returns, another thread may
     * be given the old address and record its allocation. */
    int was_recorded = old != NULL && blocks_remove(d->blocks, (uintptr_t)old);
    if (was_recorded) {
        trace_writer_heap_object_free(this_writer(), (uintptr_t)old);
    }
    void *p = d->orig.realloc(d->orig.ctx, old, size);
    if (p != NULL) {
        record_alloc(d, p, size);
    } else if (was_recorded) {
        /* Failed: the old block is still live; its size is unknown here. */
        record_alloc(d, old, 0);
    }
    in_hook = 0;
    return p;
}

static void hook_free(void *ctx, void *p)
{
    domain_hook *d = ctx;
    if (in_hook || p == NULL || !trace_writer_enabled()) {
        d->orig.free(d->orig.ctx, p);
        return;
    }
    in_hook = 1;
    record_free(d, p);
    d->orig.free(d->orig.ctx, p);
    in_hook = 0;
}

static void *hook_arena_alloc(void *ctx, size_t size)
{
    (void)ctx;
    void *p = orig_arena.alloc(orig_arena.ctx, size);
    /* Called from inside pymalloc, under an OBJ or MEM hook's guard (GIL
     * held): recorded all the same, with the Python call stack. */
    if (p != NULL && trace_enabled()) {
        set_insert(&live_arenas, (uintptr_t)p);
        trace_writer_span_alloc_stack(this_writer(), (uintptr_t)p, (size + 4095) / 4096, ARENA_KIND,
                                      PyGILState_Check() ? current_stack() : 0);
    }
    return p;
}

static void hook_arena_free(void *ctx, void *p, size_t size)
{
    (void)ctx;
    if (p != NULL && trace_enabled() && set_remove(&live_arenas, (uintptr_t)p)) {
        trace_span_free((uintptr_t)p);
    }
    orig_arena.free(orig_arena.ctx, p, size);
}

/* Whether `fn` is CPython's own code (its default allocators, or the debug
 * hooks of PYTHONMALLOC=debug / -X dev), rather than another tool's. */
static int is_cpythons(void *fn)
{
    Dl_info mine, theirs;
    if (!dladdr((void *)&PyMem_Malloc, &mine) || !dladdr(fn, &theirs)) {
        return 1; /* cannot tell: assume CPython's */
    }
    return mine.dli_fbase == theirs.dli_fbase;
}

static const char *const domain_names[3] = {"PYMEM_DOMAIN_RAW", "PYMEM_DOMAIN_MEM", "PYMEM_DOMAIN_OBJ"};

static PyObject *install_hooks(PyObject *self, PyObject *unused)
{
    if (hooks_installed) {
        Py_RETURN_NONE;
    }
    if (!sites_key_ok) {
        sites_key_ok = pthread_key_create(&sites_key, sites_release) == 0;
    }
    PyMemAllocatorEx current[3];
    for (int dom = 0; dom < 3; dom++) {
        PyMem_GetAllocator((PyMemAllocatorDomain)dom, &current[dom]);
        if (!is_cpythons((void *)current[dom].malloc)) {
            Dl_info info;
            const char *who = dladdr((void *)current[dom].malloc, &info) && info.dli_fname ? info.dli_fname : "?";
            return PyErr_Format(PyExc_RuntimeError,
                                "alloctrace: another tool already hooks Python's allocator (%s is served by %s); "
                                "run alloctrace without it",
                                domain_names[dom], who);
        }
    }
    PyObjectArenaAllocator arena;
    PyObject_GetArenaAllocator(&arena);
    if (!is_cpythons((void *)arena.alloc)) {
        return PyErr_Format(PyExc_RuntimeError,
                            "alloctrace: another tool already hooks pymalloc's arena allocator; run alloctrace without it");
    }
    if (frame_table == NULL) {
        void *t = mmap(NULL, FRAME_SLOTS * sizeof(frame_slot), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (t == MAP_FAILED) {
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        frame_table = t;
    }
    block_map *maps[2] = {&gil_blocks, &raw_blocks};
    for (int i = 0; i < 2; i++) {
        if (maps[i]->top == NULL) {
            void *t = mmap(NULL, TOP_ENTRIES * sizeof *maps[i]->top, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (t == MAP_FAILED) {
                return PyErr_SetFromErrno(PyExc_OSError);
            }
            maps[i]->top = t;
            if (getenv("AT_SHARED")) gil_blocks.shared = 1;
        }
    }
    for (int dom = 0; dom < 3; dom++) {
        hooks[dom].orig = current[dom];
        hooks[dom].needs_gil_check = dom == PYMEM_DOMAIN_RAW;
        hooks[dom].blocks = dom == PYMEM_DOMAIN_RAW ? &raw_blocks : &gil_blocks;
        PyMemAllocatorEx hook = {&hooks[dom], hook_malloc, hook_calloc, hook_realloc, hook_free};
        PyMem_SetAllocator((PyMemAllocatorDomain)dom, &hook);
    }
    orig_arena = arena;
    PyObjectArenaAllocator arena_hook = {NULL, hook_arena_alloc, hook_arena_free};
    PyObject_SetArenaAllocator(&arena_hook);
    pthread_atfork(NULL, NULL, reset_locks_in_child);
    hooks_installed = 1;
    Py_RETURN_NONE;
}

static PyObject *hooks_active(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(hooks_installed);
}

/* ---- the session ---- */

static PyObject *start(PyObject *self, PyObject *args)
{
    PyObject *path_obj;
    if (!PyArg_ParseTuple(args, "O&", PyUnicode_FSConverter, &path_obj)) {
        return NULL;
    }
    blocks_clear();
    set_clear(&live_arenas);
    trace_config cfg;
    trace_config_init(&cfg);
    cfg.path = PyBytes_AS_STRING(path_obj);
    trace_result r = trace_start(&cfg);
    if (r != TRACE_OK) {
        PyErr_Format(PyExc_RuntimeError, "alloctrace: cannot start tracing to %s: %s (%s)", cfg.path,
                     trace_result_str(r), trace_last_error_detail());
        Py_DECREF(path_obj);
        return NULL;
    }
    Py_DECREF(path_obj);
    Py_RETURN_NONE;
}

static PyObject *stop(PyObject *self, PyObject *unused)
{
    PyEval_SetProfile(NULL, NULL);
    trace_result r = trace_stop();
    if (r != TRACE_OK && r != TRACE_ERR_NOT_STARTED) {
        return PyErr_Format(PyExc_RuntimeError, "alloctrace: writing the trace failed: %s (%s)", trace_result_str(r),
                            trace_last_error_detail());
    }
    return PyBool_FromLong(r == TRACE_OK);
}

static PyObject *enabled(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(trace_enabled());
}

/* --native from now on: refused (RuntimeError) on a CPython whose frame
 * layout this module was not built for or whose eval loop it cannot find.
 * Before start and profile_on. */
static PyObject *native_on(PyObject *self, PyObject *unused)
{
    if (!alloctrace_native_supported()) {
        return PyErr_Format(PyExc_RuntimeError, "alloctrace: --native supports CPython 3.11 only, not %s",
                            PY_VERSION);
    }
    void *eval = dlsym(RTLD_DEFAULT, "_PyEval_EvalFrameDefault");
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    if (eval == NULL || !dladdr1(eval, &info, (void **)&sym, RTLD_DL_SYMENT) || sym == NULL || sym->st_size == 0) {
        return PyErr_Format(PyExc_RuntimeError,
                            "alloctrace: --native cannot find _PyEval_EvalFrameDefault's code in this Python (%s)",
                            PY_VERSION);
    }
    eval_lo = (uint64_t)(uintptr_t)eval;
    eval_len = sym->st_size;
    native_mode = 1;
    Py_RETURN_NONE;
}

/* Starts the shadow stack on the calling thread, from its next call on. */
static PyObject *profile_on(PyObject *self, PyObject *unused)
{
    const char *forced = getenv("ALLOCTRACE_PYTHON_PROFILE_STACKS");
    walk_mode = !native_mode && alloctrace_walk_supported() && !(forced != NULL && strcmp(forced, "1") == 0);
    if (walk_mode) {
        if (thread_state() == NULL) {
            return PyErr_NoMemory();
        }
        PyThreadState *ts = PyThreadState_Get();
        walk_stop = alloctrace_current_frame(ts);
        walk_stop_ts = ts;
        Py_RETURN_NONE;
    }
    if (native_mode) {
        /* The caller's frame and its callers are running already. */
        PyFrameObject *here = PyEval_GetFrame();
        if (here != NULL) {
            Py_INCREF(here);
            shadow_push_callers(here);
            shadow_push(here, 1);
            Py_DECREF(here);
        }
    }
    PyEval_SetProfile(profile, NULL);
    Py_RETURN_NONE;
}

/* The frame profile_on ran in is returning (the program ran to its end):
 * walks from now on (atexit handlers) go to the outermost frame. */
static PyObject *program_returned(PyObject *self, PyObject *unused)
{
    walk_stop = NULL;
    walk_stop_ts = NULL;
    Py_RETURN_NONE;
}

/* threading.setprofile's hook: on a new thread's first event, replaces
 * itself by the C profile function and handles that event; in walk_mode
 * removes itself and sets up the thread's state. */
static PyObject *thread_profile(PyObject *self, PyObject *args)
{
    PyObject *frame, *event, *arg;
    if (!PyArg_ParseTuple(args, "OOO", &frame, &event, &arg)) {
        return NULL;
    }
    if (walk_mode) {
        /* Walks need no profile function: this thread's state only. */
        PyEval_SetProfile(NULL, NULL);
        (void)thread_state();
        Py_RETURN_NONE;
    }
    PyEval_SetProfile(profile, NULL);
    if (PyFrame_Check(frame) && PyUnicode_Check(event) && PyUnicode_CompareWithASCIIString(event, "call") == 0) {
        if (native_mode) {
            shadow_push_callers((PyFrameObject *)frame);
        }
        shadow_push((PyFrameObject *)frame, 0);
    }
    Py_RETURN_NONE;
}

/* The calling thread's shadow stack as (qualname, file, line) tuples,
 * innermost first: for tests. */
static PyObject *shadow_frames(PyObject *self, PyObject *unused)
{
    PyObject *list = PyList_New(0);
    shadow_stack *s = shadow;
    if (list == NULL || s == NULL) {
        return list;
    }
    for (size_t i = s->depth; i > 0; i--) {
        shadow_entry *e = &s->entries[i - 1];
        if (e->code == NULL) {
            continue;
        }
        PyObject *t = Py_BuildValue("(OOi)", e->code->co_qualname, e->code->co_filename,
                                    PyCode_Addr2Line(e->code, PyFrame_GetLasti(e->frame)));
        if (t == NULL || PyList_Append(list, t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(t);
    }
    return list;
}

static PyMethodDef methods[] = {
    {"install_hooks", install_hooks, METH_NOARGS, "Wraps the three PyMem domains and pymalloc's arena allocator."},
    {"hooks_active", hooks_active, METH_NOARGS, "Whether this module's hooks are installed."},
    {"start", start, METH_VARARGS, "start(path): trace_start writing to path."},
    {"stop", stop, METH_NOARGS, "Stops the profile function on this thread and the trace; False if it was off."},
    {"enabled", enabled, METH_NOARGS, "Whether tracing is on."},
    {"native_on", native_on, METH_NOARGS, "Merges native frames into the stacks (--native); before start."},
    {"profile_on", profile_on, METH_NOARGS, "Keeps this thread's shadow stack from its next call on."},
    {"thread_profile", thread_profile, METH_VARARGS, "For threading.setprofile."},
    {"program_returned", program_returned, METH_NOARGS, "The frame profile_on ran in returns."},
    {"shadow_frames", shadow_frames, METH_NOARGS, "This thread's shadow stack, innermost first."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "alloctrace._alloctrace", "CPython's allocators through alloctrace's C API.", -1, methods,
};

PyMODINIT_FUNC PyInit__alloctrace(void)
{
    if (PyInterpreterState_Get() != PyInterpreterState_Main()) {
        PyErr_SetString(PyExc_ImportError, "alloctrace: subinterpreters are not supported");
        return NULL;
    }
    return PyModule_Create(&module);
}
