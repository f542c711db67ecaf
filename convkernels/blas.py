"""DaCe library environments for the vendor BLAS of GEMM library nodes, from pip wheels.

DaCe links a library node's expansion against the *environments* the expansion lists
(``@dace.library.environment`` classes: include folders, libraries, headers, state
fields).  DaCe's own BLAS environments look for Intel MKL through ``MKLROOT`` or the
dynamic loader's paths, and for cuBLAS inside the CUDA toolkit, which is not where
pip puts them (and CUDA 13's toolkit here ships no cuBLAS at all).  This module
defines the project's own environments, which find them where pip does, and two
``Gemm`` expansions that use them:

* :class:`ConvbenchMKL` (``Gemm`` implementation :data:`GEMM_MKL`): ``mkl.h`` and
  ``libmkl_rt`` under ``$MKLROOT`` if set, else under the Python prefix, where the
  ``mkl-include`` and ``mkl-devel`` wheels install them (``<venv>/include``,
  ``<venv>/lib``).  The wheels ship only the versioned runtime (``libmkl_rt.so.3``),
  so the newest ``libmkl_rt.so[.N]`` is linked.
* :class:`ConvbenchCuBLAS` (``Gemm`` implementation :data:`GEMM_CUBLAS`): the CUDA
  toolkit's cuBLAS where nvcc's toolkit has one, else the ``nvidia-cublas`` wheel's
  headers and ``libcublas.so.N`` (``site-packages/nvidia/<cu13 or cublas>/``).

Libraries are linked by absolute path, so CMake puts their folder on the built
library's RPATH and it loads them without ``LD_LIBRARY_PATH``.  The expansions
generate DaCe's code (``ExpandGemmMKL``, ``ExpandGemmCuBLAS``) unchanged; only what
they are compiled and linked against differs.  Nothing in DaCe is modified: importing
this module registers the environments and the two implementations.
"""

import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path
from typing import List, Optional, Tuple

import dace.library
from dace.libraries.blas.environments.cublas import cuBLAS
from dace.libraries.blas.nodes.gemm import ExpandGemmCuBLAS, ExpandGemmMKL, Gemm

#: ``Gemm.implementation`` names of the expansions below.
GEMM_MKL = "convbench_MKL"
GEMM_CUBLAS = "convbench_cuBLAS"

#: DaCe's BLAS helper headers (``dace_blas.h``, ``dace_cublas.h``).  DaCe's environments
#: name them relative to their own folder; ours live elsewhere, so the folder is an
#: include folder instead.
DACE_BLAS_INCLUDE = Path(dace.libraries.blas.__file__).resolve().parent / "include"


# -- finding the libraries ---------------------------------------------------------------------

def shared_library(folder: Path, stem: str) -> Optional[Path]:
    """``folder/stem.so`` if it exists, else the newest ``folder/stem.so.N[.M...]``, else None."""
    if (folder / f"{stem}.so").is_file():
        return folder / f"{stem}.so"
    versions = [p for p in folder.glob(f"{stem}.so.*") if p.is_file()
                and re.fullmatch(r"[0-9]+(\.[0-9]+)*", p.name[len(stem) + 4:])]
    return max(versions, key=lambda p: [int(v) for v in p.name[len(stem) + 4:].split(".")],
               default=None)


def mkl_paths() -> Tuple[Optional[Path], Optional[Path]]:
    """(folder of ``mkl.h``, ``libmkl_rt``) under ``$MKLROOT``, else under the Python prefix
    (the pip wheels); None for what is missing."""
    root = Path(os.environ.get("MKLROOT") or sys.prefix)
    include = root / "include"
    library = (shared_library(root / "lib", "libmkl_rt")
               or shared_library(root / "lib" / "intel64", "libmkl_rt"))  # oneAPI's layout
    return (include if (include / "mkl.h").is_file() else None), library


def mkl_problem() -> Optional[str]:
    """Why MKL cannot be compiled against and linked, or None when it can."""
    include, library = mkl_paths()
    if include is not None and library is not None:
        return None
    root = os.environ.get("MKLROOT")
    where = f"MKLROOT {root}" if root else f"the Python prefix {sys.prefix} (MKLROOT is unset)"
    missing = " and ".join(what for what, path in (("include/mkl.h", include),
                                                   ("lib/libmkl_rt.so", library)) if path is None)
    return (f"no {missing} under {where}.  Run `make setup` (installs the mkl-devel and "
            "mkl-include pip packages), or point MKLROOT at an MKL installation.")


def toolkit_has_cublas() -> bool:
    """Whether the CUDA toolkit of the ``nvcc`` on the PATH has cuBLAS's header."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return False
    root = Path(nvcc).resolve().parent.parent
    return any(root.glob("include/cublas_v2.h")) or any(root.glob("targets/*/include/cublas_v2.h"))


def cublas_wheel() -> Optional[Tuple[Path, Path]]:
    """(include folder, libcublas) of an installed ``nvidia-cublas`` wheel, or None.

    The wheels put them in ``nvidia/<cu13 or cublas>/{include,lib}`` of site-packages."""
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        for header in sorted(Path(base).glob("*/include/cublas_v2.h")):
            library = shared_library(header.parent.parent / "lib", "libcublas")
            if library is not None:
                return header.parent, library
    return None


def cublas_paths() -> Tuple[List[str], List[str]]:
    """(include folders, libraries) for cuBLAS: the wheel's unless the toolkit has cuBLAS
    (then CMake finds ``cublas`` next to the CUDA runtime, as with DaCe's environment)."""
    wheel = None if toolkit_has_cublas() else cublas_wheel()
    if wheel is None:
        return [], ["cublas"]
    include, library = wheel
    return [str(include)], [str(library)]


# -- environments ------------------------------------------------------------------------------
# DaCe evaluates the cmake_* fields given as functions when it configures a build, so the
# paths are looked up then (in the process that compiles), not when this module is imported.

class _Defaults:
    """The environment fields both use as DaCe's defaults; libraries are linked by
    absolute path, so CMake adds their folder to the RPATH (no link flags)."""

    cmake_minimum_version = None
    cmake_packages: List[str] = []
    cmake_variables: dict = {}
    cmake_compile_flags: List[str] = []
    cmake_link_flags: List[str] = []
    cmake_files: List[str] = []
    state_fields: List[str] = []
    init_code = finalize_code = ""
    dependencies: List[str] = []


@dace.library.environment
class ConvbenchMKL(_Defaults):
    """Intel MKL's CBLAS (``libmkl_rt``) from ``$MKLROOT`` or the pip wheels."""

    headers = ["mkl.h", "dace_blas.h"]

    @staticmethod
    def cmake_includes() -> List[str]:
        include, _ = mkl_paths()
        return ([str(include)] if include else []) + [str(DACE_BLAS_INCLUDE)]

    @staticmethod
    def cmake_libraries() -> List[str]:
        _, library = mkl_paths()
        return [str(library)] if library else []

    @staticmethod
    def is_installed() -> bool:
        return mkl_problem() is None


@dace.library.environment
class ConvbenchCuBLAS(_Defaults):
    """cuBLAS from the CUDA toolkit, or from the ``nvidia-cublas`` wheel where it has none.
    Headers, state (one cuBLAS handle per device) and call set-up are DaCe's ``cuBLAS``."""

    headers = {"frame": ["dace_cublas.h"], "cuda": ["dace_cublas.h"]}
    state_fields = list(cuBLAS.state_fields)

    @staticmethod
    def cmake_includes() -> List[str]:
        return cublas_paths()[0] + [str(DACE_BLAS_INCLUDE)]

    @staticmethod
    def cmake_libraries() -> List[str]:
        return cublas_paths()[1]

    @staticmethod
    def handle_setup_code(node) -> str:
        """The code before each cuBLAS call (binds the handle to the device and stream)."""
        return cuBLAS.handle_setup_code(node)

    @staticmethod
    def is_installed() -> bool:
        return toolkit_has_cublas() or cublas_wheel() is not None


# -- Gemm expansions ---------------------------------------------------------------------------

@dace.library.register_expansion(Gemm, GEMM_MKL)
class ExpandGemmConvbenchMKL(ExpandGemmMKL):
    """DaCe's MKL ``Gemm`` expansion (a ``cblas_?gemm`` call), linked with :class:`ConvbenchMKL`."""

    environments = [ConvbenchMKL]


@dace.library.register_expansion(Gemm, GEMM_CUBLAS)
class ExpandGemmConvbenchCuBLAS(ExpandGemmCuBLAS):
    """DaCe's cuBLAS ``Gemm`` expansion, compiled and linked with :class:`ConvbenchCuBLAS`."""

    environments = [ConvbenchCuBLAS]
