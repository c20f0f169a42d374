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

int alloctrace_native_supported(void)
{
    return 1;
}
#else
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
