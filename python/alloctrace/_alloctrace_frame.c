/*
 * The one fact of CPython's internal frame layout that --native needs,
 * kept apart from _alloctrace.c so that only this file sees CPython's
 * internal headers (Py_BUILD_CORE): whether a running frame is the entry
 * frame of its C call of _PyEval_EvalFrameDefault. In 3.11 one such call
 * runs its entry frame and every Python-to-Python call made from it
 * (inlined, no C call of their own); each frame that starts a C call of
 * the eval loop has `is_entry` set before its first instruction runs, so
 * before the profile function sees its call.
 */
#define Py_BUILD_CORE 1
#include <Python.h>

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
#endif
