"""A GPU build compiled and read on a host without a GPU: what ptxas, the device link and
the machine code say of each kernel.

:func:`probe` generates the CUDA code of one build with DaCe, compiles that ``.cu`` file
alone for the target architecture as a GPU build compiles it (nvcc with separable
compilation, ``-Xptxas -v``, then the device link), and reads per kernel what ptxas and
the link report (registers, static shared memory, stack frame, spill stores and loads)
and the launch the generated host code makes (grid and block).  :func:`occupancy` turns
those into resident blocks per SM and the limiting resource; :func:`verdict` refuses a
configuration that spills, keeps arrays in local memory, or cannot place one block on an
SM, naming the kernel and the number.  With ``disassemble``, the object's SASS is read
too (:mod:`convbench.build.sass`): each kernel's main loop, and the main kernel of the build.

The tune space (:mod:`convbench.tuning.gpuspace`) probes every configuration of a search space;
``convbench sass`` one build; :func:`read_defaults` every GPU implementation at its
defaults, the table the status reads (``results/gpu/sass/``).
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
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from convbench.build import sass
from convbench.base.errors import UsageError
from convbench.build.toolchain import PROJECT_ROOT
from convbench.build.nvcc import include_folders, link_command, nvcc_command
from convkernels.gpu import dynamic_shared

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
    # static plus dynamic, with cudaFuncAttributeMaxDynamicSharedMemorySize (227 KiB)
    "max_shared_per_block": 232448,
}


@dataclasses.dataclass
class Kernel:
    """What ptxas and the generated launch say of one ``__global__`` function."""

    name: str
    registers: int = 0
    shared: int = 0
    #: Dynamic shared memory it launches with (:mod:`convkernels.gpu.dynamic_shared`), which
    #: ptxas does not report.
    dynamic_shared: int = 0
    #: ptxas's notes on its wgmma (C7509 and its kin: the asynchronous MMAs serialized, or
    #: a wait injected), by code; empty where it made none.
    wgmma_notes: str = ""
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    threads: int = 0
    blocks: int = 0
    blocks_per_sm: int = 0
    occupancy: float = 0.0
    limiter: str = ""
    waves: float = 0.0
    #: What its main loop's machine code says (:mod:`convbench.build.sass`), where it was read.
    sass: Optional[sass.Reading] = None

    @property
    def fma(self) -> int:
        """FMA-class instructions in its main loop (0 where unread)."""
        return self.sass.fma if self.sass else 0

    @property
    def weight(self) -> Tuple[int, int]:
        """How it ranks as a build's main kernel: the FMAs of a real loop first (a
        loop-free kernel's body, a transform say, runs once per thread), then of the
        whole body (:func:`convbench.build.sass.weight`)."""
        return sass.weight(self.sass) if self.sass else (0, 0)


# ---------------------------------------------------------------------------------------------
# What ptxas and the generated code say
# ---------------------------------------------------------------------------------------------

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
#: ptxas's performance notes on wgmma: "(C7509) Potential Performance Loss: wgmma.mma_async
#: instructions are serialized due to ... in the function '_Z...'", "(C7517) warpgroup.wait
#: is injected ... in function '_Z...'".
_WGMMA_NOTE = re.compile(r"\((C75\d\d)\).*(?:wgmma|warpgroup).* function '(\w+)'")
_LAUNCH = re.compile(r"cudaLaunchKernel\(\(void\*\)(\w+), dim3\(([^)]*)\), dim3\(([^)]*)\)")


demangle = sass.demangle


def parse_ptxas(text: str) -> Dict[str, Kernel]:
    """Per kernel (C name): registers, static shared memory, stack and spills, from the
    output of ``ptxas -v``.  CUB's empty kernel and other library kernels are kept: a
    caller filters by the names the generated launches use."""
    kernels: Dict[str, Kernel] = {}
    current: Optional[Kernel] = None
    for line in text.splitlines():
        m = _WGMMA_NOTE.search(line)
        if m:  # printed before the function's own lines, and naming it
            k = kernels.setdefault(demangle(m.group(2)), Kernel(demangle(m.group(2))))
            k.wgmma_notes = " ".join(sorted(set(k.wgmma_notes.split()) | {m.group(1)}))
            continue
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
    dynamic = dynamic_shared.kernel_bytes(cu_text)
    out = []
    for name, (blocks, threads) in parse_launches(cu_text).items():
        k = found.get(name, Kernel(name))
        if name in linked:
            k.registers, k.stack, k.shared = linked[name]
        k.sass = readings.get(name)
        k.dynamic_shared = dynamic.get(name, 0)
        k.threads, k.blocks = threads or 0, blocks or 0
        if threads:
            k.blocks_per_sm, k.occupancy, k.limiter = occupancy(
                threads, k.registers, k.shared + k.dynamic_shared, arch)
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
        # ptxas's figure for sm_90 counts the 1 KiB the system reserves per block (the
        # pipelined kernel's 36864 bytes of stages read 37888); the 48 KiB limit is the
        # program's own (49152 bytes of stages ran on an H200, 2026-11-28)
        if k.shared - arch["shared_reserved_per_block"] > arch["static_shared_per_block"]:
            return f"{k.name} needs {k.shared} bytes of static shared memory"
        total = k.shared - arch["shared_reserved_per_block"] + k.dynamic_shared
        if k.dynamic_shared and total > arch["max_shared_per_block"]:
            return (f"{k.name} needs {total} bytes of shared memory ({k.dynamic_shared} "
                    f"dynamic) > {arch['max_shared_per_block']}")
        if k.threads and k.blocks_per_sm == 0:
            return f"{k.name}: one block of {k.threads} threads does not fit an SM ({k.limiter})"
    return None


# ---------------------------------------------------------------------------------------------
# Compiling one configuration
# ---------------------------------------------------------------------------------------------

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


def probe(impl_name, layer_set: str, layer, params: Mapping[str, int],
          workdir: Optional[Path] = None, timeout: float = 300.0, dtype=None,
          disassemble: bool = False, keep_listing: bool = False) -> Probe:
    """Generate the GPU code of ``impl_name`` on ``layer`` with ``params`` in precision
    ``dtype`` (default: the implementation's first) and compile it with nvcc for the
    target architecture; with ``disassemble``, read each kernel's main loop from the
    SASS (``keep_listing``: keep the listing too).  A :class:`Probe` (with the seconds it
    took)."""
    import time
    from convbench.build import precision
    t0 = time.perf_counter()
    impl = _implementation(impl_name)
    dtype = precision.get_dtype(dtype or impl.precisions[0])
    result = Probe(impl.name, layer_set, layer.name, layer.batch, dict(params),
                   dtype=dtype.label)
    _compile(result, impl_name, layer, params, workdir, timeout, dtype, disassemble,
             keep_listing)
    result.seconds = round(time.perf_counter() - t0, 2)
    return result


def _implementation(impl):
    """A registered implementation by name, or an implementation object as it is (the
    network's block epilogues are not registered)."""
    from convbench import registry
    return registry.get(impl) if isinstance(impl, str) else impl


def _compile(result: Probe, impl_name, layer, params, workdir, timeout, dtype,
             disassemble: bool, keep_listing: bool) -> None:
    from convbench.build import toolchain
    impl = _implementation(impl_name)
    reason = impl.unsupported_reason(layer, impl.resolve_params(dict(params)))
    if reason:
        result.error = f"refused: {reason}"
        return
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp = Path(tmp)
        try:
            spec = toolchain.make_spec(impl, layer, dtype, target="gpu", params=params)
            with toolchain.dace_config("gpu", tmp, spec.dtype, spec.arch):
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
            proc = subprocess.run(nvcc_command(cu, obj, spec.dtype, include_folders(codes),
                                               spec.arch),
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
        link = subprocess.run(link_command(obj, linked, spec.arch), capture_output=True, text=True,
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


def tag(params: Mapping[str, int]) -> str:
    """A short, file-name-safe name of a configuration: ``M128N64K16r8x4`` (+ ``s4`` split-K
    chunks, ``p3`` pipeline stages, ``_name value`` the others; ``splitK=1``, one slice,
    is left out: the pipelined forward's configurations were named so before it had the
    parameter)."""
    params = {k: v for k, v in params.items() if not (k == "splitK" and v == 1)}
    short = [("CTAtileM", "M"), ("CTAtileN", "N"), ("CTAtileK", "K")]
    text = "".join(f"{s}{params[k]}" for k, s in short if k in params)
    if "threadTileM" in params:
        text += f"r{params['threadTileM']}x{params['threadTileN']}"
    if "nsplitK" in params:
        text += f"s{params['nsplitK']}"
    if "stages" in params:
        text += f"p{params['stages']}"
    rest = sorted(k for k in params if k not in {"CTAtileM", "CTAtileN", "CTAtileK",
                                                 "threadTileM", "threadTileN", "nsplitK",
                                                 "stages"})
    return text + "".join(f"_{k}{params[k]}" for k in rest)


RESOURCE_COLUMNS = ("kernel", "registers", "shared", "stack", "spill_stores", "spill_loads",
                    "threads", "blocks", "blocks_per_sm", "occupancy", "limiter", "waves",
                    "dynamic_shared", "wgmma_notes")
def kernel_row(k: Kernel) -> Dict[str, object]:
    """One kernel's resources (:data:`RESOURCE_COLUMNS`) and its main loop's reading
    (:data:`convbench.build.sass.COLUMNS`, empty where the SASS was not read)."""
    row = {"kernel": k.name, "registers": k.registers, "shared": k.shared, "stack": k.stack,
           "spill_stores": k.spill_stores, "spill_loads": k.spill_loads,
           "threads": k.threads, "blocks": k.blocks, "blocks_per_sm": k.blocks_per_sm,
           "occupancy": round(k.occupancy, 3), "limiter": k.limiter,
           "waves": round(k.waves, 2), "dynamic_shared": k.dynamic_shared,
           "wgmma_notes": k.wgmma_notes}
    row.update(k.sass.row() if k.sass else dict.fromkeys(sass.COLUMNS, ""))
    return row


def read_csv(path: Path) -> List[Dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _probe_job(job) -> Probe:
    import warnings
    impl_name, layer_set, layer, params, dtype = job
    from convbench import registry
    warnings.simplefilter("ignore")  # DaCe's codegen warnings would garble the progress
    registry.load_implementations()
    return probe(impl_name, layer_set, layer, params, dtype=dtype, disassemble=True)


def probe_layers(layers: Sequence[Tuple[str, str, int]]):
    """The :class:`~convbench.layersets.layer.Layer` of each ``(set, name, batch)``."""
    from convbench.layersets.sets import load_layers
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
                   f"occupancy {k.occupancy:.2f}, " + fma_text(k))
                + f"  [{time.perf_counter() - t0:.0f} s]")
    return [found[i] for i in range(len(todo))]


def share_text(row: Mapping[str, object]) -> str:
    """``FFMA 47%`` of a row (``4 HGMMA`` for a wgmma loop, whose instruction share says
    little: one HGMMA does 16 HMMAs' work per warp), or empty where its SASS was not read."""
    if row.get("fma_share") in (None, ""):
        return ""
    if str(row.get("hgmma") or "0") != "0":
        return f"{row['hgmma']} HGMMA"
    if not float(row["fma_share"]):
        return "no FMA"
    return f"{row.get('fma_kind') or 'FMA'} {100 * float(row['fma_share']):.0f}%"


def fma_text(k: Kernel) -> str:
    """``FFMA 47% of a 552-instruction main loop``, or that the SASS was not read."""
    r = k.sass
    if r is None:
        return "SASS not read"
    return f"{r.fma_kind or 'FMA'} {100 * r.fma_share:.0f}% of a {r.instructions}-instruction " + (
        "main loop" if r.loops else "loop-free body")


def per_fma_text(row: Mapping[str, object]) -> str:
    """A row's shared loads per FMA by width, ``LDS 0.49`` or ``LDS.128 0.12, LDS 0.06``."""
    from convbench.build.sass import LDS_WIDTHS, _column
    parts = [f"{w} {float(row[_column(w)]):.2f}" for w in LDS_WIDTHS
             if row.get(_column(w)) not in (None, "") and float(row[_column(w)])]
    return ", ".join(parts) or ("none" if row.get("fma_share") not in (None, "") else "")


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
    from convbench import registry
    todo = []
    for layer_set, layer in probe_layers(layers):
        for name in impls:
            impl = registry.get(name)
            todo.append((name, layer_set, layer, dict(impl.resolve_params({})),
                         impl.precisions[0]))
    say(f"reading {len(todo)} builds (implementations x layers), {jobs} at a time")
    return run_probes(todo, jobs, say)


def write_readings(out: Path, probes: Sequence[Probe], info: Mapping[str, str]) -> Path:
    """``readings.csv`` (every kernel) and ``README.md`` (the main kernels) in ``out``;
    the rows of implementations not read this time are kept from the file there."""
    from convbench import registry
    from convbench.base import tables
    from convbench.base.files import write_atomic
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
                      share_text(r), per_fma_text(r), r["ldg"], r["ldgsts"], r["int_per_fma"],
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
