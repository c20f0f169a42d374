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
