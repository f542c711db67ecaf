"""Result files of a profiling run, written into one folder.

docs/profiling.md, "Result files", describes the three files;
:mod:`convbench.results.schema` declares their columns.  All three are rewritten atomically
after every layer, so an interrupted run keeps every layer it finished and no reader sees a
half-written file.
"""

import csv
import dataclasses
import datetime
import hashlib
import io
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from convbench.results import schema
from convbench.base.files import make_folder, write_atomic
from convbench.layersets.layer import Layer
from convbench.timing.timers import Timing

# The schema's names, for the callers that import them from here.
DACE, SAMPLE_COLUMNS, SUMMARY_COLUMNS = schema.DACE, schema.SAMPLE_COLUMNS, schema.SUMMARY_COLUMNS


def save_records(path: os.PathLike, meta: Dict[str, Any], records: List[Any]) -> Path:
    """Write a benchmark script's raw numbers as ``{"meta": ..., "records": ...}`` JSON."""
    path = Path(path)
    make_folder(path.parent)
    write_atomic(path, json.dumps({"meta": meta, "records": records}, indent=1, default=str))
    print(f"wrote {path}")
    return path


def fastest_vendor(medians: Mapping[str, Optional[float]]
                   ) -> Tuple[Optional[str], Optional[float]]:
    """The baseline of a ratio: the fastest of the vendor paths timed (name to median
    ms; None or NaN: not timed), as ``(name, ms)``, or ``(None, None)``."""
    timed = {k: v for k, v in medians.items() if v is not None and not math.isnan(v)}
    if not timed:
        return None, None
    name = min(timed, key=timed.get)
    return name, timed[name]


def spearman(xs: List[float], ys: List[float]) -> Optional[float]:
    """Spearman's rank correlation of two equally long samples (ties get their mean
    rank); None under three pairs or where either sample is constant."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None

    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return sxy / (sxx * syy) ** 0.5 if sxx and syy else None


def compulsory_bytes(layer: Layer, element_bytes: int = 4) -> int:
    """Bytes a forward pass must move at least: input and filter read, output written."""
    numel = 0
    for shape in (layer.input_shape, layer.filter_shape, layer.output_shape):
        count = 1
        for s in shape:
            count *= s
        numel += count
    return numel * element_bytes


@dataclasses.dataclass
class Measurement:
    """One backend timed on one layer."""

    backend: str
    timing: Timing


class RunWriter:
    """Collects the measurements of a run and keeps its folder up to date."""

    def __init__(self, outdir: os.PathLike, metadata: Dict[str, Any], references: List[str],
                 columns: Sequence[str] = (), ratio_of: str = "median_ms"):
        """``columns``: summary columns of this kind of run beyond the ratio columns, filled
        per backend by :meth:`add_entry`'s ``columns``; ``ratio_of``: the column the
        ``ratio_vs_*`` columns divide (one of ``columns`` where the run's figure is not the
        median of its pooled samples)."""
        self.outdir = Path(outdir)
        make_folder(self.outdir)
        self.metadata = dict(metadata, status=schema.RUNNING, layers_done=[])
        self.references = list(references)
        self.columns = list(columns)
        self.ratio_of = ratio_of
        self.samples: List[Dict[str, Any]] = []
        self.summary: List[Dict[str, Any]] = []
        self._write()

    @property
    def paths(self) -> Dict[str, Path]:
        return {"samples": self.outdir / schema.SAMPLES, "summary": self.outdir / schema.SUMMARY,
                "metadata": self.outdir / schema.METADATA}

    def add_layer(self, index: int, layer: Layer, implementation: str,
                  measurements: List[Measurement], extra: Optional[Dict[str, Any]] = None):
        """Record one layer's measurements and rewrite the files."""
        return self.add_entry(index, layer.name, implementation, measurements,
                              geometry=layer.describe(), batch=layer.batch, flop=layer.flops(),
                              nbytes=compulsory_bytes(layer), extra=extra)

    def add_entry(self, index: int, name: str, implementation: str,
                  measurements: List[Measurement], geometry: str = "", batch: Any = "",
                  flop: Optional[float] = None, nbytes: Optional[float] = None,
                  extra: Optional[Dict[str, Any]] = None,
                  columns: Optional[Mapping[str, Mapping[str, Any]]] = None):
        """Record the measurements of one timed thing (a layer, or a part of a network
        step, with its FLOPs and bytes where they are known) and rewrite the files.
        ``columns``: per backend, values of the writer's own columns."""
        rows = []
        for m in measurements:
            for i, t in enumerate(m.timing.samples_ms):
                self.samples.append({"layer_index": index, "layer": name,
                                     "implementation": implementation, "backend": m.backend,
                                     "iteration": i, "time_ms": t})
            stats = m.timing.stats()
            seconds = stats["median_ms"] * 1e-3
            row = {"layer_index": index, "layer": name, "geometry": geometry, "batch": batch,
                   "implementation": implementation, "backend": m.backend, **stats}
            if flop is not None:
                row.update(gflop=flop / 1e9, gflops=flop / seconds / 1e9)
            if nbytes is not None:
                row.update(mbytes=nbytes / 1e6, bandwidth_gbs=nbytes / seconds / 1e9)
            if flop is not None and nbytes:
                row["intensity"] = flop / nbytes
            row.update((columns or {}).get(m.backend, {}))
            rows.append(row)
        medians = {r["backend"]: r[self.ratio_of] for r in rows}
        for r in rows:
            for ref in self.references:
                ratio = r[self.ratio_of] / medians[ref] if ref in medians else ""
                r[schema.ratio_column(ref)] = ratio
        self.summary.extend(rows)
        self.metadata["layers_done"].append(
            dict({"index": index, "layer": name}, **(extra or {}),
                 limited=[m.backend for m in measurements if m.timing.limited]))
        self._write()
        return rows

    def finish(self, status: str = schema.COMPLETE) -> None:
        self.metadata["status"] = status
        self.metadata["finished"] = _now()
        self._write()

    def _write(self) -> None:
        write_atomic(self.paths["samples"], csv_text(schema.SAMPLE_COLUMNS, self.samples))
        columns = (schema.SUMMARY_COLUMNS + [schema.ratio_column(r) for r in self.references]
                   + self.columns)
        write_atomic(self.paths["summary"], csv_text(columns, self.summary))
        write_atomic(self.paths["metadata"], json.dumps(self.metadata, indent=1, default=str))


def csv_text(columns: List[str], rows: List[Dict[str, Any]]) -> str:
    """``rows`` as CSV text with these columns (a missing cell empty, floats to 6 digits)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(row.get(k, "")) for k in columns})
    return buf.getvalue()


def _cell(value):
    if isinstance(value, float):
        return f"{value:.6g}"
    return value


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


#: Untracked files under these folders are results, not sources: they do not make a run
#: dirty.
_NOT_SOURCES = ("results/", "outputs/")


def git_commit(root: Path) -> Dict[str, Any]:
    """The checkout's commit, and whether its sources differ from it: tracked files
    changed, or untracked files that git does not ignore (outside ``results/`` and
    ``outputs/``).  ``changed`` names them (at most 50) and ``diff_sha256`` hashes the
    difference (``git diff HEAD`` and the untracked files' names and contents), so that two
    runs of the same dirty tree can be told apart from two of different ones."""
    def git(*args, text=True):
        return subprocess.run(("git", "-C", str(root)) + args, capture_output=True, text=text,
                              timeout=30)
    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return {"commit": None, "dirty": None}
        tracked = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no")
                   .stdout.splitlines() if line.strip()]
        untracked = sorted(f for f in git("ls-files", "--others", "--exclude-standard")
                           .stdout.splitlines() if f and not f.startswith(_NOT_SOURCES))
        info: Dict[str, Any] = {"commit": head.stdout.strip(),
                                "dirty": bool(tracked or untracked)}
        if info["dirty"]:
            digest = hashlib.sha256(git("diff", "HEAD", "--binary", text=False).stdout)
            for name in untracked:
                digest.update(name.encode() + b"\0")
                try:
                    digest.update((root / name).read_bytes())
                except OSError:
                    pass
            info.update(changed=(tracked + untracked)[:50], changed_count=len(tracked) +
                        len(untracked), diff_sha256=digest.hexdigest())
        return info
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def device_metadata(device: str) -> Dict[str, Any]:
    """The device by name, with driver and CUDA versions on the GPU."""
    from convbench.timing import devices
    out: Dict[str, Any] = {"kind": device, "name": devices.describe(device),
                           "cpu": devices.describe("cpu"), "host": platform.node()}
    if device == "gpu":
        import torch
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        out.update({"gpu": props.name, "compute_capability": f"{props.major}.{props.minor}",
                    "memory_gib": round(props.total_memory / 2 ** 30, 1),
                    "sm_count": props.multi_processor_count, "cuda_runtime": torch.version.cuda,
                    "driver": _nvidia_smi("driver_version")})
    return out


def _nvidia_smi(field: str) -> Optional[str]:
    try:
        out = subprocess.run(("nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"),
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def run_metadata(root: Path, device: str, threads: Optional[int]) -> Dict[str, Any]:
    """Versions, device, threads and commit: the parts of the metadata every run shares."""
    import dace
    import numpy
    import torch
    cudnn = None
    try:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # noqa: BLE001 - a CPU-only torch may not know cuDNN at all
        cudnn = None
    return {
        "timestamp": _now(),
        "command": [Path(sys.argv[0]).name] + sys.argv[1:],
        "git": git_commit(root),
        "versions": {"python": platform.python_version(), "dace": dace.__version__,
                     "torch": torch.__version__, "numpy": numpy.__version__, "cudnn": cudnn},
        "device": device_metadata(device),
        "threads": {"requested": threads, "torch": torch.get_num_threads(),
                    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")},
        "isa": _isa_metadata(torch),
        "caches": _caches_metadata(),
    }


def _caches_metadata() -> Dict[str, Any]:
    """The CPU caches the CPU kernels' blockings were derived from
    (:mod:`convkernels.cpu.caches`), and the online CPUs."""
    from convkernels.cpu.caches import caches
    return dict(caches().describe(), cpus=os.cpu_count())


def _isa_metadata(torch) -> Dict[str, Any]:
    """The vector ISA the CPU kernels are built for, its cap (``$CONVBENCH_ISA``), and
    what torch's own CPU kernels use (ATen's capability, oneDNN's cap)."""
    from convkernels.cpu import isa
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    return {"kernels": isa.widest_isa(), "cap": isa.isa_cap() or None,
            "torch": capability() if capability else None,
            "ONEDNN_MAX_CPU_ISA": os.environ.get("ONEDNN_MAX_CPU_ISA")}
