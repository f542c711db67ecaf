"""The tiled implicit-GEMM family: programs shared by ``implicitGemmTiledonly``,
``implicitGemmWarpTiled``, ``implicitGemmNCDHW`` and ``implicitGemmsplitK``.

The convolution is ``Y[M, N] = A[M, K] @ B[K, N]`` with M = output pixels
(b, od, oh, ow), N = output channels and K = C * kd * kh * kw.  ``A`` is gathered
from the flat padded input through two offset tables (``A[m, kk] =
x[rowoff[m] + coloff[kk]]``), ``B`` is the filter copied into a zero-padded matrix
``Bp``, and ``Y[m, n]`` is written to ``y[yrow[m] + n * YC]``.  Only the tables depend
on the layout, so one program serves NDHWC and NCDHW.

The block map lists M last: DaCe launches a map's last dimension on the grid's x axis,
the only one without the 65535 limit, and M / CTAtileM reaches 5e5 blocks on CosmoFlow.

Tails: M, N and K are padded to whole tiles.  Padded rows of ``A`` read offset 0 (a
valid input element) and are never stored; padded columns of ``A`` meet zero rows of
``Bp``; padded columns of ``Bp`` are zero and never stored.
"""

from types import SimpleNamespace
from typing import Optional, Tuple

import dace
import numpy as np

from convkernels.layer import Layer, layer_constants
from convkernels.layouts import Layout, Pass
from convkernels.declarations import ALL_PRECISIONS, Param
from convkernels.gpu import tiling as T
from convkernels.padding import pad_input
from convkernels.programs import stable_program

#: Tables and matrices the programs take as arguments; :func:`finish` makes them transients.
TABLES = ("rowoff", "coloff", "yrow", "Bp")

TILE_PARAMS = (
    Param("CTAtileM", 64, "output pixels (GEMM rows) per thread block", T.power_of_two),
    Param("CTAtileN", 64, "output channels (GEMM columns) per thread block", T.power_of_two),
    Param("CTAtileK", 16, "reduction taps staged per step", T.power_of_two),
    Param("threadTileM", 4, "rows of the per-thread register tile", T.power_of_two),
    Param("threadTileN", 4, "columns of the per-thread register tile", T.power_of_two),
)


def check_tiles(params) -> Optional[str]:
    tm, tn, tk = params["CTAtileM"], params["CTAtileN"], params["CTAtileK"]
    rm, rn = params["threadTileM"], params["threadTileN"]
    if rm > tm or rn > tn:
        return "threadTileM/N must not exceed CTAtileM/N"
    ntm, ntn = tm // rm, tn // rn
    return T.require(
        (ntm * ntn <= T.MAX_THREADS,
         f"(CTAtileM/threadTileM)*(CTAtileN/threadTileN) = {ntm * ntn} threads > {T.MAX_THREADS}"),
        (tk % ntm == 0, f"CTAtileK={tk} must be a multiple of CTAtileM/threadTileM={ntm} "
                        "(each thread row stages whole rows of the K step)"),
        (tm % ntn == 0, f"CTAtileM={tm} must be a multiple of CTAtileN/threadTileN={ntn}"),
        (tk * (tm + tn) * T.ELEMENT_BYTES <= T.SHARED_BYTES,
         f"staged tiles need {tk * (tm + tn) * T.ELEMENT_BYTES} bytes of shared memory > "
         f"{T.SHARED_BYTES}"),
    )


def geometry(layer: Layer, layout: Layout, tm: int, tn: int, tk: int, nsplit: int = 1):
    """GEMM sizes padded to tiles (K to ``nsplit`` whole chunks of ``tk``)."""
    L = layer_constants(layer, layout)
    gkp = T.round_up(layer.gemm_k, tk * nsplit)
    return SimpleNamespace(
        L=L, GM=layer.gemm_m, GN=layer.gemm_n, GK=layer.gemm_k,
        GMp=T.round_up(layer.gemm_m, tm), GNp=T.round_up(layer.gemm_n, tn), GKp=gkp,
        KS=gkp // nsplit, XS=int(np.prod(L.xp_shape)), YS=int(np.prod(L.y_shape)),
        YC=T.output_channel_stride(layer, layout))


def finish(program, layer: Layer, layout: Layout, G, filter_matrix=None) -> dace.SDFG:
    """SDFG of ``program`` with the harness signature (x, w, y): padding, tables, Bp
    (``filter_matrix(sdfg, name, layer, layout)`` makes it, default
    :func:`~convkernels.gpu.tiling.add_filter_matrix`)."""
    sdfg = pad_input(program, layer, layout)
    T.add_row_table(sdfg, "rowoff", layer, layout, G.GMp)
    T.add_tap_table(sdfg, "coloff", layer, layout, G.GKp)
    T.add_output_table(sdfg, "yrow", layer, layout, G.GMp)
    (filter_matrix or T.add_filter_matrix)(sdfg, "Bp", layer, layout)
    return sdfg


def tiled_only(layer: Layer, layout: Layout, dtype, params) -> dace.SDFG:
    """CTA tiles of CTAtileM x CTAtileN outputs, one output per thread, sequential K loop
    reading global memory directly (no staging buffers)."""
    TM, TN = params["CTAtileM"], params["CTAtileN"]
    G = geometry(layer, layout, TM, TN, 1)
    dt, at, i32, zero = dtype.dace, dtype.acc_dace, dace.int32, dtype.zero
    GM, GN, GMp, GNp, GKp, YC = G.GM, G.GN, G.GMp, G.GNp, G.GKp, G.YC

    @stable_program
    def igemm_tiled(x: dt[G.L.xp_shape], w: dt[G.L.w_shape], y: dt[G.L.y_shape],
                    rowoff: i32[GMp], coloff: i32[GKp], yrow: i32[GMp], Bp: dt[GKp, GNp]):
        xf = np.reshape(x, [G.XS])
        yf = np.reshape(y, [G.YS])
        for blk_n, blk_m in dace.map[0:GNp:TN, 0:GMp:TM]:  # blk_m fastest: grid x
            acc = np.ndarray([TM, TN], at)
            for ti, tj in dace.map[0:TM, 0:TN]:
                acc[ti, tj] = zero
            for ti, tj in dace.map[0:TM, 0:TN]:
                for kk in dace.map[0:GKp]:
                    with dace.tasklet:
                        xa << xf(1)[:]
                        ro << rowoff[blk_m + ti]
                        co << coloff[kk]
                        bv << Bp[kk, blk_n + tj]
                        out >> acc(1, lambda u, v: u + v)[ti, tj]
                        out = xa[ro + co] * bv
            for ti, tj in dace.map[0:TM, 0:TN]:
                with dace.tasklet:
                    a << acc[ti, tj]
                    ro << yrow[blk_m + ti]
                    out >> yf(-1)[:]
                    if blk_m + ti < GM and blk_n + tj < GN:
                        out[ro + (blk_n + tj) * YC] = a

    return finish(igemm_tiled, layer, layout, G)


def warp_tiled(layer: Layer, layout: Layout, dtype, params, nsplit: int = 1) -> dace.SDFG:
    """CTA tiles, per-thread register tiles, and A/B tiles staged per K step.

    Thread (ti, tj) owns rows ``ti + r * NTM`` and columns ``tj + s * NTN`` of the CTA
    tile (strided, so that neighbouring threads read neighbouring staged elements).
    With ``nsplit > 1`` the K range is cut into ``nsplit`` chunks, one per block along
    a third grid dimension; each writes a partial tile to ``part`` and a reduction
    kernel sums the partials into ``y``.
    """
    TM, TN, TK = params["CTAtileM"], params["CTAtileN"], params["CTAtileK"]
    RM, RN = params["threadTileM"], params["threadTileN"]
    NTM, NTN = TM // RM, TN // RN
    VK, UA = TK // NTM, TM // NTN
    G = geometry(layer, layout, TM, TN, TK, nsplit)
    dt, at, i32, zero = dtype.dace, dtype.acc_dace, dace.int32, dtype.zero
    GM, GN, GMp, GNp, GKp, KS, YC, NS = G.GM, G.GN, G.GMp, G.GNp, G.GKp, G.KS, G.YC, nsplit

    @stable_program
    def igemm_warp(x: dt[G.L.xp_shape], w: dt[G.L.w_shape], y: dt[G.L.y_shape],
                   rowoff: i32[GMp], coloff: i32[GKp], yrow: i32[GMp], Bp: dt[GKp, GNp]):
        xf = np.reshape(x, [G.XS])
        yf = np.reshape(y, [G.YS])
        part = np.ndarray([NS, GMp, GNp], at)  # float32 partial sums (split-K only)
        for blk_s, blk_n, blk_m in dace.map[0:NS, 0:GNp:TN, 0:GMp:TM]:  # blk_m: grid x
            acc = np.ndarray([NTM, NTN, RM, RN], at)
            for ti, tj in dace.map[0:NTM, 0:NTN]:
                for r, s in dace.map[0:RM, 0:RN]:
                    acc[ti, tj, r, s] = zero
            for k0 in dace.map[0:KS:TK]:
                As = np.ndarray([TK, TM], dt)
                Bs = np.ndarray([TK, TN], dt)
                for ti, tj in dace.map[0:NTM, 0:NTN]:
                    for v, u in dace.map[0:VK, 0:UA]:
                        with dace.tasklet:  # gather A[m, kk] through the tables
                            xa << xf(1)[:]
                            ro << rowoff[blk_m + tj + u * NTN]
                            co << coloff[blk_s * KS + k0 + ti + v * NTM]
                            out >> As[ti + v * NTM, tj + u * NTN]
                            out = xa[ro + co]
                    for v, u in dace.map[0:VK, 0:RN]:
                        Bs[ti + v * NTM, tj + u * NTN] = Bp[blk_s * KS + k0 + ti + v * NTM,
                                                            blk_n + tj + u * NTN]
                for ti, tj in dace.map[0:NTM, 0:NTN]:
                    for kk, r, s in dace.map[0:TK, 0:RM, 0:RN]:
                        acc[ti, tj, r, s] += (dace.float32(As[kk, ti + r * NTM])
                                              * dace.float32(Bs[kk, tj + s * NTN]))
            for ti, tj in dace.map[0:NTM, 0:NTN]:
                for r, s in dace.map[0:RM, 0:RN]:
                    if NS == 1:  # resolved when the program is parsed
                        with dace.tasklet:
                            a << acc[ti, tj, r, s]
                            ro << yrow[blk_m + ti + r * NTM]
                            out >> yf(-1)[:]
                            if blk_m + ti + r * NTM < GM and blk_n + tj + s * NTN < GN:
                                out[ro + (blk_n + tj + s * NTN) * YC] = a
                    else:
                        part[blk_s, blk_m + ti + r * NTM, blk_n + tj + s * NTN] = acc[ti, tj, r, s]
        if NS > 1:
            for m, n in dace.map[0:GM, 0:GN]:
                total = zero
                for i in range(NS):
                    total = total + part[i, m, n]
                yf[yrow[m] + n * YC] = total

    return finish(igemm_warp, layer, layout, G)


def _warp_schedule(target):
    return T.tiled_schedule(target, sequential=("k0",), shared=("As", "Bs"), private={"acc": 2})


#: Schedules of the warp-tiled programs (``warp_tiled``).
WARP_SCHEDULES = {"cpu": _warp_schedule("cpu"), "gpu": _warp_schedule("gpu")}


def warp_fields(name: str, summary: str, layout: Layout, split_k: bool = False,
                default_for: Tuple[str, ...] = ()) -> dict:
    """What a warp-tiled variant registers with (the registry's ``Implementation``
    fields); ``split_k`` adds the ``nsplitK`` parameter."""
    params = TILE_PARAMS
    if split_k:
        params += (Param("nsplitK", 4, "number of chunks the reduction (K) is split into"),)

    def algorithm(layer, dtype, values):
        return warp_tiled(layer, layout, dtype, values, nsplit=values.get("nsplitK", 1))

    return dict(
        name=name, summary=summary, layout=layout, pass_=Pass.FWD, algorithm=algorithm,
        schedules=WARP_SCHEDULES, params=params, check_params=check_tiles,
        supports=_split_k_partials if split_k else T.int32_offsets,
        constraints=T.INT32_CONSTRAINT + (SPLIT_K_CONSTRAINT if split_k else ""),
        default_for=default_for, precisions=ALL_PRECISIONS)


SPLIT_K_CONSTRAINT = "; nsplitK x padded GEMM rows x padded GEMM columns below 2^31 (partial sums)"


def _split_k_partials(layer: Layer, params) -> Optional[str]:
    """Why the split-K partial-sum buffer of ``layer`` is out of int32 range, or None.

    DaCe indexes arrays with int; at 2^31 elements and above the index wraps (seen on
    an H100: an illegal memory access on MLPerf conv1 at batch 8 with nsplitK=4)."""
    reason = T.int32_offsets(layer, params)
    if reason:
        return reason
    G = geometry(layer, Layout.NCDHW, params["CTAtileM"], params["CTAtileN"], params["CTAtileK"],
                 params["nsplitK"])
    elements = params["nsplitK"] * G.GMp * G.GNp
    if elements > T.INT32_MAX:
        return (f"partial sums of nsplitK={params['nsplitK']} chunks ({elements} elements) exceed "
                f"int32 indexing ({T.INT32_MAX}); use fewer chunks or implicitGemmNCDHW")
    return None


#: The tiles of ``tiled_only`` (one output element per thread).
TILED_ONLY_PARAMS = (
    Param("CTAtileM", 16, "output pixels per thread block", T.power_of_two),
    Param("CTAtileN", 16, "output channels per thread block", T.power_of_two))


def check_tiled_only(params) -> Optional[str]:
    """Why ``tiled_only``'s tiles cannot launch, or None."""
    threads = params["CTAtileM"] * params["CTAtileN"]
    return T.require((threads <= T.MAX_THREADS,
                      f"CTAtileM*CTAtileN = {threads} threads > {T.MAX_THREADS}"))


def tiled_only_schedule(target: str):
    """``tiled_only``'s schedule for ``target``: the K loop sequential, the accumulator
    per thread."""
    return T.tiled_schedule(target, sequential=("kk",), private={"acc": 2})
