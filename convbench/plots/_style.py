"""What the plots share: matplotlib (Agg), fonts, a colour and marker per backend,
titles, number formats, the label placer and saving."""

import textwrap
import zlib
from pathlib import Path
from typing import List, Tuple, Union

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display needed, the same output everywhere

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from convbench.base.files import WriteError, make_folder  # noqa: E402
from convbench.results.schema import COMPLETE, DACE  # noqa: E402
from .reader import RunData, finite  # noqa: E402

DPI = 130
FONT = {"figure.dpi": DPI, "font.size": 10, "axes.titlesize": 10, "axes.labelsize": 10,
        "xtick.labelsize": 9, "ytick.labelsize": 9, "legend.fontsize": 9, "figure.titlesize": 12}

# Fixed colors and markers for the backends we know, so that a backend looks the same
# in every plot of every run; others get a stable pick from the rest of the palette.
_COLORS = {DACE: "#1f77b4", "torch": "#ff7f0e", "cudnn": "#2ca02c"}
_SPARE_COLORS = ("#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
_MARKERS = {DACE: "o", "torch": "s", "cudnn": "^"}
_SPARE_MARKERS = ("D", "v", "P", "X", "<", ">", "h")


def _pick(known: dict, spare: tuple, backend: str) -> str:
    return known.get(backend) or spare[zlib.crc32(backend.encode()) % len(spare)]


def backend_color(backend: str) -> str:
    """The color of ``backend`` in every plot (stable across runs)."""
    return _pick(_COLORS, _SPARE_COLORS, backend)


def backend_marker(backend: str) -> str:
    """The roofline marker of ``backend`` (stable across runs)."""
    return _pick(_MARKERS, _SPARE_MARKERS, backend)


# ----------------------------------------------------------------------------- text

def _batch_text(run: RunData) -> str:
    batch = run.metadata.get("batch")
    if batch is None:
        values = {row.get("batch") for row in run.summary.values() if finite(row.get("batch"))}
        if len(values) == 1:
            batch = int(values.pop())
    return f"batch {batch}" if batch is not None else "batch as in the layer file"


def run_title(run: RunData, what: str, width: int = 100) -> str:
    """Two or three title lines: what, implementation and pass; device, layers, precision,
    batch, timing."""
    meta = run.metadata
    first = f"{what}: {run.implementation}"
    if meta.get("pass"):
        first += f" ({meta['pass']})"
    if run.references:
        first += " vs " + ", ".join(run.references)
    status = meta.get("status")
    if isinstance(status, str) and status and status != COMPLETE:
        first += f"  [run {status}: {len(run.layers)} layers]"
    device = meta.get("device")
    parts = []
    if isinstance(device, dict):
        name = device.get("name") or device.get("kind")
        if name:
            parts.append(str(name) + (f" [{device['kind']}]" if device.get("kind")
                                      and device.get("name") else ""))
    elif isinstance(device, str):
        parts.append(device)
    if meta.get("layer_set"):
        parts.append(f"layer set {meta['layer_set']}")
    precision = meta.get("precision")
    if isinstance(precision, dict) and precision.get("label"):
        parts.append(precision["label"] + (f", sums in {precision['accumulate']}"
                                           if precision.get("accumulate") not in
                                           (None, precision.get("dtype")) else ""))
    parts.append(_batch_text(run))
    timing = meta.get("timing")
    if isinstance(timing, dict):
        bits = [str(timing["method"])] if timing.get("method") else []
        if timing.get("warmup") is not None:
            bits.append(f"{timing['warmup']} warm-up")
        if timing.get("iterations") is not None:
            bits.append(f"{timing['iterations']} iterations")
        if bits:
            parts.append(", ".join(bits))
    lines = textwrap.wrap(first, width) + textwrap.wrap(" · ".join(parts), width)
    return "\n".join(lines)


def layer_title(run: RunData, layer: str) -> str:
    geo = run.geometry.get(layer)
    return f"{layer}\n{geo}" if geo else layer


def fmt_ms(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:#.3g}"


def fmt_num(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width, subsequent_indent="  "))


# ----------------------------------------------------------------------------- labels

# candidate label positions around a point: offset [points], ha, va
_LABEL_SPOTS = (((0, 7), "center", "bottom"), ((8, 0), "left", "center"),
                ((-8, 0), "right", "center"), ((6, 6), "left", "bottom"),
                ((-6, 6), "right", "bottom"), ((0, -8), "center", "top"),
                ((6, -6), "left", "top"), ((-6, -6), "right", "top"))


def place_labels(fig: "plt.Figure", ax: "plt.Axes", labels: list,
                 points: List[Tuple[float, float]]) -> None:
    """Put each label at the first spot around its point that overlaps no marker and no
    label placed before it, inside the axes; else stack it above its point."""
    if not labels:
        return
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    half = 5.0 * fig.dpi / 72.0  # half a marker, in pixels
    taken = [Bbox.from_extents(x - half, y - half, x + half, y + half)
             for x, y in ax.transData.transform(points)]
    frame = ax.get_window_extent(renderer)

    def free(box: Bbox) -> bool:
        inside = (box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0
                  and box.y1 <= frame.y1)
        return inside and not any(box.overlaps(t) for t in taken)

    for ann in sorted(labels, key=lambda a: (a.xy[0], a.xy[1])):
        for offset, ha, va in _LABEL_SPOTS:
            ann.xyann = offset
            ann.set_ha(ha)
            ann.set_va(va)
            if free(ann.get_window_extent(renderer)):
                break
        else:
            ann.set_ha("center")
            ann.set_va("bottom")
            for step in range(60):
                ann.xyann = (0, 7 + 4 * step)
                if free(ann.get_window_extent(renderer)):
                    break
        taken.append(ann.get_window_extent(renderer))


def save(fig: "plt.Figure", path: Union[str, Path]) -> Path:
    """Write ``fig`` to ``path`` (making its folder) and close it."""
    path = Path(path)
    make_folder(path.parent)
    try:
        fig.savefig(path, dpi=DPI)
    except OSError as err:
        raise WriteError(path, err) from None
    finally:
        plt.close(fig)
    return path
