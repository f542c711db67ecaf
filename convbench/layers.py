"""The layer model and the layer-set CSV reader.

README.md, "Layer CSV format", describes the canonical and the legacy format.  Every
problem is raised as :class:`~convbench.errors.LayerFileError`, naming the file, the
line and the field.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from .errors import LayerFileError, UsageError

CANONICAL_HEADER = ("layer", "batch", "in_channels", "out_channels", "in_d", "in_h", "in_w",
                    "k_d", "k_h", "k_w", "stride", "pad")
#: Optional columns of the canonical format: per-dimension padding overriding ``pad``
#: (an empty cell means ``pad``).
OPTIONAL_COLUMNS = ("pad_d", "pad_h", "pad_w")
LEGACY_HEADER = ("InChannel", "InputDepth", "InputHeight", "InputWidth", "KernelDepth",
                 "KernelHeight", "KernelWidth", "OutputChannel", "OutputDepth", "OutputHeight",
                 "OutputWidth")
#: Batch given to rows of legacy files, which carry none (``--batch`` overrides).
LEGACY_BATCH = 1

#: The folder of the shipped layer sets.
CONVPARAMS_DIR = Path(__file__).resolve().parent.parent / "convparams"


@dataclasses.dataclass(frozen=True)
class Layer:
    """One 3D convolution: NCDHW input of ``batch x in_channels x in_d x in_h x in_w``,
    ``out_channels`` filters of ``k_d x k_h x k_w``, the same stride and padding
    in every spatial dimension, no dilation, no groups."""

    name: str
    batch: int
    in_channels: int
    out_channels: int
    in_d: int
    in_h: int
    in_w: int
    k_d: int
    k_h: int
    k_w: int
    stride: int = 1
    pad: int = 0
    #: Per-dimension padding where it differs from ``pad`` (None: ``pad``).  A 2D layer
    #: written as 3D (depth 1, kernel depth 1) pads height and width only.
    pad_d: Optional[int] = None
    pad_h: Optional[int] = None
    pad_w: Optional[int] = None

    def __post_init__(self):
        problem = self.problem()
        if problem is not None:
            raise ValueError(f"layer {self.name!r}: {problem[1]}")

    # -- validity ---------------------------------------------------------------------------
    def problem(self):
        """``(field, message)`` for the first thing wrong with this layer, or None."""
        for field in ("batch", "in_channels", "out_channels", "in_d", "in_h", "in_w", "k_d",
                      "k_h", "k_w", "stride"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                return field, f"must be a positive integer, got {value!r}"
        if not isinstance(self.pad, int) or self.pad < 0:
            return "pad", f"must be a non-negative integer, got {self.pad!r}"
        for dim in ("d", "h", "w"):
            value = getattr(self, f"pad_{dim}")
            if value is not None and (not isinstance(value, int) or value < 0):
                return f"pad_{dim}", f"must be a non-negative integer, got {value!r}"
        for dim, p in zip(("d", "h", "w"), self.pads):
            size, k = getattr(self, f"in_{dim}"), getattr(self, f"k_{dim}")
            if k > size + 2 * p:
                return (f"k_{dim}", f"kernel size {k} is larger than the padded input "
                        f"({size} + 2*{p} = {size + 2 * p})")
        return None

    @property
    def pads(self) -> Tuple[int, int, int]:
        """Padding of depth, height and width."""
        return tuple(self.pad if p is None else p for p in (self.pad_d, self.pad_h, self.pad_w))

    @property
    def anisotropic(self) -> bool:
        """True if the dimensions are not all padded alike."""
        return len(set(self.pads)) > 1

    # -- derived sizes ----------------------------------------------------------------------
    def _out(self, size, k, pad):
        return (size + 2 * pad - k) // self.stride + 1

    @property
    def out_d(self):
        return self._out(self.in_d, self.k_d, self.pads[0])

    @property
    def out_h(self):
        return self._out(self.in_h, self.k_h, self.pads[1])

    @property
    def out_w(self):
        return self._out(self.in_w, self.k_w, self.pads[2])

    @property
    def input_shape(self):
        """NCDHW shape of the input."""
        return (self.batch, self.in_channels, self.in_d, self.in_h, self.in_w)

    @property
    def filter_shape(self):
        """KCTRS shape of the filter (torch's ``weight`` shape)."""
        return (self.out_channels, self.in_channels, self.k_d, self.k_h, self.k_w)

    @property
    def output_shape(self):
        """NCDHW shape of the output."""
        return (self.batch, self.out_channels, self.out_d, self.out_h, self.out_w)

    @property
    def gemm_m(self):
        """Rows of the implicit GEMM: N * Do * Ho * Wo."""
        return self.batch * self.out_d * self.out_h * self.out_w

    @property
    def gemm_n(self):
        """Columns of the implicit GEMM: the output channels."""
        return self.out_channels

    @property
    def gemm_k(self):
        """Reduction length of the forward pass: C * kd * kh * kw."""
        return self.in_channels * self.k_d * self.k_h * self.k_w

    def flops(self):
        """Floating-point operations of one forward pass (a multiply-add counts 2)."""
        return 2 * self.gemm_m * self.gemm_n * self.gemm_k

    def with_batch(self, batch: int) -> "Layer":
        return dataclasses.replace(self, batch=batch)

    def describe(self) -> str:
        """A short human-readable form, e.g. ``16->32 66x66x66 k3x3x3 s1 p0 b16``."""
        def dims(a, b, c):
            return f"{a}^3" if a == b == c else f"{a}x{b}x{c}"
        return (f"{self.in_channels}->{self.out_channels} @{dims(self.in_d, self.in_h, self.in_w)}"
                f" k{dims(self.k_d, self.k_h, self.k_w)} s{self.stride} p{self._pad_text(',')}"
                f" b{self.batch}")

    def _pad_text(self, sep: str) -> str:
        return str(self.pad) if not self.anisotropic else sep.join(map(str, self.pads))

    def key(self) -> str:
        """Geometry (name excluded) as a stable string, for build names and caches."""
        return (f"b{self.batch}_c{self.in_channels}_k{self.out_channels}_i{self.in_d}x{self.in_h}x"
                f"{self.in_w}_f{self.k_d}x{self.k_h}x{self.k_w}_s{self.stride}_p{self._pad_text('x')}")


# -- CSV reading ---------------------------------------------------------------------------

def _int_field(path, lineno, field, text):
    text = (text or "").strip()
    try:
        return int(text, 10)
    except ValueError:
        raise LayerFileError(path, lineno, f"not an integer: {text!r}", field=field) from None


def _check_layer(path, lineno, values: dict, column_of=None) -> Layer:
    """Build a Layer from parsed integers, turning validity problems into LayerFileErrors.

    ``column_of`` maps Layer fields to the file's column names where they differ."""
    probe = object.__new__(Layer)  # validate without raising from __post_init__
    for f in dataclasses.fields(Layer):
        object.__setattr__(probe, f.name, values.get(f.name, f.default))
    problem = probe.problem()
    if problem is not None:
        field = (column_of or {}).get(problem[0], problem[0])
        raise LayerFileError(path, lineno, problem[1], field=field)
    return Layer(**values)


def parse_layers(text: str, path="<string>") -> List[Layer]:
    """Parse a layer-set CSV (canonical or legacy header) held in ``text``."""
    rows = list(csv.reader(io.StringIO(text)))
    # Line numbers are 1-based; skip blank lines but keep numbering.
    numbered = [(i + 1, row) for i, row in enumerate(rows) if any(cell.strip() for cell in row)]
    if not numbered:
        raise LayerFileError(path, None, "empty file: no header and no layers")
    header_line, header = numbered[0]
    header = [h.strip() for h in header]
    body = numbered[1:]

    if "InChannel" in header or "OutputChannel" in header:
        expected, legacy = LEGACY_HEADER, True
    else:
        expected, legacy = CANONICAL_HEADER, False
    optional = () if legacy else OPTIONAL_COLUMNS
    for col in header:
        if col not in expected and col not in optional:
            raise LayerFileError(path, header_line, f"unknown column '{col}' (expected: "
                                 f"{','.join(expected)}" + (f"; optional: {','.join(optional)}"
                                                            if optional else "") + ")")
    for col in expected:
        if col not in header:
            raise LayerFileError(path, header_line, f"missing column '{col}'")
    if len(set(header)) != len(header):
        dup = next(c for c in header if header.count(c) > 1)
        raise LayerFileError(path, header_line, f"duplicated column '{dup}'")

    if not body:
        raise LayerFileError(path, header_line, "no layers after the header")
    layers: List[Layer] = []
    seen = {}
    for lineno, row in body:
        if len(row) != len(header):
            raise LayerFileError(path, lineno, f"expected {len(header)} fields, got {len(row)}")
        cells = dict(zip(header, row))
        if legacy:
            layer = _legacy_layer(path, lineno, cells, index=len(layers))
        else:
            name = cells["layer"].strip()
            if not name:
                raise LayerFileError(path, lineno, "empty layer name", field="layer")
            values = {"name": name}
            for f in CANONICAL_HEADER[1:]:
                values[f] = _int_field(path, lineno, f, cells[f])
            for f in OPTIONAL_COLUMNS:
                if f in cells and cells[f].strip():
                    values[f] = _int_field(path, lineno, f, cells[f])
            layer = _check_layer(path, lineno, values)
        if layer.name in seen:
            raise LayerFileError(path, lineno, f"duplicated layer name '{layer.name}' (first on "
                                 f"line {seen[layer.name]})", field="layer")
        seen[layer.name] = lineno
        layers.append(layer)
    return layers


def _legacy_layer(path, lineno, cells, index) -> Layer:
    ints = {col: _int_field(path, lineno, col, cells[col]) for col in LEGACY_HEADER}
    values = dict(name=f"layer{index}", batch=LEGACY_BATCH, in_channels=ints["InChannel"],
                  out_channels=ints["OutputChannel"], in_d=ints["InputDepth"],
                  in_h=ints["InputHeight"], in_w=ints["InputWidth"], k_d=ints["KernelDepth"],
                  k_h=ints["KernelHeight"], k_w=ints["KernelWidth"], stride=1, pad=0)
    column_of = {"in_channels": "InChannel", "out_channels": "OutputChannel",
                 "in_d": "InputDepth", "in_h": "InputHeight", "in_w": "InputWidth",
                 "k_d": "KernelDepth", "k_h": "KernelHeight", "k_w": "KernelWidth"}
    layer = _check_layer(path, lineno, values, column_of)
    for dim, col in (("d", "OutputDepth"), ("h", "OutputHeight"), ("w", "OutputWidth")):
        given = ints[col]
        computed = getattr(layer, f"out_{dim}")
        if given != computed:
            raise LayerFileError(path, lineno, f"output size {given} is inconsistent with the "
                                 f"input and kernel (stride 1, pad 0 give {computed})", field=col)
    return layer


def resolve_layer_set(spec: str) -> Path:
    """Map ``--paramscsv`` (a set name in ``convparams/`` or a path) to a file path."""
    candidates = [Path(spec)]
    if os.sep not in spec and "/" not in spec:
        candidates.insert(0, CONVPARAMS_DIR / (spec if spec.endswith(".csv") else spec + ".csv"))
    for cand in candidates:
        if cand.is_file():
            return cand
    known = ", ".join(available_layer_sets()) or "none"
    raise UsageError(f"--paramscsv: no layer set or file named '{spec}' (known sets: {known})")


def available_layer_sets() -> List[str]:
    return sorted(p.stem for p in CONVPARAMS_DIR.glob("*.csv"))


def load_layers(spec: str) -> List[Layer]:
    """Read a layer set by name or path."""
    path = resolve_layer_set(spec)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise LayerFileError(path, None, f"cannot read: {err}") from None
    return parse_layers(text, path=_display_path(path))


def _display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def select_layers(layers: Sequence[Layer], first: Optional[int], last: Optional[int]) -> List[Layer]:
    """Layers ``first .. last-1`` (the original CLI's ``--currlayer``/``--lastlayer``)."""
    n = len(layers)
    lo = 0 if first is None else first
    hi = n if last is None else last
    if not 0 <= lo < n:
        raise UsageError(f"--currlayer: {lo} is out of range (the set has layers 0..{n - 1})")
    if not lo < hi <= n:
        raise UsageError(f"--lastlayer: {hi} must be in {lo + 1}..{n} (layers --currlayer.."
                         f"--lastlayer-1 are run)")
    return list(layers[lo:hi])
