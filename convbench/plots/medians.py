"""``medians.png``: median time per layer and backend, with DaCe's ratio to a reference."""

import math
import textwrap
from pathlib import Path
from typing import Dict, Union

import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from convbench.results.schema import DACE
from ._style import FONT, backend_color, plt, run_title, save
from .reader import RunData


def plot_medians(run: RunData, path: Union[str, Path]) -> Path:
    """Grouped bars (log y) of the median per layer and backend, IQR error bars, and the
    DaCe / first-reference ratio above each layer group; writes ``path``."""
    layers, backends = run.layers, run.backends
    nb = max(len(backends), 1)
    ref = run.first_reference
    with plt.rc_context(FONT):
        legend_w = 0.35 + 0.075 * max([len(run.label(b)) for b in backends] + [24])
        per_layer = max(1.45 if any(run.geometry.values()) else 0.8, 0.5 + 0.42 * nb)
        width = min(max(7.0, 1.2 + legend_w + len(layers) * per_layer), 28.0)
        fig, ax = plt.subplots(figsize=(width, 5.6))
        bar_w = 0.8 / nb
        x = np.arange(len(layers))
        tops: Dict[int, float] = {}
        values = []
        any_noisy = False
        for j, backend in enumerate(backends):
            color = backend_color(backend)
            for i, layer in enumerate(layers):
                st = run.stats(layer, backend)
                if st is None or not st.median > 0:
                    continue
                xpos = x[i] + (j - (nb - 1) / 2) * bar_w
                err = [[max(st.median - st.q1, 0.0)], [max(st.q3 - st.median, 0.0)]]
                hatch = "///" if st.noisy else None
                any_noisy |= bool(st.noisy)
                ax.bar(xpos, st.median, bar_w * 0.95, color=color, edgecolor="black",
                       linewidth=0.5, hatch=hatch, yerr=err, capsize=3,
                       error_kw={"elinewidth": 1, "ecolor": "black"})
                top = max(st.q3, st.median)
                tops[i] = max(tops.get(i, 0.0), top)
                values += [st.median, max(st.q1, st.median / 1e3)]
        ax.set_yscale("log")
        if values:
            lo, hi = min(values), max(tops.values())
            ax.set_ylim(lo / 2.0, hi * 4.0)
        ax.set_xticks(x)
        ax.set_xticklabels([_layer_tick(run, layer, len(layers)) for layer in layers])
        ax.set_xlim(-0.6, len(layers) - 0.4)
        ax.set_ylabel("median time [ms]")
        ax.grid(axis="y", which="major", alpha=0.3)
        ax.grid(axis="y", which="minor", alpha=0.1)

        xlabel = "layer"
        if ref is not None and DACE in backends:
            impl = run.implementation
            caption = (f"above each group: {impl} median / {ref} median"
                       f"  (>1x: {impl} slower than {ref}, <1x: faster)")
            xlabel += "\n" + "\n".join(textwrap.wrap(caption, int((width - legend_w) * 11)))
            for i, layer in enumerate(layers):
                if i not in tops:
                    continue
                r = run.ratio(layer, ref)
                text = f"{r:.2f}x" if r < 10 else f"{r:.1f}x" if r < 100 else f"{r:.0f}x"
                color = "#b22222" if r > 1 else "#006400"
                if not math.isfinite(r):
                    text, color = "n/a", "gray"
                ax.text(x[i], tops[i] * 1.45, text, ha="center", va="bottom",
                        fontsize=10, fontweight="bold", color=color)
        ax.set_xlabel(xlabel)
        handles = [Patch(facecolor=backend_color(b), edgecolor="black", label=run.label(b))
                   for b in backends]
        if any_noisy:
            handles.append(Patch(facecolor="white", edgecolor="black", hatch="///",
                                 label="noisy (IQR/median high)"))
        handles.append(Line2D([], [], color="black", marker="_", markersize=10, linestyle="",
                              label="error bar: IQR (q1..q3)"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  borderaxespad=0.0)
        if not layers:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", color="gray")
        ax.set_title(run_title(run, "median time", width=int((width - legend_w) * 11)))
        fig.tight_layout()
        return save(fig, path)


def _layer_tick(run: RunData, layer: str, nlayers: int) -> str:
    geo = run.geometry.get(layer)
    if geo and nlayers <= 8:
        return f"{layer}\n" + "\n".join(textwrap.wrap(geo, 15))
    return layer
