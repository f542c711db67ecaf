"""The DaCe toolchain: SDFG generation, scheduling and compilation, for CPU and CUDA.

docs/build-cache.md describes the build names and folders
, the vendor BLAS ("Three commands") and the settings that make DaCe 1.0.2
build CUDA with nvcc 13 ("The toolchain, and CUDA 13").  Those settings apply only for
the duration of a GPU build; :func:`dace_settings` explains each where it sets it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

from convbench.build import chatter, launch, loader, precision, replay
from convkernels.cpu import isa
from convbench.base.errors import UsageError
from convbench.layersets.layer import Layer
from convbench.registry import Implementation

PROJECT_ROOT = Path(__file__).resolve().parents[2]
COMPAT_DIR = Path(__file__).resolve().parent / "cuda_compat"
#: CUDA architecture of the GPU builds (sm_90: H100 and H200).
CUDA_ARCH = os.environ.get("CONVBENCH_CUDA_ARCH", "90")


# The precisions live in convbench.build.precision; these names stay importable from here.
DType, DTYPES, get_dtype = precision.DType, precision.DTYPES, precision.get_dtype


def default_cachedir() -> Path:
    env = os.environ.get("CONVBENCH_CACHE")
    return Path(env) if env else PROJECT_ROOT / ".cache" / "builds"


# -- DaCe configuration --------------------------------------------------------------------

#: ``-march`` of the host code of GPU builds.  GPU builds must load on other x86-64 hosts
#: with the same GPU architecture (see :mod:`convbench.build.cache`), so their host code avoids
#: ``-march=native``; x86-64-v2 (SSE4.2, POPCNT) runs on every x86-64 server of the last
#: decade.  CPU builds keep DaCe's ``-march=native``: the cache key records what it means.
PORTABLE_MARCH = "-march=x86-64-v2"


def arch_of(impl: Implementation) -> str:
    """The CUDA architecture of ``impl``'s GPU builds: its own (``"90a"`` for ``wgmma``) or
    :data:`CUDA_ARCH`."""
    return impl.cuda_arch or CUDA_ARCH


def dace_settings(target: str, build_root: Path, dtype: Optional[DType] = None,
                  arch: Optional[str] = None) -> Dict[Tuple[str, ...], Any]:
    """The DaCe configuration entries a build for ``target`` (in precision ``dtype``, for
    the CUDA architecture ``arch``, default :data:`CUDA_ARCH`) runs under."""
    import dace
    arch = arch or CUDA_ARCH
    cfg = dace.config.Config
    settings: Dict[Tuple[str, ...], Any] = {
        ("default_build_folder",): str(build_root),
        # Fail loudly rather than silently reuse a stale binary: we name builds uniquely.
        ("compiler", "use_cache"): False,
        # The parser's progress bars only with -v (convbench.build.chatter)
        ("progress",): chatter.progress_setting(),
    }
    if target == "cpu":
        settings[("compiler", "cpu", "args")] = _tuning_args(
            _vector_width_args(_isa_cap_args(cfg.get("compiler", "cpu", "args"))))
    if target == "gpu":
        cuda_args = cfg.get("compiler", "cuda", "args").replace("-march=native", PORTABLE_MARCH)
        # nvcc 13 fix (CUB 3): DaCe 1.0.2's runtime headers (dace/cuda/multidim_gbar.cuh,
        # dace/reduction.h) call cub::CTA_SYNC and cub::CountingInputIterator /
        # TransformInputIterator, which CUB 3 (CCCL 3, CUDA 13) removed, so every generated
        # .cu fails to compile.  cub3_compat.cuh defines them again (a no-op with older CUB)
        # and `nvcc -include` puts it before DaCe's headers without patching DaCe.
        compat = f"-include {COMPAT_DIR / 'cub3_compat.cuh'}"
        settings.update({
            # Not an nvcc fix: GPU builds' host code must run on other x86-64 hosts.
            ("compiler", "cpu", "args"):
                cfg.get("compiler", "cpu", "args").replace("-march=native", PORTABLE_MARCH),
            # Fix for compiling without a GPU: DaCe's default backend "auto" guesses CUDA or
            # HIP on every build (nvidia-smi, CMake's FindCUDA, CUDA_HOME, libcudart) and
            # fails where every guess does; GPU builds are compiled on hosts without a GPU
            # (and always for NVIDIA), so the backend is fixed instead of detected.
            ("compiler", "cuda", "backend"): "cuda",
            # nvcc 13 fix: DaCe's default cuda_arch is 60, and nvcc 13 no longer supports
            # compute_60 (its oldest is compute_75): "Unsupported gpu architecture".
            ("compiler", "cuda", "cuda_arch"): arch,
            ("compiler", "cuda", "args"):
                cuda_args if compat in cuda_args else f"{cuda_args} {compat}",
            # nvcc 13 fix (C++17): DaCe's CMakeLists sets CMAKE_CUDA_STANDARD 14, but CUDA 13's
            # CCCL headers (thrust, libcu++) stop with "#error ... requires at least C++17".
            # This CMake rules file maps CMake's C++14 option for CUDA to -std=c++17.
            ("compiler", "extra_cmake_args"):
                f"-DCMAKE_USER_MAKE_RULES_OVERRIDE_CUDA={COMPAT_DIR / 'cuda_cxx17.cmake'}",
            # Not an nvcc fix: launch on the default stream, the one torch's tensors and
            # events use (see convbench.timing).
            ("compiler", "cuda", "max_concurrent_streams"): -1,
        })
        if arch.endswith("a"):
            # An architecture-specific target (sm_90a: wgmma): DaCe's CMake takes cuda_arch
            # only where it detects no GPU, and would compile for the detected sm_90 on a
            # GPU host, where ptxas rejects wgmma; naming the architecture skips detection.
            key = ("compiler", "extra_cmake_args")
            settings[key] = f"{settings[key]} -DLOCAL_CUDA_ARCHITECTURES={arch}"
    if dtype is not None and dtype.half:
        # The 16-bit storage types must be declared before the first line DaCe generates
        # (the state struct that holds persistent arrays precedes its global code), so
        # the compilers include them first.
        include = f"-include {precision.HEADER}"
        for lang in ("cpu", "cuda") if target == "gpu" else ("cpu",):
            key = ("compiler", lang, "args")
            settings[key] = f"{settings.get(key, cfg.get(*key))} {include}"
    return settings


#: DaCe configuration entries that change what a build produces (for cache keys and
#: result metadata), besides those :func:`dace_settings` sets.
_RELEVANT_CONFIG = {
    "cpu": [("compiler", "cpu", "executable"), ("compiler", "cpu", "args"),
            ("compiler", "cpu", "libs"), ("compiler", "cpu", "openmp_sections"),
            ("compiler", "build_type"), ("compiler", "linker", "args"),
            ("compiler", "extra_cmake_args")],
    "gpu": [("compiler", "cuda", "args"), ("compiler", "cuda", "cuda_arch"),
            ("compiler", "cuda", "backend"), ("compiler", "cuda", "max_concurrent_streams"),
            ("compiler", "cuda", "default_block_size"), ("compiler", "cuda", "libs")],
}


def toolchain_flags(target: str, arch: Optional[str] = None) -> Dict[str, Any]:
    """The toolchain settings that decide a ``target`` build (part of cache keys).

    Folders are written as ``<project>`` and ``<prefix>``, so the same checkout elsewhere
    gets the same flags.  Compiler versions, which legitimately differ between the host
    that builds and the host that loads, are in :func:`toolchain_versions` instead.
    """
    import dace
    keys = _RELEVANT_CONFIG["cpu"] + (_RELEVANT_CONFIG["gpu"] if target == "gpu" else [])
    with dace_config(target, Path("<unused>"), arch=arch):
        config = {".".join(k): dace.config.Config.get(*k) for k in keys}
    flags: Dict[str, Any] = {"dace": dace.__version__, "config": config}
    if "-march=native" in config["compiler.cpu.args"]:
        flags["native_march"] = _native_march()
    if target == "gpu":
        flags["cuda_compat"] = {p.name: _sha16(p) for p in sorted(COMPAT_DIR.iterdir())
                                if p.is_file()}
    flags["blas"] = _blas_flags(target)
    return json.loads(_portable(json.dumps(flags, sort_keys=True)))


def toolchain_versions(target: str) -> Dict[str, Any]:
    """The compilers a ``target`` build uses here (recorded, not keyed) and its vendor BLAS
    (keyed, in :func:`toolchain_flags`, with placeholders; here with the local paths)."""
    info: Dict[str, Any] = {"cxx": _tool_version(("c++", "--version")),
                            "blas": _blas_flags(target)}
    if target == "gpu":
        info["nvcc"] = _tool_version(("nvcc", "--version"), last=True)
    return info


def _blas_flags(target: str) -> Dict[str, Any]:
    """The project's BLAS environment for ``target`` builds (:mod:`convkernels.blas`):
    its name, the include folders and libraries it resolves to here, and its source."""
    from convkernels import blas
    env = blas.ConvbenchMKL if target == "cpu" else blas.ConvbenchCuBLAS
    return {"environment": env.full_class_path(), "includes": env.cmake_includes(),
            "libraries": env.cmake_libraries(), "source": _sha16(Path(blas.__file__))}


def _sha16(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _portable(text: str) -> str:
    """``text`` with the project folder and the Python prefix replaced by placeholders."""
    for path, name in ((str(PROJECT_ROOT), "<project>"), (sys.prefix, "<prefix>")):
        text = text.replace(path, name)
    return text


@functools.lru_cache(maxsize=None)
def _tool_version(command: Tuple[str, ...], last: bool = False) -> str:
    """First (or last) non-empty line of ``command``'s output, or why it did not run."""
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as err:
        return f"unavailable ({type(err).__name__})"
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    return (lines[-1] if last else lines[0]) if lines else "unknown"


@functools.lru_cache(maxsize=None)
def _native_target() -> Dict[str, str]:
    """What gcc's ``-march=native`` means on this host: its options and their values
    (``{"-march=": "znver3", "-mavx512f": "[enabled]", "-mprefer-vector-width=": "256"}``)."""
    try:
        out = subprocess.run(("c++", "-march=native", "-Q", "--help=target"), capture_output=True,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return dict(parts for parts in (line.split() for line in out.splitlines()) if len(parts) == 2)


def _native_march() -> str:
    """What gcc's ``-march=native`` means on this host (e.g. ``znver3``)."""
    return _native_target().get("-march=", "unknown")


def _host_avx512() -> bool:
    """Whether the kernels are built for AVX-512 here: the compiler's native target has
    it and :func:`convkernels.cpu.isa.isa_cap` leaves it."""
    return (_native_target().get("-mavx512f") == "[enabled]"
            and isa.widest_isa() == "avx512f")


#: What gcc leaves out of ``-march=native`` to stay below each x86 ISA of
#: :data:`convkernels.cpu.isa.ISAS` (``-mno-avx512f`` takes every AVX-512 subset with it).
_ABOVE = {"avx512f": "-mno-avx512f", "avx2": "-mno-avx2 -mno-fma", "avx": "-mno-avx"}


def _isa_cap_args(args: str) -> str:
    """``args`` with the ``-mno-...`` options that keep a native build within the ISA that
    ``$CONVBENCH_ISA`` caps an x86 host at (``avx2``: no AVX-512; ``avx``: no AVX2 or FMA
    either; ``sse4_2``: no AVX)."""
    cap = isa.isa_cap()
    if "-march=native" not in args or cap not in isa.ISAS or cap in ("asimd", "neon"):
        return args
    target = _native_target()
    above = [opts for name, opts in _ABOVE.items()
             if isa.ISAS.index(name) < isa.ISAS.index(cap)
             and target.get(f"-m{name}") == "[enabled]" and opts not in args]
    return " ".join([args, *above])


#: Added to CPU builds where ``-march=native`` enables AVX-512 but prefers narrower vectors.
WIDE_VECTORS = "-mprefer-vector-width=512"


def _vector_width_args(args: str) -> str:
    """``args`` with :data:`WIDE_VECTORS` added where the host has AVX-512 and gcc's tuning
    for it prefers 256-bit vectors (Intel cores since Skylake-X, which gcc tunes against
    the frequency drop of 512-bit code).  The register-blocked kernels keep micro-tiles of
    16-lane vectors in registers: split into 256-bit halves they spill and run several
    times slower (results/cpu/xeon_f6m167_avx512/).  Hosts without AVX-512 are left
    alone: their tuned entries pick 8-lane vectors."""
    target = _native_target()
    if ("-march=native" not in args or "-mprefer-vector-width" in args
            or not _host_avx512()
            or target.get("-mprefer-vector-width=") in (None, "512")):
        return args
    return f"{args} {WIDE_VECTORS}"


#: Added to CPU builds where ``-march=native`` tunes for an AMD Zen core without AVX-512.
GENERIC_TUNE = "-mtune=generic"


def _tuning_args(args: str) -> str:
    """``args`` with :data:`GENERIC_TUNE` added where gcc's ``-march=native`` tunes for a
    Zen core (``-mtune=znver*``) and there is no AVX-512, so 16 vector registers.  gcc's Zen
    cost model takes a load folded into an FMA as free: it keeps the micro-tile's filter
    vectors in memory and reloads them for every FMA, 12 loads per 8 FMAs in a 4 x 2 tile,
    which fill the load ports before the FMA units.  Generic tuning loads each filter vector
    once into a register.  On the AVX2 EPYC (family 25 model 1, znver3, gcc 12.2), a
    register-blocked inner loop on L1-resident data ran at 52-60 GFLOP/s on one core with
    znver3 tuning and at 99 with generic tuning (the core's FMA peak is about 100); znver1
    and znver2 tuning fold too.  The ISA is unchanged (``-march=native`` stays)."""
    target = _native_target()
    if ("-march=native" not in args or "-mtune" in args
            or not target.get("-mtune=", "").startswith("znver")
            or _host_avx512()):
        return args
    return f"{args} {GENERIC_TUNE}"


@contextlib.contextmanager
def dace_config(target: str, build_root: Path, dtype: Optional[DType] = None,
                arch: Optional[str] = None) -> Iterator[None]:
    """Apply :func:`dace_settings` for the duration of the block."""
    import dace
    with contextlib.ExitStack() as stack:
        for path, value in dace_settings(target, build_root, dtype, arch).items():
            stack.enter_context(dace.config.set_temporary(*path, value=value))
        yield


# -- Builds --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class BuildSpec:
    """Everything that determines one compiled SDFG."""

    impl: Implementation
    layer: Layer
    dtype: DType
    target: str
    params: Mapping[str, int]
    #: Names a deliberately altered build (a test that plants a bug by patching a helper
    #: the source hash cannot see).  It is part of the key and of the name, so a planted
    #: build and the real one never share a cache entry.  Empty for real builds.
    planted: str = ""

    @property
    def arch(self) -> str:
        """The CUDA architecture of a GPU build (:func:`arch_of`)."""
        return arch_of(self.impl)

    def key(self) -> Dict[str, Any]:
        key = {"impl": self.impl.name, "layer": self.layer.key(), "dtype": self.dtype.name,
               "target": self.target, "params": dict(sorted(self.params.items())),
               **self.dtype.key()}
        if self.planted:
            key["planted"] = self.planted
        return key

    @property
    def name(self) -> str:
        """Unique, valid C identifier: readable prefix plus a hash of the full key."""
        digest = hashlib.sha1(json.dumps(self.key(), sort_keys=True).encode()).hexdigest()[:10]
        raw = (f"{self.impl.name}_{self.layer.name}_{self.target}_{self.dtype.label}"
               f"_b{self.layer.batch}")
        if self.planted:
            raw += f"_planted_{self.planted}"
        return re.sub(r"[^A-Za-z0-9_]", "_", raw) + f"_{digest}"


@dataclasses.dataclass
class Build:
    spec: BuildSpec
    folder: Path
    #: The loaded program (``CompiledSDFG``), or None when only compiled.
    program: Any
    #: Seconds per phase: ``sdfg`` (parse + schedule) and ``compile`` (codegen + compiler)
    #: for a fresh build, ``load`` for one loaded from the cache.
    times: Dict[str, float]
    #: The shared library that was built.
    library: Optional[Path] = None
    #: The scheduled SDFG that was compiled, or loaded from the cache (for inspection).
    sdfg: Any = None
    #: ``built`` (compiled in this process) or ``loaded`` (precompiled, from the cache).
    origin: str = "built"

    @property
    def seconds(self) -> float:
        """Time it took to get this build: compiling, or loading from the cache."""
        return sum(self.times.values())

    def __call__(self, **arrays):
        if self.program is None:
            raise RuntimeError(f"build {self.spec.name} was compiled but not loaded")
        return self.program(**arrays)


def make_spec(impl: Implementation, layer: Layer, dtype="float32", target: str = "cpu",
              params: Optional[Mapping[str, Any]] = None, planted: str = "") -> BuildSpec:
    """The spec of one build (``dtype``: a name or a :class:`~convbench.build.precision.DType`);
    ``planted`` tags a deliberately broken one (tests)."""
    if target not in impl.targets:
        raise UsageError(f"{impl.name} has no schedule for target '{target}' (it has: "
                         f"{', '.join(impl.targets)})")
    dtype = get_dtype(dtype)
    reason = impl.unsupported_dtype(dtype, target)
    if reason:
        raise UsageError(f"{impl.name}: {reason}")
    return BuildSpec(impl, layer, dtype, target, impl.resolve_params(params), planted)


def make_sdfg(spec: BuildSpec):
    """Parse the algorithm for the layer and apply the target's schedule."""
    import dace

    program = spec.impl.algorithm(spec.layer, spec.dtype, dict(spec.params))
    sdfg = program if isinstance(program, dace.SDFG) else program.to_sdfg(simplify=True)
    sdfg.name = spec.name
    spec.impl.schedules[spec.target](sdfg, spec.layer, dict(spec.params))
    index_single_elements(sdfg)
    if spec.target == "gpu":
        launch.fit_grids(sdfg)
        problems = launch.grid_problems(sdfg)
        if problems:
            raise ValueError(f"{spec.name}: " + "; ".join(problems))
    sdfg.validate()
    return sdfg


def index_single_elements(sdfg) -> int:
    """Type as pointers the tasklet connectors that the tasklet's code indexes but whose
    memlet is one element; returns how many.  DaCe 1.0.2 makes such a connector a scalar
    and then cannot generate the index ("Missing dimensions in expression"): a whole
    array read as ``a[i]`` is one element on a layer with one channel or a 1x1x1 filter.
    A pointer keeps every stride of the array."""
    import ast

    import dace
    changed = 0
    for node, state in sdfg.all_nodes_recursive():
        if not isinstance(node, dace.nodes.Tasklet) or node.language != dace.Language.Python:
            continue
        indexed = {n.value.id for n in ast.walk(ast.parse(node.code.as_string))
                   if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name)}
        edges = [(e, e.dst_conn, node.in_connectors) for e in state.in_edges(node)] + \
                [(e, e.src_conn, node.out_connectors) for e in state.out_edges(node)]
        for edge, conn, conns in edges:
            memlet = edge.data
            if (conn in indexed and memlet.data is not None and memlet.wcr is None
                    and memlet.subset.num_elements() == 1
                    and not isinstance(conns.get(conn), dace.pointer)):
                conns[conn] = dace.pointer(state.sdfg.arrays[memlet.data].dtype)
                changed += 1
    return changed


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """Python's cyclic garbage collector run less often within the block.  DaCe's frontend,
    simplification and code generation allocate millions of small objects, and the
    collector's default thresholds (700 allocations, then every 10th and 100th pass)
    make it scan the growing object graph again and again.  With the thresholds below
    (and the objects of the imports set aside with ``gc.freeze``), six blocked-kernel
    SDFGs of CosmoFlow's layers took 31.5 s instead of 33.5-36.5 s (AMD EPYC f25m17),
    about what they take with the collector off (32.4 s)."""
    import gc
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(200_000, 100, 1000)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def compile_spec(spec: BuildSpec, folder: Path,
                 prepare=None) -> Tuple[Any, Path, Dict[str, float]]:
    """Generate, schedule and compile ``spec`` into ``folder`` (emptied first).

    ``prepare(sdfg)``, if given, changes the scheduled SDFG before it is compiled (for
    example to add instrumentation); such builds do not belong in the cache.

    Returns the scheduled SDFG, the shared library and the seconds per phase.  GPU
    builds compile, and load, on a machine without a GPU; running one needs a GPU.
    """
    from dace.codegen import compiler

    folder = Path(folder)
    times = {}
    with dace_config(spec.target, folder.parent, spec.dtype, spec.arch), _fewer_collections(), \
            chatter.captured(folder / chatter.LOG_NAME, spec.name):
        t0 = time.perf_counter()
        sdfg = make_sdfg(spec)
        if prepare is not None:
            prepare(sdfg)
        sdfg.build_folder = str(folder)
        t1 = time.perf_counter()
        times["sdfg"] = t1 - t0
        if folder.exists():
            shutil.rmtree(folder)
        with replay.replaying(spec.target):
            # make_sdfg validated the SDFG; validate again only what prepare changed
            sdfg.compile(validate=prepare is not None, return_program_handle=False)
        library = Path(compiler.get_binary_name(str(folder), sdfg.name))
        times["compile"] = time.perf_counter() - t1
    return sdfg, library, times


def load_program(library: Path, sdfg) -> Any:
    """The program of a compiled SDFG's library, loaded once per process and never
    closed (:mod:`convbench.build.loader` says why DaCe's own loader is not used)."""
    return loader.load_program(library, sdfg)
