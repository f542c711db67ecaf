"""``implicitGemmNCDHWinplace``: the warp-tiled NCDHW implicit GEMM without copies in
front of it.  It reads the input and the filter where they are.

``implicitGemmNCDHW`` pays for three kinds of set-up work on every call.  It pads the
input (a zeroing kernel and a copy).  It copies the filter into a zero-padded GEMM
matrix; on CosmoFlow v1 conv7 that copy took 358 of 540 us on the H100.  And it writes
two int32 tables with one entry per output pixel (67 MB each for MLPerf conv1 at batch
8).  This variant does none of them:

* **Borders by predicated loads.**  Each thread decodes the output pixels of the rows it
  stages once, before the K loop, into registers (``rb``: the offset of the window's
  origin in the unpadded input; ``rp``: its (d, h, w) packed in 10-bit fields, biased by
  256 so that they stay positive).  A reduction tap's offset and its (kd, kh, kw) come
  from two tables of GK entries (``coloff``, ``coldhw``; 27 KB on conv7).  The sum of
  the packed fields is the input coordinate, and a load whose coordinate falls outside
  the input reads 0 instead.
* **The filter as it is.**  In NCDHW the filter [K, C, kd, kh, kw] already is the
  [N, GK] matrix B transposed, rows in the reduction order of ``coloff``.  The block
  stages its TK x TN slice with threads along the reduction index (coalesced reads of
  consecutive taps), into a shared buffer padded by one column (``Bs[TK, TN + 1]``, so
  that those stores do not all hit the same bank).
* **The output offset** of each pixel is decoded once per stored element.

The rest is ``implicitGemmNCDHW``'s structure (:mod:`convkernels.gpu.igemm`): block tiles, per
thread register tiles of threadTileM x threadTileN accumulators, A and B staged in shared
memory per K step of CTAtileK taps.  Flat indices are decoded with ``//`` and ``%`` only
in tasklet code, never in subscripts (docs/adding-an-implementation.md).
"""

from typing import Optional, Tuple

import dace
import numpy as np

from convkernels.gpu import igemm
from convkernels.gpu import tiling as T
from convkernels.layer import Layer, layer_constants
from convkernels.programs import stable_program
from convkernels.layouts import Layout

#: The packed coordinates: three 10-bit fields, each biased so that a window origin at
#: -pad stays positive; field + tap must stay below 1024.
FIELD = 1024
BIAS = 256
PACK_LIMIT = FIELD - BIAS


def bounds(layer: Layer) -> Tuple[int, int, int]:
    """The input extent a load's coordinate must lie in, per dimension (d, h, w)."""
    return layer.in_d, layer.in_h, layer.in_w


def check_tiles(params) -> Optional[str]:
    """``implicitGemmNCDHW``'s constraints, and the filter staging's: each thread row
    stages whole columns of B (CTAtileN a multiple of CTAtileM/threadTileM) and each
    thread column whole K steps (CTAtileK a multiple of CTAtileN/threadTileN)."""
    base = igemm.check_tiles(params)
    if base:
        return base
    ntm = params["CTAtileM"] // params["threadTileM"]
    ntn = params["CTAtileN"] // params["threadTileN"]
    tk, tm, tn = params["CTAtileK"], params["CTAtileM"], params["CTAtileN"]
    return T.require(
        (tn % ntm == 0, f"CTAtileN={tn} must be a multiple of CTAtileM/threadTileM={ntm} "
                        "(each thread row stages whole filter columns)"),
        (tk % ntn == 0, f"CTAtileK={tk} must be a multiple of CTAtileN/threadTileN={ntn} "
                        "(each thread column stages whole K steps of the filter)"),
        (tk * (tm + tn + 1) * T.ELEMENT_BYTES <= T.SHARED_BYTES,
         f"staged tiles need {tk * (tm + tn + 1) * T.ELEMENT_BYTES} bytes of shared memory"),
    )


def supports(layer: Layer, params) -> Optional[str]:
    reason = T.int32_offsets(layer, params)
    if reason:
        return reason
    # A field holds a coordinate from -pad to extent + pad - 1, plus the bias.
    if max(layer.pads) > BIAS:
        return f"padding {max(layer.pads)} over {BIAS} (coordinates packed in 10-bit fields)"
    worst = max(size + pad for size, pad in zip((layer.in_d, layer.in_h, layer.in_w), layer.pads))
    if worst > PACK_LIMIT:
        return (f"input extent plus padding ({worst}) over {PACK_LIMIT} (coordinates packed "
                "in 10-bit fields)")
    return None


def add_tap_tables(sdfg, layer: Layer, length: int) -> None:
    """``coloff[kk]``: offset of tap kk in the unpadded NCDHW input from the window's
    origin; ``coldhw[kk]``: its (kd, kh, kw) packed as the row coordinates are; both 0
    past GK.  One flat map fills both (one small kernel on the GPU, every thread busy)."""
    d, h, w = layer.in_d, layer.in_h, layer.in_w
    kvol, khw = layer.k_d * layer.k_h * layer.k_w, layer.k_h * layer.k_w
    for name in ("coloff", "coldhw"):
        desc = sdfg.arrays[name]
        if tuple(desc.shape) != (length,):
            raise ValueError(f"table {name} has shape {desc.shape}, expected ({length},)")
        desc.transient = True
    state = sdfg.add_state_before(sdfg.start_state, "tap_tables")
    state.add_mapped_tasklet(
        "tap_tables", {"i": f"0:{length}"}, {},
        f"""c = i // {kvol}
t = i % {kvol}
kd = t // {khw}
kh = (t % {khw}) // {layer.k_w}
kw = t % {layer.k_w}
if i < {layer.gemm_k}:
    off = c * {d * h * w} + kd * {h * w} + kh * {w} + kw
    dhw = kd * {FIELD * FIELD} + kh * {FIELD} + kw
else:
    off = 0
    dhw = 0""",
        {"off": dace.Memlet("coloff[i]"), "dhw": dace.Memlet("coldhw[i]")},
        external_edges=True)


def inplace(layer: Layer, dtype, params) -> dace.SDFG:
    TM, TN, TK = params["CTAtileM"], params["CTAtileN"], params["CTAtileK"]
    RM, RN = params["threadTileM"], params["threadTileN"]
    NTM, NTN = TM // RM, TN // RN
    VK, UA = TK // NTM, TM // NTN      # A staging: rows ti + v*NTM (taps), cols tj + u*NTN
    VN, UK = TN // NTM, TK // NTN      # B staging: cols ti + v*NTM (channels), rows tj + u*NTN
    L = layer_constants(layer, Layout.NCDHW)
    G = igemm.geometry(layer, Layout.NCDHW, TM, TN, TK)
    dt, i32, zero = dtype.dace, dace.int32, dtype.zero
    GM, GN, GK, GMp, GKp = G.GM, G.GN, G.GK, G.GMp, G.GKp
    xshape = (L.N, L.C, L.D, L.H, L.W)
    XS, YS, WS = int(np.prod(xshape)), G.YS, GN * GK
    IH, IW = L.H, L.W
    PLANE, OHW, OW = L.OD * L.OH * L.OW, L.OH * L.OW, L.OW
    SD, SH, SW = L.SD, L.SH, L.SW
    PD, PH, PW = L.PD, L.PH, L.PW
    CHW = L.C * L.D * L.H * L.W
    BD, BH, BW = bounds(layer)
    F1, F2 = FIELD, FIELD * FIELD

    @stable_program
    def igemm_inplace(x: dt[xshape], w: dt[L.w_shape], y: dt[L.y_shape],
                      coloff: i32[GKp], coldhw: i32[GKp]):
        xf = np.reshape(x, [XS])
        wf = np.reshape(w, [WS])
        yf = np.reshape(y, [YS])
        for blk_n, blk_m in dace.map[0:G.GNp:TN, 0:GMp:TM]:  # blk_m: grid x
            acc = np.ndarray([NTM, NTN, RM, RN], dt)
            rb = np.ndarray([NTM, NTN, UA], i32)
            rp = np.ndarray([NTM, NTN, UA], i32)
            for ti, tj in dace.map[0:NTM, 0:NTN]:
                for r, s in dace.map[0:RM, 0:RN]:
                    acc[ti, tj, r, s] = zero
                for u in dace.map[0:UA]:
                    with dace.tasklet:  # the window origin of each staged row, once
                        ob >> rb[ti, tj, u]
                        op >> rp[ti, tj, u]
                        m = blk_m + tj + u * NTN
                        b = m // PLANE
                        p = m % PLANE
                        od = p // OHW
                        oh = (p % OHW) // OW
                        ow = p % OW
                        d0 = od * SD - PD
                        h0 = oh * SH - PH
                        w0 = ow * SW - PW
                        ob = b * CHW + (d0 * IH + h0) * IW + w0
                        op = (d0 + BIAS) * F2 + (h0 + BIAS) * F1 + (w0 + BIAS)
            for k0 in dace.map[0:GKp:TK]:
                As = np.ndarray([TK, TM], dt)
                Bs = np.ndarray([TK, TN + 1], dt)
                for ti, tj in dace.map[0:NTM, 0:NTN]:
                    for v, u in dace.map[0:VK, 0:UA]:
                        with dace.tasklet:  # A[m, kk], 0 outside the input
                            xa << xf(1)[:]
                            ro << rb[ti, tj, u]
                            rq << rp[ti, tj, u]
                            co << coloff[k0 + ti + v * NTM]
                            cq << coldhw[k0 + ti + v * NTM]
                            out >> As[ti + v * NTM, tj + u * NTN]
                            at = rq + cq
                            dd = at // F2 - BIAS
                            hh = (at // F1) % F1 - BIAS
                            ww = at % F1 - BIAS
                            if (blk_m + tj + u * NTN < GM and k0 + ti + v * NTM < GK
                                    and dd >= 0 and dd < BD and hh >= 0 and hh < BH
                                    and ww >= 0 and ww < BW):
                                out = xa[ro + co]
                            else:
                                out = 0
                    for v, u in dace.map[0:VN, 0:UK]:
                        with dace.tasklet:  # B[kk, n] = w[n, kk], 0 past the edges
                            wv << wf(1)[:]
                            out >> Bs[tj + u * NTN, ti + v * NTM]
                            if blk_n + ti + v * NTM < GN and k0 + tj + u * NTN < GK:
                                out = wv[(blk_n + ti + v * NTM) * GK + k0 + tj + u * NTN]
                            else:
                                out = 0
                for ti, tj in dace.map[0:NTM, 0:NTN]:
                    for kk, r, s in dace.map[0:TK, 0:RM, 0:RN]:
                        acc[ti, tj, r, s] += As[kk, ti + r * NTM] * Bs[kk, tj + s * NTN]
            for ti, tj in dace.map[0:NTM, 0:NTN]:
                for r, s in dace.map[0:RM, 0:RN]:
                    with dace.tasklet:
                        a << acc[ti, tj, r, s]
                        out >> yf(-1)[:]
                        m = blk_m + ti + r * NTM
                        n = blk_n + tj + s * NTN
                        if m < GM and n < GN:
                            out[(m // PLANE) * (GN * PLANE) + n * PLANE + m % PLANE] = a

    sdfg = igemm_inplace.to_sdfg(simplify=True)
    add_tap_tables(sdfg, layer, GKp)
    return sdfg


SCHEDULES = {t: T.tiled_schedule(t, sequential=("k0",), shared=("As", "Bs"),
                                 private={"acc": 2, "rb": 2, "rp": 2}) for t in ("cpu", "gpu")}
