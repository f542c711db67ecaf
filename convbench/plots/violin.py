"""``violin.png``: the samples of each layer, one violin per backend."""

import math
from pathlib import Path
from typing import Union

import numpy as np

from ._style import FONT, backend_color, fmt_ms, layer_title, plt, run_title, save
from .reader import RunData

#: Median ratio between backends above which a layer's violin axis is logarithmic.
LOG_VIOLIN_RATIO = 8.0


def plot_violin(run: RunData, path: Union[str, Path]) -> Path:
    """One subplot per layer, one violin per backend, median marked; writes ``path``."""
    layers = run.layers
    n = max(len(layers), 1)
    ncols = min(n, 3 if n != 4 else 2)
    nrows = math.ceil(n / ncols)
    with plt.rc_context(FONT):
        width = max(3.0 + 0.9 * len(run.backends), 4.2)
        fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, 3.6 * nrows + 0.9),
                                 squeeze=False)
        flat = axes.ravel()
        for ax, layer in zip(flat, layers):
            _violin_axes(ax, run, layer)
        for ax in flat[len(layers):]:
            ax.axis("off")
        fig.suptitle(run_title(run, "time per call", width=int(16 * width * ncols / 1.3)))
        fig.tight_layout()
        return save(fig, path)


def _violin_axes(ax: "plt.Axes", run: RunData, layer: str) -> None:
    ax.set_title(layer_title(run, layer))
    ax.set_ylabel("time per call [ms]")
    ax.grid(axis="y", alpha=0.3)
    present = [b for b in run.backends if run.samples.get((layer, b)) is not None
               and run.samples[(layer, b)].size]
    if not present:
        ax.text(0.5, 0.5, "no samples", transform=ax.transAxes, ha="center", va="center",
                color="gray")
        ax.set_xticks([])
        return
    rng = np.random.default_rng(0)  # jitter of the sample dots, reproducible
    ticks = []
    medians = []
    for pos, backend in enumerate(present):
        times = run.samples[(layer, backend)]
        color = backend_color(backend)
        med = float(np.median(times))
        medians.append(med)
        if times.size >= 2 and np.ptp(times) > 0:
            parts = ax.violinplot([times], positions=[pos], widths=0.8, showmedians=False,
                                  showextrema=False)
            for body in parts["bodies"]:
                body.set_facecolor(color)
                body.set_edgecolor(color)
                body.set_alpha(0.35)
        jitter = rng.uniform(-0.12, 0.12, times.size)
        ax.scatter(pos + jitter, times, s=6, color=color, alpha=0.55, linewidths=0, zorder=2)
        ax.hlines(med, pos - 0.3, pos + 0.3, color="black", linewidth=1.8, zorder=3)
        ax.plot([pos], [med], marker="o", markersize=5, markerfacecolor="white",
                markeredgecolor="black", zorder=4)
        ticks.append(f"{run.label(backend)}\n{fmt_ms(med)} ms, n={times.size}")
    ax.set_xticks(range(len(present)))
    ax.set_xticklabels(ticks)
    ax.set_xlim(-0.6, len(present) - 0.4)
    if min(medians) > 0 and max(medians) / min(medians) > LOG_VIOLIN_RATIO:
        # Backends an order of magnitude apart: a linear axis would flatten the faster one.
        ax.set_yscale("log")
        ax.set_ylabel("time per call [ms] (log scale)")
    else:
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, hi + 0.05 * (hi - lo))
    if max(len(run.label(b)) for b in present) > 14 and len(present) > 2:
        for label in ax.get_xticklabels():
            label.set_fontsize(8)
