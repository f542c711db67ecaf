"""``directConvNCDHW``: direct convolution on NCDHW, scheduled by DaCe's auto-optimize.

One parallel map over every output element (n, k, od, oh, ow); each element
sums over input channels and the kd x kh x kw taps of the (padded) input.
"""

import dace

from convbench.registry import Layout, Pass
from convbench.registry import Implementation, register
from impls._common import auto_cpu, auto_gpu, layer_constants, pad_input


def algorithm(layer, dtype, params):
    L = layer_constants(layer, Layout.NCDHW)
    dt, zero = dtype.dace, dtype.numpy(0)
    N, C, K, KD, KH, KW, S = L.N, L.C, L.K, L.KD, L.KH, L.KW, L.S
    OD, OH, OW = L.OD, L.OH, L.OW

    @dace.program
    def direct_conv(x: dt[L.xp_shape], w: dt[L.w_shape], y: dt[L.y_shape]):
        for n, k, od, oh, ow in dace.map[0:N, 0:K, 0:OD, 0:OH, 0:OW]:
            acc = zero
            for c in range(C):
                for kd in range(KD):
                    for kh in range(KH):
                        for kw in range(KW):
                            acc += x[n, c, od * S + kd, oh * S + kh, ow * S + kw] * w[k, c, kd, kh, kw]
            y[n, k, od, oh, ow] = acc

    return pad_input(direct_conv, layer, Layout.NCDHW)


register(Implementation(
    name="directConvNCDHW",
    summary="direct convolution on NCDHW, one map over all outputs, DaCe auto-optimize",
    layout=Layout.NCDHW,
    pass_=Pass.FWD,
    algorithm=algorithm,
    schedules={"cpu": auto_cpu, "gpu": auto_gpu},
))
