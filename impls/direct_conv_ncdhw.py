"""``directConvNCDHW``: direct convolution on NCDHW, scheduled by DaCe's auto-optimize.

One parallel map over every output element (n, k, od, oh, ow), with k = g * K/G + j for
group g; each element sums over the C/G input channels of its group and the
kd x kh x kw taps of the (padded) input, tap kd reading plane ``od * SD + kd * ED``
(stride and dilation per dimension).  With ``directConvNCDHWBwdData`` and
``directConvNCDHWBwdFilter`` it is the direct family that handles the whole layer model.
"""

import dace

from convbench.registry import ALL_PRECISIONS, FEATURES, Layout, Pass
from convbench.registry import Implementation, register
from impls._common import auto_cpu, auto_gpu, layer_constants, pad_input
from impls._stable import stable_program


def algorithm(layer, dtype, params):
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


register(Implementation(
    name="directConvNCDHW",
    summary="direct convolution on NCDHW, one map over all outputs, DaCe auto-optimize",
    layout=Layout.NCDHW,
    pass_=Pass.FWD,
    algorithm=algorithm,
    schedules={"cpu": auto_cpu, "gpu": auto_gpu},
    handles=FEATURES,
    precisions=ALL_PRECISIONS,
))
