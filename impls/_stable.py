"""``@stable_program``: ``@dace.program`` whose generated code does not depend on where the
program's source sits.

DaCe names what it generates after the program's module and the source lines of its
statements: a map of ``igemm_pipelined`` on line 452 of ``impls/_pipelined.py`` becomes
the GPU kernel ``impls__pipelined_igemm_pipelined_452_0_0_0``, a temporary of line 88
``__tmp_88_8``.  So moving a program to another module, or adding a line above it,
changed the code of every build that used it.  :func:`stable_program` gives DaCe the function
with its own source as the whole file (line 1 is its first decorator) and the module
:data:`PREFIX`: the names then depend on the program's text alone (the same map is
``cb_igemm_pipelined_6_0_0_0`` wherever the function is defined).

The function's globals, closure, defaults and annotations are the original's; only the
code object's file name (a key of :mod:`linecache`, where the source is registered, not a
file on disk) and first line change.  A parse error points at a line of the program,
counted from its first decorator, in ``<program NAME of FILE>``.
"""

import inspect
import linecache
import types

import dace

#: The module name DaCe sees for every program (the prefix of the names it derives).
PREFIX = "cb"


def stable_program(f):
    """``dace.program(f)``, with names that depend on ``f``'s text only (module)."""
    lines = inspect.getsource(f).splitlines(keepends=True)
    key = f"<program {f.__qualname__} of {f.__code__.co_filename}>"
    linecache.cache[key] = (len("".join(lines)), None, lines, key)
    relocated = types.FunctionType(f.__code__.replace(co_filename=key, co_firstlineno=1),
                                   f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    for attribute in ("__kwdefaults__", "__annotations__", "__qualname__", "__doc__"):
        setattr(relocated, attribute, getattr(f, attribute))
    relocated.__dict__.update(f.__dict__)
    relocated.__module__ = PREFIX
    return dace.program(relocated)
