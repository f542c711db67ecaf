"""``directConvNDHWCblockedBwdData``: dL/dx on NDHWC with the register-blocked forward
kernel of ``directConvNDHWCblocked``.

For stride 1, dL/dx is a forward convolution of dL/dy (``K`` channels) with the filter
flipped in space and its channels swapped (``C`` outputs), padded by ``k - 1 - p`` per
dimension: ``dx[b, d, h, w, c] = sum dy[b, d + p - t, ..., k] * w[k, t, ..., c]``; with ``t'
= k - 1 - t`` that is the forward form on dL/dy padded by ``k - 1 - p``.  The forward
generator (:func:`convkernels.cpu.direct.blocking.blocked_source`) runs on that transposed
layer and packs the filter flipped while it packs it anyway, so the flip costs nothing.  Its
micro-tiles vectorise over the input channels ``c`` (contiguous in dL/dx).  Stride > 1 is
not supported here (``implicitGemmBwdData`` splits it by stride phase).

The original filter ``w[k, taps, c]`` already has the vector dimension ``c`` innermost,
so packing is optional (``PACK``): with ``PACK`` = 0 the kernel reads its filter vectors
in place, flipped where read, one cache line per vector at a constant stride.  For the
many-channel, few-pixel layers the copy costs more than the convolution; for large
layers the contiguous packed stream is faster.  The tuner picks per layer.
"""

import math

from convkernels.cpu.direct.blocking import (blocked_source, channel_tiles_outer,
                                             generated_program, micro_tile, channel_block,
                                             input_modes)
from convkernels.cpu.direct import bf16_dot
from convkernels.layer import layer_constants
from convkernels.transposed import swap_roles, transposed_layer
from convkernels.layouts import Layout


def tile_sizes(layer, params):
    """The :class:`~convkernels.cpu.direct.blocking.MicroTile` of the transposed layer: ``nv`` vectors of
    ``nb`` input channels of ``layer`` (its output channels)."""
    t = transposed_layer(layer)
    return micro_tile(t, params, t.out_channels)


def algorithm(layer, dtype, params):
    t = transposed_layer(layer)
    L = layer_constants(t, Layout.NDHWC)
    if params["DOT"] and not bf16_dot.refusal(t, dtype.name):
        (db, hb, wb), nv = bf16_dot.tile_of(t, params)
        return swap_roles(bf16_dot.dpbf16_sdfg(
            t, L, dtype, (db, hb, wb), nv, f"bwdd_dpbf16_{t.key()}_{db}x{hb}x{wb}x{nv}",
            flip=True))
    db, hb, wb, nb, nv = tile_sizes(layer, params)
    k_outer = channel_tiles_outer(t, params["KOUTER"])
    pack = packed(layer, params["PACK"])
    cblk = channel_block(t.in_channels, params["CBLK"])
    edge, in_place = input_modes(L, (db, hb, wb), params, dtype.name)
    sdfg = generated_program(t, blocked_source(L, dtype.name, db, hb, wb, nb, k_outer, flip=True,
                                               nv=nv, pack=pack, cblk=cblk,
                                               group=params["GROUP"], edge=edge,
                                               in_place=in_place),
                             "direct_blocked", f"bwdd_{db}x{hb}x{wb}x{nb}x{nv}_{int(k_outer)}_"
                             f"{int(pack)}_{cblk}_{params['GROUP']}_{params['EDGE']}_"
                             f"{int(in_place)}", in_place, dtype)
    return swap_roles(sdfg)


def packed(layer, pack: int) -> bool:
    """``PACK``: 1 copy the filter first, 0 read it in place, 2 (auto) copy it when it
    has fewer elements than dL/dy (a copy that the convolution then amortises)."""
    if pack != 2:
        return bool(pack)
    return math.prod(layer.filter_shape) < math.prod(layer.output_shape)
