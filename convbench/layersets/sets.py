"""Layer sets: where ``--paramscsv`` finds one, how it is read, and which layers of it run.

A set is a layer CSV (:func:`convbench.layersets.layer.parse_layers`) or a file of oneDNN benchdnn
problem descriptors (:mod:`convbench.layersets.benchdnn`), named by path or by its name in
``convparams/``.  This module sits above both readers, so neither imports the other.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional, Sequence

from convbench.layersets.benchdnn import looks_like_descriptors, parse_descriptors
from convbench.base.errors import LayerFileError, UsageError
from convbench.layersets.layer import Layer, parse_layers

CONVPARAMS_DIR = Path(__file__).resolve().parents[2] / "convparams"

#: File endings of the shipped layer sets: CSV, and benchdnn descriptor files.
SET_SUFFIXES = (".csv", ".benchdnn")


def resolve_layer_set(spec: str) -> Path:
    """Map ``--paramscsv`` (a set name in ``convparams/`` or a path) to a file path."""
    candidates = [Path(spec)]
    if os.sep not in spec and "/" not in spec:
        named = [CONVPARAMS_DIR / spec] if spec.endswith(SET_SUFFIXES) else \
            [CONVPARAMS_DIR / (spec + suffix) for suffix in SET_SUFFIXES]
        candidates[:0] = named
    for cand in candidates:
        if cand.is_file():
            return cand
    if Path(spec).exists():
        raise UsageError(f"--paramscsv: '{spec}' is not a file")
    known = ", ".join(available_layer_sets()) or "none"
    raise UsageError(f"--paramscsv: no layer set or file named '{spec}' (known sets: {known})")


def available_layer_sets() -> List[str]:
    return sorted(p.stem for suffix in SET_SUFFIXES for p in CONVPARAMS_DIR.glob("*" + suffix))


def load_layers(spec: str, skipped: Optional[list] = None) -> List[Layer]:
    """Read a layer set by name or path: a layer CSV, or a file of benchdnn problem
    descriptors (told apart by their first line that is not a comment).  ``skipped``: a
    list that collects the error of each line the model cannot hold instead of raising
    the first."""
    path = resolve_layer_set(spec)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        raise LayerFileError(path, None, f"cannot read: {err}") from None
    if looks_like_descriptors(text):
        return parse_descriptors(text, path=_display_path(path), skipped=skipped)
    return parse_layers(text, path=_display_path(path), skipped=skipped)


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
