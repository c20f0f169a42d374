"""Builds the alloctrace package: the `alloctrace._alloctrace` C extension
links the project's static library (target/release/liballoctrace.a, built
with cargo when missing) and hooks CPython's allocators through the C API.

`pip install ./python` from the repository's top level. ALLOCTRACE_ROOT
names another checkout; ALLOCTRACE_LIB another liballoctrace.a.
"""

import glob
import os
import subprocess
import sys

from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def repo_root():
    root = os.environ.get("ALLOCTRACE_ROOT") or os.path.dirname(HERE)
    if not os.path.exists(os.path.join(root, "include", "alloctrace.h")):
        sys.exit(
            "alloctrace: cannot find include/alloctrace.h under %s: build from the "
            "repository (pip install ./python) or set ALLOCTRACE_ROOT" % root
        )
    return root


def static_library(root):
    lib = os.environ.get("ALLOCTRACE_LIB") or os.path.join(root, "target", "release", "liballoctrace.a")
    if not os.path.exists(lib):
        print("alloctrace: building %s (cargo build --release -p alloctrace)" % lib, flush=True)
        subprocess.check_call(["cargo", "build", "--release", "-p", "alloctrace"], cwd=root)
    return lib


ROOT = repo_root()
LIB = static_library(ROOT)

setup(
    ext_modules=[
        Extension(
            "alloctrace._alloctrace",
            sources=["alloctrace/_alloctrace.c", "alloctrace/_alloctrace_frame.c"],
            include_dirs=[os.path.join(ROOT, "include")],
            extra_compile_args=["-Wall", "-Wextra", "-Wno-missing-field-initializers", "-Wno-unused-parameter"],
            # The static library's symbols stay inside the extension, so a
            # liballoctrace.so or the LD_PRELOAD shim in the same process is
            # a separate tracer, never mixed with this one.
            extra_link_args=[LIB, "-Wl,--exclude-libs,ALL", "-lpthread", "-ldl", "-lm"],
            # Rebuilt when the library or a header changes (pip builds in
            # python/build/, which stays between installs): the inline
            # event path is compiled in from alloctrace_inline.h.
            depends=[LIB, "alloctrace/_alloctrace_walk.h"] + sorted(glob.glob(os.path.join(ROOT, "include", "*.h"))),
        )
    ],
)
