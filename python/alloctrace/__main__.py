"""`python3 -m alloctrace run [-o TRACE] (script.py | -m module) [args]`.

Runs the script as `python script.py [args]` would (sys.argv, sys.path[0],
a fresh __main__ module) or the module as `python -m module [args]` would,
with every allocation traced, and writes the trace: TRACE, or
alloctrace-NAME-PID.trace in the current directory (NAME: the script's file
name without .py, or the module's name). Usage errors exit 2 before
anything runs; otherwise the exit status is the program's.
"""

import atexit
import builtins
import io
import os
import sys
import threading
import types

USAGE = """usage: python3 -m alloctrace run [-o TRACE] script.py [args ...]
       python3 -m alloctrace run [-o TRACE] -m module [args ...]

Runs a Python program with every allocation traced (the three PyMem domains,
pymalloc's objects and arenas), each with its Python call stack, and writes
an alloctrace trace for the `alloctrace` commands (top, leaks, flamegraph,
report, export, check).

options:
  -o, --output TRACE  the trace file (default: alloctrace-NAME-PID.trace,
                      NAME the script's name without .py or the module's)
  --native            native frames in the stacks too: each of the
                      interpreter's eval frames replaced by the Python
                      frames it runs (CPython 3.11)
  -h, --help          this text
"""


class UsageError(Exception):
    pass


def parse_run(args):
    """(output, native, module or None, script or None, program args)."""
    output = None
    native = False
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-h", "--help"):
            sys.stdout.write(USAGE)
            sys.exit(0)
        elif a in ("-o", "--output"):
            if i + 1 >= len(args):
                raise UsageError("%s needs a file name" % a)
            output = args[i + 1]
            i += 2
        elif a.startswith("--output="):
            output = a[len("--output="):]
            i += 1
        elif a.startswith("-o") and len(a) > 2:
            output = a[2:]
            i += 1
        elif a == "--native":
            native = True
            i += 1
        elif a == "-m":
            if i + 1 >= len(args):
                raise UsageError("-m needs a module name")
            return output, native, args[i + 1], None, args[i + 2:]
        elif a.startswith("-m") and len(a) > 2:
            return output, native, a[2:], None, args[i + 1:]
        elif a == "--":
            i += 1
            break
        elif a.startswith("-") and a != "-":
            raise UsageError("unknown option %s" % a)
        else:
            break
    if i >= len(args):
        raise UsageError("no script or -m module to run")
    if output == "":
        raise UsageError("the trace file name is empty")
    return output, native, None, args[i], args[i + 1:]


def refuse_subinterpreters():
    """Creating a subinterpreter raises: its frames would not be on any
    shadow stack, and its allocations would go through the same hooks.
    (_xxsubinterpreters up to 3.12, _interpreters from 3.13.)"""

    def create(*args, **kwargs):
        raise RuntimeError("alloctrace: subinterpreters are not supported")

    for name in ("_xxsubinterpreters", "_interpreters"):
        try:
            module = __import__(name)
        except ImportError:
            continue
        module.create = create


def prepare_script(path):
    """(code, __main__ module) for `python path`, before tracing starts."""
    try:
        with io.open_code(path) as f:
            source = f.read()
    except OSError as e:
        raise UsageError("cannot read %s: %s" % (path, e.strerror or e))
    try:
        code = compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as e:
        raise UsageError("%s does not compile: %s" % (path, e))
    from importlib.machinery import SourceFileLoader

    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None
    main.__loader__ = SourceFileLoader("__main__", path)
    main.__package__ = None
    main.__spec__ = None
    main.__builtins__ = builtins
    sys.argv[0] = path
    sys.path[0] = os.path.dirname(os.path.abspath(path))
    return code, main


def prepare_module(name):
    """(code, __main__ module) for `python -m name`, before tracing starts."""
    import runpy

    # sys.path[0] is already the current directory, as for `python -m`.
    try:
        mod_name, spec, code = runpy._get_module_details(name, UsageError)
    except UsageError as e:
        raise UsageError(str(e).replace("%s: " % sys.executable, ""))
    main = types.ModuleType("__main__")
    main.__file__ = spec.origin
    main.__cached__ = spec.cached
    main.__loader__ = spec.loader
    main.__package__ = spec.parent
    main.__spec__ = spec
    main.__builtins__ = builtins
    sys.argv[0] = spec.origin or name
    return code, main


def run(args):
    output, native, module, script, prog_args = parse_run(args)
    sys.argv[:] = [module or script] + prog_args
    if module is not None:
        code, main = prepare_module(module)
        name = module
    else:
        code, main = prepare_script(script)
        name = os.path.basename(script)
        if name.endswith(".py"):
            name = name[:-3]
    if output is None:
        output = "alloctrace-%s-%d.trace" % (name, os.getpid())

    from . import _alloctrace

    try:
        import tracemalloc

        if tracemalloc.is_tracing():
            raise RuntimeError("alloctrace: tracemalloc is tracing; run alloctrace without it")
        if native:
            _alloctrace.native_on()
        _alloctrace.install_hooks()
    except RuntimeError as e:
        sys.stderr.write("%s\n" % e)
        sys.exit(1)

    refuse_subinterpreters()
    sys.modules["__main__"] = main
    pid = os.getpid()

    def stop():
        # A forked child's tracer is off (docs/PYTHON.md): nothing to write.
        if os.getpid() != pid:
            return
        threading.setprofile(None)
        try:
            _alloctrace.stop()
        except RuntimeError as e:
            sys.stderr.write("%s\n" % e)

    try:
        _alloctrace.start(output)
    except RuntimeError as e:
        sys.stderr.write("%s\n" % e)
        sys.exit(1)
    # atexit runs its functions last-registered first: this one runs after
    # every handler the program registers, once its threads are joined.
    atexit.register(stop)
    threading.setprofile(_alloctrace.thread_profile)
    _alloctrace.profile_on()
    try:
        exec(code, main.__dict__)
    finally:
        _alloctrace.program_returned()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if argv else 2
    if argv[0] != "run":
        sys.stderr.write("alloctrace: error: unknown command %r (the command is `run`)\n%s" % (argv[0], USAGE))
        return 2
    try:
        run(argv[1:])
    except UsageError as e:
        sys.stderr.write("alloctrace: error: %s\n" % e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
