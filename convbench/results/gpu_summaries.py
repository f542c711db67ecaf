"""What the GPU campaigns' summaries say per implementation: the campaign folders under
``results/gpu/`` (``<date>_<device>/summary.csv``), which one each implementation's figures
come from, and DaCe's time over the fastest vendor path (cuDNN or torch, either memory
format, the same precision) per verified case.  ``convbench status`` and its headline read
them; nothing here measures."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from convbench.results import writer as results

VENDOR_COLUMNS = ("cudnn_ms", "torch_ms", "cudnn_other_ms", "torch_other_ms")


def read_csv(path: Path) -> List[Dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def campaigns(results: Path, tune: bool = False) -> List[Tuple[Path, bool]]:
    """The GPU campaign folders with a summary, oldest first (folders are named
    ``<date>_<device>``), each with whether its cases phase finished; the tune campaigns
    alone with ``tune``, else the others."""
    import json
    out = []
    for folder in sorted(p.parent for p in (results / "gpu").glob("*/summary.csv")):
        def read(name):
            try:
                return json.loads((folder / name).read_text())
            except (OSError, ValueError):
                return {}
        if (read("campaign.json").get("options", {}).get("tier") == "tune") != tune:
            continue
        cases = read("state.json").get("phases", {}).get("cases", {})
        out.append((folder, cases.get("status") == "done"))
    return out


def gpu_status(results: Path) -> Dict[str, Tuple[Tuple[int, int, List[float]], str]]:
    """implementation -> (:func:`gpu_cases`' counts, campaign name): the newest campaign
    that ran it to the end of its cases, else the newest that ran it at all (a call cut
    short covers a few layers, but a fault it found still shows). An implementation that
    only a tune campaign ran takes the newest of those, each layer's fastest
    configuration giving its ratio."""
    chosen: Dict[str, Tuple[Tuple[int, int, List[float]], str, bool]] = {}
    for folder, finished in campaigns(results):
        for impl, counts in gpu_cases(folder).items():
            if impl not in chosen or finished or not chosen[impl][2]:
                chosen[impl] = (counts, folder.name, finished)
    tuned: Dict[str, Tuple[Tuple[int, int, List[float]], str, bool]] = {}
    for folder, finished in campaigns(results, tune=True):
        for impl, counts in gpu_cases(folder, best_per_layer=True).items():
            if impl not in chosen:
                tuned[impl] = (counts, folder.name, finished)
    chosen.update(tuned)
    return {impl: (counts, name) for impl, (counts, name, _) in chosen.items()}


def gpu_cases(campaign: Optional[Path], best_per_layer: bool = False
              ) -> Dict[str, Tuple[int, int, List[float]]]:
    """implementation -> (cases verified, cases run, DaCe / fastest vendor per verified case;
    with ``best_per_layer``, per layer the ratio of its fastest verified case: a tune
    campaign's cases are configurations of one layer)."""
    out = {}
    for impl, (verified, run, per_problem) in gpu_problems(campaign).items():
        out[impl] = (verified, run, [min(r) for r in per_problem.values()] if best_per_layer
                     else [x for r in per_problem.values() for x in r])
    return out


Problem = Tuple[str, ...]


def gpu_problems(campaign: Optional[Path]
                 ) -> Dict[str, Tuple[int, int, Dict[Problem, List[float]]]]:
    """implementation -> (cases verified, cases run, per problem (layer set, layer, batch,
    pass, precision) the ratios DaCe / fastest vendor of its verified cases, in the
    campaign's order)."""
    from convbench import registry
    out: Dict[str, Tuple[int, int, Dict[Problem, List[float]]]] = {}
    if campaign is None:
        return out
    rows = [r for r in read_csv(campaign / "summary.csv") if not r.get("planted")]
    known = registry.all_implementations()

    def problem(row):  # the vendors are timed once per layer, batch, pass and precision
        impl = known.get(row["impl"])
        if impl is None:
            return row["layer_set"], row["layer"], row["batch"], row["impl"]
        parts = row["id"].split(".")  # a precision other than float32 is one part of the id
        precision = next((p for p in impl.precisions if p in parts), impl.precisions[0])
        return row["layer_set"], row["layer"], row["batch"], str(impl.pass_), precision
    vendors: Dict[tuple, Dict[str, float]] = defaultdict(dict)
    for row in rows:
        timed = vendors[problem(row)]
        for c in VENDOR_COLUMNS:
            if row.get(c):
                timed[c] = min(float(row[c]), timed.get(c, float("inf")))
    for row in rows:
        verified, run, per_problem = out.get(row["impl"], (0, 0, {}))
        run += row["status"] != "refused"
        if row["status"] == "verified":
            verified += 1
            _, fastest = results.fastest_vendor(vendors[problem(row)])
            if row.get("dace_ms") and fastest:
                per_problem.setdefault(problem(row), []).append(float(row["dace_ms"]) / fastest)
        out[row["impl"]] = (verified, run, per_problem)
    return out
