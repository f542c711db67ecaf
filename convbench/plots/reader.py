"""Reading a run folder (see :mod:`convbench.results.schema`): no drawing here.

:func:`load_run` reads a profiler run into a :class:`RunData`, :func:`read_breakdown`
the medians of an end-to-end run.  Bad input raises FileNotFoundError naming the
missing folder or file, or ValueError naming the file, line and column.
"""

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from convbench.results import schema
from convbench.results.schema import DACE

#: Cell values read as "not available" (NaN) in numeric columns.
MISSING = {"", "nan", "none", "null", "n/a", "na", "-"}


def finite(value: Any) -> bool:
    """A finite int or float (not None, not NaN, not text)."""
    return isinstance(value, (int, float)) and math.isfinite(value)


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
        if row is not None and finite(row.get("median_ms")):
            med = row["median_ms"]
            q1 = row.get("q1_ms", math.nan)
            q3 = row.get("q3_ms", math.nan)
            return Stats(med, q1 if finite(q1) else med, q3 if finite(q3) else med,
                         row.get("noisy"))
        times = self.samples.get((layer, backend))
        if times is None or times.size == 0:
            return None
        q1, med, q3 = np.percentile(times, [25, 50, 75])
        return Stats(float(med), float(q1), float(q3), None)

    def ratio(self, layer: str, reference: str) -> float:
        """DaCe median / ``reference`` median on ``layer`` (NaN if either is missing)."""
        row = self.summary.get((layer, DACE))
        column = schema.ratio_column(reference)
        if row is not None and finite(row.get(column)):
            return float(row[column])
        mine, ref = self.stats(layer, DACE), self.stats(layer, reference)
        if mine is None or ref is None or not ref.median > 0:
            return math.nan
        return mine.median / ref.median


# ----------------------------------------------------------------------------- files

def _require(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing {path.name} (not a run directory?)")


def read_metadata(run_dir: Union[str, Path], required: bool = True) -> Dict[str, Any]:
    """``metadata.json`` of ``run_dir`` (``{}`` when it is missing and not ``required``)."""
    path = Path(run_dir) / schema.METADATA
    if not required and not path.is_file():
        return {}
    _require(path)
    try:
        metadata = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(metadata, dict):
        raise ValueError(  # noqa: TRY004 (bad file content, not a bad argument)
            f"{path}: expected a JSON object, got {type(metadata).__name__}")
    return metadata


def _read_csv(path: Path, required: Sequence[str]) -> List[Tuple[int, Dict[str, str]]]:
    """Rows of ``path`` as (line number, dict of stripped cells); checks the header has
    the ``required`` columns."""
    _require(path)
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames:
            raise ValueError(f"{path}: empty file, expected a header line")
        header = reader.fieldnames = [h.strip() for h in reader.fieldnames]
        for col in required:
            if col not in header:
                raise ValueError(f"{path}: missing column '{col}' (header: {','.join(header)})")
        rows = []
        for row in reader:
            if None in row:
                raise ValueError(f"{path}:{reader.line_num}: more fields than the header")
            rows.append((reader.line_num, {k: (v or "").strip() for k, v in row.items()}))
    return rows


def _key(path: Path, line: int, row: Dict[str, str]) -> Tuple[str, str]:
    """(layer, backend) of a row, both non-empty."""
    if not row["layer"] or not row["backend"]:
        raise ValueError(f"{path}:{line}: empty 'layer' or 'backend'")
    return row["layer"], row["backend"]


def _cell(path: Path, line: int, col: str, text: str, required: bool = False) -> Any:
    """A cell typed by its column: text for :data:`schema.SUMMARY_TEXT`, ``noisy`` as bool
    or None, ``layer_index`` as int, any other column as a number (NaN where empty, unless
    ``required``)."""
    where, low = f"{path}:{line}: column '{col}'", text.lower()
    if col in schema.SUMMARY_TEXT:
        return text
    if col == "noisy":
        if low in ("true", "1", "yes", "false", "0", "no"):
            return low in ("true", "1", "yes")
        if low in MISSING:
            return None
        raise ValueError(f"{where}: {text!r} is not True/False")
    if col == "layer_index":
        try:
            return int(float(text))
        except (ValueError, OverflowError):
            raise ValueError(f"{where}: {text!r} is not an integer") from None
    if low in MISSING:
        if required:
            raise ValueError(f"{where}: empty, expected a number")
        return math.nan
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{where}: {text!r} is not a number") from None


# ----------------------------------------------------------------------------- runs

def load_run(run_dir: Union[str, Path]) -> RunData:
    """Read ``samples.csv``, ``summary.csv`` and ``metadata.json`` of ``run_dir``."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise FileNotFoundError(f"{run_dir}: no such run directory")
    if not run_dir.is_dir():
        raise NotADirectoryError(f"{run_dir}: not a directory")
    metadata = read_metadata(run_dir)

    order: Dict[str, int] = {}  # layer -> layer_index
    seen_backends: List[str] = []
    impls = set()  # the implementations the dace rows name

    def note(layer: str, index: int, backend: str, implementation: str) -> None:
        order.setdefault(layer, index)
        if backend not in seen_backends:
            seen_backends.append(backend)
        if backend == DACE and implementation:
            impls.add(implementation)

    spath = run_dir / schema.SAMPLES
    lists: Dict[Tuple[str, str], List[float]] = {}
    for line, row in _read_csv(spath, schema.SAMPLE_COLUMNS):
        key = _key(spath, line, row)
        note(key[0], _cell(spath, line, "layer_index", row["layer_index"]), key[1],
             row["implementation"])
        t = _cell(spath, line, "time_ms", row["time_ms"], required=True)
        lists.setdefault(key, [])
        if math.isfinite(t):
            lists[key].append(t)
    samples = {k: np.asarray(v, dtype=float) for k, v in lists.items()}

    upath = run_dir / schema.SUMMARY
    summary: Dict[Tuple[str, str], Dict[str, Any]] = {}
    geometry: Dict[str, str] = {}
    for line, row in _read_csv(upath, schema.SUMMARY_REQUIRED):
        key = _key(upath, line, row)
        typed = summary[key] = {col: _cell(upath, line, col, text) for col, text in row.items()}
        note(key[0], typed["layer_index"], key[1], typed.get("implementation"))
        if typed.get("geometry"):
            geometry.setdefault(key[0], typed["geometry"])

    if not samples and not summary:
        raise ValueError(f"{run_dir}: no rows in {schema.SAMPLES} nor {schema.SUMMARY}")
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


def read_breakdown(run_dir: Union[str, Path]) -> Dict[str, Dict[str, Dict[str, float]]]:
    """``phase -> backend -> part -> median ms`` from an end-to-end run's ``summary.csv``,
    whose ``layer`` column names ``<phase>.<part>`` (``train.conv2.bwd``, ``forward.other``,
    ``train.total``): the median of the process medians where the run timed in several
    processes (``median_of_processes_ms``), else the median."""
    path = Path(run_dir) / schema.SUMMARY
    out: Dict[str, Dict[str, Dict[str, float]]] = {}
    for line, row in _read_csv(path, ("layer", "backend", "median_ms")):
        phase, sep, part = row["layer"].partition(".")
        if not sep or not part:
            raise ValueError(f"{path}:{line}: layer {row['layer']!r} is not <phase>.<part> "
                             "(not an end-to-end run?)")
        column = "median_of_processes_ms" if row.get("median_of_processes_ms") else "median_ms"
        value = _cell(path, line, column, row[column], required=True)
        out.setdefault(phase, {}).setdefault(row["backend"], {})[part] = value
    if not out:
        raise ValueError(f"{path}: no rows")
    return out
