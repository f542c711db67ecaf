"""Loading compiled programs: each library once per process, from a private copy, never
closed; one program object per library while anyone holds it.

Why not DaCe's loader.  DaCe 1.0.2 loads a library through ``ReloadableDLL.load``
(dace/codegen/compiled_sdfg.py).  It first asks its stub whether the library is loaded
already (``is_library_loaded`` in dace/codegen/tools/dacestub.cpp: a
``dlopen(RTLD_NOLOAD)``, which also takes a reference that nobody drops).  If it is, it
copies ``lib<name>.so`` to ``lib<name>.so_`` with ``shutil.copyfile`` and loads the
copy, and ``.so__`` when ``.so_`` is loaded too.  ``copyfile`` opens its target with
O_TRUNC.  When that target is a copy this process still has mapped, the kernel drops
the mapping's pages with the file's, private copy-on-write pages included
(``truncate_pagecache`` in mm/truncate.c), so the relocations the dynamic loader wrote
into the library are gone.  The next ``dlopen`` walks the loaded objects, reads the
copy's soname through its unrelocated ``DT_STRTAB`` (0x418 instead of an address) and
crashes in ``strcmp`` (``_dl_map_object``, elf/dl-load.c); a call into the copy would
jump through an unrelocated GOT.  Three loads of one build, the first dropped after the
second was made, are enough, on any machine (``tests/test_loader.py``).

What this module does instead:

* A library is copied once per process into a folder of the process's own (under the
  temporary folder, ``TMPDIR``) and loaded from there with ``dlopen(RTLD_NOW |
  RTLD_LOCAL)``, as DaCe's stub does.  Nothing writes to that copy afterwards, and it is
  never closed: a program's code can outlive any Python object that refers to it
  (OpenMP's threads, torch's autograd graph), and DaCe's cache paths are never in the
  loader's list, so DaCe's own "already loaded" checks (``SDFG.compile`` renames a
  program that is) stay false.
* The dynamic loader matches loaded objects by path before it looks at the file, so
  loading a library that was rebuilt in its cache folder by its path would hand back the
  old code.  A private copy is named by its content's checksum: a rebuilt library is
  another object, and programs of the old one keep running the old one.
* Callers that load a library while an earlier program object of it is alive get that
  object: one state and one set of buffers.  When the last holder drops it, DaCe
  finalises it (``__dace_exit`` frees its buffers); the library stays loaded for the
  next load, which makes a new program object.
"""

import atexit
import ctypes
import hashlib
import os
import shutil
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

_LOCK = threading.Lock()
#: Loaded libraries by (program name, SHA-256 of the file); never closed.
_LIBRARIES: Dict[Tuple[str, str], Any] = {}
#: Program objects by the same key, while someone holds them.
_PROGRAMS: "weakref.WeakValueDictionary[Tuple[str, str], Any]" = weakref.WeakValueDictionary()
_FOLDER: Optional[Path] = None


def _private_folder() -> Path:
    """This process's folder of library copies, removed when the process exits (the
    loaded copies stay mapped: removing a file does not touch its mappings)."""
    global _FOLDER
    if _FOLDER is None:
        _FOLDER = Path(tempfile.mkdtemp(prefix=f"convbench-libs-{os.getpid()}-"))
        atexit.register(shutil.rmtree, str(_FOLDER), True)
    return _FOLDER


def _pinned_library_class():
    from dace.codegen.compiled_sdfg import ReloadableDLL

    class PinnedLibrary(ReloadableDLL):
        """A library that DaCe's ``CompiledSDFG`` can use, loaded once and never closed.

        ``_library_filename`` stays the cache path: DaCe reads the program's sources
        next to it (``CompiledSDFG._try_parse_state_struct``) and reports it as
        ``CompiledSDFG.filename``."""

        def __init__(self, shown: str, copy: Path, program_name: str):
            super().__init__(shown, program_name)
            self.copy = copy
            self._cdll = None

        def is_loaded(self) -> bool:
            return self._cdll is not None

        def load(self):
            if self._cdll is not None:
                return
            try:
                self._cdll = ctypes.CDLL(str(self.copy), mode=os.RTLD_NOW | os.RTLD_LOCAL)
            except OSError as err:
                raise RuntimeError(
                    f"cannot load {self._library_filename} (from its copy {self.copy}): "
                    f"{err}; if the temporary folder does not allow programs (noexec), "
                    "set TMPDIR to one that does") from None
            self._lib = ctypes.c_void_p(self._cdll._handle)

        def get_symbol(self, name, restype=ctypes.c_int):
            if self._cdll is None:
                raise ReferenceError(f"{self.copy} is not loaded")
            try:
                address = ctypes.cast(getattr(self._cdll, name), ctypes.c_void_p).value
            except AttributeError:
                raise KeyError(f"function {name} not found in {self._library_filename}") from None
            return ctypes.CFUNCTYPE(restype)(address)

        def unload(self):
            """Never: DaCe calls this when a program object dies or a call fails."""

    return PinnedLibrary


def load_program(library: os.PathLike, sdfg) -> Any:
    """The program (DaCe's ``CompiledSDFG``) of the compiled ``library`` of ``sdfg``.

    Its initialisation (``__dace_init``) waits for the first call, as with DaCe's own
    loader.  The same object comes back for the same library file content while any
    caller holds it."""
    from dace.codegen.compiled_sdfg import CompiledSDFG

    library = Path(library).resolve()
    data = library.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    key = (sdfg.name, digest)
    with _LOCK:
        program = _PROGRAMS.get(key)
        if program is not None:
            return program
        lib = _LIBRARIES.get(key)
        if lib is None:
            copy = _private_folder() / f"{digest[:16]}_{library.name}"
            copy.write_bytes(data)  # a new name: nothing has it mapped
            lib = _pinned_library_class()(str(library), copy, sdfg.name)
            lib.load()
            _LIBRARIES[key] = lib
        program = CompiledSDFG(sdfg, lib, sdfg.arg_names)
        _PROGRAMS[key] = program
        return program


def loaded_libraries() -> Dict[Tuple[str, str], Path]:
    """The libraries this process has loaded: (program name, SHA-256) -> private copy."""
    with _LOCK:
        return {key: lib.copy for key, lib in _LIBRARIES.items()}
