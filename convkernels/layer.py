"""The layer as the kernels see it: :class:`Layer`, what a kernel reads of a layer (the
harness's layer model has these attributes), and :class:`LayerSizes`, its sizes as plain
integers.

Algorithms are written per layer with every size a Python integer
(:func:`layer_constants`), so each compiled SDFG has constant sizes.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, Tuple, runtime_checkable

from convkernels.layouts import Layout, stored_shape


@runtime_checkable
class Layer(Protocol):
    """What a kernel reads of a convolution layer (any object with these attributes: the
    harness's ``convbench.layersets.layer.Layer``).  Sizes are per dimension (depth,
    height, width) where a triple; ``pads`` are the front paddings, ``pads_end`` the back
    ones; ``stride`` and ``pad`` are the values shared by all dimensions where they are."""

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
    stride: int
    pad: int
    groups: int
    pads: Tuple[int, int, int]
    pads_end: Tuple[int, int, int]
    strides: Tuple[int, int, int]
    dilations: Tuple[int, int, int]
    out_d: int
    out_h: int
    out_w: int
    input_shape: Tuple[int, ...]
    filter_shape: Tuple[int, ...]
    output_shape: Tuple[int, ...]
    gemm_m: int
    gemm_n: int
    gemm_k: int

    def key(self) -> str:
        """A name unique to the layer's geometry (file and SDFG names)."""


@dataclasses.dataclass(frozen=True)
class LayerSizes:
    """The sizes a generated program is written with, as plain integers (each compiled
    SDFG has constant sizes), and the stored shapes for one layout."""

    N: int    # batch
    C: int    # input channels
    K: int    # output channels
    D: int    # input depth, height, width
    H: int
    W: int
    KD: int   # kernel depth, height, width
    KH: int
    KW: int
    S: int    # Layer.stride (SD SH SW per dimension)
    P: int    # Layer.pad (PD PH PW per dimension)
    PD: int
    PH: int
    PW: int
    SD: int
    SH: int
    SW: int
    ED: int   # dilation per dimension
    EH: int
    EW: int
    G: int    # groups, with CG = C/G input and KG = K/G output channels each
    CG: int
    KG: int
    DP: int   # padded input: D + 2*PD, ...
    HP: int
    WP: int
    OD: int   # output depth, height, width
    OH: int
    OW: int
    GM: int   # the implicit GEMM's sizes
    GN: int
    GK: int
    xp_shape: Tuple[int, ...]  # padded input, filter and output as stored
    w_shape: Tuple[int, ...]
    y_shape: Tuple[int, ...]


def layer_constants(layer: Layer, layout: Layout) -> LayerSizes:
    """The :class:`LayerSizes` of ``layer``, with the stored shapes for ``layout``."""
    (pd, ph, pw), (ed, eh, ew) = layer.pads, layer.pads_end
    padded = (layer.batch, layer.in_channels, layer.in_d + pd + ed, layer.in_h + ph + eh,
              layer.in_w + pw + ew)
    return LayerSizes(
        N=layer.batch, C=layer.in_channels, K=layer.out_channels, D=layer.in_d, H=layer.in_h,
        W=layer.in_w, KD=layer.k_d, KH=layer.k_h, KW=layer.k_w, S=layer.stride, P=layer.pad,
        PD=pd, PH=ph, PW=pw, SD=layer.strides[0], SH=layer.strides[1], SW=layer.strides[2],
        ED=layer.dilations[0], EH=layer.dilations[1], EW=layer.dilations[2], G=layer.groups,
        CG=layer.in_channels // layer.groups, KG=layer.out_channels // layer.groups,
        DP=padded[2], HP=padded[3], WP=padded[4], OD=layer.out_d, OH=layer.out_h,
        OW=layer.out_w, GM=layer.gemm_m, GN=layer.gemm_n, GK=layer.gemm_k,
        xp_shape=stored_shape(layout, "x", padded),
        w_shape=stored_shape(layout, "w", layer.filter_shape),
        y_shape=stored_shape(layout, "y", layer.output_shape))
