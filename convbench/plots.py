"""Plots of a profiler run directory: violins, median bars and a roofline.

A run directory holds three files written by the profiler:

``samples.csv``
    one row per timed sample: ``layer_index,layer,implementation,backend,iteration,time_ms``.
    ``backend`` is ``dace`` for the DaCe implementation being profiled (named in
    ``implementation``) or a reference (``torch``, ``cudnn``, ...).
``summary.csv``
    one row per (layer, backend): medians, quartiles, GFLOP/s, intensity and
    ``ratio_vs_<reference>`` columns (this row's median / the reference's median).
``metadata.json``
    a dict describing the run (implementation, pass, device, layer set, batch,
    references, ceilings, timing, ...).  Every key is optional.

:func:`load_run` reads them into a :class:`RunData`; :func:`plot_violin`,
:func:`plot_medians` and :func:`plot_roofline` draw one PNG each; :func:`plot_run`
draws all three.  Only the standard library, numpy and matplotlib (Agg) are used.
"""

import csv
import json
import math
import textwrap
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

# DaCe's CPU libraries are built with -ffast-math, whose start-up code turns on
# flush-to-zero for the whole process once one is loaded; numpy then warns, while
# matplotlib imports, that float32's smallest subnormal is zero.  Harmless here.
warnings.filterwarnings("ignore", message="The value of the smallest subnormal")

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # before pyplot: no display needed, the same output everywhere

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

SAMPLES = "samples.csv"
SUMMARY = "summary.csv"
METADATA = "metadata.json"

SAMPLE_COLUMNS = ("layer_index", "layer", "implementation", "backend", "iteration", "time_ms")
#: Columns ``summary.csv`` must have; the others it documents are optional here.
SUMMARY_REQUIRED = ("layer_index", "layer", "backend", "median_ms")
#: Text columns of ``summary.csv``; ``noisy`` is boolean, every other column is numeric.
SUMMARY_TEXT = {"layer", "geometry", "implementation", "backend"}
#: Cell values read as "not available" (NaN) in numeric columns.
MISSING = {"", "nan", "none", "null", "n/a", "na", "-"}

DACE = "dace"
DPI = 130
FONT = {"figure.dpi": DPI, "font.size": 10, "axes.titlesize": 10, "axes.labelsize": 10, "xtick.labelsize": 9,
        "ytick.labelsize": 9, "legend.fontsize": 9, "figure.titlesize": 12}

# Fixed colors and markers for the backends we know, so that a backend looks the same
# in every plot of every run; others get a stable pick from the rest of the palette.
_COLORS = {DACE: "#1f77b4", "torch": "#ff7f0e", "cudnn": "#2ca02c"}
_SPARE_COLORS = ("#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
_MARKERS = {DACE: "o", "torch": "s", "cudnn": "^"}
_SPARE_MARKERS = ("D", "v", "P", "X", "<", ">", "h")


def backend_color(backend: str) -> str:
    """The color of ``backend`` in every plot (stable across runs)."""
    if backend in _COLORS:
        return _COLORS[backend]
    return _SPARE_COLORS[zlib.crc32(backend.encode()) % len(_SPARE_COLORS)]


def backend_marker(backend: str) -> str:
    """The roofline marker of ``backend`` (stable across runs)."""
    if backend in _MARKERS:
        return _MARKERS[backend]
    return _SPARE_MARKERS[zlib.crc32(backend.encode()) % len(_SPARE_MARKERS)]


@dataclass
class Stats:
    """Timing statistics of one (layer, backend), in milliseconds."""

    median: float
    q1: float
    q3: float
    noisy: Optional[bool] = None


@dataclass
class RunData:
    """The contents of a run directory.

    ``samples`` maps (layer, backend) to the sample times [ms] in file order;
    ``summary`` maps (layer, backend) to the typed ``summary.csv`` row (numbers as
    float, NaN where empty; ``noisy`` as bool or None).  ``layers`` is ordered by
    ``layer_index``; ``backends`` puts ``dace`` first, then the references in
    ``metadata["references"]`` order, then any other backend by name.
    """

    run_dir: Path
    metadata: Dict[str, Any]
    samples: Dict[Tuple[str, str], np.ndarray]
    summary: Dict[Tuple[str, str], Dict[str, Any]]
    layers: List[str]
    backends: List[str]
    implementation: str
    geometry: Dict[str, str] = field(default_factory=dict)

    def label(self, backend: str) -> str:
        """Legend/tick label: the implementation name for DaCe, else the backend name."""
        return self.implementation if backend == DACE else backend

    @property
    def references(self) -> List[str]:
        """Reference backends present in the run, in order."""
        return [b for b in self.backends if b != DACE]

    @property
    def first_reference(self) -> Optional[str]:
        """The reference DaCe is compared with in the median plot (None if there is none)."""
        refs = self.references
        return refs[0] if refs else None

    def stats(self, layer: str, backend: str) -> Optional[Stats]:
        """Median and quartiles from ``summary.csv``, else from the samples, else None."""
        row = self.summary.get((layer, backend))
        if row is not None and _finite(row.get("median_ms")):
            med = row["median_ms"]
            q1 = row.get("q1_ms", math.nan)
            q3 = row.get("q3_ms", math.nan)
            return Stats(med, q1 if _finite(q1) else med, q3 if _finite(q3) else med,
                         row.get("noisy"))
        times = self.samples.get((layer, backend))
        if times is None or times.size == 0:
            return None
        q1, med, q3 = np.percentile(times, [25, 50, 75])
        return Stats(float(med), float(q1), float(q3), None)

    def ratio(self, layer: str, reference: str) -> float:
        """DaCe median / ``reference`` median on ``layer`` (NaN if either is missing)."""
        row = self.summary.get((layer, DACE))
        if row is not None and _finite(row.get(f"ratio_vs_{reference}")):
            return float(row[f"ratio_vs_{reference}"])
        mine, ref = self.stats(layer, DACE), self.stats(layer, reference)
        if mine is None or ref is None or not ref.median > 0:
            return math.nan
        return mine.median / ref.median


# ----------------------------------------------------------------------------- reading

def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _read_csv(path: Path, required: Sequence[str]) -> List[Tuple[int, Dict[str, str]]]:
    """Rows of ``path`` as (line number, dict); checks the header has ``required``."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing {path.name} (not a run directory?)")
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames
        if not header:
            raise ValueError(f"{path}: empty file, expected a header line")
        header = [h.strip() for h in header]
        reader.fieldnames = header
        for col in required:
            if col not in header:
                raise ValueError(f"{path}: missing column '{col}' (header: {','.join(header)})")
        rows = []
        for row in reader:
            if None in row:
                raise ValueError(f"{path}:{reader.line_num}: more fields than the header")
            rows.append((reader.line_num, {k: (v or "").strip() for k, v in row.items()}))
    return rows


def _number(path: Path, line: int, col: str, text: str, required: bool = False) -> float:
    if text.lower() in MISSING:
        if required:
            raise ValueError(f"{path}:{line}: column '{col}': empty, expected a number")
        return math.nan
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{path}:{line}: column '{col}': {text!r} is not a number") from None


def _index(path: Path, line: int, text: str) -> int:
    try:
        return int(float(text))
    except ValueError:
        raise ValueError(f"{path}:{line}: column 'layer_index': {text!r} is not an integer") \
            from None


def _bool(path: Path, line: int, col: str, text: str) -> Optional[bool]:
    low = text.lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    if low in MISSING:
        return None
    raise ValueError(f"{path}:{line}: column '{col}': {text!r} is not True/False")


def load_run(run_dir: Union[str, Path]) -> RunData:
    """Read ``samples.csv``, ``summary.csv`` and ``metadata.json`` of ``run_dir``.

    Raises FileNotFoundError naming the missing directory or file, and ValueError
    naming the file, line and column of bad content.
    """
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise FileNotFoundError(f"{run_dir}: no such run directory")
    if not run_dir.is_dir():
        raise NotADirectoryError(f"{run_dir}: not a directory")

    meta_path = run_dir / METADATA
    if not meta_path.is_file():
        raise FileNotFoundError(f"{meta_path}: missing {METADATA} (not a run directory?)")
    try:
        metadata = json.loads(meta_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{meta_path}: not valid JSON ({err})") from None
    if not isinstance(metadata, dict):
        raise ValueError(  # noqa: TRY004 (bad file content, not a bad argument)
            f"{meta_path}: expected a JSON object, got {type(metadata).__name__}")

    order: Dict[str, int] = {}  # layer -> layer_index
    seen_backends: List[str] = []

    def note(layer: str, index: int, backend: str) -> None:
        order.setdefault(layer, index)
        if backend not in seen_backends:
            seen_backends.append(backend)

    spath = run_dir / SAMPLES
    lists: Dict[Tuple[str, str], List[float]] = {}
    impls = set()
    for line, row in _read_csv(spath, SAMPLE_COLUMNS):
        layer, backend = row["layer"], row["backend"]
        if not layer or not backend:
            raise ValueError(f"{spath}:{line}: empty 'layer' or 'backend'")
        note(layer, _index(spath, line, row["layer_index"]), backend)
        t = _number(spath, line, "time_ms", row["time_ms"], required=True)
        if backend == DACE and row["implementation"]:
            impls.add(row["implementation"])
        lists.setdefault((layer, backend), [])
        if math.isfinite(t):
            lists[(layer, backend)].append(t)
    samples = {k: np.asarray(v, dtype=float) for k, v in lists.items()}

    upath = run_dir / SUMMARY
    summary: Dict[Tuple[str, str], Dict[str, Any]] = {}
    geometry: Dict[str, str] = {}
    for line, row in _read_csv(upath, SUMMARY_REQUIRED):
        layer, backend = row["layer"], row["backend"]
        if not layer or not backend:
            raise ValueError(f"{upath}:{line}: empty 'layer' or 'backend'")
        typed: Dict[str, Any] = {}
        for col, text in row.items():
            if col in SUMMARY_TEXT:
                typed[col] = text
            elif col == "noisy":
                typed[col] = _bool(upath, line, col, text)
            elif col == "layer_index":
                typed[col] = _index(upath, line, text)
            else:
                typed[col] = _number(upath, line, col, text)
        note(layer, typed["layer_index"], backend)
        summary[(layer, backend)] = typed
        if typed.get("geometry"):
            geometry.setdefault(layer, typed["geometry"])
        if backend == DACE and typed.get("implementation"):
            impls.add(typed["implementation"])

    if not samples and not summary:
        raise ValueError(f"{run_dir}: no rows in {SAMPLES} nor {SUMMARY}")
    meta_impl = metadata.get("implementation")
    if isinstance(meta_impl, str) and meta_impl:
        implementation = meta_impl
    elif len(impls) == 1:
        implementation = impls.pop()
    elif impls:
        raise ValueError(f"{run_dir}: the dace rows name several implementations: "
                         f"{', '.join(sorted(impls))}")
    else:
        implementation = DACE

    layers = sorted(order, key=lambda name: (order[name], name))
    refs = metadata.get("references")
    refs = [r for r in refs if isinstance(r, str)] if isinstance(refs, list) else []
    backends = [DACE] if DACE in seen_backends else []
    backends += [r for r in refs if r in seen_backends and r != DACE]
    backends += sorted(b for b in seen_backends if b not in backends)
    return RunData(run_dir, metadata, samples, summary, layers, backends, implementation,
                   geometry)


# ----------------------------------------------------------------------------- titles

def _batch_text(run: RunData) -> str:
    batch = run.metadata.get("batch")
    if batch is None:
        values = {row.get("batch") for row in run.summary.values() if _finite(row.get("batch"))}
        if len(values) == 1:
            batch = int(values.pop())
    return f"batch {batch}" if batch is not None else "batch as in the layer file"


def run_title(run: RunData, what: str, width: int = 100) -> str:
    """Two or three title lines: what, implementation and pass; device, layers, batch, timing."""
    meta = run.metadata
    first = f"{what}: {run.implementation}"
    if meta.get("pass"):
        first += f" ({meta['pass']})"
    if run.references:
        first += " vs " + ", ".join(run.references)
    status = meta.get("status")
    if isinstance(status, str) and status and status != "complete":
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


def _save(fig: "plt.Figure", path: Union[str, Path]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(path, dpi=DPI)
    finally:
        plt.close(fig)
    return path


def _layer_title(run: RunData, layer: str) -> str:
    geo = run.geometry.get(layer)
    return f"{layer}\n{geo}" if geo else layer


# ----------------------------------------------------------------------------- violin

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
        return _save(fig, path)


def _violin_axes(ax: "plt.Axes", run: RunData, layer: str) -> None:
    ax.set_title(_layer_title(run, layer))
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
    for pos, backend in enumerate(present):
        times = run.samples[(layer, backend)]
        color = backend_color(backend)
        med = float(np.median(times))
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
        ticks.append(f"{run.label(backend)}\n{_fmt_ms(med)} ms, n={times.size}")
    ax.set_xticks(range(len(present)))
    ax.set_xticklabels(ticks)
    ax.set_xlim(-0.6, len(present) - 0.4)
    medians = [float(np.median(run.samples[(layer, b)])) for b in present]
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


def _fmt_ms(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:#.3g}"


# ----------------------------------------------------------------------------- medians

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
                r = run.ratio(layer, ref)
                if i not in tops:
                    continue
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
        return _save(fig, path)


def _layer_tick(run: RunData, layer: str, nlayers: int) -> str:
    geo = run.geometry.get(layer)
    if geo and nlayers <= 8:
        return f"{layer}\n" + "\n".join(textwrap.wrap(geo, 15))
    return layer


# ----------------------------------------------------------------------------- roofline

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
            if not (_finite(perf) and perf > 0) and _finite(row.get("gflop")):
                st = run.stats(layer, backend)  # GFLOP / median seconds
                if st is not None and st.median > 0:
                    perf = row["gflop"] / (st.median / 1e3)
            if _finite(inten) and inten > 0 and _finite(perf) and perf > 0:
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
            label = f"memory: {_fmt_num(bw)} GB/s" + (f" ({bw_how})" if bw_how else "")
            h, = ax.plot(xm, bw * xm, color="0.25", linestyle="--", linewidth=1.6,
                         label=_wrap(label, 60))
            handles.append(h)
        if peak:
            xp = grid if not bw else np.insert(grid[grid >= ridge], 0, ridge)
            label = f"compute: {_fmt_num(peak)} GFLOP/s" + (f" ({peak_how})" if peak_how else "")
            h, = ax.plot(xp, np.full_like(xp, peak), color="0.25", linestyle="-",
                         linewidth=1.6, label=_wrap(label, 60))
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
        for layer, backend, inten, perf in points:
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
        _place_labels(fig, ax, labels, [(p[2], p[3]) for p in points])
        return _save(fig, path)


def _fmt_num(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width, subsequent_indent="  "))


# candidate label positions around a point: offset [points], ha, va
_LABEL_SPOTS = (((0, 7), "center", "bottom"), ((8, 0), "left", "center"),
                ((-8, 0), "right", "center"), ((6, 6), "left", "bottom"),
                ((-6, 6), "right", "bottom"), ((0, -8), "center", "top"),
                ((6, -6), "left", "top"), ((-6, -6), "right", "top"))


def _place_labels(fig: "plt.Figure", ax: "plt.Axes", labels: list,
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


# ----------------------------------------------------------------------------- all

def plot_run(run_dir: Union[str, Path, RunData],
             outdir: Union[str, Path, None] = None) -> List[Path]:
    """Write ``violin.png``, ``medians.png`` and ``roofline.png`` of a run into ``outdir``
    (default: the run directory); returns their paths.  ``run_dir`` may be a loaded run."""
    run = run_dir if isinstance(run_dir, RunData) else load_run(run_dir)
    out = Path(outdir) if outdir is not None else run.run_dir
    out.mkdir(parents=True, exist_ok=True)
    return [plot_violin(run, out / "violin.png"),
            plot_medians(run, out / "medians.png"),
            plot_roofline(run, out / "roofline.png")]


# ---------------------------------------------------------------------------------------------
# End-to-end runs: the runtime breakdown
# ---------------------------------------------------------------------------------------------

def read_breakdown(run_dir: Union[str, Path]) -> Dict[str, Dict[str, Dict[str, float]]]:
    """``phase -> backend -> part -> median ms`` from an end-to-end run's ``summary.csv``,
    whose ``layer`` column names ``<phase>.<part>`` (``train.conv2.bwd``, ``forward.other``,
    ``train.total``)."""
    path = Path(run_dir) / SUMMARY
    out: Dict[str, Dict[str, Dict[str, float]]] = {}
    for line, row in _read_csv(path, ("layer", "backend", "median_ms")):
        phase, sep, part = row["layer"].partition(".")
        if not sep or not part:
            raise ValueError(f"{path}:{line}: layer {row['layer']!r} is not <phase>.<part> "
                             "(not an end-to-end run?)")
        value = _number(path, line, "median_ms", row["median_ms"], required=True)
        out.setdefault(phase, {}).setdefault(row["backend"], {})[part] = value
    if not out:
        raise ValueError(f"{path}: no rows")
    return out


def plot_breakdown(run_dir: Union[str, Path], path: Union[str, Path]) -> Path:
    """``runtimebreakdown.png``: per phase (forward pass, training step) one stacked bar
    per backend, in milliseconds (top row) and as shares of the step (bottom row): each
    convolution's forward (solid) and backward (hatched) median, and the rest of the
    step (grey: the median step time minus the convolutions' medians), with the median
    step time and its ratio to torch on top."""
    data = read_breakdown(run_dir)
    meta_path = Path(run_dir) / METADATA
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
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
                if _finite(value) and value > 0:
                    pieces.append((value, colors[name], hatch))
        convs = sum(v for v, _, _ in pieces)
        total = parts.get("total", math.nan)
        other = total - convs if _finite(total) else parts.get("other", math.nan)
        if _finite(other) and other > 0:
            pieces.append((other, "#c7c7c7", None))
        return pieces, total if _finite(total) else convs + max(other, 0.0)

    width = 3.6 * len(phases) + 2.2
    with plt.rc_context(FONT):
        fig, axes = plt.subplots(2, len(phases), figsize=(width, 8.0), squeeze=False,
                                 gridspec_kw={"height_ratios": (3, 2)})
        for col, phase in enumerate(phases):
            backends = sorted(data[phase], key=lambda b: (b != "torch", b))
            ref = data[phase].get("torch", {}).get("total")
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
                        if backend != "torch" and _finite(ref) and ref > 0:
                            ratio = f"\n{total / ref:.2f}x torch"
                        ax.text(x, bottom, f"{_fmt_ms(total)}{ratio}", ha="center", va="bottom")
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
                    Patch(color="#c7c7c7", label="everything else")]
        fig.legend(handles=handles, loc="center right", frameon=False)
        what = (f"CosmoFlow {meta.get('model', '')} end to end, {meta.get('size', '?')}^3, batch "
                f"{meta.get('batch', '?')}, {(meta.get('device') or {}).get('name', '')}")
        fig.suptitle(_wrap(what, 90))
        fig.tight_layout(rect=(0, 0, 1 - 1.9 / width, 0.96))
        return _save(fig, path)
