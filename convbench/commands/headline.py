"""The README's headline figures ("Where it stands"), computed from committed results.

    convbench status --headline   # the Markdown bullets README.md embeds

Each figure comes from files under ``results/``; a test keeps the README's block equal to
this output, so a figure typed by hand, or left behind by a newer run, fails it.  The
sources, each named in the text it produces:

- CPU layers: the bench of both 128^3 CosmoFlow sets at batch 2 on the AVX2 EPYC, three
  passes (``rounds.csv``: per round and layer the fastest DaCe-generated median over the
  faster torch layout's; a layer's ratio is its median over rounds, as the bench reports).
- CPU training step: the newest end-to-end run under ``results/cpu/`` that timed torch in
  both memory formats (its ``metadata.json`` ``comparison``), in float32, with the fused
  blocks and the machine's own vector ISA (no ``$CONVBENCH_ISA`` cap).
- GPU layers: the newest tune campaign's FP32 cases (each layer's fastest verified
  configuration over the fastest vendor path), and the tensor-core implementations'
  range over the campaigns ``convbench status`` reads them from.
- GPU training step: the newest end-to-end run of a GPU campaign, read with the rule of
  :mod:`convbench.results.comparison` whatever it recorded.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from convbench.results import gpu_summaries
from convbench.results import comparison

#: The CPU bench the headline quotes, under ``results/``.
CPU_BENCH = "cpu/epyc_f25m1_avx2/bench_cpu_cosmoflow_mlperf+cosmoflow_b2_symmetric"
PASSES = (("fwd", "forward"), ("bwd_data", "data gradient"), ("bwd_filter", "filter gradient"))
BEGIN = "<!-- begin: convbench status --headline -->"
END = "<!-- end: convbench status --headline -->"


def _rel(path: Path, results: Path) -> str:
    return "results/" + path.relative_to(results).as_posix()


def _range(values: List[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}x"


def _meta(folder: Path) -> Dict[str, Any]:
    try:
        return json.loads((folder / "metadata.json").read_text())
    except (OSError, ValueError):
        return {}


def cpu_layers(results: Path) -> Tuple[Dict[str, Tuple[float, str]], Dict[str, Any]]:
    """Per pass: (the worst layer's ratio, that layer), and the fwd run's metadata."""
    worst = {}
    for pass_, _ in PASSES:
        per_layer: Dict[str, Dict[str, float]] = defaultdict(dict)
        with open(results / CPU_BENCH / pass_ / "rounds.csv", newline="") as f:
            for row in csv.DictReader(f):
                per_layer[row["layer"]][row["round"]] = float(row["ratio"])
        ratios = {layer: statistics.median(r.values()) for layer, r in per_layer.items()}
        layer = max(ratios, key=ratios.get)
        worst[pass_] = (ratios[layer], layer)
    return worst, _meta(results / CPU_BENCH / "fwd")


def end2end_runs(root: Path) -> List[Tuple[Path, Dict[str, Any]]]:
    """The finished end-to-end runs with a training step under ``root``, oldest first."""
    runs = []
    for meta_path in root.rglob("metadata.json"):
        meta = _meta(meta_path.parent)
        if meta.get("kind") == "end2end" and meta.get("status") == "complete" and any(
                r.get("layer") == "train.total" for r in _summary(meta_path.parent)):
            runs.append((meta_path.parent, meta))
    return sorted(runs, key=lambda r: (str(r[1].get("finished", "")), str(r[0])))


def _summary(folder: Path) -> List[Dict[str, str]]:
    try:
        with open(folder / "summary.csv", newline="") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def step_comparison(folder: Path, meta: Dict[str, Any]) -> Dict[str, Any]:
    """The training step's comparison: the run's own (runs since issue 77), else the same
    rule applied to its summary's medians (one torch contestant, one process)."""
    if "comparison" in meta:
        return meta["comparison"]["train"]
    medians: Dict[str, Dict[str, float]] = defaultdict(dict)
    for row in _summary(folder):
        phase, _, part = row["layer"].partition(".")
        if phase == "train":
            medians[row["backend"]][part] = float(row["median_ms"])
    torch = next(b for b in meta.get("references", ["torch"]) if b in medians)
    return {"torch": torch, "step_ms": {b: m["total"] for b, m in medians.items()},
            "ratio": medians["dace"]["total"] / medians[torch]["total"], "processes": 1,
            "parts": comparison.shares(medians[torch], medians["dace"])}


def _carrier(c: Dict[str, Any], folder: Path) -> str:
    """The part with the largest share of the difference, its implementation, and the
    step's ratio without it."""
    impls = {row["layer"].partition(".")[2]: row["implementation"] for row in _summary(folder)
             if row["layer"].startswith("train.") and row["backend"] == "dace"}
    parts = {k: v for k, v in c.get("parts", {}).items() if k != "other"}
    if not parts:
        return ""
    name = max(parts, key=lambda k: abs(parts[k]["difference_ms"]))
    p = parts[name]
    layer, _, kind = name.partition(".")
    what = f"{layer}'s {'forward' if kind == 'fwd' else 'backward'}" + (
        f" (`{impls[name]}`)" if impls.get(name) else "")
    verb = "saves" if p["difference_ms"] < 0 else "costs"
    return (f"{what} {verb} {abs(p['difference_ms']):.2f} ms of the "
            f"{abs(c['step_ms']['dace'] - c['step_ms'][c['torch']]):.2f} ms difference "
            f"(without it, {p['ratio_without']:.2f}x)")


def _machine(meta: Dict[str, Any], results: Optional[Path] = None,
             folder: Optional[Path] = None) -> str:
    """The device a run names; for a CPU run, the machine as ``results/cpu/README.md``'s
    table names the folder it is under (the metadata of older runs names no CPU model)."""
    if results is not None and folder is not None:
        machine = folder.relative_to(results / "cpu").parts[0]
        try:
            rows = (results / "cpu" / "README.md").read_text().splitlines()
        except OSError:
            rows = []
        for row in rows:
            if row.startswith("| ") and f"[{machine}/]" in row:
                return row.split("|")[1].strip()
    return str(meta.get("device", {}).get("name", "an unnamed device"))


def _threads(meta: Dict[str, Any]) -> str:
    threads = meta.get("threads")
    return str(threads.get("torch", "?") if isinstance(threads, dict) else threads)


def cpu_step(results: Path) -> Optional[str]:
    # the project's default path: float32, not a run that turned the fused blocks off or
    # capped the vector ISA below the machine's ($CONVBENCH_ISA)
    runs = [(f, m) for f, m in end2end_runs(results / "cpu")
            if "comparison" in m and "--no-fuse" not in m.get("command", [])
            and not (m.get("isa") or {}).get("cap")
            and (m.get("precision") or {}).get("label", "float32") == "float32"]
    if not runs:
        return None
    folder, meta = runs[-1]
    c = meta["comparison"]["train"]
    fwd = meta["comparison"]["forward"]
    t, other = c["torch"], next(f for f in comparison.TORCH_FORMATS if f != c["torch"])
    spread = ", ".join(f"{b} {c['spread_between'][b]:.1%}" for b in (t, "dace"))
    return (f"- **CPU training step ({_machine(meta, results, folder)}, {_threads(meta)} "
            "threads, "
            f"{meta['model']} {meta['size']}^3 b{meta['batch']}).** DaCe's step "
            f"{c['step_ms']['dace']:.1f} ms against torch's {c['step_ms'][t]:.1f} ms in its "
            f"faster format ({t[6:].upper()}; {other[6:].upper()} {c['step_ms'][other]:.1f} ms): "
            f"**{c['ratio']:.2f}x**; the forward pass {fwd['ratio']:.2f}x. Median of "
            f"{c['processes']} processes (spread between them: {spread}; DaCe over torch "
            f"within each: {_range(c.get('ratio_per_process') or [c['ratio']])}); "
            f"{_carrier(c, folder)}. {_chosen(meta)} ([run]({_rel(folder, results)}/), "
            "[docs](docs/end2end.md)).")


def _chosen(meta: Dict[str, Any]) -> str:
    """How the run's kernels were chosen, over the layer-passes its step runs (the first
    layer computes no data gradient)."""
    why = [w for i, per in enumerate(meta.get("chosen_by", {}).values())
           for p, w in per.items() if not (i == 0 and p == "bwd_data")]
    here = sum("measured here" in w for w in why)
    return (f"Kernels: {here} of {len(why)} layer-passes as measured on this machine "
            "(`--autotune`)" + (", the others by rule" if here < len(why) else ""))


def gpu_layers(results: Path) -> Optional[str]:
    tuned = gpu_summaries.campaigns(results, tune=True)
    if not tuned:
        return None
    folder = tuned[-1][0]
    best: Dict[str, Dict[Tuple[str, ...], float]] = defaultdict(dict)
    for impl, (_, _, per_problem) in gpu_summaries.gpu_problems(folder).items():
        for problem, ratios in per_problem.items():
            if problem[-1] != "float32":
                continue
            pass_ = problem[3]
            best[pass_][problem] = min(min(ratios), best[pass_].get(problem, float("inf")))
    texts = [f"{label} {_range(list(best[p].values()))}" for p, label in PASSES if best[p]]
    sets = sorted({problem[0] for per in best.values() for problem in per})
    try:
        device = json.loads((folder / "campaign.json").read_text())["device"]
    except (OSError, ValueError, KeyError):
        device = folder.name
    return (f"- **GPU layers ({device}, FP32).** On the "
            f"layers of the newest tune campaign ({', '.join(sets)}), the fastest verified "
            f"DaCe configuration per layer over the fastest vendor path (cuDNN or torch, "
            f"either memory format): {', '.join(texts)}; one process per case "
            f"([{folder.name}]({_rel(folder, results)}/README.md)). Every implementation "
            "with a GPU schedule verifies against torch float64 and cuDNN.")


def gpu_tensor_cores(results: Path) -> Optional[str]:
    from .. import registry
    gpu = gpu_summaries.gpu_status(results)
    ratios, names = [], set()
    for impl in registry.all_implementations().values():
        if "float32" in impl.precisions or impl.name not in gpu:
            continue
        (_, _, r), campaign = gpu[impl.name]
        ratios += r
        names.add(campaign)
    if not ratios:
        return None
    links = ", ".join(f"[{n}](results/gpu/{n}/README.md)" for n in sorted(names))
    return (f"- **Tensor cores (FP16, BF16, TF32; `mma.sync`).** {_range(ratios)} the fastest "
            f"vendor path in the same precision, over the verified cases of {links}.")


def gpu_step(results: Path) -> Optional[str]:
    runs = end2end_runs(results / "gpu")
    if not runs:
        return None
    folder, meta = runs[-1]
    c = step_comparison(folder, meta)
    t = c["torch"]
    text = (f"- **GPU training step ({_machine(meta)}, FP32, {meta['model']} "
            f"{meta['size']}^3 b{meta['batch']}).** DaCe {c['step_ms']['dace']:.2f} ms against "
            f"torch {c['step_ms'][t]:.2f} ms: **{c['ratio']:.2f}x**, "
            + (f"median of {c['processes']} processes" if c["processes"] > 1 else
               "one process") + f"; {_carrier(c, folder)}")
    if t == "torch":  # a run before issue 77: torch in one format, DaCe's
        fmt = str(meta.get("memory_format", "?")).upper()
        text += (f". torch ran only in DaCe's format ({fmt})")
        other = [(f, m) for f, m in runs[:-1] if m.get("device", {}).get("name") ==
                 meta.get("device", {}).get("name") and m.get("memory_format") !=
                 meta.get("memory_format") and m.get("model") == meta.get("model")
                 and m.get("size") == meta.get("size") and m.get("batch") == meta.get("batch")]
        if other:
            f2, m2 = other[-1]
            c2 = step_comparison(f2, m2)
            ms = c2["step_ms"][c2["torch"]]
            text += (f"; its {str(m2.get('memory_format')).upper()} step in an earlier run "
                     f"was {ms:.2f} ms ([{f2.parent.name}]({_rel(f2, results)}/)), "
                     f"{c['step_ms']['dace'] / ms:.2f}x against it")
    return text + f" ([run]({_rel(folder, results)}/))."


def markdown(results: Path) -> str:
    """The bullets README.md embeds between :data:`BEGIN` and :data:`END`."""
    worst, meta = cpu_layers(results)
    cpu = (f"- **CPU layers ({_machine(meta, results, results / CPU_BENCH)}, "
           f"{_threads(meta)} threads, batch {meta.get('batch', 2)}).** The "
           "register-blocked kernels against torch's conv3d (oneDNN) in its faster layout, "
           "worst layer of both 128^3 CosmoFlow sets, median of 3 rounds: "
           + ", ".join(f"{label} {worst[p][0]:.2f}x ({worst[p][1]})" for p, label in PASSES)
           + f" ([run]({_rel(results / CPU_BENCH, results)}/), "
           "[method](docs/benchmarking.md)).")
    lines = [cpu, cpu_step(results), gpu_layers(results), gpu_tensor_cores(results),
             gpu_step(results)]
    return "\n".join(line for line in lines if line) + "\n"


def block(text: str) -> Optional[str]:
    """The headline block of a README's text, without its markers, or None."""
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"
