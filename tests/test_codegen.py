"""The code DaCe generates for every implementation, against the committed digests
(``results/codegen/``, :mod:`convbench.build.codegen`): a change meant to leave the kernels
as they were (a move, a rename) must leave every digest as it is.

The fast tier checks each implementation on one layer in its first precision, on both
targets; the full tier checks every case of the committed set.  Both generate for AVX2,
which every x86-64 machine of this project has (the digests of the register-blocked
kernels depend on the vector width)."""

import json
import subprocess
import sys

import pytest

from convbench.build import codegen
from convkernels.cpu import isa

ROOT = codegen.Path(__file__).resolve().parent.parent
FOLDER = ROOT / "results" / "codegen"
ISA = "avx2"

needs_avx2 = pytest.mark.skipif(
    ISA not in (isa.cpuinfo().get("flags") or "").split(),
    reason="the committed digests are for x86-64 CPUs with AVX2")


def _check(*args, folder=FOLDER):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "codegen_hashes.py"),
                           "--check", "--isa", ISA, "--dir", str(folder), *args],
                          capture_output=True, text=True, timeout=3000)


@needs_avx2
def test_generated_code_is_as_committed_on_one_layer():
    result = _check("--first-precision", "--layer", "deep_noncubic")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " cases as committed" in result.stdout


@needs_avx2
@pytest.mark.full
def test_generated_code_is_as_committed_everywhere():
    result = _check()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


@needs_avx2
def test_a_changed_digest_fails_the_check(tmp_path):
    """The check can fail: with one committed digest altered, it names that case and
    exits 1."""
    data = json.loads(codegen.hashes_file(FOLDER, ISA).read_text())
    key = "implicitGemmPipelined|gpu|float32|odd:deep_noncubic:b2"
    data["cases"][key]["sha256"] = "0" * 64
    codegen.hashes_file(tmp_path, ISA).write_text(json.dumps(data))
    result = _check("--implementation", "implicitGemmPipelined", "--target", "gpu",
                    "--layer", "deep_noncubic", folder=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert key in result.stdout and "0000000000" in result.stdout


def test_a_kernel_change_changes_the_digest(monkeypatch):
    """One FMA fewer in the SIMT main loop's C++ is another digest (in this process, whose
    hash seed is the same for both)."""
    from convbench.layersets.layer import Layer
    from convkernels.gpu.simt import mainloop
    layer = Layer("t", 1, 8, 16, 4, 4, 4, 3, 3, 3, pad=1)
    before = codegen.digest(codegen.generate("implicitGemmPipelined", "gpu", "float32", layer))
    real = mainloop.fma_loop
    monkeypatch.setattr(mainloop, "fma_loop",
                        lambda s: real(s).replace("acc[0] += ", "acc[0] = ", 1))
    after = codegen.digest(codegen.generate("implicitGemmPipelined", "gpu", "float32", layer))
    assert before != after


def test_digests_are_pinned_to_their_environment():
    """Generating needs a process that started with the pinned hash seed, ISA and GPU
    architecture: this one (pytest's) did not, and is refused."""
    if codegen.is_pinned(ISA):
        pytest.skip("this process started with the pinned environment")
    with pytest.raises(RuntimeError, match="PYTHONHASHSEED"):
        codegen.run([], ISA, jobs=1)
