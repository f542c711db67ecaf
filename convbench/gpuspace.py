"""The GPU tune space, and what each configuration costs in registers and shared memory,
found on a host without a GPU.

GPU time is rare here, so the tune tier of the campaign (``convbench.campaign``) only
runs configurations that have passed this filter.  For each configuration of an
implementation's GPU search space (:data:`SPACES`), :func:`probe` generates the CUDA code
of one build with DaCe, compiles that ``.cu`` file alone for the target architecture
(``nvcc -cubin -Xptxas -v``, the flags of a real build), and reads per kernel what
ptxas reports (registers, static shared memory, stack frame, spill stores and loads) and
the launch the generated host code makes (grid and block).  :func:`occupancy` turns
those into resident blocks per SM and the limiting resource.  :func:`verdict` refuses a
configuration that spills, keeps arrays in local memory, or cannot place one block on
an SM; the refusal names the kernel and the number.

``scripts/gpu_campaign.py space`` writes the table of every configuration
(``results/gpu/tune-space/``), and the tune tier reads its verdicts from there.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from . import sass
from .errors import UsageError
from .toolchain import PROJECT_ROOT

#: The GPU search space per implementation, in ``--space`` syntax (``P=a,b;Q=c``): the
#: block tile (64-128 x 32-128), the K step, the register tile (4x4 to 8x8), and for
#: split-K the number of chunks.  Combinations an implementation refuses (too many
#: threads, shared memory over 48 KiB, a K step that the threads cannot stage evenly)
#: are dropped by its own parameter check before anything is compiled.
#: These spaces are the campaign's search plan: their size is bounded by device time
#: (:mod:`convbench.campaign.plan` prices them), not by what the kernels accept.
_TILES = "CTAtileM=64,128;CTAtileN=32,64,128;CTAtileK=8,16,32;threadTileM=4,8;threadTileN=4,8"
SPACES: Dict[str, str] = {
    "implicitGemmNCDHW": _TILES,
    "implicitGemmNCDHWinplace": _TILES,
    # Split-K is for the deep layers, whose few output pixels leave SMs idle: small
    # block tiles in M, and the chunk count as the main axis.
    "implicitGemmsplitK": ("CTAtileM=64;CTAtileN=64,128;CTAtileK=16,32;threadTileM=4,8;"
                           "threadTileN=4;nsplitK=2,4,8"),
}

#: Compute capability 9.0 (H100, H200): the per-SM limits of the CUDA programming
#: guide's table of technical specifications and of the occupancy calculator.
SM90 = {
    "name": "sm_90",
    "sms": 132,                 # H100 SXM and H200
    "max_threads_per_sm": 2048,
    "max_warps_per_sm": 64,
    "max_blocks_per_sm": 32,
    "registers_per_sm": 65536,
    "register_unit": 256,       # registers are allocated per warp in units of 256
    "max_registers_per_thread": 255,
    "shared_per_sm": 233472,    # 228 KiB
    "shared_reserved_per_block": 1024,
    "shared_unit": 128,
    "static_shared_per_block": 48 * 1024,
}


@dataclasses.dataclass
class Kernel:
    """What ptxas and the generated launch say of one ``__global__`` function."""

    name: str
    registers: int = 0
    shared: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    threads: int = 0
    blocks: int = 0
    blocks_per_sm: int = 0
    occupancy: float = 0.0
    limiter: str = ""
    waves: float = 0.0
    #: What its main loop's machine code says (:mod:`convbench.sass`), where it was read.
    sass: Optional[sass.Reading] = None

    @property
    def fma(self) -> int:
        """FMA-class instructions in its main loop (0 where unread)."""
        return self.sass.fma if self.sass else 0

    @property
    def weight(self) -> Tuple[int, int]:
        """How it ranks as a build's main kernel: the FMAs of a real loop first (a
        loop-free kernel's body, a transform say, runs once per thread), then of the
        whole body (:func:`convbench.sass.weight`)."""
        return sass.weight(self.sass) if self.sass else (0, 0)


# ---------------------------------------------------------------------------------------------
# What ptxas and the generated code say
# ---------------------------------------------------------------------------------------------

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_LAUNCH = re.compile(r"cudaLaunchKernel\(\(void\*\)(\w+), dim3\(([^)]*)\), dim3\(([^)]*)\)")


demangle = sass.demangle


def parse_ptxas(text: str) -> Dict[str, Kernel]:
    """Per kernel (C name): registers, static shared memory, stack and spills, from the
    output of ``ptxas -v``.  CUB's empty kernel and other library kernels are kept: a
    caller filters by the names the generated launches use."""
    kernels: Dict[str, Kernel] = {}
    current: Optional[Kernel] = None
    for line in text.splitlines():
        m = _ENTRY.search(line) or _PROPS.search(line)
        if m:
            name = demangle(m.group(1))
            current = kernels.setdefault(name, Kernel(name))
            continue
        if current is None:
            continue
        m = _STACK.search(line)
        if m:
            current.stack, current.spill_stores, current.spill_loads = map(int, m.groups())
        m = _USED.search(line)
        if m:
            current.registers = int(m.group(1))
            s = _SMEM.search(line)
            current.shared = int(s.group(1)) if s else 0
    return kernels


_LINKED = re.compile(r"Function properties for '([^']+)'")
_LINK_USE = re.compile(r"used (\d+) registers, used \d+ barriers, (\d+) stack, (\d+) bytes smem")


def parse_nvlink(text: str) -> Dict[str, Tuple[int, int, int]]:
    """Per kernel (C name): (registers, stack bytes, shared bytes) after the device link."""
    out: Dict[str, Tuple[int, int, int]] = {}
    current = None
    for line in text.splitlines():
        m = _LINKED.search(line)
        if m:
            current = demangle(m.group(1))
            continue
        m = _LINK_USE.search(line)
        if m and current:
            out[current] = tuple(int(g) for g in m.groups())
            current = None
    return out


def _product(dims: str) -> Optional[int]:
    try:
        return math.prod(int(d.strip()) for d in dims.split(","))
    except ValueError:  # a symbolic size: the layer's constants are all literal here
        return None


def parse_launches(cu_text: str) -> Dict[str, Tuple[Optional[int], Optional[int]]]:
    """Per kernel the generated host code launches: (blocks in the grid, threads per block)."""
    return {m.group(1): (_product(m.group(2)), _product(m.group(3)))
            for m in _LAUNCH.finditer(cu_text)}


def occupancy(threads: int, registers: int, shared: int, arch: Mapping = SM90) -> Tuple[int, float, str]:
    """Resident blocks per SM, the fraction of the SM's warps they fill, and what limits
    them (``threads``, ``registers``, ``shared`` or ``blocks``)."""
    warps = -(-threads // 32)
    per_warp = -(-max(registers, 1) * 32 // arch["register_unit"]) * arch["register_unit"]
    by = {"blocks": arch["max_blocks_per_sm"],
          "threads": arch["max_warps_per_sm"] // warps,
          # registers live in four sub-partitions of an SM, each holding whole warps
          # (CUDA's occupancy calculator, cudaOccMaxBlocksPerSMRegsLimit)
          "registers": ((arch["registers_per_sm"] // 4 // per_warp) * 4) // warps}
    if shared:
        unit = arch["shared_unit"]
        need = -(-(shared + arch["shared_reserved_per_block"]) // unit) * unit
        by["shared"] = arch["shared_per_sm"] // need
    limiter = min(by, key=lambda k: (by[k], k != "threads"))
    blocks = by[limiter]
    return blocks, blocks * warps / arch["max_warps_per_sm"], limiter


def describe_kernels(ptxas_text: str, cu_text: str, arch: Mapping = SM90,
                     nvlink_text: str = "", sass_text: str = "") -> List[Kernel]:
    """The kernels the generated code launches, with resources, occupancy and waves:
    spills from ptxas, registers, shared memory and stack from the device link where
    it reports them (a separately compiled kernel's shared memory is only known there),
    and the reading of its main loop from the SASS listing, where one is given."""
    found = parse_ptxas(ptxas_text)
    linked = parse_nvlink(nvlink_text)
    readings = sass.read_listing(sass_text) if sass_text else {}
    out = []
    for name, (blocks, threads) in parse_launches(cu_text).items():
        k = found.get(name, Kernel(name))
        if name in linked:
            k.registers, k.stack, k.shared = linked[name]
        k.sass = readings.get(name)
        k.threads, k.blocks = threads or 0, blocks or 0
        if threads:
            k.blocks_per_sm, k.occupancy, k.limiter = occupancy(threads, k.registers, k.shared, arch)
            if k.blocks_per_sm and blocks:
                k.waves = blocks / (k.blocks_per_sm * arch["sms"])
        out.append(k)
    return out


def verdict(kernels: Sequence[Kernel], arch: Mapping = SM90) -> Optional[str]:
    """Why a configuration must not reach the GPU, or None."""
    for k in kernels:
        if k.spill_stores or k.spill_loads:
            return f"{k.name} spills ({k.spill_stores} bytes stored, {k.spill_loads} loaded)"
        if k.stack:
            return f"{k.name} keeps {k.stack} bytes per thread in local memory (stack frame)"
        if k.shared > arch["static_shared_per_block"]:
            return f"{k.name} needs {k.shared} bytes of static shared memory"
        if k.threads and k.blocks_per_sm == 0:
            return f"{k.name}: one block of {k.threads} threads does not fit an SM ({k.limiter})"
    return None


# ---------------------------------------------------------------------------------------------
# Compiling one configuration
# ---------------------------------------------------------------------------------------------

def nvcc_command(cu: Path, obj: Path, dtype=None, includes: Sequence[str] = ()) -> List[str]:
    """nvcc for the device code of one generated file, as a GPU build compiles it: DaCe's
    CMake file turns on separable compilation (``-rdc=true``), which changes what ptxas
    allocates (64 registers instead of 40 for ``implicitGemmNCDHW``'s defaults, as
    Nsight Compute measured on the H100 and the H200), and the flags of
    :func:`convbench.toolchain.dace_settings` for the precision ``dtype`` (architecture,
    fast math, the CUB 3 compatibility header, the 16-bit types' header), with DaCe's
    runtime headers and ``includes`` (the include folders of the DaCe environments the
    code uses: cuBLAS's for a BLAS library node)."""
    import dace
    from . import toolchain
    args = toolchain.dace_settings("gpu", Path(tempfile.gettempdir()), dtype)[
        ("compiler", "cuda", "args")]
    include = Path(dace.__file__).parent / "runtime" / "include"
    return (["nvcc", "-std=c++17", "-O3", f"-arch=sm_{toolchain.CUDA_ARCH}", "-rdc=true", "-c",
             "-Xptxas", "-v", "-w", f"-I{include}"] + [f"-I{i}" for i in includes]
            + args.split() + ["-o", str(obj), str(cu)])


def link_command(obj: Path, out: Path) -> List[str]:
    """The device link of a separately compiled object, which reports each kernel's final
    registers, shared memory (static shared memory is only placed here) and stack."""
    from . import toolchain
    return ["nvcc", f"-arch=sm_{toolchain.CUDA_ARCH}", "-dlink", str(obj), "-o", str(out),
            "-Xnvlink", "-v"]


@dataclasses.dataclass
class Probe:
    """One configuration on one layer: its kernels, or why it was not compiled."""

    impl: str
    layer_set: str
    layer: str
    batch: int
    params: Dict[str, int]
    kernels: List[Kernel] = dataclasses.field(default_factory=list)
    error: str = ""
    seconds: float = 0.0
    #: The precision it was compiled in (a label: ``float32``, ``float16``, ...).
    dtype: str = "float32"
    #: The SASS listing of the whole object, when it was disassembled and kept.
    listing: str = ""

    @property
    def reason(self) -> Optional[str]:
        return self.error or verdict(self.kernels)

    @property
    def main(self) -> Optional[Kernel]:
        """The kernel that does the work: where the SASS was read, the one whose main
        loop holds the most FMA instructions (:attr:`Kernel.weight`), then the one that
        stages tiles in shared memory, else the one with the most threads x registers
        (the tables, copies and reductions are plain element-wise kernels)."""
        return max(self.kernels, key=lambda k: (k.weight, k.shared, k.registers * k.threads),
                   default=None)


def probe(impl_name: str, layer_set: str, layer, params: Mapping[str, int],
          workdir: Optional[Path] = None, timeout: float = 300.0, dtype=None,
          disassemble: bool = False, keep_listing: bool = False) -> Probe:
    """Generate the GPU code of ``impl_name`` on ``layer`` with ``params`` in precision
    ``dtype`` (default: the implementation's first) and compile it with nvcc for the
    target architecture; with ``disassemble``, read each kernel's main loop from the
    SASS (``keep_listing``: keep the listing too).  A :class:`Probe` (with the seconds it
    took)."""
    import time
    from . import precision, registry
    t0 = time.perf_counter()
    impl = registry.get(impl_name)
    dtype = precision.get_dtype(dtype or impl.precisions[0])
    result = Probe(impl_name, layer_set, layer.name, layer.batch, dict(params),
                   dtype=dtype.label)
    _compile(result, impl_name, layer, params, workdir, timeout, dtype, disassemble,
             keep_listing)
    result.seconds = round(time.perf_counter() - t0, 2)
    return result


def _compile(result: Probe, impl_name: str, layer, params, workdir, timeout, dtype,
             disassemble: bool, keep_listing: bool) -> None:
    from . import registry, toolchain
    impl = registry.get(impl_name)
    reason = impl.unsupported_reason(layer, impl.resolve_params(dict(params)))
    if reason:
        result.error = f"refused: {reason}"
        return
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp = Path(tmp)
        try:
            spec = toolchain.make_spec(impl, layer, dtype, target="gpu", params=params)
            with toolchain.dace_config("gpu", tmp, spec.dtype):
                sdfg = toolchain.make_sdfg(spec)
                sdfg.build_folder = str(tmp / "build")
                codes = sdfg.generate_code()
                code = next(c for c in codes if c.language == "cu")
        except Exception as err:  # noqa: BLE001 - a configuration DaCe cannot build is a result
            result.error = f"code generation: {type(err).__name__}: {err}".splitlines()[0][:300]
            return
        cu, obj, linked = tmp / "kernels.cu", tmp / "kernels.o", tmp / "linked.o"
        cu.write_text(code.clean_code)
        try:
            proc = subprocess.run(nvcc_command(cu, obj, spec.dtype, _includes(codes)),
                                  capture_output=True, text=True, timeout=timeout)
        except FileNotFoundError:
            raise UsageError("nvcc is not on PATH: the tune space is compiled with it") from None
        except subprocess.TimeoutExpired:
            result.error = f"nvcc ran past {timeout:g} s"
            return
        text = proc.stdout + proc.stderr
        if proc.returncode != 0:
            first = next((ln for ln in text.splitlines() if "error" in ln.lower()), text.strip()[:200])
            result.error = f"nvcc: {first.strip()[:300]}"
            return
        link = subprocess.run(link_command(obj, linked), capture_output=True, text=True,
                              timeout=timeout)
        if link.returncode != 0:
            result.error = f"nvlink: {(link.stdout + link.stderr).strip()[:300]}"
            return
        listing = ""
        if disassemble:
            try:
                listing = sass.disassemble(obj, timeout)
            except (OSError, RuntimeError, subprocess.SubprocessError) as err:
                result.error = f"cuobjdump: {err}"[:300]
                return
            if keep_listing:
                result.listing = listing
        result.kernels = describe_kernels(text, code.clean_code,
                                          nvlink_text=link.stdout + link.stderr,
                                          sass_text=listing)


def _includes(codes) -> List[str]:
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


# ---------------------------------------------------------------------------------------------
# The space
# ---------------------------------------------------------------------------------------------

def space(impl_name: str, text: Optional[str] = None) -> List[Dict[str, int]]:
    """The configurations of ``impl_name``'s GPU search space (or of ``text``) that the
    implementation's own parameter check accepts."""
    from . import registry
    from .tuning import parse_space
    text = text if text is not None else SPACES.get(impl_name)
    if not text:
        raise UsageError(f"{impl_name} has no GPU search space (those with one: "
                         f"{', '.join(SPACES)})")
    return [dict(p) for p in parse_space(text, registry.get(impl_name))]


def fits_layer(params: Mapping[str, int], layer) -> bool:
    """Whether a configuration's block tile is not mostly padding on ``layer``: a
    CTAtileN above the output channels (rounded up to 32), or a CTAtileM above the
    GEMM rows, only adds idle threads."""
    cols = max(32, 1 << max(0, layer.gemm_n - 1).bit_length())
    rows = max(64, 1 << max(0, layer.gemm_m - 1).bit_length())
    return params.get("CTAtileN", 0) <= cols and params.get("CTAtileM", 0) <= rows


def tag(params: Mapping[str, int]) -> str:
    """A short, file-name-safe name of a configuration: ``M128N64K16r8x4`` (+ ``s4``)."""
    short = [("CTAtileM", "M"), ("CTAtileN", "N"), ("CTAtileK", "K")]
    text = "".join(f"{s}{params[k]}" for k, s in short if k in params)
    if "threadTileM" in params:
        text += f"r{params['threadTileM']}x{params['threadTileN']}"
    if "nsplitK" in params:
        text += f"s{params['nsplitK']}"
    rest = sorted(k for k in params if k not in {"CTAtileM", "CTAtileN", "CTAtileK",
                                                 "threadTileM", "threadTileN", "nsplitK"})
    return text + "".join(f"_{k}{params[k]}" for k in rest)


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------

RESOURCE_COLUMNS = ("kernel", "registers", "shared", "stack", "spill_stores", "spill_loads",
                    "threads", "blocks", "blocks_per_sm", "occupancy", "limiter", "waves")
COLUMNS = (("impl", "config", "layer_set", "layer", "batch", "verdict") + RESOURCE_COLUMNS
           + sass.COLUMNS + ("seconds",))


def kernel_row(k: Kernel) -> Dict[str, object]:
    """One kernel's resources (:data:`RESOURCE_COLUMNS`) and its main loop's reading
    (:data:`convbench.sass.COLUMNS`, empty where the SASS was not read)."""
    row = {"kernel": k.name, "registers": k.registers, "shared": k.shared, "stack": k.stack,
           "spill_stores": k.spill_stores, "spill_loads": k.spill_loads,
           "threads": k.threads, "blocks": k.blocks, "blocks_per_sm": k.blocks_per_sm,
           "occupancy": round(k.occupancy, 3), "limiter": k.limiter,
           "waves": round(k.waves, 2)}
    row.update(k.sass.row() if k.sass else dict.fromkeys(sass.COLUMNS, ""))
    return row


def rows(probes: Iterable[Probe]) -> List[Dict[str, object]]:
    """One row per configuration and layer: its verdict, its main kernel's resources and
    the reading of that kernel's main loop."""
    return [{"impl": p.impl, "config": tag(p.params), "layer_set": p.layer_set,
             "layer": p.layer, "batch": p.batch, "verdict": p.reason or "ok",
             **kernel_row(p.main or Kernel("")), "seconds": p.seconds} for p in probes]


def write_csv(path: Path, table: Sequence[Mapping[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(table)


def read_csv(path: Path) -> List[Dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def passed(folder: Path) -> Dict[str, List[Dict[str, int]]]:
    """Per implementation, the configurations that passed on every layer they were
    compiled for, as ``space.json`` in ``folder`` records them, each with its resident
    blocks per SM under the key ``_blocks_per_sm`` and, where its SASS was read, its main
    loop's FMA share under ``_fma_share`` (for :func:`rank`)."""
    path = Path(folder) / "space.json"
    if not path.is_file():
        raise UsageError(f"{path}: no tune-space table; compile the space first "
                         "(scripts/gpu_campaign.py space)")
    data = json.loads(path.read_text())
    def private(c):
        out = {"_blocks_per_sm": c.get("blocks_per_sm", 1)}
        if c.get("fma_share") is not None:
            out["_fma_share"] = c["fma_share"]
        return out
    return {impl: [dict(c["params"], **private(c))
                   for c in entry["configs"] if c["verdict"] == "ok"]
            for impl, entry in data["implementations"].items()}


def score(params: Mapping[str, int], layer, blocks_per_sm: int, arch: Mapping = SM90,
          fma_share: Optional[float] = None) -> float:
    """A model of a configuration's efficiency on ``layer``, to order what the tune tier
    times (the GPU decides): the share of the padded GEMM that is real work, the share
    of the last wave of blocks that is busy (all of one wave below one), and how much of
    the main loop's issue goes to FMAs.  That last factor is ``fma_share``, the FMA share
    of the main loop's machine code (:mod:`convbench.sass`): an SM sub-partition issues
    one instruction per clock and retires one FFMA per clock, so a loop that is 47%
    FFMA runs at 47% of the FP32 peak at best.  Without a reading it is modelled by the
    register tile's reuse, FFMAs per shared-memory load, rm*rn/(rm+rn), relative to 8x8's.
    Split-K counts its extra pass over the partial sums as one more K step per chunk."""
    tm, tn = params["CTAtileM"], params["CTAtileN"]
    gm, gn, split = layer.gemm_m, layer.gemm_n, params.get("nsplitK", 1)
    mp, np_ = -(-gm // tm) * tm, -(-gn // tn) * tn
    waves = _waves(params, layer, blocks_per_sm, arch) * split
    busy = waves / math.ceil(waves) if waves else 0.0
    rm, rn = params.get("threadTileM", 1), params.get("threadTileN", 1)
    issue = fma_share if fma_share is not None else (rm * rn / (rm + rn)) / 4.0
    k_steps = -(-layer.gemm_k // (params.get("CTAtileK", 16) * split))
    return (gm * gn) / (mp * np_) * busy * issue * k_steps / (k_steps + (split > 1))


def rank(impl_name: str, layer, configs: Sequence[Mapping[str, int]]) -> List[Dict[str, int]]:
    """``configs`` that ``impl_name`` supports on ``layer`` and that fit it
    (:func:`fits_layer`), best :func:`score` first; split-K only where the plain tiles
    leave SMs idle (under one wave of blocks).  The FMA shares of the SASS count where
    every configuration has one, the reuse model otherwise (the two are on different
    scales).  Parameters without the private keys."""
    from . import registry
    impl = registry.get(impl_name)
    read = all(c.get("_fma_share") is not None for c in configs)
    out = []
    for c in configs:
        params = {k: v for k, v in c.items() if not k.startswith("_")}
        bps = c.get("_blocks_per_sm", 1)
        if not fits_layer(params, layer) or impl.unsupported_reason(
                layer, impl.resolve_params(params)):
            continue
        if params.get("nsplitK", 1) > 1 and _waves(params, layer, bps) >= 1.0:
            continue
        out.append((score(params, layer, bps, fma_share=c["_fma_share"] if read else None),
                    params))
    out.sort(key=lambda sp: -sp[0])
    return [p for _, p in out]


def _waves(params: Mapping[str, int], layer, blocks_per_sm: int, arch: Mapping = SM90) -> float:
    """Waves of blocks of ``params``' tiles without split-K."""
    blocks = -(-layer.gemm_m // params["CTAtileM"]) * -(-layer.gemm_n // params["CTAtileN"])
    return blocks / max(1, blocks_per_sm * arch["sms"])


#: The start of a probe's error when the implementation refuses the probe layer itself
#: (int32 partial sums, say): a fact about the layer, not about the configuration.
REFUSED = "refused: "


def summarize(table: Sequence[Mapping[str, object]]) -> Dict[str, object]:
    """``space.json`` from the rows of :func:`rows`: per implementation and
    configuration, the verdict over its layers (the first resource or compile failure,
    if any), the layers it was compiled on and those that refuse it, the range of its
    main kernel's registers, its fewest resident blocks per SM and, where the SASS was
    read, its main loop's FMA kind and lowest FMA share.  A configuration that every
    probe layer refuses has no verdict to give and counts as refused."""
    impls: Dict[str, dict] = {}
    for r in table:
        impl = str(r["impl"])
        entry = impls.setdefault(impl, {"space": SPACES.get(impl, ""), "configs": {}})
        by_tag = entry.setdefault("_params", {tag(c): c for c in space(impl)})
        c = entry["configs"].setdefault(r["config"], {
            "params": by_tag.get(r["config"], {}), "verdict": "ok", "layers": [],
            "refused_on": [], "registers": [], "blocks_per_sm": [], "fma_share": []})
        where = f"{r['layer_set']}/{r['layer']}/b{r['batch']}"
        verdict = str(r["verdict"])
        if verdict.startswith(REFUSED):
            c["refused_on"].append(where)
            continue
        c["layers"].append(where)
        if int(r["registers"] or 0):
            c["registers"].append(int(r["registers"]))
            c["blocks_per_sm"].append(int(r["blocks_per_sm"]))
        if r.get("fma_share") not in (None, ""):
            c["fma_share"].append(float(r["fma_share"]))
            c["fma_kind"] = r.get("fma_kind", "")
        if verdict != "ok" and c["verdict"] == "ok":
            c["verdict"] = f"{r['layer_set']}/{r['layer']}: {verdict}"
    for entry in impls.values():
        entry.pop("_params", None)
        for c in entry["configs"].values():
            regs = c.pop("registers")
            c["registers"] = [min(regs), max(regs)] if regs else []
            c["blocks_per_sm"] = min(c["blocks_per_sm"], default=0)
            c["fma_share"] = min(c["fma_share"], default=None)
            if not c["layers"]:
                c["verdict"] = "every probe layer refuses it: " + ", ".join(c["refused_on"])
        entry["configs"] = list(entry["configs"].values())
    return {"arch": SM90["name"], "implementations": impls}



# ---------------------------------------------------------------------------------------------
# Compiling the whole space
# ---------------------------------------------------------------------------------------------

#: The layer each configuration is compiled on: v1 conv7 at batch 16, the deepest
#: CosmoFlow layer, which every implementation with a space supports (split-K's partial
#: sums overflow int32 on the large layers).  Registers can differ a little with the
#: layer's constants: a configuration that spills on another layer shows up there as
#: time, never as a wrong result, since every tune case is verified.
PROBE_LAYERS = (("cosmoflow", "conv7", 16),)
#: Where ``space`` writes its table, and where the tune tier reads the verdicts.
DEFAULT_OUT = PROJECT_ROOT / "results" / "gpu" / "tune-space"


def _probe_job(job) -> Probe:
    import warnings
    impl_name, layer_set, layer, params, dtype = job
    from . import registry
    warnings.simplefilter("ignore")  # DaCe's codegen warnings would garble the progress
    registry.load_implementations()
    return probe(impl_name, layer_set, layer, params, dtype=dtype, disassemble=True)


def _probe_layers(layers: Sequence[Tuple[str, str, int]]):
    """The :class:`~convbench.layers.Layer` of each ``(set, name, batch)``."""
    from .layersets import load_layers
    out = []
    for layer_set, name, batch in layers:
        layer = next((lay for lay in load_layers(layer_set) if lay.name == name), None)
        if layer is None:
            raise UsageError(f"probe layer {name} is not in {layer_set}")
        out.append((layer_set, layer.with_batch(batch)))
    return out


def run_probes(todo: Sequence[tuple], jobs: int, say=print) -> List[Probe]:
    """:func:`probe` with the SASS read, for each ``(implementation, layer set, layer,
    params, dtype)`` of ``todo``, ``jobs`` processes at a time, in ``todo``'s order."""
    import concurrent.futures
    import multiprocessing
    import time
    sass.require_tools()
    t0, found = time.perf_counter(), {}
    ctx = multiprocessing.get_context("spawn")  # DaCe's global configuration per process
    with concurrent.futures.ProcessPoolExecutor(max(1, jobs), mp_context=ctx) as pool:
        futures = {pool.submit(_probe_job, job): i for i, job in enumerate(todo)}
        for n, fut in enumerate(concurrent.futures.as_completed(futures), 1):
            p = found[futures[fut]] = fut.result()
            k = p.main
            say(f"  {n}/{len(todo)} {p.impl} {tag(p.params) or p.dtype} "
                f"{p.layer_set}/{p.layer}: "
                + (p.reason or f"ok, {k.registers} registers, {k.shared} B shared, "
                   f"occupancy {k.occupancy:.2f}, " + _fma_text(k))
                + f"  [{time.perf_counter() - t0:.0f} s]")
    return [found[i] for i in range(len(todo))]


def compile_space(impls: Sequence[str], jobs: int, say=print,
                  layers: Sequence[Tuple[str, str, int]] = PROBE_LAYERS) -> List[Probe]:
    """Every configuration of ``impls``' spaces on every probe layer, ``jobs`` at a time,
    each kernel's main loop read from its SASS."""
    sass.require_tools()
    todo = [(impl, layer_set, layer, params, None)
            for layer_set, layer in _probe_layers(layers)
            for impl in impls for params in space(impl)]
    say(f"compiling {len(todo)} configurations x layers with nvcc, {jobs} at a time")
    found = run_probes(todo, jobs, say)
    order = {(impl, tag(p)): i for i, (impl, _, _, p, _) in enumerate(todo)}
    found.sort(key=lambda p: (order[(p.impl, tag(p.params))], p.layer_set, p.layer))
    return found


def _share(row: Mapping[str, object]) -> str:
    """``FFMA 47%`` of a row, or empty where its SASS was not read."""
    if row.get("fma_share") in (None, ""):
        return ""
    if not float(row["fma_share"]):
        return "no FMA"
    return f"{row.get('fma_kind') or 'FMA'} {100 * float(row['fma_share']):.0f}%"


def _fma_text(k: Kernel) -> str:
    """``FFMA 47% of a 552-instruction main loop``, or that the SASS was not read."""
    r = k.sass
    if r is None:
        return "SASS not read"
    return f"{r.fma_kind or 'FMA'} {100 * r.fma_share:.0f}% of a {r.instructions}-instruction " + (
        "main loop" if r.loops else "loop-free body")


def _per_fma(row: Mapping[str, object]) -> str:
    """A row's shared loads per FMA by width, ``LDS 0.49`` or ``LDS.128 0.12, LDS 0.06``."""
    from .sass import LDS_WIDTHS, _column
    parts = [f"{w} {float(row[_column(w)]):.2f}" for w in LDS_WIDTHS
             if row.get(_column(w)) not in (None, "") and float(row[_column(w)])]
    return ", ".join(parts) or ("none" if row.get("fma_share") not in (None, "") else "")


def write_space(out: Path, probes: Sequence[Probe], toolchain_info: Mapping[str, str]) -> Path:
    """``resources.csv``, ``space.json`` and ``README.md`` in ``out``; the rows of
    implementations not probed this time are kept from the files already there."""
    from . import tables
    from .files import write_atomic
    out = Path(out)
    probed = {p.impl for p in probes}
    table = rows(probes)
    if (out / "resources.csv").is_file():
        table = [r for r in read_csv(out / "resources.csv")
                 if r["impl"] not in probed and r["impl"] in SPACES] + table
    summary = dict(summarize(table), toolchain=dict(toolchain_info))
    write_csv(out / "resources.csv", table)
    write_atomic(out / "space.json", json.dumps(summary, indent=1) + "\n")
    lines = ["# The GPU tune space, compiled on a host without a GPU", "",
             f"Every configuration of the GPU search spaces (`convbench/gpuspace.py`, SPACES), "
             f"compiled for {SM90['name']} by `scripts/gpu_campaign.py space` "
             f"({', '.join(f'{k} {v}' for k, v in toolchain_info.items())}) as a GPU build "
             "compiles it: separable compilation (`-rdc=true`, DaCe's CMake setting) and the "
             "device link, whose report gives the registers and shared memory the GPU runs "
             "with (for `implicitGemmNCDHW`'s defaults 64 registers and 4 blocks of 256 "
             "threads per SM, what Nsight Compute measured on the H100 and H200). Per "
             "configuration and probe layer: registers, static shared memory and stack "
             "frame after the link, spill stores and loads from ptxas, the launch the "
             "generated code makes (threads per block, blocks), and from those the resident "
             f"blocks per SM, the occupancy and its limiter, and the waves over {SM90['sms']} "
             "SMs. The object is disassembled (`cuobjdump -sass`) and each kernel's main "
             "loop read ([docs/sass.md](../../../docs/sass.md)): its instructions, the "
             "share that are FMAs, shared-memory loads per FMA by width, integer "
             "instructions per FMA and barriers; `resources.csv` has every column. A "
             "configuration that spills, keeps a stack frame, or cannot place a block "
             "on an SM is refused: the tune tier does not plan it (it times each "
             "implementation's defaults as the baseline, whatever their verdict). The "
             "tune tier orders the rest by a model that takes the main loop's FMA share "
             "as the share of the FP32 peak its issue allows (`gpuspace.score`). Every row "
             "is in `resources.csv`, the verdicts in `space.json`.", ""]
    for impl, entry in summary["implementations"].items():
        configs = entry["configs"]
        ok = [c for c in configs if c["verdict"] == "ok"]
        lines += [f"## {impl}", "", f"Space `{entry['space']}`: {len(configs)} "
                  f"configurations, {len(ok)} pass, {len(configs) - len(ok)} refused.", ""]
        body = [r for r in table if r["impl"] == impl]
        lines.append(tables.markdown(
            ["config", "layer", "verdict", "regs", "smem B", "stack", "spills", "threads",
             "blocks/SM", "occupancy", "limiter", "waves", "loop instr", "FMA share",
             "shared loads / FMA", "int / FMA", "BAR"],
            [[r["config"], f"{r['layer_set']}/{r['layer']} b{r['batch']}",
              str(r["verdict"]).replace("|", "/")[:90], r["registers"], r["shared"],
              r["stack"], f"{r['spill_stores']}/{r['spill_loads']}", r["threads"],
              r["blocks_per_sm"], r["occupancy"], r["limiter"], r["waves"],
              r.get("loop_instructions", ""), _share(r), _per_fma(r),
              r.get("int_per_fma", ""), r.get("barriers", "")] for r in body],
            "lll" + "r" * 11 + "lrr"))
        lines.append("")
    tune = sorted(out.parent.glob("*_tune/cases"))
    if tune:
        lines += ranking_section(tune[-1].parent, table)
    path = out / "README.md"
    write_atomic(path, "\n".join(lines))
    return path


def ranking_check(records: Iterable[dict], table: Sequence[Mapping[str, object]]
                  ) -> Dict[str, Dict[str, object]]:
    """How each ranking model orders the configurations a tune campaign timed, against
    their measured medians: per model (``paper``: the register tile's reuse; ``sass``:
    the main loop's FMA share), over the layers with at least two configurations that
    verified and have a row in ``table``, on how many its first choice was the fastest
    (``first``; a tie for first place counts as the chance that a random pick among the
    tied is the fastest), of how many (``layers``), and the mean of Spearman's rank
    correlation of score with speed within a layer (``rho``), over the layers where it
    is defined (three configurations or more, scores not all equal)."""
    from . import registry
    from .layers import Layer
    from .results import spearman
    by_tag: Dict[tuple, Mapping[str, object]] = {}
    for r in table:  # per configuration, its lowest share over the probe layers (space.json's)
        key = (str(r["impl"]), str(r["config"]))
        if r.get("fma_share") not in (None, "") and (
                key not in by_tag or float(r["fma_share"]) < float(by_tag[key]["fma_share"])):
            by_tag[key] = r
    timed: Dict[tuple, list] = {}
    for rec in records:
        case = rec.get("case", {})
        ms = rec.get("timings", {}).get("dace", {}).get("median_ms")
        if rec.get("status") != "verified" or not ms or case.get("impl") not in SPACES:
            continue
        params = dict(case.get("params") or ()) or dict(
            registry.get(case["impl"]).resolve_params({}))
        row = by_tag.get((case["impl"], tag(params)))
        if row is not None:
            timed.setdefault((case["impl"], case["layer_set"], json.dumps(case["layer"],
                                                                          sort_keys=True)),
                             []).append((params, row, ms))
    out: Dict[str, Dict[str, object]] = {}
    for model in ("paper", "sass"):
        first, rhos, layers = 0.0, [], 0
        for (impl, _, layer_json), found in timed.items():
            if len(found) < 2:
                continue
            layers += 1
            layer = Layer(**json.loads(layer_json))
            scores = [score(p, layer, int(r["blocks_per_sm"] or 1),
                            fma_share=float(r["fma_share"]) if model == "sass" else None)
                      for p, r, _ in found]
            speed = [-ms for _, _, ms in found]
            top = [i for i, s in enumerate(scores) if s == max(scores)]
            # a tie among the top scores gets the chance that a random pick is the fastest
            first += (speed.index(max(speed)) in top) / len(top)
            rho = spearman(scores, speed)
            if rho is not None:
                rhos.append(rho)
        out[model] = {"layers": layers,
                      "first": round(first, 1),
                      "rho": round(sum(rhos) / len(rhos), 2) if rhos else None}
    return out


def ranking_section(campaign: Path, table: Sequence[Mapping[str, object]]) -> List[str]:
    """The README's paragraph on how the ranking did on ``campaign``'s timings."""
    records = [json.loads(p.read_text()) for p in sorted((campaign / "cases").glob("*.json"))]
    found = ranking_check(records, table)
    if not found["sass"]["layers"]:
        return []
    text = "; ".join(f"{'the FMA share of the SASS' if m == 'sass' else 'the register tile reuse'}"
                     f" ranks the fastest first on {v['first']:g} of {v['layers']} layers, mean "
                     "within-layer Spearman "
                     + (f"{v['rho']:+.2f}" if v["rho"] is not None else "undefined")
                     for m, v in found.items())
    return ["## The ranking against measured times", "",
            f"Of the configurations the tune campaign [{campaign.name}](../{campaign.name}/README.md) "
            "timed and verified (per layer its defaults and the configurations its plan "
            "chose; medians of CUDA-event samples), scored by `gpuspace.score` with this "
            f"table's readings: {text} (`gpuspace.ranking_check`). A ranking model chose "
            "those candidates, so this tests the order among them, not what either model "
            "would pick from the whole space.", ""]


# ---------------------------------------------------------------------------------------------
# Every GPU implementation at its defaults (the status table's reading)
# ---------------------------------------------------------------------------------------------

#: Where every GPU implementation is read at its defaults: one deep layer per CosmoFlow
#: set, at the original work's batch (v1 conv5: 128 to 256 channels on 10^3; MLPerf
#: conv4: 128 to 256 on 16^3).  Every implementation with a GPU schedule supports both.
READING_LAYERS = (("cosmoflow", "conv5", 16), ("cosmoflow_mlperf", "conv4", 8))
#: Where ``convbench sass --all`` writes its table, and where the status table reads it.
READINGS_OUT = PROJECT_ROOT / "results" / "gpu" / "sass"
#: The columns of ``readings.csv``: one row per kernel of each reading.
READING_COLUMNS = (("impl", "dtype", "layer_set", "layer", "batch", "config", "main", "error")
                   + RESOURCE_COLUMNS + sass.COLUMNS)


def kernel_rows(p: Probe) -> List[Dict[str, object]]:
    """One row per kernel of a probe (:data:`READING_COLUMNS`), its main kernel marked
    and first; one row with the error where it was not compiled."""
    head = {"impl": p.impl, "dtype": p.dtype, "layer_set": p.layer_set, "layer": p.layer,
            "batch": p.batch, "config": ";".join(f"{k}={v}" for k, v in p.params.items())}
    if p.error:
        return [dict(head, main="", error=p.error)]
    main = p.main
    kernels = sorted(p.kernels, key=lambda k: k is not main)
    return [dict(head, main="yes" if k is main else "", error="", **kernel_row(k))
            for k in kernels]


def read_defaults(impls: Sequence[str], jobs: int, say=print,
                  layers: Sequence[Tuple[str, str, int]] = READING_LAYERS) -> List[Probe]:
    """Every implementation of ``impls`` at its defaults, in its first precision, on
    each of ``layers``: compiled, disassembled and read."""
    from . import registry
    todo = []
    for layer_set, layer in _probe_layers(layers):
        for name in impls:
            impl = registry.get(name)
            todo.append((name, layer_set, layer, dict(impl.resolve_params({})),
                         impl.precisions[0]))
    say(f"reading {len(todo)} builds (implementations x layers), {jobs} at a time")
    return run_probes(todo, jobs, say)


def write_readings(out: Path, probes: Sequence[Probe], info: Mapping[str, str]) -> Path:
    """``readings.csv`` (every kernel) and ``README.md`` (the main kernels) in ``out``;
    the rows of implementations not read this time are kept from the file there."""
    from . import registry, tables
    from .files import write_atomic
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    read = {p.impl for p in probes}
    table = [r for p in probes for r in kernel_rows(p)]
    path = out / "readings.csv"
    if path.is_file():
        known = registry.all_implementations()
        table = [r for r in read_csv(path) if r["impl"] not in read and r["impl"] in known
                 and "gpu" in known[r["impl"]].targets] + table
    table.sort(key=lambda r: (r["impl"], r["layer_set"], r["layer"], r["main"] != "yes"))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=READING_COLUMNS)
        w.writeheader()
        w.writerows(table)
    write_atomic(out / "readings.json", json.dumps(
        {"arch": SM90["name"], "layers": [list(x) for x in READING_LAYERS],
         "toolchain": dict(info)}, indent=1) + "\n")
    main = [r for r in table if r["main"] == "yes" or r["error"]]
    lines = ["# Every GPU implementation's main loop, read from its machine code", "",
             "Each implementation with a GPU schedule at its defaults, in its first "
             "precision, on one deep layer of each CosmoFlow set (v1 conv5 at batch 16, "
             "MLPerf conv4 at batch 8), generated by DaCe and compiled for "
             f"{SM90['name']} as a GPU build compiles it, then disassembled "
             f"(`convbench sass --all`; {', '.join(f'{k} {v}' for k, v in info.items())}). "
             "Per implementation, the kernel whose main loop holds the most FMA "
             "instructions; `readings.csv` has every kernel and every column, "
             "[docs/sass.md](../../../docs/sass.md) says what they mean. Counts are "
             "static: instructions in the listing, not instructions run.", "",
             tables.markdown(
                 ["implementation", "precision", "layer", "regs", "smem B", "stack B",
                  "spills", "loop instr", "FMA share", "shared loads / FMA", "LDG",
                  "LDGSTS", "int / FMA", "IMAD.WIDE", "local", "BAR"],
                 [[f"`{r['impl']}`", r["dtype"], f"{r['layer_set']}/{r['layer']} b{r['batch']}"]
                  + ([r["error"][:80]] + [""] * 12 if r["error"] else
                     [r["registers"], r["shared"], r["stack"],
                      f"{r['spill_stores']}/{r['spill_loads']}", r["loop_instructions"],
                      _share(r), _per_fma(r), r["ldg"], r["ldgsts"], r["int_per_fma"],
                      r["imad_wide"], r["local"], r["barriers"]]) for r in main],
                 "lll" + "r" * 6 + "l" + "r" * 6), ""]
    write_atomic(out / "README.md", "\n".join(lines))
    return out / "README.md"


def load_readings(folder: Path = READINGS_OUT) -> Dict[Tuple[str, str], Dict[str, str]]:
    """``(implementation, layer set)`` -> the row of its main kernel in ``readings.csv``
    (empty where the file is missing)."""
    path = Path(folder) / "readings.csv"
    if not path.is_file():
        return {}
    return {(r["impl"], r["layer_set"]): r for r in read_csv(path) if r["main"] == "yes"}
