"""``runtimebreakdown.png``: where an end-to-end run's step time goes."""

import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from matplotlib.patches import Patch

from ._style import FONT, fmt_ms, plt, save, wrap
from .reader import finite, read_breakdown, read_metadata

#: The colour of the rest of the step (everything but the convolutions).
OTHER_COLOR = "#c7c7c7"
UNSPLIT_COLOR = "#e8e8e8"  # a backend timed as one span (torch.compile)


def plot_breakdown(run_dir: Union[str, Path], path: Union[str, Path]) -> Path:
    """``runtimebreakdown.png``: per phase (forward pass, training step) one stacked bar
    per backend, in milliseconds (top row) and as shares of the step (bottom row): each
    convolution's forward (solid) and backward (hatched) median, and the rest of the
    step (grey: the median step time minus the convolutions' medians), with the median
    step time and its ratio to the baseline on top: the faster of torch's memory formats
    (``torch_best`` in ``metadata.json``), or ``torch`` in runs from before both were
    timed."""
    data = read_breakdown(run_dir)
    meta = read_metadata(run_dir, required=False)
    phases = [p for p in ("forward", "train") if p in data] + \
        [p for p in data if p not in ("forward", "train")]
    layers: List[str] = []
    for phase in phases:
        for parts in data[phase].values():
            for part in parts:
                name = part.split(".")[0]
                if part not in ("other", "total") and name not in layers:
                    layers.append(name)
    cmap = plt.get_cmap("viridis")
    colors = {name: cmap(i / max(1, len(layers) - 1) * 0.9) for i, name in enumerate(layers)}

    def stack(parts: Dict[str, float]) -> Tuple[List[Tuple[float, Any, Optional[str]]], float]:
        pieces = []
        for name in layers:
            for direction, hatch in (("fwd", None), ("bwd", "///")):
                value = parts.get(f"{name}.{direction}")
                if finite(value) and value > 0:
                    pieces.append((value, colors[name], hatch))
        convs = sum(v for v, _, _ in pieces)
        total = parts.get("total", math.nan)
        if not pieces and "other" not in parts and finite(total):  # one span (torch.compile)
            return [(total, UNSPLIT_COLOR, "..")], total
        other = total - convs if finite(total) else parts.get("other", math.nan)
        if finite(other) and other > 0:
            pieces.append((other, OTHER_COLOR, None))
        return pieces, total if finite(total) else convs + max(other, 0.0)

    width = 3.6 * len(phases) + 2.2
    with plt.rc_context(FONT):
        fig, axes = plt.subplots(2, len(phases), figsize=(width, 8.0), squeeze=False,
                                 gridspec_kw={"height_ratios": (3, 2)})
        for col, phase in enumerate(phases):
            base = (meta.get("torch_best") or {}).get(phase) or "torch"
            backends = sorted(data[phase], key=lambda b: (b != base, b))
            ref = data[phase].get(base, {}).get("total")
            for row, share in ((0, False), (1, True)):
                ax = axes[row][col]
                for x, backend in enumerate(backends):
                    pieces, total = stack(data[phase][backend])
                    bottom = 0.0
                    for value, color, hatch in pieces:
                        height = 100.0 * value / total if share else value
                        ax.bar(x, height, 0.6, bottom=bottom, color=color, hatch=hatch,
                               edgecolor="white", linewidth=0.5)
                        bottom += height
                    if not share:
                        ratio = ""
                        if backend != base and finite(ref) and ref > 0:
                            ratio = f"\n{total / ref:.2f}x {base}"
                        ax.text(x, bottom, f"{fmt_ms(total)}{ratio}", ha="center", va="bottom")
                ax.set_xticks(range(len(backends)))
                ax.set_xticklabels(backends)
                ax.set_xlim(-0.6, len(backends) - 0.4)
                ax.grid(axis="y", alpha=0.3)
                if share:
                    ax.set_ylim(0, 100)
                    ax.set_ylabel("share of the step (%)")
                else:
                    ax.set_ylim(0, ax.get_ylim()[1] * 1.15)
                    ax.set_ylabel("median time per iteration (ms)")
                    ax.set_title("forward pass" if phase == "forward" else
                                 "training step" if phase == "train" else phase)
        handles = [Patch(color=colors[n], label=n) for n in layers]
        handles += [Patch(facecolor="white", edgecolor="black", hatch="///", label="backward"),
                    Patch(color=OTHER_COLOR, label="everything else")]
        if any(not any(k.endswith((".fwd", ".bwd", "other")) for k in parts)
               for per in data.values() for parts in per.values()):
            handles.append(Patch(facecolor=UNSPLIT_COLOR, edgecolor="black", hatch="..",
                                 label="not split (one span)"))
        fig.legend(handles=handles, loc="center right", frameon=False)
        what = (f"CosmoFlow {meta.get('model', '')} end to end, {meta.get('size', '?')}^3, batch "
                f"{meta.get('batch', '?')}, {(meta.get('device') or {}).get('name', '')}")
        fig.suptitle(wrap(what, 90))
        fig.tight_layout(rect=(0, 0, 1 - 1.9 / width, 0.96))
        return save(fig, path)
