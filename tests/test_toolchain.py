"""The DaCe toolchain: unique build names, cache folders, and CUDA builds with nvcc 13."""

import shutil

import pytest

from cases import GPU_IMPLS, Case, case_params
from convbench import registry, toolchain
from convbench.errors import UsageError
from convbench.layers import Layer

LAYER = Layer("tc", 1, 3, 4, 6, 5, 4, 3, 3, 3, pad=1)


def test_build_names_are_unique():
    impl = registry.get("implicitGemm")
    base = toolchain.make_spec(impl, LAYER)
    variants = [
        base,
        toolchain.make_spec(impl, LAYER.with_batch(2)),
        toolchain.make_spec(impl, LAYER, target="gpu"),
        toolchain.make_spec(registry.get("directConvNCDHW"), LAYER),
        # same layer name, other geometry (layer sets share names like "conv1")
        toolchain.make_spec(impl, Layer("tc", 1, 3, 4, 6, 5, 4, 3, 3, 3, pad=0)),
    ]
    names = [v.name for v in variants]
    assert len(set(names)) == len(names), names
    assert toolchain.make_spec(impl, LAYER).name == base.name  # deterministic
    for name in names:
        assert name.isidentifier()


def test_unknown_target_and_dtype():
    impl = registry.get("implicitGemm")
    with pytest.raises(UsageError, match="no schedule for target 'fpga'"):
        toolchain.make_spec(impl, LAYER, target="fpga")
    with pytest.raises(UsageError, match="unknown dtype"):
        toolchain.make_spec(impl, LAYER, dtype="float7")


def test_cpu_build_goes_to_cachedir(tmp_path):
    spec = toolchain.make_spec(registry.get("directConvNCDHW"), LAYER)
    build = toolchain.build(spec, tmp_path)
    assert build.folder == tmp_path / spec.name
    assert build.library.is_file() and build.library.is_relative_to(tmp_path)
    assert build.program is not None and set(build.times) == {"sdfg", "compile"}


def test_gpu_settings_carry_the_nvcc13_fixes(tmp_path):
    settings = toolchain.dace_settings("gpu", tmp_path)
    assert settings[("compiler", "cuda", "cuda_arch")] == "90"
    assert settings[("compiler", "cuda", "backend")] == "cuda"
    assert "-include" in settings[("compiler", "cuda", "args")]
    assert "cub3_compat.cuh" in settings[("compiler", "cuda", "args")]
    assert "CMAKE_USER_MAKE_RULES_OVERRIDE_CUDA" in settings[("compiler", "extra_cmake_args")]
    assert settings[("compiler", "cuda", "max_concurrent_streams")] == -1
    for name in ("cub3_compat.cuh", "cuda_cxx17.cmake"):
        assert (toolchain.COMPAT_DIR / name).is_file()
    cpu = toolchain.dace_settings("cpu", tmp_path)
    assert ("compiler", "cuda", "args") not in cpu


def test_gpu_settings_are_temporary(tmp_path):
    import dace
    before = dace.config.Config.get("compiler", "cuda", "cuda_arch")
    with toolchain.dace_config("gpu", tmp_path):
        assert dace.config.Config.get("compiler", "cuda", "cuda_arch") == "90"
    assert dace.config.Config.get("compiler", "cuda", "cuda_arch") == before


#: GPU builds compiled with nvcc (no GPU needed).  Fast tier: the default implementation
#: (tiled, shared memory) and im2colGemm (cuBLAS linked from its wheel); full tier: all.
NVCC_FAST = ("implicitGemmNCDHW", "im2colGemm")
NVCC = [Case(name, LAYER, "nvcc", target="gpu") for name in GPU_IMPLS]
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


@needs_nvcc
@pytest.mark.parametrize("case", case_params([c for c in NVCC if c.impl in NVCC_FAST], NVCC))
def test_gpu_sdfg_compiles_with_nvcc(case, builds, coverage):
    """The GPU schedule generates CUDA kernels that nvcc compiles for sm_90 (no GPU needed)."""
    try:
        build = builds(case.spec(), load=False)
        assert build.library.is_file()
        # The harness passes torch CUDA tensors: every argument must live in GPU memory.
        import dace
        sdfg = build.sdfg or dace.SDFG.from_file(str(build.folder / "program.sdfg"))
        for role in ("x", "w", "y"):
            assert sdfg.arrays[role].storage == dace.StorageType.GPU_Global, role
        cuda_sources = list((build.folder / "src" / "cuda").glob("*.cu"))
        assert cuda_sources, "no CUDA source generated"
        text = "\n".join(f.read_text() for f in cuda_sources)
        assert "__global__" in text
        cmake_cache = (build.folder / "build" / "CMakeCache.txt").read_text()
        assert "cuda_cxx17.cmake" in cmake_cache
        _check_tiled_kernel(case.impl, text)
    except Exception as err:
        coverage.record(case, "failed", f"{type(err).__name__}: {err}")
        raise
    coverage.record(case, "compiled", "nvcc sm_90")


#: Per tiled variant: (staged in shared memory?, accumulators per thread with the defaults).
TILED_KERNELS = {
    "implicitGemmTiledonly": (False, 1), "implicitGemmWarpTiled": (True, 16),
    "implicitGemmNCDHW": (True, 16), "implicitGemmsplitK": (True, 16),
    "directConvNCDHWnobuffer": (False, 4), "directConvNCDHWtileIC": (False, 4),
    "directConvNCDHWmerged": (True, 8),
}


def _check_tiled_kernel(name, text):
    """The GPU schedule of a tiled variant stages in shared memory, keeps one thread's
    accumulators (and only those) in a local array, and adds them up without atomics."""
    if name not in TILED_KERNELS:
        return
    staged, per_thread = TILED_KERNELS[name]
    assert ("__shared__" in text) == staged, name
    assert f"float acc[{per_thread}]" in text, name
    assert "reduce_atomic" not in text and "atomicAdd" not in text, name
