"""``roofline.png``: achieved GFLOP/s against arithmetic intensity, under the ceilings."""

import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
from matplotlib.lines import Line2D

from ._style import (FONT, backend_color, backend_marker, fmt_num, place_labels, plt,
                     run_title, save, wrap)
from .reader import RunData, finite


def _ceilings(meta: Dict[str, Any]) -> Tuple[Optional[float], str, Optional[float], str]:
    """(peak GFLOP/s, method, bandwidth GB/s, method); values None where unusable."""
    ceil = meta.get("ceilings")
    if not isinstance(ceil, dict):
        return None, "", None, ""

    def pos(key: str) -> Optional[float]:
        v = ceil.get(key)
        try:
            v = float(v)
        except (TypeError, ValueError):
            return None
        return v if math.isfinite(v) and v > 0 else None

    return (pos("peak_gflops"), str(ceil.get("peak_method") or ""),
            pos("bandwidth_gbs"), str(ceil.get("bandwidth_method") or ""))


def _roofline_points(run: RunData) -> List[Tuple[str, str, float, float]]:
    """(layer, backend, intensity, GFLOP/s) with positive finite values."""
    points = []
    for layer in run.layers:
        for backend in run.backends:
            row = run.summary.get((layer, backend))
            if row is None:
                continue
            inten = row.get("intensity", math.nan)
            perf = row.get("gflops", math.nan)
            if not (finite(perf) and perf > 0) and finite(row.get("gflop")):
                st = run.stats(layer, backend)  # GFLOP / median seconds
                if st is not None and st.median > 0:
                    perf = row["gflop"] / (st.median / 1e3)
            if finite(inten) and inten > 0 and finite(perf) and perf > 0:
                points.append((layer, backend, float(inten), float(perf)))
    return points


def plot_roofline(run: RunData, path: Union[str, Path]) -> Path:
    """Log-log achieved GFLOP/s against arithmetic intensity, one point per (layer,
    backend), with the ceilings of ``metadata["ceilings"]`` if present; writes ``path``."""
    peak, peak_how, bw, bw_how = _ceilings(run.metadata)
    points = _roofline_points(run)
    with plt.rc_context(FONT):
        fig, ax = plt.subplots(figsize=(10.5, 7.8))
        ax.set_xscale("log")
        ax.set_yscale("log")
        xs = [p[2] for p in points]
        ys = [p[3] for p in points]
        ridge = peak / bw if peak and bw else None
        xr = xs + ([ridge] if ridge else [])
        yr = ys + ([peak] if peak else [])
        xlo, xhi = (min(xr) / 4, max(xr) * 4) if xr else (0.1, 100.0)
        ylo, yhi = (min(yr) / 4, max(yr) * 3) if yr else (1.0, 1e4)
        if not ys and bw:
            ylo = min(ylo, bw * xlo)

        # ceilings: min(peak, bw * I)
        handles = []
        grid = np.geomspace(xlo, xhi, 200)
        if bw:
            xm = grid if not peak else grid[grid <= ridge]
            xm = np.append(xm, ridge) if peak else xm
            label = f"memory: {fmt_num(bw)} GB/s" + (f" ({bw_how})" if bw_how else "")
            h, = ax.plot(xm, bw * xm, color="0.25", linestyle="--", linewidth=1.6,
                         label=wrap(label, 60))
            handles.append(h)
        if peak:
            xp = grid if not bw else np.insert(grid[grid >= ridge], 0, ridge)
            label = f"compute: {fmt_num(peak)} GFLOP/s" + (f" ({peak_how})" if peak_how else "")
            h, = ax.plot(xp, np.full_like(xp, peak), color="0.25", linestyle="-",
                         linewidth=1.6, label=wrap(label, 60))
            handles.append(h)
        if ridge:
            h, = ax.plot([ridge], [peak], marker="D", color="black", markersize=7,
                         linestyle="", label=f"ridge point: {ridge:.3g} FLOP/byte")
            handles.append(h)
            ax.axvline(ridge, color="0.6", linestyle=":", linewidth=1, zorder=0)

        # the points of one layer (same intensity) are joined by a thin line and labelled
        # once with the layer name, next to the top point
        groups: Dict[Tuple[str, float], List[Tuple[str, str, float, float]]] = {}
        for p in points:
            groups.setdefault((p[0], round(math.log10(p[2]), 3)), []).append(p)
        for group in groups.values():
            if len(group) > 1:
                ax.plot([p[2] for p in group], [p[3] for p in group], color="0.7",
                        linewidth=0.9, zorder=1)
        for _, backend, inten, perf in points:
            ax.plot([inten], [perf], marker=backend_marker(backend), color=backend_color(backend),
                    markersize=8, markeredgecolor="black", markeredgewidth=0.6, linestyle="",
                    zorder=3)
        labels = []
        for (layer, _), group in groups.items():
            top = max(group, key=lambda p: p[3])
            labels.append(ax.annotate(layer, (top[2], top[3]), xytext=(0, 7),
                                      textcoords="offset points", ha="center", va="bottom",
                                      fontsize=8, zorder=4))
        for backend in run.backends:
            if any(p[1] == backend for p in points):
                handles.append(Line2D([], [], marker=backend_marker(backend), linestyle="",
                                      color=backend_color(backend), markeredgecolor="black",
                                      markeredgewidth=0.6, markersize=8,
                                      label=run.label(backend)))
        if not points:
            ax.text(0.5, 0.5, "no layer with GFLOP/s and intensity in summary.csv",
                    transform=ax.transAxes, ha="center", va="center", color="gray")

        ax.set_xlim(xlo, xhi)
        ax.set_ylim(ylo, yhi)
        ax.set_xlabel("arithmetic intensity [FLOP/byte] (compulsory traffic)")
        ax.set_ylabel("achieved GFLOP/s")
        ax.grid(which="major", alpha=0.3)
        ax.grid(which="minor", alpha=0.08)
        title = run_title(run, "roofline", width=120)
        if peak is None and bw is None:
            title += "\n(no ceilings in metadata: points only)"
        elif peak is None or bw is None:
            title += "\n(only the " + ("memory" if bw else "compute") + " ceiling in metadata)"
        ax.set_title(title)
        if handles:
            ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.1),
                      ncol=2, borderaxespad=0.0)
        fig.tight_layout()
        place_labels(fig, ax, labels, [(p[2], p[3]) for p in points])
        return save(fig, path)
