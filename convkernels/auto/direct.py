"""The direct convolution on NCDHW in all three passes, written as DaCe dataflow and
scheduled by DaCe's auto-optimize (``directConvNCDHW``, ``directConvNCDHWBwdData``,
``directConvNCDHWBwdFilter``): the direct family that handles the whole layer model
(groups, dilation and stride per dimension).

**Forward** (:func:`forward`).  One parallel map over every output element (n, k, od, oh,
ow), with k = g * K/G + j for group g; each element sums over the C/G input channels of its
group and the kd x kh x kw taps of the (padded) input, tap kd reading plane ``od * SD + kd *
ED`` (stride and dilation per dimension).

**Data gradient** (:func:`data_gradient`).  One parallel map over every input element (n, c,
d, h, w), with c = g * C/G + c' for group g; each sums dL/dy over the K/G output channels of
its group and every tap of the filter.  Tap kd reaches input plane d from output plane ``(d
+ PD - kd * ED) / SD`` where that is a whole number inside the output; per-tap tables
(:func:`~convkernels.auto.implicit_gemm.add_position_tables`) hold that plane, or a zero
plane appended to dL/dy where there is none, so the loop nest has no condition.  Unlike
``implicitGemmBwdData`` it visits every tap (with stride s, all but about 1/s per dimension
meet the zero plane): the simple, general member of the direct family, not a fast one.

**Filter gradient** (:func:`filter_gradient`).  One parallel map over every filter element
(k, c, kd, kh, kw), with k = g * K/G + j for group g; each sums, over every output pixel,
dL/dy of channel k times the (padded) input of channel g * C/G + c at the tap's position
``od * SD + kd * ED`` (stride and dilation per dimension).
"""

import dace
import numpy as np

from convkernels.auto.implicit_gemm import add_position_tables
from convkernels.layer import layer_constants
from convkernels.layouts import Layout
from convkernels.padding import pad_input
from convkernels.programs import stable_program


def forward(layer, dtype, params):
    L = layer_constants(layer, Layout.NCDHW)
    dt, zero = dtype.dace, dtype.zero
    N, KD, KH, KW, G, CG, KG = L.N, L.KD, L.KH, L.KW, L.G, L.CG, L.KG
    OD, OH, OW, SD, SH, SW, ED, EH, EW = L.OD, L.OH, L.OW, L.SD, L.SH, L.SW, L.ED, L.EH, L.EW

    @stable_program
    def direct_conv(x: dt[L.xp_shape], w: dt[L.w_shape], y: dt[L.y_shape]):
        for n, g, j, od, oh, ow in dace.map[0:N, 0:G, 0:KG, 0:OD, 0:OH, 0:OW]:
            acc = zero
            for c in range(CG):
                for kd in range(KD):
                    for kh in range(KH):
                        for kw in range(KW):
                            acc += (dace.float32(x[n, g * CG + c, od * SD + kd * ED, oh * SH + kh * EH,
                                                   ow * SW + kw * EW])
                                    * dace.float32(w[g * KG + j, c, kd, kh, kw]))
            y[n, g * KG + j, od, oh, ow] = acc

    return pad_input(direct_conv, layer, Layout.NCDHW)


def data_gradient(layer, dtype, params):
    L = layer_constants(layer, Layout.NCDHW)
    dt, zero, i32 = dtype.dace, dtype.zero, dace.int32
    N, K, D, H, W, G, CG, KG = L.N, L.K, L.D, L.H, L.W, L.G, L.CG, L.KG
    KD, KH, KW, OD, OH, OW = L.KD, L.KH, L.KW, L.OD, L.OH, L.OW
    x_shape = (N, L.C, D, H, W)

    @stable_program
    def direct_bwd_data(y: dt[L.y_shape], w: dt[L.w_shape], x: dt[x_shape],
                        od_t: i32[D, KD], oh_t: i32[H, KH], ow_t: i32[W, KW]):
        yz = np.zeros((N, K, OD + 1, OH + 1, OW + 1), dtype=dt)  # + a zero plane per dim
        yz[:, :, 0:OD, 0:OH, 0:OW] = y
        for n, g, c, d, h, v in dace.map[0:N, 0:G, 0:CG, 0:D, 0:H, 0:W]:
            acc = zero
            for k in range(KG):
                for kd in range(KD):
                    for kh in range(KH):
                        for kw in range(KW):
                            acc += (dace.float32(yz[n, g * KG + k, od_t[d, kd], oh_t[h, kh],
                                                    ow_t[v, kw]])
                                    * dace.float32(w[g * KG + k, c, kd, kh, kw]))
            x[n, g * CG + c, d, h, v] = acc

    sdfg = direct_bwd_data.to_sdfg(simplify=True)
    add_position_tables(sdfg, L)
    return sdfg


def filter_gradient(layer, dtype, params):
    L = layer_constants(layer, Layout.NCDHW)
    dt, zero = dtype.dace, dtype.zero
    N, KD, KH, KW, G, CG, KG = L.N, L.KD, L.KH, L.KW, L.G, L.CG, L.KG
    OD, OH, OW, SD, SH, SW, ED, EH, EW = L.OD, L.OH, L.OW, L.SD, L.SH, L.SW, L.ED, L.EH, L.EW

    @stable_program
    def direct_bwd_filter(x: dt[L.xp_shape], y: dt[L.y_shape], w: dt[L.w_shape]):
        for g, j, c, kd, kh, kw in dace.map[0:G, 0:KG, 0:CG, 0:KD, 0:KH, 0:KW]:
            acc = zero
            for n in range(N):
                for od in range(OD):
                    for oh in range(OH):
                        for ow in range(OW):
                            acc += (dace.float32(y[n, g * KG + j, od, oh, ow])
                                    * dace.float32(x[n, g * CG + c, od * SD + kd * ED,
                                                     oh * SH + kh * EH, ow * SW + kw * EW]))
            w[g * KG + j, c, kd, kh, kw] = acc

    return pad_input(direct_bwd_filter, layer, Layout.NCDHW)
