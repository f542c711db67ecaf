"""``directConvNCDHWBwdFilter``: dL/dw by the direct definition on NCDHW, scheduled by
DaCe's auto-optimize.

One parallel map over every filter element (k, c, kd, kh, kw), with k = g * K/G + j for
group g; each sums, over every output pixel, dL/dy of channel k times the (padded) input
of channel g * C/G + c at the tap's position ``od * SD + kd * ED`` (stride and dilation
per dimension).
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


register(Implementation(
    name="directConvNCDHWBwdFilter",
    summary="backward filter by the direct definition on NCDHW: one map over filter "
            "elements, each reducing over every output pixel, DaCe auto-optimize",
    layout=Layout.NCDHW,
    pass_=Pass.BWD_FILTER,
    algorithm=algorithm,
    schedules={"cpu": auto_cpu, "gpu": auto_gpu},
    handles=FEATURES,
    precisions=ALL_PRECISIONS,
))
