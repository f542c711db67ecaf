"""The tiled direct convolutions on NCDHW: programs shared by ``directConvNCDHWnobuffer``,
``directConvNCDHWtileIC`` and ``directConvNCDHWmerged``.

All three merge the output's D, H and W into one pixel index p = (od * OH + oh) * OW + ow
and give a thread block a tile of CTAtileDHW consecutive pixels.  The input window of
pixel p starts at ``poff[p]`` within one channel plane of the flat padded input, so no
``%`` or ``//`` appears in an index (see ``convkernels/gpu/tiling.py``).  Pixels past the end of
the plane read offset 0 and are never stored.
"""

from types import SimpleNamespace

import dace
import numpy as np

from convkernels.layer import Layer, layer_constants
from convkernels.layouts import Layout, Pass
from convkernels.declarations import Param
from convkernels.gpu import tiling as T
from convkernels.padding import pad_input
from convkernels.programs import stable_program

LAYOUT = Layout.NCDHW

THREAD_PARAMS = (
    Param("CTAtileDHW", 512, "output pixels (merged D*H*W) per thread block; smaller planes "
          "use the next power of two", T.power_of_two),
    Param("outputsPerThread", 4, "output pixels per thread (register accumulators)",
          T.power_of_two),
)


def check_thread_params(params):
    tp, opt = params["CTAtileDHW"], params["outputsPerThread"]
    return T.require(
        (opt <= tp, "outputsPerThread must not exceed CTAtileDHW"),
        (tp // opt <= T.MAX_THREADS, f"CTAtileDHW/outputsPerThread = {tp // opt} threads > "
                                     f"{T.MAX_THREADS}"))


def _geometry(layer: Layer, tile_p: int):
    L = layer_constants(layer, LAYOUT)
    plane = L.OD * L.OH * L.OW
    return SimpleNamespace(
        L=L, P=plane, Pp=T.round_up(plane, tile_p), XS=int(np.prod(L.xp_shape)),
        WS=int(np.prod(L.w_shape)),
        YS=int(np.prod(L.y_shape)), CX=L.C * L.DP * L.HP * L.WP, PX=L.DP * L.HP * L.WP,
        HWP=L.HP * L.WP)


def _finish(program, layer: Layer, G, taps: int = 0):
    sdfg = pad_input(program, layer, LAYOUT)
    T.add_plane_table(sdfg, "poff", layer, G.Pp)
    if taps:
        dims = (("kd", layer.k_d), ("kh", layer.k_h), ("kw", layer.k_w))
        T.add_tap_table(sdfg, "toff", layer, LAYOUT, taps, dims=dims)
        T.add_filter_matrix(sdfg, "Bp", layer, LAYOUT)
    return sdfg


def per_thread(layer: Layer, dtype, params, channel_loop_outside: bool) -> dace.SDFG:
    """One output channel per block, ``outputsPerThread`` pixels per thread, strided by
    the thread count so that neighbouring threads read neighbouring input elements.

    ``channel_loop_outside=False`` (nobuffer): each thread loops over all input channels
    and taps itself.  ``True`` (tileIC): the input-channel loop encloses the thread map,
    so all threads of a block step through the channels together.
    """
    OPT = params["outputsPerThread"]
    TP = T.fit_tile(params["CTAtileDHW"], layer.out_d * layer.out_h * layer.out_w, OPT)
    NT = TP // OPT
    G = _geometry(layer, TP)
    L = G.L
    dt, i32, zero = dtype.dace, dace.int32, dtype.zero
    N, C, K, KD, KH, KW = L.N, L.C, L.K, L.KD, L.KH, L.KW
    P, Pp, CX, PX, HWP, WP = G.P, G.Pp, G.CX, G.PX, G.HWP, L.WP
    KHW = KH * KW

    OUTSIDE = channel_loop_outside

    @stable_program
    def direct_per_thread(x: dt[L.xp_shape], w: dt[L.w_shape], y: dt[L.y_shape],
                          poff: i32[Pp]):
        xf = np.reshape(x, [G.XS])
        wf = np.reshape(w, [G.WS])
        yf = np.reshape(y, [G.YS])
        for blk_n, blk_k, blk_p in dace.map[0:N, 0:K, 0:Pp:TP]:
            acc = np.ndarray([NT, OPT], dt)
            for t in dace.map[0:NT]:
                for r in dace.map[0:OPT]:
                    acc[t, r] = zero
            if OUTSIDE:  # resolved while parsing: OUTSIDE is a Python constant
                for c in dace.map[0:C]:
                    for t in dace.map[0:NT]:
                        for kd, kh, kw, r in dace.map[0:KD, 0:KH, 0:KW, 0:OPT]:
                            with dace.tasklet:
                                xa << xf(1)[:]
                                po << poff[blk_p + t + r * NT]
                                wa << wf(1)[:]
                                out >> acc(1, lambda a, b: a + b)[t, r]
                                out = (xa[blk_n * CX + c * PX + kd * HWP + kh * WP + kw + po]
                                       * wa[((blk_k * C + c) * KD + kd) * KHW + kh * KW + kw])
            else:
                for t in dace.map[0:NT]:
                    for c, kd, kh, kw in dace.map[0:C, 0:KD, 0:KH, 0:KW]:
                        for r in dace.map[0:OPT]:
                            with dace.tasklet:
                                xa << xf(1)[:]
                                po << poff[blk_p + t + r * NT]
                                wa << wf(1)[:]
                                out >> acc(1, lambda a, b: a + b)[t, r]
                                out = (xa[blk_n * CX + c * PX + kd * HWP + kh * WP + kw + po]
                                       * wa[((blk_k * C + c) * KD + kd) * KHW + kh * KW + kw])
            for t in dace.map[0:NT]:
                for r in dace.map[0:OPT]:
                    with dace.tasklet:
                        a << acc[t, r]
                        out >> yf(-1)[:]
                        if blk_p + t + r * NT < P:
                            out[(blk_n * K + blk_k) * P + blk_p + t + r * NT] = a

    return _finish(direct_per_thread, layer, G)


def per_thread_fields(name: str, summary: str, channel_loop_outside: bool) -> dict:
    """What a per-thread variant (nobuffer or tileIC) registers with (the registry's
    ``Implementation`` fields)."""
    def algorithm(layer, dtype, params):
        return per_thread(layer, dtype, params, channel_loop_outside)

    return dict(
        name=name, summary=summary, layout=LAYOUT, pass_=Pass.FWD, algorithm=algorithm,
        schedules=PER_THREAD_SCHEDULES, params=THREAD_PARAMS, check_params=check_thread_params,
        supports=T.int32_offsets, constraints=T.INT32_CONSTRAINT)


MERGED_PARAMS = (
    Param("CTAtileOC", 16, "output channels per thread block", T.power_of_two),
    Param("CTAtileDHW", 64, "output pixels (merged D*H*W) per thread block; smaller planes "
          "use the next power of two", T.power_of_two),
    Param("threadTileOC", 2, "output channels per thread", T.power_of_two),
    Param("threadTileDHW", 4, "output pixels per thread", T.power_of_two),
)


def check_merged_params(params):
    to, tp = params["CTAtileOC"], params["CTAtileDHW"]
    ro, rp = params["threadTileOC"], params["threadTileDHW"]
    if ro > to or rp > tp:
        return "threadTileOC/DHW must not exceed CTAtileOC/DHW"
    threads = (to // ro) * (tp // rp)
    return T.require((threads <= T.MAX_THREADS, f"{threads} threads per block > {T.MAX_THREADS}"))


def _merged_pixel_tile(layer: Layer, params) -> int:
    return T.fit_tile(params["CTAtileDHW"], layer.out_d * layer.out_h * layer.out_w,
                      params["threadTileDHW"])


def _staged_taps(layer: Layer, params) -> int:
    nto = params["CTAtileOC"] // params["threadTileOC"]
    ntp = _merged_pixel_tile(layer, params) // params["threadTileDHW"]
    return T.round_up(layer.k_d * layer.k_h * layer.k_w, max(nto, ntp))


def merged_supports(layer: Layer, params):
    tq = _staged_taps(layer, params)
    staged = tq * (_merged_pixel_tile(layer, params) + params["CTAtileOC"]) * T.ELEMENT_BYTES
    return T.int32_offsets(layer) or T.require(
        (staged <= T.SHARED_BYTES, f"the staged tiles of {tq} taps need {staged} bytes of "
                                   f"shared memory > {T.SHARED_BYTES}"))


MERGED_CONSTRAINT = (T.INT32_CONSTRAINT + "; staged taps x (CTAtileDHW + CTAtileOC) x 4 bytes "
                     "within 48 KiB of shared memory")


def merged(layer: Layer, dtype, params) -> dace.SDFG:
    """Blocks of CTAtileOC output channels x CTAtileDHW pixels of one image; per input
    channel, the block stages the taps x pixels input tile (an im2col tile) and the
    channels x taps filter tile in shared memory, then each thread accumulates its
    threadTileOC x threadTileDHW register tile.

    Staged tiles are padded to whole thread rows; padded taps are staged (from valid
    addresses) but never read by the computation.
    """
    TO, TP = params["CTAtileOC"], _merged_pixel_tile(layer, params)
    RO, RP = params["threadTileOC"], params["threadTileDHW"]
    NTO, NTP = TO // RO, TP // RP
    G = _geometry(layer, TP)
    L = G.L
    taps = L.KD * L.KH * L.KW
    Tq = _staged_taps(layer, params)
    VX, VW = Tq // NTO, Tq // NTP
    GKr, GNp = L.C * taps + Tq, T.round_up(L.K, TO)
    dt, i32, zero = dtype.dace, dace.int32, dtype.zero
    N, C, K = L.N, L.C, L.K
    P, Pp, CX, PX = G.P, G.Pp, G.CX, G.PX

    @stable_program
    def direct_merged(x: dt[L.xp_shape], w: dt[L.w_shape], y: dt[L.y_shape], poff: i32[Pp],
                      toff: i32[Tq], Bp: dt[GKr, GNp]):
        xf = np.reshape(x, [G.XS])
        yf = np.reshape(y, [G.YS])
        for blk_n, blk_k, blk_p in dace.map[0:N, 0:GNp:TO, 0:Pp:TP]:
            acc = np.ndarray([NTO, NTP, RO, RP], dt)
            for ti, tj in dace.map[0:NTO, 0:NTP]:
                for a, b in dace.map[0:RO, 0:RP]:
                    acc[ti, tj, a, b] = zero
            for c in dace.map[0:C]:
                Xs = np.ndarray([Tq, TP], dt)
                Ws = np.ndarray([TO, Tq], dt)
                for ti, tj in dace.map[0:NTO, 0:NTP]:
                    for v, u in dace.map[0:VX, 0:RP]:
                        with dace.tasklet:
                            xa << xf(1)[:]
                            po << poff[blk_p + tj + u * NTP]
                            to << toff[ti + v * NTO]
                            out >> Xs[ti + v * NTO, tj + u * NTP]
                            out = xa[blk_n * CX + c * PX + to + po]
                    for a, u in dace.map[0:RO, 0:VW]:
                        Ws[ti + a * NTO, tj + u * NTP] = Bp[c * taps + tj + u * NTP,
                                                            blk_k + ti + a * NTO]
                for ti, tj in dace.map[0:NTO, 0:NTP]:
                    for tap in dace.map[0:taps]:
                        for a, b in dace.map[0:RO, 0:RP]:
                            acc[ti, tj, a, b] += Ws[ti + a * NTO, tap] * Xs[tap, tj + b * NTP]
            for ti, tj in dace.map[0:NTO, 0:NTP]:
                for a, b in dace.map[0:RO, 0:RP]:
                    with dace.tasklet:
                        v << acc[ti, tj, a, b]
                        out >> yf(-1)[:]
                        if blk_k + ti + a * NTO < K and blk_p + tj + b * NTP < P:
                            out[(blk_n * K + blk_k + ti + a * NTO) * P + blk_p + tj + b * NTP] = v

    return _finish(direct_merged, layer, G, taps=Tq)


def _schedules(**kwargs):
    return {t: T.tiled_schedule(t, **kwargs) for t in ("cpu", "gpu")}


PER_THREAD_SCHEDULES = _schedules(threads=("t",), sequential=("c",), private={"acc": 1})
MERGED_SCHEDULES = _schedules(sequential=("c", "tap"), shared=("Xs", "Ws"), private={"acc": 2})
