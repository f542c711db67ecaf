"""Two runs side by side: per layer and backend, both medians, their ratio, and whether the
difference stands out of the runs' own spread.

    convbench compare RUN_A RUN_B                    # the table
    convbench compare RUN_A RUN_B --fail-above 10    # exit 1 on a slowdown beyond noise and 10%

A run is a result folder (``summary.csv`` and ``metadata.json``, as profile, bench and
end2end write them) or its ``summary.csv``; two folders of runs (two sweeps) are compared
result folder by result folder, those of the same name.  Rows are matched by layer, geometry, batch,
implementation and backend.  A difference counts ("slower", "faster") only where the two
runs' interquartile ranges do not overlap; "~" otherwise.  The header says where the two
runs' metadata differ (machine, commit, precision, pass, threads), since a ratio across
machines or precisions compares those too.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from convbench.base import tables
from convbench.base.errors import ArgumentParser, UsageError, run_main

PROG = "convbench compare"
KEY = ("layer", "geometry", "batch", "implementation", "backend")
#: Exit status of a comparison that finds a slowdown beyond --fail-above.
SLOWER_EXIT = 1


def build_parser(prog: str = PROG):
    p = ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("run_a", metavar="RUN_A", help="the baseline: a result folder or its summary.csv")
    p.add_argument("run_b", metavar="RUN_B", help="the run compared with it")
    p.add_argument("--fail-above", type=float, default=None, metavar="PCT",
                   help=f"exit {SLOWER_EXIT} if a row of RUN_B is slower than RUN_A's beyond "
                   "the spread and by more than PCT percent")
    return p


def main(argv=None, prog: str = PROG) -> int:
    return run_main(prog, lambda a: _main(a, prog), argv)


def load_run(spec: str) -> Tuple[Dict[tuple, dict], dict]:
    """``(rows by key, metadata)`` of a run folder or summary file; UsageError (one line)
    where it is not one."""
    path = Path(spec)
    summary = path / "summary.csv" if path.is_dir() else path
    if not summary.is_file():
        raise UsageError(f"{spec}: no summary.csv (a result folder of profile, bench or "
                         "end2end, or its summary.csv)")
    try:
        with open(summary, newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise UsageError(f"{summary}: cannot read: {err}") from None
    missing = [k for k in KEY + ("median_ms",) if rows and k not in rows[0]]
    if not rows or missing:
        raise UsageError(f"{summary}: not a result summary (" + (
            f"no column {missing[0]}" if missing else "no rows") + ")")
    meta_path = summary.with_name("metadata.json")
    try:
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    except (OSError, ValueError) as err:
        raise UsageError(f"{meta_path}: cannot read: {err}") from None
    by_key = {}
    for row in rows:
        if row.get("median_ms"):
            by_key[tuple(row.get(k, "") for k in KEY)] = row
    return by_key, meta


def meta_fields(meta: dict) -> Dict[str, str]:
    """The metadata that a comparison across runs should name where it differs."""
    device = meta.get("device") or {}
    git = meta.get("git") or {}
    threads = meta.get("threads") or {}
    return {"machine": str(device.get("name", "?")),
            "commit": str(git.get("commit", "?"))[:10] + (" (dirty)" if git.get("dirty") else ""),
            "precision": _precision(meta.get("precision", "float32")),
            "pass": str(meta.get("bench_pass") or meta.get("pass") or "?"),
            "threads": str(threads.get("torch", threads.get("requested", "?")))}


def _precision(value) -> str:
    """A run's precision label (newer metadata hold a dict of dtype, math, accumulate)."""
    if isinstance(value, dict):
        return str(value.get("label") or value.get("dtype") or "?")
    return str(value)


def verdict(a: dict, b: dict) -> str:
    """"slower", "faster" or "~": whether B's median differs from A's beyond both runs'
    interquartile ranges (rows without quartiles: beyond 0)."""
    def box(row):
        median = float(row["median_ms"])
        q1, q3 = row.get("q1_ms"), row.get("q3_ms")
        return (float(q1) if q1 else median), (float(q3) if q3 else median)
    (a1, a3), (b1, b3) = box(a), box(b)
    if b1 > a3:
        return "slower"
    if b3 < a1:
        return "faster"
    return "~"


def compare(run_a: str, run_b: str) -> Tuple[List[List[str]], List[str], List[tuple]]:
    """``(table rows, notes, rows of B slower beyond the spread as (key, ratio))``."""
    a, meta_a = load_run(run_a)
    b, meta_b = load_run(run_b)
    notes = []
    fa, fb = meta_fields(meta_a), meta_fields(meta_b)
    for field in fa:
        if fa[field] != fb[field]:
            notes.append(f"{field} differs: {fa[field]} (A) against {fb[field]} (B)")
    common = [k for k in a if k in b]
    only = len(a) - len(common), len(b) - len(common)
    if any(only):
        notes.append(f"rows in A only: {only[0]}, in B only: {only[1]} (not compared)")
    if not common:
        raise UsageError(f"{run_a} and {run_b} share no layer and backend to compare")
    rows, slower = [], []
    for key in common:
        ma, mb = float(a[key]["median_ms"]), float(b[key]["median_ms"])
        ratio = mb / ma if ma > 0 else float("inf")
        mark = verdict(a[key], b[key])
        if mark == "slower":
            slower.append((key, ratio))
        layer, geometry, batch, impl, backend = key
        rows.append([layer, geometry, batch, impl, backend, f"{ma:.4g}", f"{mb:.4g}",
                     f"{ratio:.3f}", mark])
    return rows, notes, slower


def run_pairs(run_a: str, run_b: str) -> List[Tuple[str, str, str]]:
    """``(name, A, B)`` per comparison: the two runs themselves, or, for two folders of
    runs (two sweeps: docs/sweep.md), each result folder that both hold, by name."""
    a, b = Path(run_a), Path(run_b)
    if not (a.is_dir() and b.is_dir()) or (a / "summary.csv").is_file() \
            or (b / "summary.csv").is_file():
        return [("", run_a, run_b)]
    def runs(folder):
        return {p.parent.name for p in folder.glob("*/summary.csv")}
    common = sorted(runs(a) & runs(b))
    if not common:
        if runs(a) or runs(b):
            raise UsageError(f"{run_a} and {run_b} hold no result folder of the same name "
                             f"(A: {', '.join(sorted(runs(a))) or 'none'}; B: "
                             f"{', '.join(sorted(runs(b))) or 'none'})")
        return [("", run_a, run_b)]  # load_run says what is missing
    return [(name, str(a / name), str(b / name)) for name in common]


def _main(argv, prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    if args.fail_above is not None and not args.fail_above >= 0:
        raise UsageError(f"--fail-above: must be a percentage >= 0, got {args.fail_above}")
    slower = []
    pairs = run_pairs(args.run_a, args.run_b)
    for name, run_a, run_b in pairs:
        rows, notes, found = compare(run_a, run_b)
        if name:
            print(f"{'' if name == pairs[0][0] else chr(10)}== {name}")
        print(tables.aligned(["layer", "geometry", "batch", "implementation", "backend",
                              "A ms", "B ms", "B/A", "beyond spread"], rows))
        for note in notes:
            print(f"note: {note}")
        slower += found
    if args.fail_above is not None:
        limit = 1 + args.fail_above / 100
        over = [(k, r) for k, r in slower if r > limit]
        if over:
            worst = max(over, key=lambda kr: kr[1])
            print(f"{len(over)} row(s) slower beyond the spread and {args.fail_above:g}%: the "
                  f"worst {worst[0][0]} {worst[0][4]} at {worst[1]:.3f}x")
            return SLOWER_EXIT
    return 0
