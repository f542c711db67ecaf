"""The status table: per implementation and pass, what the latest committed results say.

    convbench status              # the table, from results/ as committed
    convbench status --markdown   # the same as the Markdown table README.md embeds
    convbench status --headline   # the README's headline figures (convbench.commands.headline)

Columns: the CPU verification of the full test tier (``results/verify/cpu/coverage.csv``,
and the runs of single sweeps in its subfolders: cases verified / failed, float32 apart
from float16 and bfloat16), and the latest GPU campaign (``results/gpu/<date>_<device>/
summary.csv``: cases verified / run, and DaCe's time over the fastest vendor path, cuDNN
or torch in either memory format, as best-worst over the verified cases), and the machine
code of each GPU implementation at its defaults (``results/gpu/sass/readings.csv``,
written by ``convbench sass --all``: the FMA share of its main loop on one deep layer of
each CosmoFlow set).  Nothing is measured here: the table only reads result files, so it
is as current as they are.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Tuple

from convbench.base import tables
from convbench.base.errors import ArgumentParser, UsageError, run_main
from convbench.build.toolchain import PROJECT_ROOT
from convbench.results.gpu_summaries import gpu_status, read_csv

PROG = "convbench status"


def build_parser(prog: str = PROG):
    p = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p.add_argument("--headline", action="store_true",
                   help="print the README's headline figures (\"Where it stands\"), from the "
                   "same results")
    p.add_argument("--results", default=str(PROJECT_ROOT / "results"), metavar="DIR",
                   help="the results folder to read (default: the project's)")
    return p


def main(argv=None, prog: str = PROG) -> int:
    return run_main(prog, lambda a: _main(a, prog), argv)


#: What names one case in a coverage table.
CASE_KEY = ("implementation", "pass", "dtype", "set", "layer", "batch", "target", "params")


def case_key(row: Dict[str, str]) -> Tuple[str, ...]:
    """The case a coverage row is of (tables older than the precisions have no ``dtype``
    column: their rows are float32)."""
    return tuple((row.get(k) or "float32") if k == "dtype" else row.get(k, "") for k in CASE_KEY)


def coverage_runs(results: Path) -> List[Path]:
    """The CPU coverage tables: the full tier's (``verify/cpu/coverage.csv``) and those of
    separate runs in its subfolders at any depth (a sweep run on its own, a rerun of some
    of its cases beside it), oldest run first."""
    root = results / "verify" / "cpu"
    paths = [p for p in [root / "coverage.csv", *sorted(root.glob("*/**/coverage.csv"))]
             if p.is_file()]

    def date(path: Path) -> str:
        meta = path.with_name("metadata.json")
        return results_date(meta) if meta.is_file() else ""
    return sorted(paths, key=date)


def results_date(meta: Path) -> str:
    import json
    try:
        return str(json.loads(meta.read_text()).get("date", ""))
    except (OSError, ValueError):
        return ""


def cpu_verification(results: Path) -> Dict[Tuple[str, str, bool], Tuple[int, int]]:
    """(implementation, pass, 16-bit) -> (cases verified, cases failed) on the CPU, the
    float32 cases apart from the float16 and bfloat16 ones; a case in several tables
    counts as the newest of them found it."""
    latest: Dict[Tuple[str, ...], List[Dict[str, str]]] = {}
    for path in coverage_runs(results):
        found: Dict[Tuple[str, ...], List[Dict[str, str]]] = defaultdict(list)
        for row in read_csv(path):  # within one table, rows of the same case all count
            found[case_key(row)].append(row)
        latest.update(found)
    counts: Dict[Tuple[str, str, bool], List[int]] = defaultdict(lambda: [0, 0])
    for row in (row for rows in latest.values() for row in rows):
        if row.get("target") == "cpu" and row.get("outcome") in ("verified", "failed"):
            half = row.get("dtype", "float32") != "float32"
            counts[(row["implementation"], row["pass"], half)][row["outcome"] == "failed"] += 1
    return {key: (v[0], v[1]) for key, v in counts.items()}


def sass_shares(results: Path) -> Dict[str, List[Tuple[str, float]]]:
    """implementation -> its main loop's (FMA kind, FMA share) on each layer of
    :data:`convbench.build.gpubuild.READING_LAYERS` that was read, in that order."""
    from convbench.build import gpubuild
    readings = gpubuild.load_readings(results / "gpu" / "sass")
    out: Dict[str, List[Tuple[str, float]]] = defaultdict(list)
    for layer_set, _, _ in gpubuild.READING_LAYERS:
        for (impl, lset), row in sorted(readings.items()):
            if lset == layer_set and row.get("fma_share") not in (None, ""):
                out[impl].append((row["fma_kind"], float(row["fma_share"])))
    return dict(out)


def _share_text(shares: List[Tuple[str, float]]) -> str:
    """``FFMA 47% / 46%`` (one share per layer read), or empty."""
    if not shares:
        return ""
    if not any(v for _, v in shares):
        return "no FMA in its kernels"
    kinds = {k for k, _ in shares}
    kind = kinds.pop() if len(kinds) == 1 else "/".join(k or "FMA" for k, _ in shares)
    return f"{kind or 'FMA'} " + " / ".join(f"{100 * v:.0f}%" for _, v in shares)


def share_against_ratio(results: Path) -> str:
    """One sentence: how the FFMA implementations' main-loop FMA share relates to their
    median measured ratio to the fastest vendor (Spearman), over those with both."""
    import statistics
    shares, gpu = sass_shares(results), gpu_status(results)
    pairs = []
    for impl, found in sorted(shares.items()):
        ratios = gpu.get(impl, ((0, 0, []), ""))[0][2]
        if ratios and all(k == "FFMA" for k, _ in found):
            pairs.append((impl, statistics.mean(v for _, v in found), statistics.median(ratios)))
    from convbench.results.writer import spearman
    rho = spearman([p[1] for p in pairs], [p[2] for p in pairs])
    if rho is None:
        return ("the FMA share against the measured ratio: too few FFMA implementations "
                "with both")
    return (f"over the {len(pairs)} FFMA implementations with both, Spearman's rank "
            f"correlation of the FMA share (mean over the layers read) with the median GPU "
            f"ratio is {rho:+.2f} (negative: more FMA, nearer the vendor), from readings "
            "of today's code against campaigns that may have run older code")


def table(results: Path) -> Tuple[List[str], List[List[str]], str]:
    from .. import registry
    cpu, gpu = cpu_verification(results), gpu_status(results)
    shares = sass_shares(results)
    header = ["implementation", "pass", "targets", "CPU: verified / failed",
              "CPU 16-bit: verified / failed", "GPU: verified / run",
              "GPU: DaCe / fastest vendor", "GPU main loop: FMA share"]
    rows = []
    from convkernels.layouts import Pass
    impls = sorted(registry.all_implementations().values(),
                   key=lambda i: (list(Pass).index(i.pass_), i.name))
    for impl in impls:
        ok, bad = cpu.get((impl.name, str(impl.pass_), False), (0, 0))
        ok16, bad16 = cpu.get((impl.name, str(impl.pass_), True), (0, 0))
        (verified, run, ratios), _ = gpu.get(impl.name, ((0, 0, []), ""))
        ratio = (f"{min(ratios):.2f}x" if len(ratios) == 1 else
                 f"{min(ratios):.2f}-{max(ratios):.2f}x") if ratios else ""
        rows.append([impl.name, str(impl.pass_), ", ".join(impl.targets),
                     f"{ok} / {bad}" if ok or bad else (
                         "not run" if "float32" in impl.precisions else
                         "16-bit and TF32 only" if "float32-tf32" in impl.precisions
                         else "16-bit only"),
                     f"{ok16} / {bad16}" if ok16 or bad16 else (
                         "not run" if {"float16", "bfloat16"} & set(impl.precisions)
                         else "float32 only"),
                     f"{verified} / {run}" if run else ("not run" if "gpu" in impl.targets
                                                       else "CPU only"), ratio,
                     _share_text(shares.get(impl.name, [])) if "gpu" in impl.targets else ""])
    return header, rows, sources(gpu)


def sources(gpu) -> str:
    """The campaigns the GPU columns come from: the most used, then any other with the
    implementations taken from it."""
    by: Dict[str, List[str]] = defaultdict(list)
    for impl, (_, name) in sorted(gpu.items()):
        by[name].append(impl)
    if not by:
        return "none"
    order = sorted(by, key=lambda n: (-len(by[n]), n))
    return "; ".join([order[0]] + [f"{n} ({', '.join(by[n])})" for n in order[1:]])


def _main(args, prog: str) -> int:
    args = build_parser(prog).parse_args(args)
    results = Path(args.results)
    if not results.is_dir():
        raise UsageError(f"--results: not a folder: {results}")
    if args.headline:
        from convbench.commands import headline
        print(headline.markdown(results), end="")
    elif args.markdown:
        print(markdown(results), end="")
    else:
        header, rows, source = table(results)
        print(tables.aligned(header, rows))
        print(f"CPU: results/verify/cpu/coverage.csv and */coverage.csv; GPU: "
              f"the summary.csv of results/gpu/{source}; main loop: "
              f"results/gpu/sass/readings.csv; {share_against_ratio(results)}")
    return 0


def markdown(results: Path) -> str:
    """The Markdown table ``--markdown`` prints, with its notes (README.md embeds it)."""
    header, rows, source = table(results)
    return format_markdown(header, rows, source, share_against_ratio(results))


def format_markdown(header, rows, source: str, correlation: str = "") -> str:
    body = tables.markdown(header, [[f"`{r[0]}`"] + r[1:] for r in rows], "lllllrrl")
    return body + ("\n\nCPU: the full tier's [coverage](results/verify/cpu/coverage.md), and "
                   "where a sweep ran on its own since, its table in a subfolder of "
                   "`results/verify/cpu/` (the newest run of a case counts); "
                   f"GPU: {_links(source)}; main loop: the sm_90 machine code of each GPU "
                   "implementation at its defaults on v1 conv5 (batch 16) / MLPerf conv4 "
                   "(batch 8), the share of its main loop's instructions that are FMAs "
                   "([results/gpu/sass](results/gpu/sass/README.md), `convbench sass --all`, "
                   "[docs/sass.md](docs/sass.md))"
                   + (f"; {correlation}" if correlation else "") + ".\n")


def _links(source: str) -> str:
    if source == "none":
        return "no campaign"
    parts = []
    for part in source.split("; "):
        name, _, impls = part.partition(" (")
        parts.append(f"[{name}](results/gpu/{name}/README.md)" + (f" ({impls}" if impls else ""))
    return "; ".join(parts)
