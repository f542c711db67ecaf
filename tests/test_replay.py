"""CPU builds by replayed CMake lines (convbench/build/replay.py): in a subprocess, so that
the process starts with nothing kept."""

import dataclasses
import json
import subprocess

from cases import FIRST_SMALL
from conftest import ENV, PYTHON, ROOT

_SCRIPT = """
import json, os, sys
from convbench import registry
from convbench.build import replay, toolchain
from convbench.build.cache import BuildCache
from convbench.check import verify
from convbench.layersets.layer import Layer

cache = BuildCache(sys.argv[1])
layer = Layer(**json.loads(sys.argv[2]))
truth = verify.make_truth(layer)

def build(name):
    spec = toolchain.make_spec(registry.get(name), layer)
    b = cache.get(spec, policy="rebuild")
    check = verify.verify_build(b, truth)[0]
    assert check.ok, (name, check.summary())
    return (b.library.parent / f"libdacestub_{spec.name}{b.library.suffix}").exists()

out = {"first": build("directConvNCDHW"), "kinds": len(replay.kinds())}
out["second"] = build("implicitGemm")  # another program of the same kind
os.environ["CONVBENCH_CMAKE_REPLAY"] = "0"
out["off"] = build("directConvNCDHW")
del os.environ["CONVBENCH_CMAKE_REPLAY"]
for kind in list(replay._TEMPLATES):  # kept lines that fail: CMake after all
    replay._TEMPLATES[kind] = ("false", "false")
out["broken"] = build("implicitGemm")
out["kinds_after"] = len(replay.kinds())
print("RESULT " + json.dumps(out))
"""


def test_replayed_builds_verify_and_fall_back_to_cmake(tmp_path):
    """The first program is built by CMake (with DaCe's stub), a second of the same kind
    by the kept lines under its own name (no stub), and both verify; with
    CONVBENCH_CMAKE_REPLAY=0, or where the kept lines fail, CMake builds, and a failed
    kind is not replayed again."""
    script = tmp_path / "replay_check.py"
    script.write_text(_SCRIPT)
    proc = subprocess.run([PYTHON, str(script), str(tmp_path / "cache"),
                           json.dumps(dataclasses.asdict(FIRST_SMALL))],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(line for line in proc.stdout.splitlines()
                             if line.startswith("RESULT "))[len("RESULT "):])
    # Stub present: CMake built it; absent: replayed.
    assert result == {"first": True, "kinds": 1, "second": False, "off": True,
                      "broken": True, "kinds_after": 0}
