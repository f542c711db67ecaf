"""The nvcc commands that compile and link one generated CUDA file as a GPU build compiles
it (:mod:`convbench.build.gpubuild` reads what they report): the architecture's flags, the
compile with DaCe's runtime headers and the build's flags, the device link, and the include
folders of the DaCe environments the code uses."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import List, Optional, Sequence


def arch_flags(arch: str) -> List[str]:
    """nvcc's flags for machine code of ``arch``: ``-arch=sm_90``; an architecture-specific
    target by ``-gencode`` (nvcc 13's ``-arch=sm_90a`` also emits compute_90 PTX, which
    ptxas then assembles for sm_90 and refuses wgmma in)."""
    if arch.endswith("a"):
        return [f"-gencode=arch=compute_{arch},code=sm_{arch}"]
    return [f"-arch=sm_{arch}"]


def nvcc_command(cu: Path, obj: Path, dtype=None, includes: Sequence[str] = (),
                 arch: Optional[str] = None) -> List[str]:
    """nvcc for the device code of one generated file, as a GPU build compiles it: DaCe's
    CMake file turns on separable compilation (``-rdc=true``), which changes what ptxas
    allocates (64 registers instead of 40 for ``implicitGemmNCDHW``'s defaults, as
    Nsight Compute measured on the H100 and the H200), and the flags of
    :func:`convbench.build.toolchain.dace_settings` for the precision ``dtype`` (architecture,
    fast math, the CUB 3 compatibility header, the 16-bit types' header), with DaCe's
    runtime headers and ``includes`` (the include folders of the DaCe environments the
    code uses: cuBLAS's for a BLAS library node), for ``arch`` (default the toolchain's)."""
    import dace
    from convbench.build import toolchain
    arch = arch or toolchain.CUDA_ARCH
    args = toolchain.dace_settings("gpu", Path(tempfile.gettempdir()), dtype, arch)[
        ("compiler", "cuda", "args")]
    include = Path(dace.__file__).parent / "runtime" / "include"
    return (["nvcc", "-std=c++17", "-O3", *arch_flags(arch), "-rdc=true", "-c",
             "-Xptxas", "-v", "-w", f"-I{include}"] + [f"-I{i}" for i in includes]
            + args.split() + ["-o", str(obj), str(cu)])


def link_command(obj: Path, out: Path, arch: Optional[str] = None) -> List[str]:
    """The device link of a separately compiled object, which reports each kernel's final
    registers, shared memory (static shared memory is only placed here) and stack."""
    from convbench.build import toolchain
    return ["nvcc", *arch_flags(arch or toolchain.CUDA_ARCH), "-dlink", str(obj), "-o", str(out),
            "-Xnvlink", "-v"]


def include_folders(codes) -> List[str]:
    """The include folders of the DaCe environments the generated code uses (the frame
    code names them, the CUDA file includes their headers)."""
    import dace
    folders: List[str] = []
    names = set().union(*(getattr(c, "environments", ()) or () for c in codes))
    for name in sorted(names):
        try:
            env = dace.library.get_environment(name)
        except (KeyError, ValueError):
            continue
        found = getattr(env, "cmake_includes", ())
        try:  # the project's environments compute them; DaCe's own list them
            found = found() if callable(found) else found
        except Exception:  # noqa: BLE001 - a folder it cannot name is one nvcc will miss
            found = ()
        for folder in found or ():
            if folder not in folders:
                folders.append(folder)
    return folders
