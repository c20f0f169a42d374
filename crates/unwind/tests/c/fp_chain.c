/* Call chain compiled with -O0 -fno-omit-frame-pointer: every frame keeps
 * a frame record (saved rbp, return address). Used by alloctrace-unwind's
 * tests and benchmark; the callback is Rust code that captures the stack. */
#include <stddef.h>

typedef void (*unwt_cb)(void *ctx);

void unwt_nofp_level(int n, unwt_cb cb, void *ctx);

/* n + 1 frames of unwt_fp_level, then cb(ctx). */
void unwt_fp_level(int n, unwt_cb cb, void *ctx) {
    if (n == 0)
        cb(ctx);
    else
        unwt_fp_level(n - 1, cb, ctx);
}

/* n_fp + 1 frames of unwt_fp_mixed, then n_nofp + 1 frames of
 * unwt_nofp_level (no frame pointers), then cb(ctx). */
void unwt_fp_mixed(int n_fp, int n_nofp, unwt_cb cb, void *ctx) {
    if (n_fp == 0)
        unwt_nofp_level(n_nofp, cb, ctx);
    else
        unwt_fp_mixed(n_fp - 1, n_nofp, cb, ctx);
}

/* A capture made from C: the raw frame-pointer entry point
 * (alloctrace_unwind::capture_fp_raw) called by a C frame with a frame
 * record, so no Rust frame (with or without frame pointers) sits between
 * the chain and the walk. Used as the chains' callback, with ctx = job. */
typedef unsigned long (*unwt_raw_capture)(size_t skip, unsigned long lo, unsigned long hi,
                                          unsigned long *out, size_t len);

struct unwt_fp_job {
    unwt_raw_capture capture;
    size_t skip;
    unsigned long lo, hi;
    unsigned long *out;
    size_t len;
    unsigned long result;
    unwt_cb then; /* called after the capture (the oracle), may be NULL */
    void *then_ctx;
};

void unwt_capture_leaf(void *ctx) {
    struct unwt_fp_job *job = ctx;
    job->result = job->capture(job->skip, job->lo, job->hi, job->out, job->len);
    if (job->then)
        job->then(job->then_ctx);
}

/* The trap of memoized captures: unwt_yz_y and unwt_yz_z both call
 * unwt_yz_x, which calls cb(ctx); their frames have the same size, so the
 * frames of unwt_yz_x (and the callback's) lie at the same addresses with
 * the same return addresses whichever of them called it. Only the word
 * holding unwt_yz_x's return address (into Y or into Z) differs.
 * unwt_y_then_z runs cb under Y, then under Z. */
void unwt_yz_x(unwt_cb cb, void *ctx) {
    cb(ctx);
}

void unwt_yz_y(unwt_cb cb, void *ctx) {
    unwt_yz_x(cb, ctx);
}

void unwt_yz_z(unwt_cb cb, void *ctx) {
    unwt_yz_x(cb, ctx);
}

void unwt_y_then_z(unwt_cb cb, void *ctx) {
    unwt_yz_y(cb, ctx);
    unwt_yz_z(cb, ctx);
}

/* A breakpoint trap at one of two instructions of the same frame: the
 * kernel's signal frame lands at the same stack address either way, and
 * only the interrupted pc it saves (after the int3) tells them apart. */
void unwt_trap(int which) {
#if defined(__x86_64__)
    if (which)
        __asm__ volatile("int3");
    else
        __asm__ volatile("int3");
#endif
}
