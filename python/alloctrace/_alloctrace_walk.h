/*
 * The walk of the running Python frames (CPython 3.11), shared by
 * _alloctrace.c, which reads it, and _alloctrace_frame.c, which writes it
 * (the only file that sees CPython's internal frame).
 */
#ifndef ALLOCTRACE_WALK_H
#define ALLOCTRACE_WALK_H

#include <Python.h>

/* The most frames a walk keeps: the format's 1024 and one more, so that a
 * deeper stack is registered with its truncation mark. */
#define WALK_MAX 1025

/* One thread's walks. `code` and `lasti` (instruction offset in bytes, as
 * PyFrame_GetLasti gives it) are the complete frames of the last walk,
 * innermost first, `n` of them (WALK_MAX + 1: more than WALK_MAX, the
 * innermost WALK_MAX kept). `raw` is every frame of that walk, complete
 * or not, with its next instruction pointer, `raw_n` of them (-1: none
 * kept): a walk that meets the same frames at the same instruction
 * pointers has the same stack (an instruction pointer names its code
 * object while the code object lives: the caller keeps them alive, or
 * sets raw_n to -1). */
struct walked {
    PyCodeObject *code[WALK_MAX];
    int lasti[WALK_MAX];
    int n;
    int raw_n;
    struct {
        const void *frame;
        const void *instr;
    } raw[WALK_MAX];
};

/* Walks the frames running on `ts` into `w`, without the frame `stop` and
 * its callers; returns 1 when they are the last walk's frames at the same
 * instructions (`w` unchanged), 0 when it wrote a new walk. Must not
 * allocate: it reads. 0 and nothing walked where unsupported. */
int alloctrace_walk(PyThreadState *ts, const void *stop, struct walked *w);

#endif
