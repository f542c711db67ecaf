"""The tables of README.md from the summary.csv of each run folder here (torch: its only
layout in the older runs, its faster one, channels-last, in those that timed both):
python results/cpu/epyc_f25m17_avx512/unseen_machine/table.py"""
import csv
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = ["before", "hidden_avx512", "hidden_avx2", "rules_only_avx512", "rules_only_avx2",
        "autotune_run", "autotuned_avx512"]
#: After the few-channel forward (issue 82), against torch's faster layout.
RUNS_FEW = ["hidden_avx512_few", "hidden_avx2_few", "autotune_few", "autotuned_few"]


def medians(folder):
    with open(folder / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    faster = "torch" if any(r["backend"] == "torch" for r in rows) else "torch-ndhwc"
    return {(r["layer"], "torch" if r["backend"] == faster else r["backend"]): float(r["median_ms"])
            for r in rows}


def spread(folder, part="train.total"):
    """The interquartile range over the median of ``part``, torch / DaCe, in percent."""
    with open(folder / "summary.csv") as f:
        rows = {r["backend"]: r for r in csv.DictReader(f) if r["layer"] == part}
    torch = "torch" if "torch" in rows else "torch-ndhwc"
    return " / ".join(f"{100 * float(rows[b]['iqr_over_median']):.1f}%" for b in (torch, "dace"))


def ratio(m, parts):
    dace = sum(m[(p, "dace")] for p in parts)
    torch = sum(m[(p, "torch")] for p in parts)
    return f"{torch:.1f} / {dace:.1f} ms = **{dace / torch:.2f}x**"


print("| run | forward (torch / DaCe) | training step | step's IQR / median (torch / DaCe) "
      "| conv1 in the step (forward + filter gradient) |")
print("|---|---|---|---|---|")
for run in RUNS:
    m = medians(HERE / run)
    print(f"| `{run}` | {ratio(m, ['forward.total'])} | {ratio(m, ['train.total'])} | "
          f"{spread(HERE / run)} | {ratio(m, ['train.conv1.fwd', 'train.conv1.bwd'])} |")

print()
print("| run | forward (torch / DaCe) | training step | step's IQR / median (torch / DaCe) "
      "| conv1's forward in the step |")
print("|---|---|---|---|---|")
for run in RUNS_FEW:
    if not (HERE / run / "summary.csv").is_file():
        continue
    m = medians(HERE / run)
    print(f"| `{run}` | {ratio(m, ['forward.total'])} | {ratio(m, ['train.total'])} | "
          f"{spread(HERE / run)} | {ratio(m, ['train.conv1.fwd'])} |")
