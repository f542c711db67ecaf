"""What the timed samples of an end-to-end run say: per backend, phase and part the median of
the process medians and the spreads between and within processes; the faster of torch's
memory formats, which the run is compared with; and each part's share of the difference
between the two sides, with the ratio the step would have without it.

The samples are ``samples[backend][phase][part]``: one list of milliseconds per process
(one list where the run timed in its own process).  A part is a layer's forward
(``conv2.fwd``), its backward in the training step (``conv2.bwd``), ``other`` (everything
outside the convolutions) or ``total`` (the whole step).
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence

Samples = Dict[str, Dict[str, Dict[str, List[List[float]]]]]

#: torch's two memory formats, each a contestant of the end-to-end run.
TORCH_FORMATS = ("torch-ncdhw", "torch-ndhwc")
#: Column heads of the printed table for names wider than its columns.
SHORT = {"torch-compile": "torch.comp."}


def _iqr_over_median(values: Sequence[float]) -> float:
    import numpy
    q1, med, q3 = numpy.quantile(sorted(values), (0.25, 0.5, 0.75))
    return float((q3 - q1) / med) if med > 0 else float("nan")


def part_stats(per_process: Sequence[Sequence[float]]) -> Dict[str, Any]:
    """One part of one backend: ``median_ms`` (the median of the process medians),
    ``process_medians_ms``, ``spread_between`` ((max - min) / median of the process
    medians) and ``spread_within`` (the median over processes of IQR / median)."""
    medians = [statistics.median(s) for s in per_process if s]
    if not medians:
        return {"median_ms": float("nan"), "process_medians_ms": [], "spread_between": 0.0,
                "spread_within": float("nan")}
    mid = statistics.median(medians)
    return {"median_ms": mid, "process_medians_ms": medians,
            "spread_between": (max(medians) - min(medians)) / mid if mid > 0 else 0.0,
            "spread_within": statistics.median(_iqr_over_median(s) for s in per_process if s)}


def stats_columns(per_process: Sequence[Sequence[float]]) -> Dict[str, float]:
    """The summary columns of one part of one backend: the median of the process medians
    and the spread between the processes."""
    s = part_stats(per_process)
    return {"median_of_processes_ms": s["median_ms"],
            "spread_between_processes": s["spread_between"]}


def medians(samples: Samples) -> Dict[str, Dict[str, Dict[str, float]]]:
    """``[backend][phase][part]`` -> the median of the process medians."""
    return {b: {ph: {part: part_stats(s)["median_ms"] for part, s in parts.items()}
                for ph, parts in per.items()} for b, per in samples.items()}


def faster_torch(samples: Samples, phase: str,
                 candidates: Sequence[str] = TORCH_FORMATS) -> Optional[str]:
    """The torch contestant with the lower step (``total``) in ``phase``."""
    timed = {b: part_stats(samples[b][phase]["total"])["median_ms"]
             for b in candidates if b in samples and "total" in samples[b].get(phase, {})}
    return min(timed, key=timed.get) if timed else None


def shares(torch_ms: Mapping[str, float], dace_ms: Mapping[str, float]
           ) -> Dict[str, Dict[str, float]]:
    """Per part but the total: its ``torch_ms``, ``dace_ms``, ``difference_ms`` (DaCe's
    less torch's), ``share`` of the step's difference (the shares of all parts sum to
    about 1: medians do not add up exactly), and ``ratio_without``, the step's ratio with
    the part left out of both sides.  A part whose share is large, or whose removal moves
    the ratio past 1, carries the result."""
    total_t, total_d = torch_ms["total"], dace_ms["total"]
    diff = total_d - total_t
    out = {}
    for part in torch_ms:
        if part == "total" or part not in dace_ms:
            continue
        t, d = torch_ms[part], dace_ms[part]
        rest_t = total_t - t
        out[part] = {"torch_ms": t, "dace_ms": d, "difference_ms": d - t,
                     "share": (d - t) / diff if diff else float("nan"),
                     "ratio_without": (total_d - d) / rest_t if rest_t > 0 else float("nan")}
    return out


def compare(samples: Samples, phases: Sequence[str], dace: str = "dace") -> Dict[str, Any]:
    """Per phase: the faster torch format, every backend's step and its spreads, DaCe's
    ratio to the faster torch (and each process's own: the processes time every backend,
    so a process slowed as a whole keeps its ratio), and the parts' shares (metadata
    ``comparison``)."""
    out = {}
    for phase in phases:
        best = faster_torch(samples, phase)
        stats = {b: part_stats(per[phase]["total"]) for b, per in samples.items()}
        mids = medians(samples)
        entry = {"torch": best, "step_ms": {b: s["median_ms"] for b, s in stats.items()},
                 "parts_ms": {b: {part: ms for part, ms in mids[b][phase].items()
                                  if part != "total"} for b in mids},
                 "spread_between": {b: s["spread_between"] for b, s in stats.items()},
                 "spread_within": {b: s["spread_within"] for b, s in stats.items()},
                 "processes": max(len(per[phase]["total"]) for per in samples.values())}
        if best is not None and dace in samples:
            entry["ratio"] = stats[dace]["median_ms"] / stats[best]["median_ms"]
            # each process times every backend, interleaved: its own ratio is a paired one
            entry["ratio_per_process"] = [
                d / t for d, t in zip(stats[dace]["process_medians_ms"],
                                      stats[best]["process_medians_ms"]) if t > 0]
            entry["parts"] = shares(mids[best][phase], mids[dace][phase])
        out[phase] = entry
    return out


def table(comparison: Mapping[str, Any], layers: Sequence[str], backends: Sequence[str],
          dace: str = "dace") -> List[str]:
    """The run's table: per layer (forward and backward together), ``other`` and the step,
    each backend's median of process medians, DaCe over the faster torch, and the part's
    share of the difference; then the spreads."""
    lines = []
    for phase, c in comparison.items():
        best = c.get("torch")
        names = [b for b in backends if b != dace] + [dace]
        lines.append(f"\n{phase} (median of {c['processes']} process median(s), ms; ratio and "
                     f"share against the faster torch, {best}):")
        lines.append(f"{'part':10s}" + "".join(f"{SHORT.get(b, b):>13s}" for b in names)
                     + f"{'ratio':>8s}{'share':>8s}{'w/o':>7s}")
        parts = c.get("parts", {})
        for name in list(layers) + ["other"]:
            group = [p for p in parts if p == name or p.split(".")[0] == name]
            if not group:
                continue
            t = sum(parts[p]["torch_ms"] for p in group)
            d = sum(parts[p]["dace_ms"] for p in group)
            share = sum(parts[p]["share"] for p in group)
            without = (c["step_ms"][dace] - d) / (c["step_ms"][best] - t) \
                if c["step_ms"][best] - t > 0 else float("nan")
            row = "".join(_ms_cell(_part_ms(c, b, group)) for b in names[:-1])
            lines.append(f"{name:10s}{row}{d:11.2f}ms{d / t if t > 0 else float('nan'):7.2f}x"
                         f"{share:7.0%} {without:5.2f}x")
        step = "".join(f"{c['step_ms'][b]:11.2f}ms" for b in names)
        lines.append(f"{'step':10s}{step}{c.get('ratio', float('nan')):7.2f}x")
        if len(c.get("ratio_per_process", [])) > 1:
            lines.append(f"{'':10s}per process: " + ", ".join(
                f"{r:.3f}x" for r in c["ratio_per_process"]))
        lines.append(f"{'spread':10s}" + "".join(
            f"{c['spread_between'][b]:>8.1%} {c['spread_within'][b]:>4.0%}" for b in names)
            + "   (between processes, within one: IQR/median)")
    return lines


def _ms_cell(ms: float) -> str:
    """A table cell of 13 characters: milliseconds, or "-" for a part a backend does not
    time apart (torch.compile's step is one span)."""
    return f"{ms:11.2f}ms" if ms == ms else f"{'-':>13s}"


def _part_ms(c: Mapping[str, Any], backend: str, group: Sequence[str]) -> float:
    return sum(c["parts_ms"][backend].get(p, float("nan")) for p in group)
