"""The layer model and the layer-set CSV reader.

docs/layers.md describes the canonical and the legacy format.  Every
problem is raised as :class:`~convbench.base.errors.LayerFileError`, naming the file, the
line and the field.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from typing import List, Optional, Sequence, Tuple

from convbench.base.errors import LayerFileError

CANONICAL_HEADER = ("layer", "batch", "in_channels", "out_channels", "in_d", "in_h", "in_w",
                    "k_d", "k_h", "k_w", "stride", "pad")
#: Optional columns of the canonical format: per-dimension padding and stride overriding
#: ``pad`` and ``stride`` (an empty cell means ``pad``, ``stride``), dilation (all
#: dimensions, then per dimension), groups, and ``transposed`` (1: the row is a transposed
#: convolution as torch's ``ConvTranspose3d`` takes it, with ``output_pad``), and the
#: padding at the back, bottom and right where it differs from the front (``pad_d_end`` ...;
#: empty: as at the front).  The ``pad`` cell may also say ``same`` or ``valid``.
OPTIONAL_COLUMNS = ("pad_d", "pad_h", "pad_w", "stride_d", "stride_h", "stride_w", "dilation",
                    "dilation_d", "dilation_h", "dilation_w", "groups", "transposed",
                    "output_pad", "output_pad_d", "output_pad_h", "output_pad_w",
                    "pad_d_end", "pad_h_end", "pad_w_end")
#: The ``pad`` cell's words: ``valid`` (no padding) and ``same`` (the output of a stride-1
#: layer as large as its input; with a stride, ``ceil(input / stride)``, as TensorFlow and
#: ONNX's ``SAME_UPPER`` have it), the odd one of an even total at the end, as torch pads.
PAD_WORDS = ("same", "valid")
#: Lines of a layer CSV that start with this (after blanks) are comments.
COMMENT = "#"
LEGACY_HEADER = ("InChannel", "InputDepth", "InputHeight", "InputWidth", "KernelDepth",
                 "KernelHeight", "KernelWidth", "OutputChannel", "OutputDepth", "OutputHeight",
                 "OutputWidth")
#: Batch given to rows of legacy files, which carry none (``--batch`` overrides).
LEGACY_BATCH = 1

#: The folder of the shipped layer sets.


#: What a layer may need beyond the basic model (one stride, one padding, no dilation, no
#: groups), as :meth:`Layer.features` names it; an implementation lists those it handles.
FEATURES = ("anisotropic padding", "anisotropic stride", "dilation", "groups",
            "asymmetric padding")


@dataclasses.dataclass(frozen=True)
class Layer:
    """One 3D convolution: NCDHW input of ``batch x in_channels x in_d x in_h x in_w``,
    ``out_channels`` filters of ``k_d x k_h x k_w`` over ``in_channels / groups``
    channels each, with a stride, a padding and a dilation per spatial dimension.

    ``stride``, ``pad`` and ``dilation`` apply to every dimension unless a per-dimension
    field (``stride_d`` ...) says otherwise.  ``transposed``: the layer is a transposed
    convolution (torch's ``ConvTranspose3d``), stored as the convolution whose gradient
    for the input it is, so its forward pass is this layer's ``bwd_data`` pass (see
    :meth:`transposed_of`)."""

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
    stride_d: Optional[int] = None
    stride_h: Optional[int] = None
    stride_w: Optional[int] = None
    dilation: int = 1
    dilation_d: Optional[int] = None
    dilation_h: Optional[int] = None
    dilation_w: Optional[int] = None
    groups: int = 1
    transposed: bool = False
    #: Padding at the back, bottom and right where it differs from the front, top and left
    #: (None: the same): ``padding='same'`` with an even kernel, ONNX's per-side ``pads``.
    pad_d_end: Optional[int] = None
    pad_h_end: Optional[int] = None
    pad_w_end: Optional[int] = None

    def __post_init__(self):
        problem = self.problem()
        if problem is not None:
            raise ValueError(f"layer {self.name!r}: {problem[1]}")

    # -- validity ---------------------------------------------------------------------------
    def problem(self):
        """``(field, message)`` for the first thing wrong with this layer, or None."""
        for field in ("batch", "in_channels", "out_channels", "in_d", "in_h", "in_w", "k_d",
                      "k_h", "k_w", "stride", "dilation", "groups"):
            value = getattr(self, field)
            if not _is_int(value) or value <= 0:
                return field, f"must be a positive integer, got {value!r}"
        if not _is_int(self.pad) or self.pad < 0:
            return "pad", f"must be a non-negative integer, got {self.pad!r}"
        for dim in ("d", "h", "w"):
            for field, least in (("pad", 0), ("stride", 1), ("dilation", 1), ("pad_end", 0)):
                name = f"pad_{dim}_end" if field == "pad_end" else f"{field}_{dim}"
                value = getattr(self, name)
                if value is not None and (not _is_int(value) or value < least):
                    kind = "non-negative" if least == 0 else "positive"
                    return name, f"must be a {kind} integer, got {value!r}"
        if self.transposed and self.asymmetric:
            return "pad", ("a transposed convolution padded differently at its two ends is "
                           "not in the layer model")
        for field, count in (("in_channels", self.in_channels),
                             ("out_channels", self.out_channels)):
            if count % self.groups:
                return "groups", (f"{field}={count} is not a multiple of groups="
                                  f"{self.groups}")
        for dim, p, pe, dl in zip(("d", "h", "w"), self.pads, self.pads_end, self.dilations):
            size, k = getattr(self, f"in_{dim}"), getattr(self, f"k_{dim}")
            span = dl * (k - 1) + 1
            if span > size + p + pe:
                what = f"kernel size {k}" if dl == 1 else f"dilated kernel ({k} taps, span {span})"
                padded = f"2*{p}" if p == pe else f"{p} + {pe}"
                return (f"k_{dim}", f"{what} is larger than the padded input "
                        f"({size} + {padded} = {size + p + pe})")
        return None

    @property
    def pads(self) -> Tuple[int, int, int]:
        """Padding of depth, height and width."""
        return tuple(self.pad if p is None else p for p in (self.pad_d, self.pad_h, self.pad_w))

    @property
    def pads_end(self) -> Tuple[int, int, int]:
        """Padding at the back, bottom and right (:attr:`pads` where not set)."""
        return tuple(f if e is None else e
                     for f, e in zip(self.pads, (self.pad_d_end, self.pad_h_end, self.pad_w_end)))

    @property
    def asymmetric(self) -> bool:
        """True if some dimension is padded differently at its two ends."""
        return self.pads_end != self.pads

    @property
    def strides(self) -> Tuple[int, int, int]:
        """Stride of depth, height and width."""
        return tuple(self.stride if s is None else s
                     for s in (self.stride_d, self.stride_h, self.stride_w))

    @property
    def dilations(self) -> Tuple[int, int, int]:
        """Dilation of depth, height and width (1: taps next to each other)."""
        return tuple(self.dilation if d is None else d
                     for d in (self.dilation_d, self.dilation_h, self.dilation_w))

    @property
    def anisotropic(self) -> bool:
        """True if the dimensions are not all padded alike."""
        return len(set(self.pads)) > 1

    def features(self) -> Tuple[str, ...]:
        """What this layer needs beyond the basic model (names from :data:`FEATURES`)."""
        needs = {"anisotropic padding": self.anisotropic,
                 "anisotropic stride": len(set(self.strides)) > 1,
                 "dilation": any(d != 1 for d in self.dilations),
                 "groups": self.groups != 1,
                 "asymmetric padding": self.asymmetric}
        return tuple(f for f in FEATURES if needs[f])

    def feature_text(self, feature: str) -> str:
        """This layer's value of ``feature``, in words (for refusals)."""
        return {"anisotropic padding": "pads d,h,w by " + ",".join(map(str, self.pads)),
                "anisotropic stride": "strides d,h,w by " + ",".join(map(str, self.strides)),
                "dilation": "dilation " + ",".join(map(str, self.dilations)),
                "groups": f"{self.groups} groups",
                "asymmetric padding": "pads d,h,w by " + ",".join(
                    f"{p}+{e}" for p, e in zip(self.pads, self.pads_end)) + " (front+back)"}[feature]

    # -- derived sizes ----------------------------------------------------------------------
    def _out(self, axis):
        size = (self.in_d, self.in_h, self.in_w)[axis]
        k = (self.k_d, self.k_h, self.k_w)[axis]
        span = self.dilations[axis] * (k - 1) + 1
        return (size + self.pads[axis] + self.pads_end[axis] - span) // self.strides[axis] + 1

    @property
    def out_d(self):
        return self._out(0)

    @property
    def out_h(self):
        return self._out(1)

    @property
    def out_w(self):
        return self._out(2)

    @property
    def input_shape(self):
        """NCDHW shape of the input."""
        return (self.batch, self.in_channels, self.in_d, self.in_h, self.in_w)

    @property
    def filter_shape(self):
        """KCTRS shape of the filter (torch's ``weight`` shape: C is the channels of one
        group)."""
        return (self.out_channels, self.in_channels // self.groups, self.k_d, self.k_h,
                self.k_w)

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
        """Reduction length of the forward pass: C/groups * kd * kh * kw."""
        return self.in_channels // self.groups * self.k_d * self.k_h * self.k_w

    def flops(self):
        """Floating-point operations of one forward pass (a multiply-add counts 2)."""
        return 2 * self.gemm_m * self.gemm_n * self.gemm_k

    def with_batch(self, batch: int) -> "Layer":
        return dataclasses.replace(self, batch=batch)

    @classmethod
    def transposed_of(cls, name: str, batch: int, in_channels: int, out_channels: int,
                      in_size, kernel, stride=(1, 1, 1), pad=(0, 0, 0), dilation=(1, 1, 1),
                      groups: int = 1, output_pad=(0, 0, 0)) -> "Layer":
        """The layer of a transposed convolution given as torch's ``ConvTranspose3d`` takes
        it (its own input channels and size): the convolution from its output (size
        ``(i - 1)*s - 2p + d*(k - 1) + 1 + output_pad`` per dimension) back to its input,
        marked ``transposed``.  Raises ValueError for an output padding not below the
        stride (torch also takes one below the dilation; that one is not the gradient of a
        convolution of this size)."""
        out = []
        for i, k, s, p, dl, op in zip(in_size, kernel, stride, pad, dilation, output_pad):
            if not 0 <= op < s:
                raise ValueError(f"layer {name!r}: output padding {op} must be below the "
                                 f"stride {s}")
            out.append((i - 1) * s - 2 * p + dl * (k - 1) + 1 + op)
        if min(out) <= 0:
            raise ValueError(f"layer {name!r}: the transposed convolution's output would be "
                             f"{'x'.join(map(str, out))}")
        layer = cls.from_triples(name, batch, out_channels, in_channels, out, kernel, stride,
                                 pad, dilation, groups)
        return dataclasses.replace(layer, transposed=True)

    @classmethod
    def from_triples(cls, name: str, batch: int, in_channels: int, out_channels: int, in_size,
                     kernel, stride=(1, 1, 1), pad=(0, 0, 0), dilation=(1, 1, 1),
                     groups: int = 1) -> "Layer":
        """A layer from per-dimension (depth, height, width) triples, with the
        per-dimension fields set only where the dimensions differ (:meth:`normalized`)."""
        layer = cls(name, batch, in_channels, out_channels, *in_size, *kernel,
                    stride=stride[0], pad=pad[0], pad_d=pad[0], pad_h=pad[1], pad_w=pad[2],
                    stride_d=stride[0], stride_h=stride[1], stride_w=stride[2],
                    dilation=dilation[0], dilation_d=dilation[0], dilation_h=dilation[1],
                    dilation_w=dilation[2], groups=groups)
        return layer.normalized()

    @property
    def output_pads(self) -> Tuple[int, int, int]:
        """The output padding of the transposed convolution from this layer's output size
        back to its input size (``ConvTranspose3d``'s ``output_padding``)."""
        sizes = zip(self.input_shape[2:], self.output_shape[2:], self.strides, self.pads,
                    self.dilations, (self.k_d, self.k_h, self.k_w))
        return tuple(i - ((o - 1) * s - 2 * p + d * (k - 1) + 1) for i, o, s, p, d, k in sizes)

    def normalized(self) -> "Layer":
        """The same layer with per-dimension fields left None where they equal the
        all-dimension one (so that equal layers compare and print alike)."""
        values = {}
        for field, base in (("pad", self.pads), ("stride", self.strides),
                            ("dilation", self.dilations)):
            common = base[0] if len(set(base)) == 1 else getattr(self, field)
            values[field] = common
            for dim, v in zip("dhw", base):
                values[f"{field}_{dim}"] = None if v == common else v
        for dim, front, end in zip("dhw", self.pads, self.pads_end):
            values[f"pad_{dim}_end"] = None if end == front else end
        return dataclasses.replace(self, **values)

    def describe(self) -> str:
        """A short human-readable form, e.g. ``16->32 66x66x66 k3x3x3 s1 p0 b16``."""
        def dims(a, b, c):
            return f"{a}^3" if a == b == c else f"{a}x{b}x{c}"
        text = (f"{self.in_channels}->{self.out_channels} @{dims(self.in_d, self.in_h, self.in_w)}"
                f" k{dims(self.k_d, self.k_h, self.k_w)} s{_triple(self.strides, ',')}"
                f" p{self._pad_text(',')}"
                + (f"/{self._pad_end_text(',')}" if self.asymmetric else "")) \
            + "".join(" " + e for e in self._extras(","))
        if self.transposed:
            text += " (transposed: fwd is bwd_data)"
        return text + f" b{self.batch}"

    def _pad_text(self, sep: str) -> str:
        return str(self.pads[0]) if not self.anisotropic else sep.join(map(str, self.pads))

    def _pad_end_text(self, sep: str) -> str:
        """The padding at the ends, where it differs from the front (else "")."""
        return "" if not self.asymmetric else (
            str(self.pads_end[0]) if len(set(self.pads_end)) == 1 else sep.join(map(str, self.pads_end)))

    def key(self) -> str:
        """Geometry (name excluded) as a stable string, for build names and caches.  The
        fields of the basic model keep the form they always had, so keys (and the tuning
        entries stored under them) stay valid."""
        key = (f"b{self.batch}_c{self.in_channels}_k{self.out_channels}_i{self.in_d}x{self.in_h}x"
               f"{self.in_w}_f{self.k_d}x{self.k_h}x{self.k_w}_s{_triple(self.strides, 'x')}"
               f"_p{self._pad_text('x')}")
        if self.asymmetric:  # only then: the keys of symmetric layers stay as they were
            key += f"_pe{self._pad_end_text('x')}"
        return key + "".join("_" + e for e in self._extras("x"))

    def _extras(self, sep: str) -> List[str]:
        """The fields beyond stride and padding that differ from their defaults, as
        ``d<dilation>`` and ``g<groups>`` (for :meth:`describe` and :meth:`key`)."""
        extras = []
        if any(d != 1 for d in self.dilations):
            extras.append("d" + _triple(self.dilations, sep))
        if self.groups != 1:
            extras.append(f"g{self.groups}")
        return extras


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _triple(values, sep: str) -> str:
    """``2`` for (2, 2, 2), else ``1<sep>2<sep>2``."""
    return str(values[0]) if len(set(values)) == 1 else sep.join(map(str, values))


# -- CSV reading ---------------------------------------------------------------------------

def _int_field(path, lineno, field, text):
    text = (text or "").strip()
    try:
        return int(text, 10)
    except ValueError:
        raise LayerFileError(path, lineno, f"not an integer: {text!r}", field=field) from None


def _check_layer(path, lineno, values: dict, column_of=None, sizes: bool = True) -> Layer:
    """Build a Layer from parsed integers, turning validity problems into LayerFileErrors.

    ``column_of`` maps Layer fields to the file's column names where they differ.
    ``sizes=False``: check the fields only, not that the kernel fits the input (the
    fields of a transposed row, whose sizes are checked once it is a convolution)."""
    probe = object.__new__(Layer)  # validate without raising from __post_init__
    for f in dataclasses.fields(Layer):
        object.__setattr__(probe, f.name, values.get(f.name, f.default))
    problem = probe.problem()
    if problem is not None and (sizes or not problem[0].startswith("k_")):
        field = (column_of or {}).get(problem[0], problem[0])
        raise LayerFileError(path, lineno, problem[1], field=field)
    return Layer(**values) if sizes else probe


def parse_layers(text: str, path="<string>", skipped: Optional[list] = None) -> List[Layer]:
    """Parse a layer-set CSV (canonical or legacy header) held in ``text``.  A UTF-8
    byte-order mark, CRLF line ends, blank lines and comment lines (``#``) are allowed.
    ``skipped``: a list that collects the :class:`LayerFileError` of each row the model
    cannot hold, instead of raising the first (a file whose rows all fail still raises)."""
    lines = text.lstrip("\ufeff").splitlines()
    # Line numbers are 1-based; skip blank and comment lines but keep numbering.
    numbered = [(i + 1, row) for i, line in enumerate(lines)
                if not line.lstrip().startswith(COMMENT)
                for row in csv.reader([line]) if any(cell.strip() for cell in row)]
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
        try:
            layer = _row_layer(path, lineno, row, header, legacy, len(layers), seen)
        except LayerFileError as err:
            if skipped is None:
                raise
            skipped.append(err)
            continue
        seen[layer.name] = lineno
        layers.append(layer)
    if not layers and skipped:
        raise skipped[0]
    return layers


def _row_layer(path, lineno, row, header, legacy, index, seen) -> Layer:
    """The layer of one data row of a layer CSV (LayerFileError where it has none)."""
    if len(row) != len(header):
        raise LayerFileError(path, lineno, f"expected {len(header)} fields, got {len(row)}")
    cells = dict(zip(header, row))
    if legacy:
        layer = _legacy_layer(path, lineno, cells, index=index)
    else:
        name = cells["layer"].strip()
        if not name:
            raise LayerFileError(path, lineno, "empty layer name", field="layer")
        values = {"name": name}
        pad_word = cells["pad"].strip().lower()
        for f in CANONICAL_HEADER[1:]:
            if f == "pad" and pad_word in PAD_WORDS:
                values[f] = 0
                continue
            values[f] = _int_field(path, lineno, f, cells[f])
        for f in OPTIONAL_COLUMNS:
            if f in cells and cells[f].strip():
                values[f] = _int_field(path, lineno, f, cells[f])
        if pad_word in PAD_WORDS:
            _apply_pad_word(path, lineno, values, pad_word)
        layer = _canonical_layer(path, lineno, values)
    if layer.name in seen:
        raise LayerFileError(path, lineno, f"duplicated layer name '{layer.name}' (first on "
                             f"line {seen[layer.name]})", field="layer")
    return layer


def same_padding(size: int, k: int, stride: int = 1, dilation: int = 1) -> Tuple[int, int]:
    """``(front, back)`` padding of ``'same'`` along one dimension: the output is
    ``ceil(size / stride)``, and an odd total puts the extra one at the back."""
    span = dilation * (k - 1) + 1
    total = max((-(-size // stride) - 1) * stride + span - size, 0)
    return total // 2, total - total // 2


def _apply_pad_word(path, lineno, values: dict, word: str) -> None:
    """Per-dimension padding of a row whose ``pad`` cell says ``same`` or ``valid``."""
    given = [f for f in values if f.startswith("pad_")]
    if given:
        raise LayerFileError(path, lineno, f"'{word}' sets every dimension's padding, so "
                             f"{given[0]} cannot be given too", field="pad")
    if word == "valid":
        return
    if values.get("transposed"):
        raise LayerFileError(path, lineno, "'same' is a convolution's padding, not a "
                             "transposed convolution's", field="pad")
    for d in "dhw":
        for f in ("in", "k"):  # checked by the layer itself, but 'same' needs them first
            if values[f"{f}_{d}"] <= 0:
                raise LayerFileError(path, lineno, f"must be a positive integer, got "
                                     f"{values[f'{f}_{d}']}", field=f"{f}_{d}")
        stride = values.get(f"stride_{d}", values["stride"])
        dilation = values.get(f"dilation_{d}", values.get("dilation", 1))
        if stride <= 0 or dilation <= 0:
            continue  # the layer's own check names the field
        values[f"pad_{d}"], values[f"pad_{d}_end"] = same_padding(
            values[f"in_{d}"], values[f"k_{d}"], stride, dilation)
    fronts = [values.get(f"pad_{d}", 0) for d in "dhw"]
    if len(set(fronts)) == 1:  # one padding for all: the form the other rows have
        values["pad"] = fronts[0]
        for d in "dhw":
            values.pop(f"pad_{d}", None)
            if values.get(f"pad_{d}_end") == fronts[0]:
                values.pop(f"pad_{d}_end")


def _canonical_layer(path, lineno, values: dict) -> Layer:
    """The layer of one canonical row (``values``: the name and the integer cells)."""
    transposed = values.pop("transposed", 0)
    output_pad = values.pop("output_pad", 0)
    output_pads = tuple(values.pop(f"output_pad_{d}", output_pad) for d in "dhw")
    if transposed not in (0, 1):
        raise LayerFileError(path, lineno, f"must be 0 or 1, got {transposed}", field="transposed")
    if any(output_pads) and not transposed:
        raise LayerFileError(path, lineno, "only a transposed layer (transposed=1) has one",
                             field="output_pad")
    layer = _check_layer(path, lineno, values, sizes=not transposed)
    if not transposed:
        return layer
    # The row is the transposed convolution's own view: turn it into the convolution.
    try:
        return Layer.transposed_of(
            layer.name, layer.batch, layer.in_channels, layer.out_channels,
            (layer.in_d, layer.in_h, layer.in_w), (layer.k_d, layer.k_h, layer.k_w),
            layer.strides, layer.pads, layer.dilations, layer.groups, output_pads)
    except ValueError as err:
        raise LayerFileError(path, lineno, str(err).split(": ", 1)[-1],
                             field="output_pad" if "output padding" in str(err) else None) \
            from None


def format_csv(layers: Sequence[Layer], comments: Sequence[str] = ()) -> str:
    """``layers`` as a layer CSV that :func:`parse_layers` reads back to equal layers: the
    canonical columns, and only the optional ones some layer needs.  A transposed layer is
    written as ``ConvTranspose3d`` takes it (its own input), with ``transposed=1``."""
    rows = []
    for layer in layers:
        row = {"layer": layer.name, "batch": layer.batch}
        if layer.transposed:  # the transposed convolution's own view
            row.update(in_channels=layer.out_channels, out_channels=layer.in_channels,
                       in_d=layer.out_d, in_h=layer.out_h, in_w=layer.out_w, transposed=1)
            ops = layer.output_pads
            if len(set(ops)) == 1:
                row["output_pad"] = ops[0] or ""
            else:
                row.update({f"output_pad_{d}": v for d, v in zip("dhw", ops)})
        else:
            row.update(in_channels=layer.in_channels, out_channels=layer.out_channels,
                       in_d=layer.in_d, in_h=layer.in_h, in_w=layer.in_w)
        row.update(k_d=layer.k_d, k_h=layer.k_h, k_w=layer.k_w)
        for field, values in (("stride", layer.strides), ("pad", layer.pads),
                              ("dilation", layer.dilations)):
            common = max(set(values), key=values.count)
            if field != "dilation" or common != 1:
                row[field] = common
            for d, v in zip("dhw", values):
                if v != common:
                    row[f"{field}_{d}"] = v
        if layer.groups != 1:
            row["groups"] = layer.groups
        for d, front, end in zip("dhw", layer.pads, layer.pads_end):
            if end != front:
                row[f"pad_{d}_end"] = end
        rows.append(row)
    header = list(CANONICAL_HEADER) + [
        c for c in OPTIONAL_COLUMNS if any(r.get(c) not in (None, "") for r in rows)]
    out = io.StringIO()
    for line in comments:
        out.write(f"{COMMENT} {line}\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for r in rows:
        writer.writerow([r.get(c, "") for c in header])
    return out.getvalue()


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
