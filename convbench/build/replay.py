"""CPU builds without a CMake run each: CMake's compile and link lines, replayed.

DaCe 1.0.2 builds every program through CMake (``configure_and_compile`` in
dace/codegen/compiler.py): a configure in the new build folder (compiler detection,
FindOpenMP and FindThreads, about 1.3 s on a 2-core EPYC) and ``cmake --build``, which
also compiles DaCe's loader stub (about 0.5 s).  Together they are most of a small CPU
build's 5 s.  Two programs whose CMake command lines differ only in the program's name
and folder get the same compile and link lines, but for those two strings.  So, per
process:

* the first CPU program of each kind (its CMake command line with the name and folder
  taken out, and the environment that steers the compilers) is configured and built by
  CMake as usual, and the compile line of its one source file (``build.make`` with the
  variables of ``flags.make`` put in) and its link line (``link.txt``) are kept;
* a later program of the same kind runs those two lines, with its own name and folder,
  in its build folder.  It gets no loader stub: :mod:`convbench.build.loader` does not use one.

Anything else (GPU programs, several source files, lines that cannot be read) goes
through CMake; so does a program whose replayed lines fail, and its kind then stops
being replayed.  ``CONVBENCH_CMAKE_REPLAY=0`` turns replaying off.
"""

import contextlib
import os
import re
import shlex
import subprocess
import threading
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

#: Environment variables that change what CMake finds or what the compilers do.
_ENVIRONMENT = ("PATH", "CC", "CXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "CPATH",
                "LIBRARY_PATH", "LD_LIBRARY_PATH", "MKLROOT", "CMAKE_PREFIX_PATH",
                "CMAKE_GENERATOR")
_LOCK = threading.Lock()
#: kind -> (compile line, link line) with ``{FOLDER}`` and ``{NAME}`` in place; None: not
#: replayable.
_TEMPLATES: Dict[str, Optional[Tuple[str, str]]] = {}
_PLACEHOLDERS = ("{FOLDER}", "{NAME}")


def enabled() -> bool:
    return os.environ.get("CONVBENCH_CMAKE_REPLAY", "1") != "0"


def _kind(cmake_command: str, folder: str, name: str) -> str:
    text = cmake_command.replace(folder, "{FOLDER}").replace(name, "{NAME}")
    env = "\0".join(f"{k}={os.environ.get(k, '')}" for k in _ENVIRONMENT)
    return text + "\0" + env


def _make_variables(path: Path) -> Dict[str, str]:
    variables = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Z_]+) = (.*)$", line)
        if m:
            variables[m.group(1)] = m.group(2)
    return variables


def _captured(build: Path, name: str) -> Optional[Tuple[str, str]]:
    """The compile and link lines of program ``name`` in the CMake build folder ``build``
    (None where they are not the simple case this module replays)."""
    target = build / "CMakeFiles" / f"{name}.dir"
    try:
        rules = (target / "build.make").read_text()
        flags = _make_variables(target / "flags.make")
        link = (target / "link.txt").read_text().strip()
    except OSError:
        return None
    compiles = [line.strip() for line in rules.splitlines()
                if line.startswith("\t") and " -c " in line and " -o " in line]
    if len(compiles) != 1 or "\n" in link:
        return None
    line = compiles[0]
    for var in ("CXX_DEFINES", "CXX_INCLUDES", "CXX_FLAGS"):
        line = line.replace(f"$({var})", flags.get(var, ""))
    if "$(" in line or "$(" in link:
        return None
    return line, link


def _fill(template: str, folder: str, name: str) -> str:
    return template.replace("{FOLDER}", folder).replace("{NAME}", name)


def _templated(text: str, folder: str, name: str) -> Optional[str]:
    if any(p in text for p in _PLACEHOLDERS):
        return None
    return text.replace(folder, "{FOLDER}").replace(name, "{NAME}")


class _Build:
    """One ``configure_and_compile`` call: its configure, then its build."""

    def __init__(self, cmake_command: str, build: Path):
        self.build = build
        self.folder = str(build.parent)
        self.name = next((m.group(1) for m in
                          [re.search(r"-DDACE_PROGRAM_NAME=(\S+)", cmake_command)] if m), "")
        self.kind = _kind(cmake_command, self.folder, self.name) if self.name else ""
        with _LOCK:
            self.template = _TEMPLATES.get(self.kind) if self.kind else None
        self.replaying = self.template is not None
        self.cmake_command = cmake_command

    def replay(self) -> bool:
        """Run the kept lines; False (and the kind forgotten) if they fail."""
        obj_dirs = set()
        for arg in shlex.split(self.template[0]):
            if arg.endswith(".o") and "CMakeFiles/" in arg:
                obj_dirs.add(os.path.dirname(arg))
        for d in obj_dirs:
            (self.build / _fill(d, self.folder, self.name)).mkdir(parents=True, exist_ok=True)
        for line in self.template:
            done = subprocess.run(_fill(line, self.folder, self.name), shell=True,
                                  cwd=self.build, capture_output=True, text=True)
            if done.returncode != 0:
                with _LOCK:
                    _TEMPLATES[self.kind] = None
                return False
        return True

    def keep(self):
        """After CMake built the program: keep its lines for later programs of its kind."""
        if not self.kind or self.kind in _TEMPLATES:
            return
        found = _captured(self.build, self.name)
        template = None
        if found is not None:
            lines = [_templated(x, self.folder, self.name) for x in found]
            template = tuple(lines) if None not in lines else None
        with _LOCK:
            _TEMPLATES.setdefault(self.kind, template)


_STATE = threading.local()  # per thread: the folders of the programs being built
_REAL: List = []  # DaCe's own _run_liveoutput, once patched


def _install() -> None:
    """Put :func:`_run` in DaCe's place, once per process; it passes every command
    through except inside :func:`replaying` on the calling thread."""
    from dace.codegen import compiler
    with _LOCK:
        if not _REAL:
            _REAL.append(compiler._run_liveoutput)
            compiler._run_liveoutput = _run


def _run(command, output_stream=None, **kwargs):
    real = _REAL[0]
    builds: Optional[Dict[str, _Build]] = getattr(_STATE, "builds", None)
    if builds is None or not isinstance(command, str):
        return real(command, output_stream=output_stream, **kwargs)
    cwd = str(Path(kwargs.get("cwd", ".")))
    if command.startswith("cmake ") and "--build" not in command:  # the configure
        build = builds[cwd] = _Build(command, Path(cwd))
        if build.replaying:
            return None
        return real(command, output_stream=output_stream, **kwargs)
    if command.startswith("cmake --build"):
        build = builds.pop(cwd, None)
        if build is not None and build.replaying:
            if build.replay():
                return None
            real(build.cmake_command, output_stream=output_stream, **kwargs)  # CMake after all
        result = real(command, output_stream=output_stream, **kwargs)
        if build is not None and not build.replaying:
            build.keep()
        return result
    return real(command, output_stream=output_stream, **kwargs)


@contextlib.contextmanager
def replaying(target: str) -> Iterator[None]:
    """Within the block, this thread's CPU programs are built by replayed CMake lines
    where they can be (see the module's docstring)."""
    if target != "cpu" or not enabled():
        yield
        return
    _install()
    outer = getattr(_STATE, "builds", None)
    _STATE.builds = {}
    try:
        yield
    finally:
        _STATE.builds = outer


def kinds() -> List[str]:
    """The kinds this process replays (for tests)."""
    with _LOCK:
        return [k for k, v in _TEMPLATES.items() if v is not None]
