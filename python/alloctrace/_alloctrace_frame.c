/*
 * What alloctrace reads of CPython's internal frame layout, kept apart
 * from _alloctrace.c so that only this file sees CPython's internal
 * headers (Py_BUILD_CORE): the chain of running frames (alloctrace_walk,
 * the Python call stack of an allocation on 3.11) and, for --native,
 * whether a running frame is the entry frame of its C call of
 * _PyEval_EvalFrameDefault. In 3.11 one such call
 * runs its entry frame and every Python-to-Python call made from it
 * (inlined, no C call of their own); each frame that starts a C call of
 * the eval loop has `is_entry` set before its first instruction runs, so
 * before the profile function sees its call.
 */
#define Py_BUILD_CORE 1
#include <Python.h>

#include "_alloctrace_walk.h"

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#include <internal/pycore_frame.h>

/* 1 when `f` (running) is its eval call's entry frame, 0 when it was
 * called from Python inside the same call. Must not allocate: it reads. */
int alloctrace_frame_is_entry(PyFrameObject *f)
{
    return f->f_frame != NULL && f->f_frame->is_entry;
}

/* The frames running on `ts` inside `top` (a running frame), innermost
 * first: frames whose call the profile function has not seen yet (an
 * allocation made while CPython prepares that call event: the frame
 * object it passes). Their code (borrowed), last instruction and entry
 * flag go to `code`, `lasti` and `entry`; returns how many (0 in the
 * common case: `top` is the running frame), or -1 when `top` is not
 * within `max` frames. Must not allocate: it reads. */
int alloctrace_unseen_frames(PyThreadState *ts, PyFrameObject *top, PyCodeObject **code, int *lasti, char *entry,
                             int max)
{
    _PyInterpreterFrame *want = top->f_frame;
    _PyInterpreterFrame *f = ts->cframe != NULL ? ts->cframe->current_frame : NULL;
    int n = 0;
    while (f != NULL && f != want) {
        if (n == max) {
            return -1;
        }
        code[n] = f->f_code;
        lasti[n] = _PyInterpreterFrame_LASTI(f);
        entry[n] = f->is_entry;
        n++;
        f = f->previous;
    }
    return f == want ? n : -1;
}

int alloctrace_native_supported(void)
{
    return 1;
}

/* The running frame of `ts` (its innermost complete one), as an opaque
 * pointer for alloctrace_walk's `stop`; NULL when none. */
const void *alloctrace_current_frame(PyThreadState *ts)
{
    _PyInterpreterFrame *f = ts->cframe != NULL ? ts->cframe->current_frame : NULL;
    while (f != NULL && _PyFrame_IsIncomplete(f)) {
        f = f->previous;
    }
    return f;
}

/* See _alloctrace_walk.h. Frames CPython has begun to set up but not yet
 * started (incomplete: no instruction run, no call event yet) are left
 * out of `code`/`lasti`, as PyFrame_GetBack leaves them out; whether a
 * frame is complete follows from its code and instruction (and whether
 * it is a generator's, which its code says). */
int alloctrace_walk(PyThreadState *ts, const void *stop, struct walked *w)
{
    _PyInterpreterFrame *top = ts->cframe != NULL ? ts->cframe->current_frame : NULL;
    _PyInterpreterFrame *f = top;
    /* The common case first: the last walk's instructions (an allocation
     * loop in C or in Python). */
    if (w->raw_n >= 0) {
        /* A frame the last walk met is neither NULL nor `stop`: a frame
         * equal to one is neither. */
        const int raw_n = w->raw_n;
        int i = 0;
        while (i < raw_n && w->raw[i].frame == f && w->raw[i].instr == (const void *)f->prev_instr) {
            f = f->previous;
            i++;
        }
        if (i == raw_n && (f == NULL || f == stop)) {
            return 1;
        }
    }
    int raw_n = 0, n = 0;
    for (f = top; f != NULL && f != stop; f = f->previous) {
        if (raw_n < WALK_MAX) {
            w->raw[raw_n].frame = f;
            w->raw[raw_n].instr = f->prev_instr;
        }
        raw_n++;
        if (_PyFrame_IsIncomplete(f)) {
            continue;
        }
        if (n == WALK_MAX) {
            n++;
            break;
        }
        w->code[n] = f->f_code;
        w->lasti[n] = _PyInterpreterFrame_LASTI(f) * (int)sizeof(_Py_CODEUNIT);
        n++;
    }
    w->n = n;
    w->raw_n = raw_n <= WALK_MAX && n <= WALK_MAX ? raw_n : -1;
    return 0;
}

/* From 3.11.1 on, a frame leaves the chain before it is cleared (GH-99729),
 * so a walk made by a finalizer that the clearing runs never meets a
 * frame whose code object may already be gone; 3.11.0 keeps the shadow
 * stack. Py_Version: the running interpreter's, not the headers'. */
int alloctrace_walk_supported(void)
{
    return Py_Version >= 0x030B01F0;
}
#else
int alloctrace_unseen_frames(PyThreadState *ts, PyFrameObject *top, PyCodeObject **code, int *lasti, char *entry,
                             int max)
{
    (void)ts;
    (void)top;
    (void)code;
    (void)lasti;
    (void)entry;
    (void)max;
    return -1;
}

int alloctrace_frame_is_entry(PyFrameObject *f)
{
    (void)f;
    return 0;
}

int alloctrace_native_supported(void)
{
    return 0;
}

const void *alloctrace_current_frame(PyThreadState *ts)
{
    (void)ts;
    return NULL;
}

int alloctrace_walk(PyThreadState *ts, const void *stop, struct walked *w)
{
    (void)ts;
    (void)stop;
    w->n = 0;
    w->raw_n = -1;
    return 0;
}

int alloctrace_walk_supported(void)
{
    return 0;
}
#endif
