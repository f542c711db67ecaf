"""The DaCe toolchain: unique build names, cache folders, CUDA builds with nvcc 13, and the
vendor BLAS environments of GEMM library nodes."""

import json
import os
import shlex
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from cases import FIRST_SMALL, GPU_IMPLS, Case, case_params
from convbench import registry
from convbench.build import cache, toolchain
from convbench.base.errors import UsageError
from convbench.layersets.layer import Layer

LAYER = Layer("tc", 1, 3, 4, 6, 5, 4, 3, 3, 3, pad=1)
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


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
    with pytest.raises(UsageError, match="--dtype: unknown precision .float7."):
        toolchain.make_spec(impl, LAYER, dtype="float7")


def test_cpu_build_goes_to_cachedir(tmp_path):
    spec = toolchain.make_spec(registry.get("directConvNCDHW"), LAYER)
    build = cache.build(spec, tmp_path)
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


def test_gpu_backend_is_fixed_not_detected(tmp_path, monkeypatch):
    """Where DaCe's auto-detection finds no GPU (no nvidia-smi, no CUDA for CMake, no
    CUDA_HOME, no libcudart) it fails; GPU builds still get the CUDA backend."""
    import ctypes.util

    from dace.codegen import common
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: types.SimpleNamespace(wait=lambda: 1))
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    for name in ("CUDA_HOME", "HIP_PLATFORM"):
        monkeypatch.delenv(name, raising=False)
    import dace
    # DaCe caches the answer: an earlier GPU build in this process must not decide it.
    common.get_gpu_backend.cache_clear()
    try:
        with dace.config.set_temporary("compiler", "cuda", "backend", value="auto"):
            with pytest.raises(RuntimeError, match="Cannot autodetect"):
                common.get_gpu_backend()
            with toolchain.dace_config("gpu", tmp_path):
                assert common.get_gpu_backend() == "cuda"
    finally:
        common.get_gpu_backend.cache_clear()


@needs_nvcc
@pytest.mark.full  # why each setting is there; the fast tier's nvcc build needs them all
def test_nvcc13_needs_each_compat_setting(tmp_path):
    """What each nvcc 13 setting of :func:`toolchain.dace_settings` fixes, shown on DaCe's
    runtime header (what every generated .cu includes first), compiled the way GPU builds
    compile it: with all settings it compiles; without the CUB 3 compatibility header, or
    with C++14 instead of what the CMake override selects, nvcc 13 rejects it; and nvcc 13
    has no compute_60, DaCe's default architecture."""
    import dace
    default_arch = dace.config.Config.get_default("compiler", "cuda", "cuda_arch")
    archs = subprocess.run(["nvcc", "--list-gpu-arch"], capture_output=True, text=True,
                           check=True).stdout.split()
    assert f"compute_{toolchain.CUDA_ARCH}" in archs
    assert all(f"compute_{a}" not in archs for a in default_arch.split(",")), archs

    # The C++ standard flag CMake uses for CUDA_STANDARD 14 once the override is loaded.
    script = tmp_path / "show.cmake"
    script.write_text(f'include("{toolchain.COMPAT_DIR / "cuda_cxx17.cmake"}")\n'
                      'message("${CMAKE_CUDA14_STANDARD_COMPILE_OPTION}")\n')
    shown = subprocess.run(["cmake", "-P", str(script)], capture_output=True, text=True, check=True)
    std = shown.stderr.strip()
    assert std == "-std=c++17"

    args = shlex.split(toolchain.dace_settings("gpu", tmp_path)[("compiler", "cuda", "args")])
    compat = args.index("-include")
    assert Path(args[compat + 1]) == toolchain.COMPAT_DIR / "cub3_compat.cuh"
    source = tmp_path / "runtime.cu"
    source.write_text("#include <dace/dace.h>\n")
    runtime = Path(dace.__file__).parent / "runtime" / "include"

    def nvcc(args, std):  # front end only (--cuda): seconds, not a full compile
        run = subprocess.run(["nvcc", f"-arch=sm_{toolchain.CUDA_ARCH}", std, *args,
                              f"-I{runtime}", "--cuda", str(source), "-o",
                              str(tmp_path / "runtime.ii")], capture_output=True, text=True)
        return run.returncode, run.stdout + run.stderr

    rc, out = nvcc(args, std)
    assert rc == 0, out
    rc, out = nvcc(args[:compat] + args[compat + 2:], std)
    assert rc != 0 and '"CTA_SYNC" is undefined' in out, out
    rc, out = nvcc(args, "-std=c++14")
    assert rc != 0 and "C++17" in out.replace("C++ 17", "C++17"), out


# -- vendor BLAS: the project's DaCe environments ------------------------------------------

# (ids name the library: an id "gpu" would mark the test as needing a GPU, see conftest.py)
@pytest.mark.parametrize("target, environment, implementation, call, header", [
    ("cpu", "ConvbenchMKL", "GEMM_MKL", "cblas_sgemm", "mkl.h"),
    ("gpu", "ConvbenchCuBLAS", "GEMM_CUBLAS", "cublasSgemm", "dace_cublas.h"),
], ids=["mkl", "cublas"])
def test_gemm_uses_the_project_blas_environment(tmp_path, target, environment, implementation,
                                                call, header):
    """im2colGemm's GEMM expands to the vendor BLAS call, compiled against the project's
    environment: its header in the generated code, its include folders and libraries in
    the CMake flags (generated, not compiled)."""
    import dace
    from dace.codegen import compiler

    from convkernels import blas as environments
    env = getattr(environments, environment)
    spec = toolchain.make_spec(registry.get("im2colGemm"), LAYER, target=target)
    with toolchain.dace_config(target, tmp_path):
        sdfg = toolchain.make_sdfg(spec)
        gemms = [n for n, _ in sdfg.all_nodes_recursive() if isinstance(n, dace.nodes.LibraryNode)]
        assert gemms and {n.implementation for n in gemms} == {getattr(environments, implementation)}
        code = sdfg.generate_code()
    used = set().union(*(c.environments for c in code))
    assert used == {f"convkernels.blas.{environment}"}
    text = "\n".join(c.clean_code for c in code)
    assert call in text and f'#include "{header}"' in text
    flags, _ = compiler.get_environment_flags(dace.library.get_environments_and_dependencies(used))
    cmake = dict(f.split("=", 1) for f in flags)
    assert cmake["-DDACE_ENV_INCLUDES"].strip('"').split() == sorted(env.cmake_includes())
    assert cmake["-DDACE_ENV_LIBRARIES"].strip('"').split() == sorted(env.cmake_libraries())
    if target == "gpu":
        assert "cublas_handle" in text  # the environment's state field: one handle per device


def _fake_mkl(root, versions):
    (root / "include").mkdir(parents=True)
    (root / "include" / "mkl.h").write_text("")
    (root / "lib").mkdir()
    for version in versions:
        (root / "lib" / f"libmkl_rt.so{version}").write_text("")
    return root


def test_mkl_environment_follows_mklroot_then_the_prefix(tmp_path, monkeypatch):
    from convkernels import blas as environments
    from convkernels.blas import ConvbenchMKL
    monkeypatch.delenv("MKLROOT", raising=False)
    if environments.mkl_problem() is None:  # the pip wheels: the newest versioned runtime
        assert ConvbenchMKL.cmake_includes()[0] == os.path.join(sys.prefix, "include")
        [library] = ConvbenchMKL.cmake_libraries()
        assert Path(library).parent == Path(sys.prefix, "lib") and "libmkl_rt.so" in library
    before = toolchain.toolchain_flags("cpu")
    root = _fake_mkl(tmp_path / "mkl", [".2", ".10", ".9.1", ".x"])
    monkeypatch.setenv("MKLROOT", str(root))
    assert ConvbenchMKL.cmake_includes() == [str(root / "include"),
                                             str(environments.DACE_BLAS_INCLUDE)]
    assert ConvbenchMKL.cmake_libraries() == [str(root / "lib" / "libmkl_rt.so.10")]
    (root / "lib" / "libmkl_rt.so").write_text("")  # the unversioned name wins
    assert ConvbenchMKL.cmake_libraries() == [str(root / "lib" / "libmkl_rt.so")]
    after = toolchain.toolchain_flags("cpu")
    assert after["blas"]["libraries"] == [str(root / "lib" / "libmkl_rt.so")]
    assert after != before  # another MKL, another cache key
    monkeypatch.setenv("MKLROOT", str(tmp_path / "nowhere"))
    assert ConvbenchMKL.cmake_libraries() == [] and "include/mkl.h" in environments.mkl_problem()
    with pytest.raises(RuntimeError, match="im2colGemm needs Intel MKL"):
        toolchain.make_sdfg(toolchain.make_spec(registry.get("im2colGemm"), LAYER))


def test_cublas_environment_takes_the_wheel_without_toolkit_cublas(monkeypatch):
    from convkernels import blas as environments
    from convkernels.blas import ConvbenchCuBLAS
    wheel = environments.cublas_wheel()
    if wheel is not None and not environments.toolkit_has_cublas():
        assert ConvbenchCuBLAS.cmake_includes()[0] == str(wheel[0])
        assert ConvbenchCuBLAS.cmake_libraries() == [str(wheel[1])]
        assert wheel[1].name.startswith("libcublas.so") and (wheel[0] / "cublas_v2.h").is_file()
    monkeypatch.setattr(environments, "toolkit_has_cublas", lambda: True)
    assert ConvbenchCuBLAS.cmake_libraries() == ["cublas"]
    assert ConvbenchCuBLAS.cmake_includes() == [str(environments.DACE_BLAS_INCLUDE)]


@pytest.mark.parametrize("target", ["cpu", "gpu"], ids=["mkl", "cublas"])
def test_cache_key_records_the_blas_portably(target):
    from convkernels import blas as environments
    env = environments.ConvbenchMKL if target == "cpu" else environments.ConvbenchCuBLAS
    blas = toolchain.toolchain_flags(target)["blas"]
    assert blas["environment"] == f"convkernels.blas.{env.__name__}"
    assert len(blas["libraries"]) == len(env.cmake_libraries()) >= 1
    text = json.dumps(blas)
    assert str(toolchain.PROJECT_ROOT) not in text and sys.prefix not in text
    local = json.dumps(toolchain.toolchain_versions(target)["blas"])
    assert all(lib in local for lib in env.cmake_libraries())


def _dynamic_section(library):
    if shutil.which("readelf") is None:
        pytest.skip("readelf is not installed")
    return subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True,
                          check=True).stdout


def _check_linked(build, environment):
    """``build`` was compiled with ``environment`` and its library finds the environment's
    (absolutely linked) libraries through its RPATH."""
    assert (build.folder / "dace_environments.csv").read_text().split() == [
        environment.full_class_path()]
    dynamic = _dynamic_section(build.library)
    for library in map(Path, environment.cmake_libraries()):
        if library.is_absolute():
            assert f"[{library.name}]" in dynamic, dynamic
            rpaths = [line for line in dynamic.splitlines() if "RPATH" in line or "RUNPATH" in line]
            assert any(str(library.parent) in line for line in rpaths), dynamic


MKL_CASE = Case("im2colGemm", FIRST_SMALL, "small")  # a build of the fast tier's


@pytest.mark.prebuild(MKL_CASE)
def test_cpu_gemm_links_mkl_from_its_environment(builds):
    from convkernels.blas import ConvbenchMKL, mkl_problem
    if mkl_problem():
        pytest.skip(mkl_problem())
    build = builds(MKL_CASE.spec(), load=False)
    _check_linked(build, ConvbenchMKL)
    assert "libmkl_rt.so" in _dynamic_section(build.library)


#: GPU builds compiled with nvcc (no GPU needed).  Fast tier: the default implementation
#: (tiled, shared memory; each nvcc build takes about 18 s on a 2-core CI machine, CMake's
#: CUDA configure 7 of them) in float16, through halfprec.h (bfloat16 takes the same 16-bit
#: path; the float32 CUDA code of the pipelined kernels is compiled by the fast tier's SASS
#: gates, tests/test_pipelined.py); full tier: all, float32 among them, im2colGemm's cuBLAS
#: and the tensor-core kernel's inline PTX.
NVCC_FAST = ("implicitGemmNCDHW",)
#: The tensor-core kernels copy channels at least 4 bytes at a time: an even count.
EVEN_LAYER = Layer("tc2", 1, 4, 6, 6, 5, 4, 3, 3, 3, pad=1)


def _nvcc_layer(name):
    return EVEN_LAYER if name.startswith("implicitGemmMMA") else LAYER


NVCC = [Case(name, _nvcc_layer(name), "nvcc", target="gpu") for name in GPU_IMPLS]
#: The tensor-core kernels in their other precisions (the first is in NVCC).
NVCC += [Case(name, _nvcc_layer(name), "nvcc", target="gpu", dtype=dtype) for name in GPU_IMPLS
         for dtype in registry.get(name).precisions[1:]]
#: The MMA instruction of each tensor-core precision.
MMA_PTX = {"float16": "m16n8k16.row.col.f32.f16.f16.f32",
           "bfloat16": "m16n8k16.row.col.f32.bf16.bf16.f32",
           "float32-tf32": "m16n8k8.row.col.f32.tf32.tf32.f32"}


@needs_nvcc
@pytest.mark.parametrize("case", case_params([c for c in NVCC if c.impl in NVCC_FAST
                                              and c.precision == "float16"], NVCC))
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
        # Each nvcc 13 setting reached CMake (see test_nvcc13_needs_each_compat_setting).
        cmake_cache = (build.folder / "build" / "CMakeCache.txt").read_text()
        assert "cuda_cxx17.cmake" in cmake_cache
        assert f"DACE_CUDA_ARCHITECTURES_DEFAULT:STRING={toolchain.CUDA_ARCH}\n" in cmake_cache
        cuda_flags = next(line for line in cmake_cache.splitlines()
                          if line.startswith("CMAKE_CUDA_FLAGS:"))
        assert f"-include {toolchain.COMPAT_DIR / 'cub3_compat.cuh'}" in cuda_flags
        if case.impl == "im2colGemm":
            from convkernels.blas import ConvbenchCuBLAS
            _check_linked(build, ConvbenchCuBLAS)
            assert "libcublas.so" in _dynamic_section(build.library)
        _check_tiled_kernel(case.impl, text)
        if case.impl.startswith("implicitGemmMMA"):  # fragments through ldmatrix
            assert f"mma.sync.aligned.{MMA_PTX[case.precision]}" in text
            assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in text
            assert "cp.async.cg.shared.global" in text
            assert "cvt.rna.tf32.f32" not in text  # the tensor cores read float32 registers
    except Exception as err:
        coverage.record(case, "failed", f"{type(err).__name__}: {err}")
        raise
    coverage.record(case, "compiled", "nvcc sm_90")


#: Per tiled variant: (staged in shared memory?, accumulators per thread with the defaults).
TILED_KERNELS = {
    "implicitGemmTiledonly": (False, 1), "implicitGemmWarpTiled": (True, 16),
    "implicitGemmNCDHW": (True, 16), "implicitGemmsplitK": (True, 16),
    "directConvNCDHWnobuffer": (False, 4), "directConvNCDHWtileIC": (False, 4),
    "directConvNCDHWmerged": (True, 8), "implicitGemmMMA": (True, 128),
    "implicitGemmMMABwdData": (True, 128),
    "winogradF2Tiled": (True, 64), "winogradF2TiledBwdData": (True, 64),
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
    assert "GridBarrier" not in text, name  # a kernel inside a kernel (kernel_faults)


@pytest.mark.parametrize("name", GPU_IMPLS)
def test_gpu_schedules_have_no_kernel_faults(name, tmp_path):
    """No GPU schedule nests a device-level map in a kernel (DaCe would launch it behind
    a grid-wide barrier that deadlocks on a large grid: winogradF2Tiled hung an H200 so)
    or leaves a kernel's own buffer in global memory, shared by every block.  Code
    generation without nvcc, so the fast tier sees every GPU program."""
    from convkernels.gpu.tiling import kernel_faults
    impl = registry.get(name)
    spec = toolchain.make_spec(impl, LAYER, target="gpu", dtype=impl.precisions[0])
    with toolchain.dace_config("gpu", tmp_path):
        sdfg = toolchain.make_sdfg(spec)
    assert kernel_faults(sdfg) == []


def test_kernel_faults_are_found(tmp_path):
    """The two faults planted in a sound schedule, each named; and a staging buffer the
    schedule cannot find by name (simplify renames temporaries) is an error, not a
    buffer silently left in global memory."""
    import dace
    from convkernels.gpu import tiling
    spec = toolchain.make_spec(registry.get("winogradF2Tiled"), LAYER, target="gpu")
    with toolchain.dace_config("gpu", tmp_path):
        sdfg = toolchain.make_sdfg(spec)
    for node, _ in sdfg.all_nodes_recursive():
        if isinstance(node, dace.nodes.MapEntry) and node.map.params == ["c0"]:
            node.map.schedule = dace.ScheduleType.GPU_Device
    sdfg.arrays["Vs"].storage = dace.StorageType.GPU_Global
    faults = tiling.kernel_faults(sdfg)
    assert len(faults) == 2, faults
    assert "map c0 is a GPU_Device map inside kernel blk_" in faults[0]
    assert "transient Vs is in global memory" in faults[1]
    with pytest.raises(ValueError, match="GPU schedule of .*: map c0"):
        tiling.check_kernels(sdfg)
    with pytest.raises(ValueError, match="no staging buffer Ws"):
        tiling.tiled_schedule("gpu", shared=("Ws",))(sdfg, LAYER, {})


@pytest.mark.parametrize("target, added", [
    # AVX-512 with gcc preferring 256-bit vectors (Intel): the CPU builds ask for 512
    ({"-march=": "rocketlake", "-mtune=": "rocketlake", "-mavx512f": "[enabled]",
      "-mprefer-vector-width=": "256"}, {"-mprefer-vector-width=512"}),
    # AVX-512 already preferred (Zen 5, 32 registers): left alone
    ({"-march=": "znver5", "-mtune=": "znver5", "-mavx512f": "[enabled]",
      "-mprefer-vector-width=": "512"}, set()),
    # Zen 3 with AVX2 only: gcc's Zen tuning folds the filter loads into the FMAs
    ({"-march=": "znver3", "-mtune=": "znver3", "-mavx512f": "[disabled]",
      "-mprefer-vector-width=": "256"}, {"-mtune=generic"}),
    # AVX2 elsewhere, or unknown: left alone
    ({"-march=": "haswell", "-mtune=": "haswell", "-mavx512f": "[disabled]"}, set()),
    ({}, set()),
])
def test_cpu_build_arguments_follow_the_host(monkeypatch, tmp_path, target, added):
    """The register-blocked kernels keep their micro-tiles in vector registers.  Where gcc's
    -march=native tuning would split 16-lane vectors into 256-bit halves, CPU builds add
    -mprefer-vector-width=512; on a Zen core with 16 registers, whose tuning reloads the
    filter vectors for every FMA, -mtune=generic.  The cache key, which records the
    arguments, follows; GPU builds' host code stays portable."""
    import dace
    monkeypatch.setattr(toolchain, "_native_target", lambda: target)
    adjustments = {toolchain.WIDE_VECTORS, toolchain.GENERIC_TUNE}
    with toolchain.dace_config("cpu", tmp_path):
        args = dace.config.Config.get("compiler", "cpu", "args")
    assert adjustments & set(args.split()) == added, args
    key_args = toolchain.toolchain_flags("cpu")["config"]["compiler.cpu.args"]
    assert adjustments & set(key_args.split()) == added, key_args
    with toolchain.dace_config("gpu", tmp_path):
        assert not adjustments & set(dace.config.Config.get("compiler", "cpu", "args").split())
