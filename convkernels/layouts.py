"""Data layouts and convolution passes: what tensors a program takes, in what order.

The harness keeps its tensors in torch's logical NCDHW/KCTRS form and converts them
here, in one place, to and from the layout a program declares (docs/architecture.md, "Adding an
implementation"): NCDHW, with the filter K, C, Kd, Kh, Kw (KCTRS), or NDHWC, with the
filter K, Kd, Kh, Kw, C (KTRSC: torch's ``channels_last_3d``, cuDNN's NHWC).
"""

from __future__ import annotations

import enum
from typing import Dict, Tuple


class Layout(str, enum.Enum):
    NCDHW = "NCDHW"
    NDHWC = "NDHWC"

    def __str__(self):
        return self.value


class Pass(str, enum.Enum):
    """The three convolutions of a training step: the forward pass, and the gradients
    for the input (backward data) and for the filter (backward filter)."""

    FWD = "fwd"
    BWD_DATA = "bwd_data"
    BWD_FILTER = "bwd_filter"

    def __str__(self):
        return self.value


#: For each pass: the program's input tensor roles, in order, and its output role.
#: Roles: ``x`` input activations, ``w`` filter, ``y`` output activations; in the
#: backward passes ``y`` is dL/dy, and the output ``x`` (``w``) is dL/dx (dL/dw).
PASS_SIGNATURE: Dict[Pass, Tuple[Tuple[str, ...], str]] = {
    Pass.FWD: (("x", "w"), "y"),
    Pass.BWD_DATA: (("y", "w"), "x"),
    Pass.BWD_FILTER: (("x", "y"), "w"),
}

# Permutations from torch's logical order to the stored order, per layout and role kind.
_TO_STORED = {
    (Layout.NCDHW, "act"): (0, 1, 2, 3, 4),
    (Layout.NCDHW, "filter"): (0, 1, 2, 3, 4),
    (Layout.NDHWC, "act"): (0, 2, 3, 4, 1),
    (Layout.NDHWC, "filter"): (0, 2, 3, 4, 1),
}
_ROLE_KIND = {"x": "act", "y": "act", "w": "filter"}


def _perm(layout: Layout, role: str):
    return _TO_STORED[(Layout(layout), _ROLE_KIND[role])]


def stored_shape(layout: Layout, role: str, logical_shape) -> Tuple[int, ...]:
    """Shape in memory of a tensor whose logical (NCDHW/KCTRS) shape is given."""
    return tuple(logical_shape[i] for i in _perm(layout, role))


def to_layout(tensor, layout: Layout, role: str):
    """A contiguous copy of a logical torch tensor in the layout's stored order."""
    return tensor.permute(*_perm(layout, role)).contiguous()


def from_layout(tensor, layout: Layout, role: str):
    """View a stored tensor back in logical order (inverse of :func:`to_layout`)."""
    perm = _perm(layout, role)
    inverse = [perm.index(i) for i in range(len(perm))]
    return tensor.permute(*inverse)
