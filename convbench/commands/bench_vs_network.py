"""Per-layer DaCe/torch ratios of the CPU bench next to those measured inside the network.

Reads result folders only.  ``--bench DIR`` (repeatable, one per run; their rounds are
pooled): a ``bench_cpu.py`` run with one folder per pass (``DIR/fwd``, ``DIR/bwd_data``,
``DIR/bwd_filter``; a single pass's folder also works).  ``--network DIR`` (repeatable, one
per run): ``cosmoflow_end2end.py`` runs. Layers are matched by geometry and batch.  Both
ratios use what the network ran: its DaCe implementation of each pass, and torch in the
network's memory format.  The network's backward part of a layer is its data and filter
gradients together (the filter gradient alone for the first layer), so the bench's side adds
the two passes' medians.

A bench ratio is the median over its (pooled) rounds with their min-max (a folder from
before ``--rounds`` is one round); a network ratio the
median over the runs (each run's ratio: median DaCe ms over median torch ms of that
part) with their min-max.  ``agree`` says whether the two ranges overlap.
"""

import csv
import json
import statistics
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from convbench.base.errors import ArgumentParser, UsageError, run_main

PROG = "bench_vs_network.py"
PASSES = ("fwd", "bwd_data", "bwd_filter")


def build_parser(prog: str = PROG):
    p = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--bench", action="append", required=True, metavar="DIR",
                   help="a bench_cpu.py result folder (with fwd/, bwd_data/, bwd_filter/); "
                   "repeat for each run: their rounds are pooled")
    p.add_argument("--network", action="append", required=True, metavar="DIR",
                   help="a cosmoflow_end2end.py result folder; repeat for each run")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="also write the table (markdown) to FILE")
    return p


def main(argv=None, prog: str = PROG) -> int:
    return run_main(prog, lambda a: _main(a, prog), argv)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UsageError(f"{path}: not a readable result file ({err.__class__.__name__})")


def _bench_rounds(folder: Path) -> Dict[str, Dict[Tuple[str, int], Dict[str, List[float]]]]:
    """pass -> (geometry, batch) -> backend -> per-round medians.  A folder written before
    bench_cpu.py had rounds counts as one round (its summary's medians)."""
    dirs = {p: folder / p for p in PASSES if (folder / p / "summary.csv").is_file()}
    if not dirs and (folder / "summary.csv").is_file():
        dirs = {_read_json(folder / "metadata.json").get("bench_pass", "fwd"): folder}
    if not dirs:
        raise UsageError(f"--bench {folder}: no summary.csv (not a bench_cpu.py folder)")
    out = {}
    for pass_, d in dirs.items():
        geometry, per = {}, {}
        with open(d / "summary.csv") as f:
            summary = list(csv.DictReader(f))
        for row in summary:
            geometry[row["implementation"]] = (row["geometry"], int(row["batch"]))
        if (d / "rounds.csv").is_file():
            with open(d / "rounds.csv") as f:
                rows = [(r["layer"], r["backend"], r["median_ms"]) for r in csv.DictReader(f)]
        else:
            rows = [(r["implementation"], r["backend"], r["median_ms"]) for r in summary]
        for label, backend, ms in rows:
            per.setdefault(geometry[label], {}).setdefault(backend, []).append(float(ms))
        out[pass_] = per
    return out


def _network_runs(folders) -> List[dict]:
    runs = []
    for folder in map(Path, folders):
        meta = _read_json(folder / "metadata.json")
        if meta.get("kind") != "end2end" or not (folder / "summary.csv").is_file():
            raise UsageError(f"--network {folder}: not a cosmoflow_end2end.py result folder")
        parts = {}
        with open(folder / "summary.csv") as f:
            for row in csv.DictReader(f):
                parts.setdefault(row["layer"], {})[row["backend"]] = row
        runs.append({"meta": meta, "parts": parts, "folder": folder})
    return runs


def _range(values: List[float]) -> Tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def _pooled(bench_dirs):
    """The rounds of several bench runs, one after the other."""
    pooled: Dict[str, Dict[Tuple[str, int], Dict[str, List[float]]]] = {}
    for folder in bench_dirs:
        for pass_, per in _bench_rounds(Path(folder)).items():
            for key, backends in per.items():
                for backend, values in backends.items():
                    pooled.setdefault(pass_, {}).setdefault(key, {}).setdefault(
                        backend, []).extend(values)
    return pooled


def _baseline(meta: dict, phase: str) -> str:
    """The torch backend an end-to-end run compares with in ``phase``."""
    return (meta.get("torch_best") or {}).get(phase) or "torch"


def compare(bench_dirs: Sequence, network_dirs: Sequence) -> List[dict]:
    """One row per network part that the bench measured (forward and training backward)."""
    bench = _pooled(bench_dirs)
    runs = _network_runs(network_dirs)
    rows = []
    for phase, suffix in (("forward", "fwd"), ("train", "bwd")):
        # the network's baseline: the faster of torch's formats in this phase (runs from
        # before both were timed: torch in the run's one format); the bench's torch in it
        base = _baseline(runs[0]["meta"], phase)
        layout = base if base != "torch" else \
            "torch-" + runs[0]["meta"].get("memory_format", "ncdhw")
        for name, part in runs[0]["parts"].items():
            if not name.startswith(f"{phase}.") or not name.endswith(f".{suffix}"):
                continue
            layer = name.split(".")[1]
            geometry = (part[base]["geometry"], int(part[base]["batch"]))
            impls = runs[0]["meta"]["implementations"][layer]
            passes = ["fwd"] if suffix == "fwd" else \
                [p for p in ("bwd_data", "bwd_filter") if p in impls and
                 impls[p] in part[base]["implementation"].split("+")]
            try:
                per_round = [
                    sum(bench[p][geometry][impls[p]][r] for p in passes) /
                    sum(bench[p][geometry][layout][r] for p in passes)
                    for r in range(min(len(bench[p][geometry][layout]) for p in passes))]
            except KeyError:
                continue  # the bench did not time this layer, pass or implementation
            net = [float(run["parts"][name]["dace"]["median_ms"]) /
                   float(run["parts"][name][_baseline(run["meta"], phase)]["median_ms"])
                   for run in runs if name in run["parts"]]
            b, n = _range(per_round), _range(net)
            rows.append({"part": f"{layer} {'forward' if suffix == 'fwd' else 'backward'}",
                         "geometry": geometry[0], "implementation": "+".join(impls[p] for p in passes),
                         "bench": b, "network": n, "rounds": len(per_round), "runs": len(net),
                         "agree": b[1] <= n[2] and n[1] <= b[2]})
    if not rows:
        raise UsageError("no layer of the network runs is in the bench folder (geometry and "
                         "batch must match)")
    return rows


def table(rows) -> str:
    from convbench.base.tables import markdown

    def cell(r):
        return f"{r[0]:.2f} ({r[1]:.2f}-{r[2]:.2f})"
    return markdown(["part", "geometry", "DaCe implementation", "bench: median (range)",
                     "network: median (range)", "ranges overlap"],
                    [[r["part"], r["geometry"], r["implementation"], cell(r["bench"]),
                      cell(r["network"]), "yes" if r["agree"] else "no"] for r in rows],
                    align="lllrrl")


def _main(argv, prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    rows = compare(args.bench, args.network)
    text = table(rows)
    print(text)
    agree = sum(r["agree"] for r in rows)
    print(f"ranges overlap on {agree} of {len(rows)} parts "
          f"(bench: {rows[0]['rounds']} rounds; network: {rows[0]['runs']} runs)")
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0
