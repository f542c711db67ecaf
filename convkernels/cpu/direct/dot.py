"""``directConvNDHWCdot``: a register-blocked direct convolution for the CPU, on NDHWC,
vectorised over the *input* channels (dot-product form), with no filter packing.

On NDHWC the input channels ``c`` are contiguous both in the input ``x[b, d, h, w, c]``
and in the KTRSC filter ``w[k, kd, kh, kw, c]``.  A micro-tile of ``P`` output pixels
times ``KT`` output channels keeps ``P * KT`` accumulator vectors of ``CV`` lanes (lane
``j`` sums the channels ``c = j mod CV``):

    acc[P * KT, CV] = 0
    for kd, kh, kw, cb:                       # taps, then channel blocks of CV
        for j in 0..CV-1:                     # one SIMD vector
            x0 = x[pixel 0 + tap, cb*CV + j] ... x{P-1}
            w0 = w[k0 + 0, tap, cb*CV + j]   ... w{KT-1}
            acc[p*KT + q, j] += x{p} * w{q}   # P*KT statements, written out
    y[pixel p, k0 + q] = sum over j of acc[p*KT + q, j]

Each step loads ``P + KT`` vectors for ``P * KT`` FMAs, and both loads are contiguous
in the arrays as they are stored, so the filter is read in place.  This suits layers
with many channels and few output pixels (CosmoFlow's last layers), where
``directConvNDHWCblocked`` spends much of its time packing a filter that each
micro-tile then uses for only a few pixels.

The same constraints shape the code as in ``directConvNDHWCblocked`` (see there):
statements generated unrolled, plain inner loops, size-1 map dimensions dropped,
OpenMP collapsed over the tile map, every size a constant.
"""

from typing import NamedTuple

from convkernels.cpu.direct.blocking import (channel_tiles_outer, generated_program,
                                             input_at, kouter_param, largest_divisor,
                                             map_header, store_tile, pixel_tile,
                                             reduction_nest, signature, tile_pixels,
                                             lanes_param, registers_of)
from convkernels.cpu.isa import fit_tile
from convkernels.layer import layer_constants
from convkernels.declarations import Param
from convkernels.layouts import Layout
from convkernels.transposed import swap_roles, transposed_layer

#: at most this many accumulator vectors on any CPU (AVX-512's 32 registers less the
#: loads); the tuner keeps to :func:`convkernels.cpu.isa.accumulator_budget` of this one
MAX_ACCUMULATORS = 28


class DotTile(NamedTuple):
    """``db x hb x wb`` output pixels times ``kt`` output channels per micro-tile, and
    ``cv`` input channels per vector."""

    db: int
    hb: int
    wb: int
    kt: int
    cv: int


def tile_sizes(layer, params) -> DotTile:
    """The :class:`DotTile` of ``params`` on ``layer`` (``kt`` and ``cv`` the largest
    divisors of K and C up to ``KT`` and ``CV``)."""
    return DotTile(*pixel_tile(layer, params["PIX"], params["WB"]),
                   largest_divisor(layer.out_channels, params["KT"]),
                   largest_divisor(layer.in_channels, params["CV"]))


def dot_source(L, dtype_name, db, hb, wb, kt, cv, k_outer, flip=False):
    """The program's text for layer constants ``L`` and the tile ``(db, hb, wb, kt, cv)``.
    ``flip``: ``w`` is the filter of the convolution that ``L`` transposes (``C x taps x
    K``, see ``directConvNDHWCdotBwdData``); it is first copied flipped in space and with
    its channels swapped (a KTRSC filter of ``L``, read in place from then on)."""
    kblk, cblk, S = L.K // kt, L.C // cv, L.S
    pix = tile_pixels((db, hb, wb))
    nacc = len(pix) * kt
    lines = signature(L, dtype_name, "direct_dot", (L.C, L.KD, L.KH, L.KW, L.K) if flip else None)
    if flip:
        lines.append(f"    wt = dace.define_local([{L.K}, {L.KD}, {L.KH}, {L.KW}, {L.C}], dt)")
        header, i = map_header([("k", L.K), ("td", L.KD), ("th", L.KH), ("tw", L.KW),
                                ("c", L.C)], "    ")
        lines += [header] if header else []
        lines.append(f"{'        ' if header else '    '}wt[{i['k']}, {i['td']}, {i['th']}, "
                     f"{i['tw']}, {i['c']}] = w[{i['c']}, {L.KD - 1} - {i['td']}, "
                     f"{L.KH - 1} - {i['th']}, {L.KW - 1} - {i['tw']}, {i['k']}]")
    tile = (db, hb, wb)
    nest, ind, depth, t = reduction_nest(L, kblk, tile, k_outer, nacc, cv, ("cb", cblk),
                                         locals_=[("red", nacc)])
    lines += nest
    for p, offset in enumerate(pix):
        lines.append(f"{depth}x{p} = {input_at(t, tile, offset, S, f'cb * {cv} + j')}")
    for q in range(kt):
        lines.append(f"{depth}w{q} = {'wt' if flip else 'w'}[{t['kb']} * {kt} + {q}, kd, kh, kw, "
                     f"cb * {cv} + j]")
    for p in range(len(pix)):
        for q in range(kt):
            lines.append(f"{depth}acc[{p * kt + q}, j] += x{p} * w{q}")
    lines += [f"{ind}for i1 in range({nacc}):",
              f"{ind}    red[i1] = 0",
              f"{ind}    for j1 in range({cv}):",
              f"{ind}        red[i1] += acc[i1, j1]"]
    lines += store_tile(ind, t, tile, "q1", kt, lambda p: f"red[{p * kt} + q1]")
    return "\n".join(lines) + "\n"


def algorithm(layer, dtype, params):
    L = layer_constants(layer, Layout.NDHWC)
    db, hb, wb, kt, cv = tile_sizes(layer, params)
    k_outer = channel_tiles_outer(layer, params["KOUTER"])
    return generated_program(layer, dot_source(L, dtype.name, db, hb, wb, kt, cv, k_outer),
                             "direct_dot", f"{db}x{hb}x{wb}x{kt}x{cv}_{int(k_outer)}")


#: the tile parameters (shared with ``directConvNDHWCdotBwdData``)
PARAMS = (Param("PIX", 4, "output pixels per micro-tile (width first, then height and "
                          "depth, by divisors of the output size)"),
          Param("WB", 8, "at most this many of them along the width"),
          Param("KT", fit_tile(4, 4), "output channels per micro-tile (the largest divisor "
                                      "of K up to KT)"),
          lanes_param("CV", "input channels per vector (the largest divisor of C up to CV)"),
          kouter_param())


def check_params_dot(values):
    n = values["PIX"] * values["KT"]
    if n > MAX_ACCUMULATORS:
        return (f"PIX*KT={n} accumulator vectors; at most {MAX_ACCUMULATORS} fit in the "
                "the registers of any CPU next to the loads")
    return None


#: Accumulator registers of one micro-tile on this CPU (for the tuner).
registers = registers_of(tile_sizes, width_first=False)


def data_gradient(layer, dtype, params):
    """dL/dx of a stride-1 ``layer``: the dot-product kernel on the transposed layer (dL/dy
    padded by ``k - 1 - p``, the filter flipped in space with its channels swapped),
    vectorised over the reduction channels (the layer's output channels); x and y swap
    roles for the harness."""
    t = transposed_layer(layer)
    L = layer_constants(t, Layout.NDHWC)
    db, hb, wb, kt, cv = tile_sizes(t, params)
    k_outer = channel_tiles_outer(t, params["KOUTER"])
    source = dot_source(L, dtype.name, db, hb, wb, kt, cv, k_outer, flip=True)
    sdfg = generated_program(t, source,
                             "direct_dot", f"bwdd_{db}x{hb}x{wb}x{kt}x{cv}_{int(k_outer)}")
    return swap_roles(sdfg)


def data_gradient_registers(layer, params):
    """:func:`registers` of the transposed layer the data gradient runs on."""
    return registers(transposed_layer(layer), params)
