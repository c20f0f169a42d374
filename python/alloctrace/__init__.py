"""alloctrace for Python: every allocation of CPython's three PyMem domains
(pymalloc's small objects too) and pymalloc's arenas, with Python call
stacks, written as an alloctrace trace that the `alloctrace` commands read.

    python3 -m alloctrace run [-o TRACE] script.py [args]
    python3 -m alloctrace run [-o TRACE] -m module [args]

See docs/PYTHON.md.
"""

__all__ = ["main"]


def main(argv=None):
    from .__main__ import main as _main

    return _main(argv)
