"""Hierarchical roofline from Nsight Compute counters (the metric set of seed 003).

FLOPs are counted from the SASS instruction counters (``fadd + fmul + 2 * ffma``, per
thread, predicated on), bytes at three levels of the memory hierarchy (``dram``, the L2
slices ``lts``, the L1/texture units ``l1tex``), time from ``gpu__time_duration``.  A
kernel's arithmetic intensity at a level is its FLOPs over the bytes at that level.

How a campaign profiles: one process (:func:`profile_main`, run under ``ncu
--profile-from-start off``) warms every target up outside any profiled range, then, per
target, opens a profiled range (``cudaProfilerStart``), launches the marker kernel
:data:`MARKER`, calls the target once and closes the range.  The marker rows split ncu's
CSV into one segment per target, whatever number of kernels each launched (cuDNN may
launch several).
"""

from __future__ import annotations

import csv
import io
import json
import sys
from typing import Callable, Dict, List, Optional, Sequence

METRICS = (
    "sm__sass_thread_inst_executed_op_fadd_pred_on.sum",
    "sm__sass_thread_inst_executed_op_fmul_pred_on.sum",
    "sm__sass_thread_inst_executed_op_ffma_pred_on.sum",
    "dram__bytes.sum",
    "lts__t_bytes.sum",
    "l1tex__t_bytes.sum",
    "gpu__time_duration.sum",
)
LEVELS = ("dram", "lts", "l1tex")
#: The marker: torch's ``torch.cuda._sleep`` kernel (ATen's ``spin_kernel``), which neither
#: cuDNN nor a DaCe build launches; torch is on every GPU host, CuPy may not import there.
MARKER = "spin_kernel"


def ncu_command() -> List[str]:
    """The ``ncu`` prefix: the metrics, base units, raw CSV, clocks as found."""
    return ["ncu", "--profile-from-start", "off", "--metrics", ",".join(METRICS),
            "--csv", "--page", "raw", "--print-units", "base", "--clock-control", "none",
            "--target-processes", "all"]


def _number(text: str) -> Optional[float]:
    text = text.strip().replace(",", "")
    if text in ("", "n/a", "N/A"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_csv(text: str) -> List[Dict[str, object]]:
    """The kernel rows of ``ncu --csv --page raw`` output (other lines, such as ncu's
    ``==PROF==`` messages and the program's own output, are skipped; the units row too)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    rows = []
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if not (row.get("ID") or "").strip().isdigit():
            continue  # the units row, or a stray line
        rows.append({"id": int(row["ID"]), "kernel": row.get("Kernel Name", ""),
                     **{m: _number(row.get(m, "") or "") for m in METRICS}})
    rows.sort(key=lambda r: r["id"])
    return rows


def segments(rows: Sequence[Dict[str, object]], labels: Sequence[str]) -> Dict[str, List[dict]]:
    """The kernel rows after each marker row, by the label of the target profiled there."""
    out: Dict[str, List[dict]] = {}
    current: Optional[List[dict]] = None
    n = 0
    for row in rows:
        if MARKER in str(row["kernel"]):
            if n >= len(labels):
                raise ValueError(f"more marker kernels than targets ({len(labels)})")
            current = out.setdefault(labels[n], [])
            n += 1
        elif current is not None:
            current.append(row)
    if n != len(labels):
        raise ValueError(f"{n} marker kernel(s) for {len(labels)} target(s)")
    return out


def summarize(kernels: Sequence[dict]) -> Dict[str, object]:
    """FLOPs, bytes per level, time and intensities of one target's kernels together."""
    def total(metric):
        values = [k[metric] for k in kernels if k[metric] is not None]
        return sum(values) if values else None
    fadd, fmul, ffma = (total(m) for m in METRICS[:3])
    flops = None if None in (fadd, fmul, ffma) else fadd + fmul + 2 * ffma
    out: Dict[str, object] = {"kernels": [k["kernel"] for k in kernels], "flops": flops,
                              "seconds": (total("gpu__time_duration.sum") or 0) * 1e-9 or None}
    for level, metric in zip(LEVELS, METRICS[3:6]):
        nbytes = total(metric)
        out[f"{level}_bytes"] = nbytes
        out[f"{level}_intensity"] = flops / nbytes if flops and nbytes else None
    out["gflops"] = flops / out["seconds"] / 1e9 if flops and out["seconds"] else None
    return out


def plot(points: Dict[str, dict], ceilings: dict, path: str) -> Optional[str]:
    """A log-log roofline: the measured FP32 and bandwidth ceilings, and each target at
    its DRAM, L2 and L1 intensities.  Returns the path, or None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    peak, bw = ceilings.get("peak_gflops"), ceilings.get("bandwidth_gbs")
    fig, ax = plt.subplots(figsize=(8, 5.5))
    xs = [10 ** (i / 10) for i in range(-20, 41)]
    if peak and bw:
        ax.plot(xs, [min(peak, bw * x) for x in xs], "k-", lw=1.5,
                label=f"FP32 SGEMM {peak:.0f} GFLOP/s, DRAM copy {bw:.0f} GB/s (measured)")
    styles = {"dram": "o", "lts": "s", "l1tex": "^"}
    for label, p in sorted(points.items()):
        if not p.get("gflops"):
            continue
        color = "tab:blue" if label.endswith("dace") else "tab:red"
        for level, marker in styles.items():
            x = p.get(f"{level}_intensity")
            if x:
                ax.scatter([x], [p["gflops"]], marker=marker, color=color, alpha=0.7)
    for level, marker in styles.items():
        ax.scatter([], [], marker=marker, color="gray", label=f"intensity at {level}")
    ax.scatter([], [], color="tab:blue", label="best DaCe")
    ax.scatter([], [], color="tab:red", label="cuDNN")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("GFLOP/s (SASS fadd+fmul+2*ffma over gpu__time_duration)")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def profile_call(target: dict) -> Callable[[], object]:
    """A no-argument call of one roofline target (``backend`` dace or cudnn), for
    :func:`profile_main`."""
    from convbench.check import references, verify
    from convbench.experiment.pipeline import Experiment
    from convbench.experiment.case import LayerCase
    case = LayerCase.from_json(target["case"])
    impl, layer = case.implementation, case.layer
    inputs = verify.make_inputs(layer, impl.pass_, seed=0, dtype=case.precision)
    if target["backend"] == "dace":
        exp = Experiment(impl, [layer], "gpu", policy="reuse", cachedir=target["cachedir"],
                         dtype=case.precision)
        return exp.call(exp.build(impl, layer, case.resolved_params()), inputs)
    ref = {r.name: r for r in references.REFERENCES}[target["backend"]]
    return ref.prepare(layer, impl.pass_, impl.layout, "gpu",
                       {r: t.cuda() for r, t in inputs.items()},
                       references.ReferenceOptions(allow_tf32=False, cudnn_algo="find"))


def profile_main(targets_json: str, labels_out: str) -> int:
    """Under ncu: build every target's call, warm each up, then profile each once between
    a marker kernel and the end of its profiled range.  Writes the labels in order."""
    import torch
    targets = json.loads(open(targets_json).read())
    calls, failed = [], {}
    for t in targets:  # a target that cannot be prepared or run is left out, and said so
        try:
            fn = profile_call(t)
            fn()  # warm-up, outside any profiled range
            torch.cuda.synchronize()
            calls.append((t["label"], fn))
        except Exception as err:  # noqa: BLE001
            failed[t["label"]] = f"{type(err).__name__}: {err}".splitlines()[0][:300]
            print(f"roofline target {t['label']} failed: {failed[t['label']]}", file=sys.stderr)
    labels = []
    for label, fn in calls:
        torch.cuda.profiler.start()
        torch.cuda._sleep(1)  # the marker kernel: the next rows belong to this target
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        labels.append(label)
    with open(labels_out, "w") as f:
        json.dump(labels, f)
    if failed:
        with open(labels_out + ".failed.json", "w") as f:
            json.dump(failed, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(profile_main(sys.argv[1], sys.argv[2]))
