"""Loading compiled programs in one process, again and again (convbench/build/loader.py).

DaCe 1.0.2's own loader crashed the process when one build was loaded three times with
the first program dropped in between (issue 39): these patterns run in a subprocess,
where a crash is a failed test rather than the end of the test session."""

import dataclasses
import json
import shutil
import subprocess

import pytest

from cases import FIRST_SMALL, Case
from conftest import ENV, PYTHON, ROOT

#: A build that the fast tier makes anyway (and that compiles quickly: the pattern
#: compiles it once more, under the "rebuild" policy).
CASES = [Case("implicitGemm", FIRST_SMALL, "small")]

_PATTERN = """
import gc, json, sys
from pathlib import Path
from convbench import registry
from convbench.build import loader, toolchain
from convbench.build.cache import BuildCache
from convbench.check import verify
from convbench.layersets.layer import Layer

cache = BuildCache(sys.argv[1])
layer = Layer(**json.loads(sys.argv[2]))
specs = [toolchain.make_spec(registry.get(name), layer) for name in sys.argv[3].split(",")]
truth = verify.make_truth(layer)

def checked(spec, policy):
    build = cache.get(spec, policy=policy)
    check = verify.verify_build(build, truth)[0]
    assert check.ok, check.summary()
    return build

def window(spec, policies):
    # Each load is made while the one before is alive, and the oldest is dropped after
    # it (DaCe's loader crashed on the third); then all are dropped, and loaded again.
    live = [checked(spec, policies[0])]
    for i, policy in enumerate(policies[1:]):
        live.append(checked(spec, policy))
        if i % 2 == 0:
            live.pop(0)
            gc.collect()
    programs = {id(b.program) for b in live}
    del live
    gc.collect()
    checked(spec, policies[-1])
    return len(programs)

for spec in specs:
    for policy in ("require", "reuse"):
        assert window(spec, [policy] * 5) == 1, "one library, several program objects"
        print("PATTERN", policy, "ok", flush=True)
# A rebuild while programs of the old library are alive, then loads of the new one.
# The loads after the rebuild share the new library's one program (the old one's were
# dropped): 2 would mean a second copy of the new library, or the old one kept.
assert window(specs[0], ["require", "require", "rebuild", "reuse", "require"]) == 1, \
    "the loads after a rebuild do not share one program"
print("PATTERN rebuild ok", flush=True)
left = sorted(str(p) for p in Path(sys.argv[1]).rglob("*.so*") if not p.name.endswith(".so"))
assert not left, left
print("PATTERN libraries", len(loader.loaded_libraries()))
"""


@pytest.mark.prebuild(*CASES)
def test_loading_one_build_again_and_again(builds, tmp_path):
    """Load, run, drop and load again under every cache policy, with earlier program
    objects of the same build alive: every call verifies, callers share one program
    object, and no renamed library copy appears in the cache.  (DaCe's loader crashed on
    the third load: see convbench/build/loader.py.)"""
    cache = tmp_path / "cache"
    for case in CASES:  # a copy of the session's builds: "rebuild" recompiles them
        builds(case.spec(), load=False)  # built here where the session built nothing up front
        src = builds.cache.entry(case.spec())
        shutil.copytree(src, cache / src.name)
    script = tmp_path / "pattern.py"
    script.write_text(_PATTERN)
    proc = subprocess.run(
        [PYTHON, str(script), str(cache), json.dumps(dataclasses.asdict(FIRST_SMALL)),
         ",".join(c.impl for c in CASES)],
        cwd=ROOT, env=dict(ENV, MALLOC_PERTURB_="165", PYTHONWARNINGS="ignore"),
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (f"exit status {proc.returncode}\n" + proc.stdout[-2000:]
                                  + proc.stderr[-3000:])
    said = [line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("PATTERN")]
    assert said[:-1] == [["require", "ok"], ["reuse", "ok"]] * len(CASES) + [
        ["rebuild", "ok"]], proc.stdout[-2000:]
    # One library per build at least (a rebuild whose bytes differ is loaded as another).
    assert said[-1][0] == "libraries" and int(said[-1][1]) >= len(CASES)


_REBUILT = """
import sys
from pathlib import Path
import numpy as np
import dace
from dace.codegen import compiler
from convbench.build import loader

folder = Path(sys.argv[1])

def program(offset):
    @dace.program
    def add(x: dace.float64[4], y: dace.float64[4]):
        y[:] = x + offset
    sdfg = add.to_sdfg()
    sdfg.name = "loader_rebuilt"
    sdfg.build_folder = str(folder)
    sdfg.compile(return_program_handle=False)
    return loader.load_program(compiler.get_binary_name(str(folder), sdfg.name), sdfg)

def run(p):
    x, y = np.arange(4.0), np.zeros(4)
    p(x=x, y=y)
    return (y - x).tolist()

one = program(1.0)
assert run(one) == [1.0] * 4, run(one)
two = program(2.0)      # the same name, compiled into the same folder
assert run(two) == [2.0] * 4, f"the rebuilt library ran the old code: {run(two)}"
assert run(one) == [1.0] * 4, "the old program changed"
print("ok")
"""


def test_a_library_rebuilt_in_place_is_loaded_anew(tmp_path):
    """The dynamic loader matches loaded objects by path: a library compiled again into
    the same folder, while the old one is loaded, must run the new code (and the old
    program its own)."""
    script = tmp_path / "rebuilt.py"  # DaCe reads a program's source from its file
    script.write_text(_REBUILT)
    proc = subprocess.run([PYTHON, str(script), str(tmp_path / "build")], cwd=ROOT,
                          env=dict(ENV, PYTHONWARNINGS="ignore"), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (
        f"exit status {proc.returncode}\n" + proc.stdout[-2000:] + proc.stderr[-3000:])


def test_a_library_that_cannot_load_is_one_clear_error(tmp_path):
    from convbench.build import loader

    class FakeSDFG:
        name = "not_a_library"
        arg_names = []
    bogus = tmp_path / "libnot_a_library.so"
    bogus.write_bytes(b"not an ELF file")
    with pytest.raises(RuntimeError, match="cannot load .*libnot_a_library.so"):
        loader.load_program(bogus, FakeSDFG())


def test_only_the_loader_calls_daces_loader():
    """DaCe's ``get_program_handle``/``ReloadableDLL`` take the renaming path that
    crashed; every load goes through convbench.build.loader."""
    offenders = []
    for folder in ("convbench", "scripts", "impls", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name in ("loader.py", "test_loader.py"):
                continue
            text = path.read_text()
            if "get_program_handle" in text or "ReloadableDLL" in text or \
                    "load_from_file" in text:
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
