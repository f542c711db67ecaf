"""``directConvNDHWCblocked``: a register-blocked direct convolution for the CPU, on NDHWC.

The output is cut into micro-tiles of ``wb`` consecutive output pixels along the
width times ``nb`` consecutive output channels.  One micro-tile is computed by

    acc[wb, nb] = 0
    for kd, kh, kw, c:                       # the reduction, C * kd * kh * kw steps
        for j in 0..nb-1:                    # contiguous output channels: one SIMD vector
            wv = wp[kb, kd, kh, kw, c, j]
            acc[0, j] += x[b, od*S+kd, oh*S+kh, (ow0+0)*S+kw, c] * wv
            ...                              # wb statements, written out (unrolled)
            acc[wb-1, j] += x[..., (ow0+wb-1)*S+kw, c] * wv

and stored.  With ``nb`` = 16 floats the ``j`` loop is one AVX-512 vector; the ``wb``
statements are ``wb`` broadcast-FMAs on ``wb`` accumulator vectors, whose addresses are
constant, so the C++ compiler keeps the whole ``acc`` tile in registers across the
reduction (16 x 16 floats = 16 of the 32 zmm registers).  Each filter vector is loaded
once per ``wb`` FMAs and each input value once per ``nb`` FMAs.

* **Filter packing**: the KTRSC filter is first copied into ``wp[K/nb, kd, kh, kw, C,
  nb]``, so the ``nb`` channels of one tap are contiguous (one aligned vector load).
* **Unrolling**: GCC ignores the ``#pragma unroll`` DaCe emits for unrolled maps, and
  DaCe 1.0.2's ``dace.unroll`` fails on this loop nest, so the ``wb`` statements are
  generated in the program's source text (:func:`convkernels.programs.program_from_source`).
  The ``j`` and reduction loops are plain loops: a map nested inside the reduction
  loops is miscompiled by DaCe 1.0.2's frontend (its input memlets lose the loop
  offsets).
* **Parallelism**: the tile map (batch, od, oh, output-width tile, channel tile) is an
  OpenMP loop collapsed over all five dimensions.
* **Several channel vectors** (``NV``): a micro-tile can hold ``nv`` vectors of ``nb``
  output channels per pixel, ``acc[pixels * nv, nb]``; each input value is then loaded
  once per ``nv`` FMAs and each filter vector once per ``pixels`` FMAs.  Where the output
  size allows only power-of-two pixel counts, 8 pixels x 2 vectors (16 accumulators, 10
  loads per 16 FMAs) beats 16 pixels x 1 vector (17 loads).  (A ``j`` loop over 32 lanes
  instead is not kept in registers by GCC: twice as slow.)
* **The input where it lies** (``INPLACE``, default 1): when every tap that a tile runs
  reads the input for every one of its pixels (tiles one pixel deep and high in padded
  dimensions, whose tap bounds are then exact, and ``EDGE`` bodies along the width: see
  :func:`convkernels.cpu.direct.microkernel.reads_in_place`), the kernel reads the unpadded input, index less
  padding, and the padded copy (zero the border, copy the interior: a pass over the
  input per call) is not made; that pass matters most on the data gradient, whose
  transposed layer is padded by k-1.  Other tiles keep the copy.
* **Per-layer specialisation**: every size is a constant; ``wb`` is the largest divisor
  of the output width up to ``WB``, ``nb`` the largest divisor of K up to ``NB``, ``nv``
  the largest divisor of ``K / nb`` up to ``NV``.
"""

from convkernels.cpu.direct.blocking import (blocked_source, channel_tiles_outer,
                                             generated_program, micro_tile, channel_block,
                                             input_modes)
from convkernels.cpu.direct import bf16_dot
from convkernels.layer import layer_constants
from convkernels.layouts import Layout


def tile_sizes(layer, params):
    """The :class:`~convkernels.cpu.direct.blocking.MicroTile`: ``db x hb x wb`` output pixels (width
    first, then height, then depth, up to ``PIX`` pixels) times ``nv`` vectors of ``nb``
    output channels."""
    return micro_tile(layer, params, layer.out_channels)


def algorithm(layer, dtype, params):
    L = layer_constants(layer, Layout.NDHWC)
    if params["DOT"] and not bf16_dot.refusal(layer, dtype.name):
        (db, hb, wb), nv = bf16_dot.tile_of(layer, params)
        return bf16_dot.dpbf16_sdfg(layer, L, dtype, (db, hb, wb), nv,
                                   f"direct_blocked_dpbf16_{layer.key()}_{db}x{hb}x{wb}x{nv}")
    db, hb, wb, nb, nv = tile_sizes(layer, params)
    k_outer = channel_tiles_outer(layer, params["KOUTER"])
    cblk = channel_block(layer.in_channels, params["CBLK"])
    edge, in_place = input_modes(L, (db, hb, wb), params, dtype.name)
    return generated_program(layer, blocked_source(L, dtype.name, db, hb, wb, nb, k_outer, nv=nv,
                                                   cblk=cblk, group=params["GROUP"],
                                                   edge=edge, in_place=in_place),
                             "direct_blocked",
                             f"{db}x{hb}x{wb}x{nb}x{nv}_{int(k_outer)}_{cblk}_{params['GROUP']}"
                             f"_{params['EDGE']}_{int(in_place)}", in_place, dtype)
