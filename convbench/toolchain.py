"""The DaCe toolchain: SDFG generation, scheduling and compilation, for CPU and CUDA.

* Every build gets a unique SDFG name and build folder per (implementation,
  layer geometry, dtype, target, parameters): DaCe's default cache is keyed by
  the SDFG name alone, so equal names would overwrite each other.
* Builds go under the project cache directory (``--cachedir``, the environment
  variable ``CONVBENCH_CACHE``, or ``<project>/.cache/builds``).
* CUDA builds work with nvcc 13 and DaCe 1.0.2 through three settings applied
  only for the duration of a GPU build (see :func:`dace_settings`):

  1. DaCe's CMakeLists forces CUDA C++14 while CUDA 13's CCCL needs C++17; a
     CMake rules override (``cuda_compat/cuda_cxx17.cmake``) maps the C++14
     option to ``-std=c++17``.
  2. DaCe's runtime headers use CUB APIs that CUB 3 removed; a compatibility
     header (``cuda_compat/cub3_compat.cuh``) is force-included with
     ``nvcc -include``.
  3. ``compiler.cuda.cuda_arch`` is 90 (H100/H200; nvcc 13 rejects DaCe's
     default 60) and the GPU backend is ``cuda`` even where no GPU is present.
* BLAS library nodes link Intel MKL (CPU) and cuBLAS (GPU) from their pip wheels
  when nothing else provides them (see :func:`vendor_blas`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

from .errors import UsageError
from .layers import Layer
from .registry import Implementation

PROJECT_ROOT = Path(__file__).resolve().parent.parent
COMPAT_DIR = Path(__file__).resolve().parent / "cuda_compat"
#: CUDA architecture of the GPU builds (sm_90: H100 and H200).
CUDA_ARCH = os.environ.get("CONVBENCH_CUDA_ARCH", "90")


@dataclasses.dataclass(frozen=True)
class DType:
    name: str
    #: Unit roundoff of the arithmetic (used by the verification tolerance).
    unit_roundoff: float

    @property
    def dace(self):
        import dace
        return getattr(dace, self.name)

    @property
    def numpy(self):
        import numpy
        return getattr(numpy, self.name)

    @property
    def torch(self):
        import torch
        return getattr(torch, self.name)


DTYPES: Dict[str, DType] = {"float32": DType("float32", 2.0 ** -24)}


def get_dtype(name: str) -> DType:
    if name not in DTYPES:
        raise UsageError(f"--dtype: unknown dtype '{name}' (known: {', '.join(DTYPES)})")
    return DTYPES[name]


def default_cachedir() -> Path:
    env = os.environ.get("CONVBENCH_CACHE")
    return Path(env) if env else PROJECT_ROOT / ".cache" / "builds"


# ---------------------------------------------------------------------------------------------
# DaCe configuration
# ---------------------------------------------------------------------------------------------

def dace_settings(target: str, build_root: Path) -> Dict[Tuple[str, ...], Any]:
    """The DaCe configuration entries a build for ``target`` runs under."""
    import dace
    cfg = dace.config.Config
    settings: Dict[Tuple[str, ...], Any] = {
        ("default_build_folder",): str(build_root),
        # Fail loudly rather than silently reuse a stale binary: we name builds uniquely.
        ("compiler", "use_cache"): False,
    }
    if target == "gpu":
        base_args = cfg.get("compiler", "cuda", "args")
        compat = f"-include {COMPAT_DIR / 'cub3_compat.cuh'}"
        settings.update({
            ("compiler", "cuda", "backend"): "cuda",
            ("compiler", "cuda", "cuda_arch"): CUDA_ARCH,
            ("compiler", "cuda", "args"): base_args if compat in base_args else f"{base_args} {compat}",
            ("compiler", "extra_cmake_args"):
                f"-DCMAKE_USER_MAKE_RULES_OVERRIDE_CUDA={COMPAT_DIR / 'cuda_cxx17.cmake'}",
            # Launch on the default stream, the one torch's tensors and events use.
            ("compiler", "cuda", "max_concurrent_streams"): -1,
        })
    return settings


@contextlib.contextmanager
def dace_config(target: str, build_root: Path) -> Iterator[None]:
    """Apply :func:`dace_settings` and :func:`vendor_blas` for the duration of the block."""
    import dace
    with contextlib.ExitStack() as stack:
        for path, value in dace_settings(target, build_root).items():
            stack.enter_context(dace.config.set_temporary(*path, value=value))
        stack.enter_context(vendor_blas(target))
        yield


# ---------------------------------------------------------------------------------------------
# Vendor BLAS for DaCe's BLAS library nodes: Intel MKL (CPU) and cuBLAS (GPU) from pip wheels
# ---------------------------------------------------------------------------------------------

@contextlib.contextmanager
def vendor_blas(target: str) -> Iterator[None]:
    """Let DaCe's BLAS environments find the vendor libraries that pip installed.

    * CPU: DaCe's ``IntelMKL`` environment (``dace/libraries/blas/environments/intel_mkl.py``)
      takes ``$MKLROOT/include/mkl.h`` and links ``$MKLROOT/lib/libmkl_rt.so``.  The
      ``mkl-include``/``mkl-devel`` wheels install into the environment prefix
      (``<venv>/include``, ``<venv>/lib``), so when ``MKLROOT`` is unset and the prefix has
      ``mkl.h``, ``MKLROOT`` is set to the prefix.  The wheels ship only the versioned
      runtime (``libmkl_rt.so.3``), which DaCe does not look for: that file is linked then.
    * GPU: DaCe's ``cuBLAS`` environment expects cuBLAS inside the CUDA toolkit.  Where
      nvcc's toolkit has none (this machine's has not), the ``nvidia-cublas`` wheel's
      headers and ``libcublas.so.N`` are used.

    Libraries are linked by absolute path, so CMake puts their folder on the built
    library's RPATH and it loads them without ``LD_LIBRARY_PATH``.  Everything is undone
    when the block ends.
    """
    with contextlib.ExitStack() as stack:
        if target == "cpu":
            from dace.libraries.blas.environments.intel_mkl import IntelMKL
            if "MKLROOT" not in os.environ and Path(sys.prefix, "include", "mkl.h").is_file():
                stack.enter_context(_environ("MKLROOT", sys.prefix))
            root = os.environ.get("MKLROOT")
            runtime = _shared_library(Path(root, "lib"), "libmkl_rt") if root else None
            if runtime is not None and runtime.name != "libmkl_rt.so":
                stack.enter_context(_override(IntelMKL, cmake_libraries=[str(runtime)]))
        elif target == "gpu":
            from dace.libraries.blas.environments.cublas import cuBLAS
            wheel = _cublas_wheel() if not _toolkit_has_cublas() else None
            if wheel is not None:
                include, library = wheel
                stack.enter_context(_override(cuBLAS, cmake_includes=[str(include)],
                                              cmake_libraries=[str(library)]))
        yield


def _shared_library(folder: Path, stem: str) -> Optional[Path]:
    """``folder/stem.so`` if it exists, else the newest ``folder/stem.so.N``, else None."""
    if (folder / f"{stem}.so").is_file():
        return folder / f"{stem}.so"
    versions = [p for p in folder.glob(f"{stem}.so.*") if p.is_file()
                and re.fullmatch(r"[0-9]+(\.[0-9]+)*", p.name[len(stem) + 4:])]
    return max(versions, key=lambda p: [int(v) for v in p.name[len(stem) + 4:].split(".")],
               default=None)


def _toolkit_has_cublas() -> bool:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return False
    root = Path(nvcc).resolve().parent.parent
    return any(root.glob("include/cublas_v2.h")) or any(root.glob("targets/*/include/cublas_v2.h"))


def _cublas_wheel() -> Optional[Tuple[Path, Path]]:
    """(include folder, libcublas) of an installed ``nvidia-cublas`` wheel, or None.

    The wheels put them in ``nvidia/<cu13 or cublas>/{include,lib}`` of site-packages."""
    import importlib.util
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        for header in sorted(Path(base).glob("*/include/cublas_v2.h")):
            library = _shared_library(header.parent.parent / "lib", "libcublas")
            if library is not None:
                return header.parent, library
    return None


@contextlib.contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    """Set an environment variable for the duration of the block."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@contextlib.contextmanager
def _override(environment, **fields) -> Iterator[None]:
    """Give fields of a DaCe library environment class fixed list values for the block
    (as a static method where DaCe has one, since DaCe calls those)."""
    saved = {name: environment.__dict__[name] for name in fields}
    try:
        for name, value in fields.items():
            fixed = list(value)
            setattr(environment, name, staticmethod(lambda fixed=fixed: list(fixed))
                    if isinstance(saved[name], staticmethod) else fixed)
        yield
    finally:
        for name, value in saved.items():
            setattr(environment, name, value)


# ---------------------------------------------------------------------------------------------
# Builds
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class BuildSpec:
    """Everything that determines one compiled SDFG."""

    impl: Implementation
    layer: Layer
    dtype: DType
    target: str
    params: Mapping[str, int]

    def key(self) -> Dict[str, Any]:
        return {"impl": self.impl.name, "layer": self.layer.key(), "dtype": self.dtype.name,
                "target": self.target, "params": dict(sorted(self.params.items()))}

    @property
    def name(self) -> str:
        """Unique, valid C identifier: readable prefix plus a hash of the full key."""
        digest = hashlib.sha1(json.dumps(self.key(), sort_keys=True).encode()).hexdigest()[:10]
        raw = f"{self.impl.name}_{self.layer.name}_{self.target}_{self.dtype.name}_b{self.layer.batch}"
        return re.sub(r"[^A-Za-z0-9_]", "_", raw) + f"_{digest}"


@dataclasses.dataclass
class Build:
    spec: BuildSpec
    folder: Path
    #: The loaded program (``CompiledSDFG``), or None when only compiled.
    program: Any
    #: Seconds spent per phase: ``sdfg`` (parse + schedule) and ``compile`` (codegen + compiler).
    times: Dict[str, float]
    #: The shared library that was built.
    library: Optional[Path] = None
    #: The scheduled SDFG that was compiled (for inspection).
    sdfg: Any = None

    def __call__(self, **arrays):
        if self.program is None:
            raise RuntimeError(f"build {self.spec.name} was compiled but not loaded")
        return self.program(**arrays)


def make_spec(impl: Implementation, layer: Layer, dtype: str = "float32", target: str = "cpu",
              params: Optional[Mapping[str, Any]] = None) -> BuildSpec:
    if target not in impl.targets:
        raise UsageError(f"{impl.name} has no schedule for target '{target}' (it has: "
                         f"{', '.join(impl.targets)})")
    return BuildSpec(impl, layer, get_dtype(dtype), target, impl.resolve_params(params))


def make_sdfg(spec: BuildSpec):
    """Parse the algorithm for the layer and apply the target's schedule."""
    import dace

    program = spec.impl.algorithm(spec.layer, spec.dtype, dict(spec.params))
    sdfg = program if isinstance(program, dace.SDFG) else program.to_sdfg(simplify=True)
    sdfg.name = spec.name
    spec.impl.schedules[spec.target](sdfg, spec.layer, dict(spec.params))
    sdfg.validate()
    return sdfg


def build(spec: BuildSpec, cachedir: Optional[os.PathLike] = None, load: bool = True) -> Build:
    """Generate, schedule and compile ``spec``; load it unless ``load`` is False.

    GPU builds compile on a machine without a GPU; loading one needs a GPU.
    """
    from dace.codegen import compiler

    root = Path(cachedir) if cachedir is not None else default_cachedir()
    root.mkdir(parents=True, exist_ok=True)
    folder = root / spec.name
    times = {}
    with dace_config(spec.target, root):
        t0 = time.perf_counter()
        sdfg = make_sdfg(spec)
        sdfg.build_folder = str(folder)
        t1 = time.perf_counter()
        times["sdfg"] = t1 - t0
        if folder.exists():  # a stale build of the same spec: build from scratch
            shutil.rmtree(folder)
        sdfg.compile(return_program_handle=False)
        library = Path(compiler.get_binary_name(str(folder), sdfg.name))
        times["compile"] = time.perf_counter() - t1
        program = compiler.get_program_handle(str(library), sdfg) if load else None
    return Build(spec=spec, folder=folder, program=program, times=times, library=library,
                 sdfg=sdfg)
