/* Call chain compiled with -O2 -fomit-frame-pointer: no frame records, rbp
 * is an ordinary register here; only .eh_frame describes these frames. */
#include <stddef.h>

typedef void (*unwt_cb)(void *ctx);

volatile int unwt_sink;

/* n + 1 frames of unwt_nofp_level, then cb(ctx). The store after the call
 * keeps it from being a tail call, noinline keeps every level a frame. */
__attribute__((noinline)) void unwt_nofp_level(int n, unwt_cb cb, void *ctx) {
    if (n == 0)
        cb(ctx);
    else
        unwt_nofp_level(n - 1, cb, ctx);
    unwt_sink = unwt_sink + 1;
}

/* void unwt_garbage_rbp(unsigned long garbage, unwt_cb cb, void *ctx):
 * calls cb(ctx) with rbp = garbage (restored after), as code that uses rbp
 * as a general register would leave it; its CFI says where rbp was saved,
 * so a DWARF unwinder passes through it and a frame-pointer walk does not. */
#if defined(__x86_64__)
__asm__(
    ".text\n"
    ".globl unwt_garbage_rbp\n"
    ".type unwt_garbage_rbp,@function\n"
    "unwt_garbage_rbp:\n"
    "  .cfi_startproc\n"
    "  push %rbp\n"
    "  .cfi_def_cfa_offset 16\n"
    "  .cfi_offset %rbp, -16\n"
    "  mov %rdi, %rbp\n"
    "  mov %rdx, %rdi\n"
    "  call *%rsi\n"
    "  pop %rbp\n"
    "  .cfi_def_cfa_offset 8\n"
    "  ret\n"
    "  .cfi_endproc\n"
    ".size unwt_garbage_rbp, .-unwt_garbage_rbp\n");
#endif

/* The Y/Z trap of tests/c/fp_chain.c without frame pointers: equal frames
 * (the stores after the calls keep them from being tail calls, and differ
 * so that the compiler does not fold Y and Z into one function). */
__attribute__((noinline)) void unwt_nofp_yz_x(unwt_cb cb, void *ctx) {
    cb(ctx);
    unwt_sink = unwt_sink + 1;
}

__attribute__((noinline)) void unwt_nofp_yz_y(unwt_cb cb, void *ctx) {
    unwt_nofp_yz_x(cb, ctx);
    unwt_sink = unwt_sink + 2;
}

__attribute__((noinline)) void unwt_nofp_yz_z(unwt_cb cb, void *ctx) {
    unwt_nofp_yz_x(cb, ctx);
    unwt_sink = unwt_sink + 3;
}

__attribute__((noinline)) void unwt_nofp_y_then_z(unwt_cb cb, void *ctx) {
    unwt_nofp_yz_y(cb, ctx);
    unwt_nofp_yz_z(cb, ctx);
    unwt_sink = unwt_sink + 4;
}

/* void unwt_rbp_levels(unsigned long value, int n, unwt_cb cb, void *ctx):
 * unwt_nofp_level(n, cb, ctx) with rbp = value (restored after), as a
 * caller that keeps a loop counter in rbp leaves it: the n + 1 frames
 * without frame pointers pass it through unchanged down to cb. */
#if defined(__x86_64__)
__asm__(
    ".text\n"
    ".globl unwt_rbp_levels\n"
    ".type unwt_rbp_levels,@function\n"
    "unwt_rbp_levels:\n"
    "  .cfi_startproc\n"
    "  push %rbp\n"
    "  .cfi_def_cfa_offset 16\n"
    "  .cfi_offset %rbp, -16\n"
    "  mov %rdi, %rbp\n"
    "  mov %esi, %edi\n"
    "  mov %rdx, %rsi\n"
    "  mov %rcx, %rdx\n"
    "  call unwt_nofp_level@PLT\n"
    "  pop %rbp\n"
    "  .cfi_def_cfa_offset 8\n"
    "  ret\n"
    "  .cfi_endproc\n"
    ".size unwt_rbp_levels, .-unwt_rbp_levels\n");

/* void unwt_bp_cfa_levels(const unsigned long *rec, int n, unwt_cb cb,
 * void *ctx): unwt_nofp_level(n, cb, ctx) from a frame whose CFA is
 * rbp-based (CFA = rbp + 16, rbp saved at CFA - 16: a frame record), with
 * rbp = its own frame record (rec == NULL: the walk goes on to its caller)
 * or rec (a record elsewhere: the walk follows it). The levels below pass
 * rbp through, so the step out of this frame depends on the rbp that the
 * walk reaches the levels with. */
__asm__(
    ".text\n"
    ".globl unwt_bp_cfa_levels\n"
    ".type unwt_bp_cfa_levels,@function\n"
    "unwt_bp_cfa_levels:\n"
    "  .cfi_startproc\n"
    "  push %rbp\n"
    "  .cfi_def_cfa_offset 16\n"
    "  .cfi_offset %rbp, -16\n"
    "  mov %rsp, %rbp\n"
    "  test %rdi, %rdi\n"
    "  cmovnz %rdi, %rbp\n"
    "  .cfi_def_cfa %rbp, 16\n"
    "  mov %esi, %edi\n"
    "  mov %rdx, %rsi\n"
    "  mov %rcx, %rdx\n"
    "  call unwt_nofp_level@PLT\n"
    "  .cfi_def_cfa %rsp, 16\n"
    "  pop %rbp\n"
    "  .cfi_def_cfa_offset 8\n"
    "  ret\n"
    "  .cfi_endproc\n"
    ".size unwt_bp_cfa_levels, .-unwt_bp_cfa_levels\n");
#endif

/* void unwt_call_n(int n, unwt_cb cb, void *ctx): cb(ctx) n times (n > 0)
 * from one call instruction, rbp untouched: each call starts in the same
 * state. */
#if defined(__x86_64__)
__asm__(
    ".text\n"
    ".globl unwt_call_n\n"
    ".type unwt_call_n,@function\n"
    "unwt_call_n:\n"
    "  .cfi_startproc\n"
    "  push %rbx\n"
    "  .cfi_def_cfa_offset 16\n"
    "  .cfi_offset %rbx, -16\n"
    "  push %r12\n"
    "  .cfi_def_cfa_offset 24\n"
    "  .cfi_offset %r12, -24\n"
    "  push %r13\n"
    "  .cfi_def_cfa_offset 32\n"
    "  .cfi_offset %r13, -32\n"
    "  mov %edi, %r13d\n"
    "  mov %rsi, %rbx\n"
    "  mov %rdx, %r12\n"
    "1:\n"
    "  mov %r12, %rdi\n"
    "  call *%rbx\n"
    "  dec %r13d\n"
    "  jnz 1b\n"
    "  pop %r13\n"
    "  .cfi_def_cfa_offset 24\n"
    "  pop %r12\n"
    "  .cfi_def_cfa_offset 16\n"
    "  pop %rbx\n"
    "  .cfi_def_cfa_offset 8\n"
    "  ret\n"
    "  .cfi_endproc\n"
    ".size unwt_call_n, .-unwt_call_n\n");
#endif
