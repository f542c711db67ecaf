"""``directConvNCDHWBwdData``: dL/dx by the direct definition on NCDHW, scheduled by DaCe's
auto-optimize.

One parallel map over every input element (n, c, d, h, w), with c = g * C/G + c' for
group g; each sums dL/dy over the K/G output channels of its group and every tap of the
filter.  Tap kd reaches input plane d from output plane ``(d + PD - kd * ED) / SD`` where
that is a whole number inside the output; per-tap tables (``_backward.add_position_tables``)
hold that plane, or a zero plane appended to dL/dy where there is none, so the loop nest
has no condition.  Unlike ``implicitGemmBwdData`` it visits every tap (with stride s,
all but about 1/s per dimension meet the zero plane): the simple, general member of the
direct family, not a fast one.
"""

import dace
import numpy as np

from convbench.registry import ALL_PRECISIONS, FEATURES, Layout, Pass
from convbench.registry import Implementation, register
from impls._backward import add_position_tables
from impls._common import auto_cpu, auto_gpu, layer_constants
from impls._stable import stable_program


def algorithm(layer, dtype, params):
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


register(Implementation(
    name="directConvNCDHWBwdData",
    summary="backward data by the direct definition on NCDHW: every tap, per-tap output "
            "tables with a zero plane, DaCe auto-optimize",
    layout=Layout.NCDHW,
    pass_=Pass.BWD_DATA,
    algorithm=algorithm,
    schedules={"cpu": auto_cpu, "gpu": auto_gpu},
    handles=FEATURES,
    precisions=ALL_PRECISIONS,
))
