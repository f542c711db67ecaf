"""How the kernel library defines DaCe programs: :func:`stable_program` for programs written
in DaCe's Python, :func:`program_from_source` for programs whose text is generated per layer.

``@stable_program`` is ``@dace.program`` with generated code that does not depend on where
the program's source sits.  DaCe names what it generates after the program's module and the
source lines of its statements: a map of ``igemm_pipelined`` on line 452 of the module
``impls/_pipelined.py`` became the GPU kernel ``impls__pipelined_igemm_pipelined_452_0_0_0``,
a temporary of line 88 ``__tmp_88_8``, so moving a program to another module, or adding a
line above it, changed the code of every build that used it.  :func:`stable_program` gives
DaCe the function with its own source as the whole file (line 1 is its first decorator) and
the module :data:`PREFIX`: the names then depend on the program's text alone (that map is
``cb_igemm_pipelined_6_0_0_0`` wherever the function is defined).  The function's globals,
closure, defaults and annotations are the original's; only the code object's file name (a
key of :mod:`linecache`, where the source is registered, not a file on disk) and first line
change.  A parse error points at a line of the program, counted from its first decorator, in
``<program NAME of FILE>``.
"""

import inspect
import linecache
import types

import dace

from convkernels.fold import fold_indices

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


def program_from_source(source: str, function: str, name: str, namespace=None):
    """The ``@dace.program`` named ``function`` defined by Python ``source`` text.

    For programs whose statements are generated (unrolled) per layer.  DaCe parses a
    program from its source file, so the text is written to a module file named after
    ``name`` and a hash of the text (in ``$TMPDIR/convbench-generated``, rewritten
    atomically, shared by every process) and imported from there.  (Source that only
    :mod:`linecache` knows is not enough: DaCe 1.0.2 then misreads array shapes.)
    ``namespace``: names the text uses that have no source form (a DaCe type object),
    set in the module before its text runs.  Index expressions are folded first
    (:func:`convkernels.fold.fold_indices`).
    """
    import hashlib
    import importlib.util
    import os
    import re
    import tempfile
    from pathlib import Path
    source = fold_indices(source)  # the same program, cheaper for DaCe to parse
    digest = hashlib.sha1(source.encode()).hexdigest()[:12]
    module = re.sub(r"[^A-Za-z0-9_]", "_", f"cb_gen_{name}_{digest}")
    folder = Path(tempfile.gettempdir()) / "convbench-generated"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{module}.py"
    if not path.is_file() or path.read_text() != source:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(module, path)
    loaded = importlib.util.module_from_spec(spec)
    loaded.__dict__.update(namespace or {})
    spec.loader.exec_module(loaded)
    return getattr(loaded, function)
