"""oneDNN benchdnn problem descriptors as layers.

A descriptor such as ``g2mb4ic32id16ih16iw16oc64od8oh8ow8kd3kh3kw3sd2sh2sw2pd1ph1pw1n"x"``
names one convolution by letter codes, each followed by a number, in any order (``_``
separates nothing and is skipped): ``g`` groups, ``mb`` batch, ``ic``/``oc`` channels,
``id ih iw`` input and ``od oh ow`` output sizes, ``kd kh kw`` kernel, ``sd sh sw`` stride,
``pd ph pw`` padding and ``dd dh dw`` dilation, written as benchdnn writes it (the gap
between taps: 0 is a dense kernel, so dilation = value + 1), then ``n`` and the name (to
the end; quotes are dropped).  benchdnn's suites (``tests/benchdnn/inputs/conv/...``)
are files of such lines with ``#`` comments.

The rules that fill what a descriptor leaves out are benchdnn's: batch 2, stride 1; a
missing output size is computed (padding 0 if that is missing too), a missing padding is
computed from a given output size; dimensions not given at all copy the next larger one
(``id16`` alone is a cube), and a problem without depth is 2D (depth 1 here).  What the
layer model cannot express is refused with the line and the reason.  An output size that
symmetric padding does not give sets the padding at the back, bottom or right to what it
needs, as benchdnn derives its right padding; one that no padding gives is refused.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional

from convbench.base.errors import LayerFileError
from convbench.layersets.layer import Layer

#: The letter codes of a descriptor (``n`` and the name come last).
CODES = ("mb", "ic", "id", "ih", "iw", "oc", "od", "oh", "ow", "kd", "kh", "kw", "sd", "sh",
         "sw", "pd", "ph", "pw", "dd", "dh", "dw", "g")
_TOKEN = re.compile(r"(mb|ic|id|ih|iw|oc|od|oh|ow|kd|kh|kw|sd|sh|sw|pd|ph|pw|dd|dh|dw|g)(\d+)")


def looks_like_descriptors(text: str) -> bool:
    """True if the first line that is not blank or a comment is a descriptor (no comma,
    starts with a code) rather than a CSV header."""
    for line in text.lstrip("\ufeff").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        return "," not in line and _TOKEN.match(line.replace("_", "")) is not None
    return False


def parse_descriptor(text: str, default_name: str = "layer") -> Dict[str, object]:
    """The fields of one descriptor (``{"g": 2, "ic": 32, ...}`` plus ``"name"``); raises
    ValueError naming the first part it cannot read."""
    body, name = text, None
    pos = 0  # no code starts with n: the first n at a token boundary starts the name
    fields: Dict[str, object] = {}
    while pos < len(body):
        if body[pos] == "_":
            pos += 1
            continue
        if body[pos] == "n":
            name = body[pos + 1:].strip().strip("\"'")
            break
        tok = _TOKEN.match(body, pos)
        if tok is None:
            raise ValueError(f"cannot read {body[pos:]!r} (expected one of "
                             f"{', '.join(CODES)} and a number, or n and a name)")
        if tok.group(1) in fields:
            raise ValueError(f"{tok.group(1)} is given twice")
        fields[tok.group(1)] = int(tok.group(2))
        pos = tok.end()
    fields["name"] = name or default_name
    return fields


def _out(i, k, s, p, dl):
    return (i - ((k - 1) * dl + 1) + 2 * p) // s + 1


def descriptor_layer(fields: Dict[str, object]) -> Layer:
    """The layer of a parsed descriptor, by benchdnn's rules; ValueError if it has none."""
    f = dict(fields)
    for code in ("ic", "oc"):
        if not f.get(code):
            raise ValueError(f"{code} is missing or 0")
    dims: Dict[str, Optional[Dict[str, int]]] = {}
    for d in "dhw":
        given = {c: f[c + d] for c in ("i", "o", "k", "s", "p", "d") if c + d in f}
        # benchdnn: a dimension is absent if nothing but stride 1 / padding 0 names it
        absent = (not any(given.get(c) for c in ("i", "o", "k", "d"))
                  and given.get("s", 1) == 1 and given.get("p", 0) < 1)
        dims[d] = None if absent else given
    if all(v is None for v in dims.values()):
        raise ValueError("no spatial size is given (id, ih or iw)")
    # missing smaller dimensions copy the next larger one (cubic, square); a problem
    # without depth (or height) is 2D (1D) and gets size-1 dimensions there instead
    order = "dhw"
    first = next(i for i, d in enumerate(order) if dims[d] is not None)
    for i, d in enumerate(order):
        if dims[d] is None:
            dims[d] = dict(dims[order[i - 1]]) if i > first else \
                {"i": 1, "o": 1, "k": 1, "s": 1, "p": 0, "d": 0}
    values = {}
    for d in order:
        g = dims[d]
        if not g.get("i") or not g.get("k"):
            raise ValueError(f"i{d} and k{d} are needed once the {d} dimension is used")
        i, k, s, dl = g["i"], g["k"], g.get("s", 1), g.get("d", 0) + 1
        if s <= 0:
            raise ValueError(f"s{d} must be positive")
        end = None
        if "o" in g and g["o"]:
            p = g["p"] if "p" in g else ((g["o"] - 1) * s - i + (k - 1) * dl + 1) // 2
            if p >= 0 and _out(i, k, s, p, dl) != g["o"]:
                # benchdnn's right padding: what the given output size needs
                end = (g["o"] - 1) * s + (k - 1) * dl + 1 - i - p
            if p < 0 or (end is not None and end < 0):
                raise ValueError(f"o{d}{g['o']} is not what i{d}{i} k{d}{k} s{d}{s} "
                                 f"d{d}{dl - 1} give with any padding of p{d}{max(p, 0)} at "
                                 f"the front (without padding: "
                                 f"{(i - (k - 1) * dl - 1) // s + 1})")
        else:
            p = g.get("p", 0)
        values[d] = (i, k, s, p, dl, end)
    (di, dk, ds, dp, dd, de), (hi, hk, hs, hp, hd, he), (wi, wk, ws, wp, wd, we) = (
        values[d] for d in order)
    layer = Layer.from_triples(str(f["name"]), int(f.get("mb", 2)), int(f["ic"]), int(f["oc"]),
                               (di, hi, wi), (dk, hk, wk), (ds, hs, ws), (dp, hp, wp),
                               (dd, hd, wd), int(f.get("g", 1)))
    ends = {f"pad_{d}_end": e for d, e in zip("dhw", (de, he, we)) if e is not None}
    return dataclasses.replace(layer, **ends) if ends else layer


def parse_descriptors(text: str, path="<string>", skipped: Optional[list] = None) -> List[Layer]:
    """The layers of a benchdnn descriptor file (one per line; ``#`` comments and blank
    lines skipped); problems are :class:`LayerFileError` with the line.  ``skipped``: a
    list that collects the error of each line the model cannot hold instead of raising
    the first (as :func:`convbench.layersets.layer.parse_layers`)."""
    layers: List[Layer] = []
    seen: Dict[str, int] = {}
    for lineno, raw in enumerate(text.lstrip("\ufeff").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            layer = _line_layer(path, lineno, line, len(layers), seen)
        except LayerFileError as err:
            if skipped is None:
                raise
            skipped.append(err)
            continue
        seen[layer.name] = lineno
        layers.append(layer)
    if not layers:
        if skipped:
            raise skipped[0]
        raise LayerFileError(path, None, "no descriptors (only comments or blank lines)")
    return layers


def _line_layer(path, lineno, line, index, seen) -> Layer:
    if line.startswith("--"):
        raise LayerFileError(path, lineno, f"benchdnn option {line.split()[0]!r}: only "
                             "problem descriptors are read (one per line)")
    try:
        layer = descriptor_layer(parse_descriptor(line, default_name=f"layer{index}"))
    except ValueError as err:
        message = str(err)
        if message.startswith("layer "):  # Layer's own check: drop its name prefix
            message = message.split(": ", 1)[-1]
        raise LayerFileError(path, lineno, message) from None
    if layer.name in seen:
        raise LayerFileError(path, lineno, f"duplicated layer name '{layer.name}' (first on "
                             f"line {seen[layer.name]})")
    return layer
