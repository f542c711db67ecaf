"""``implicitGemm``: implicit GEMM on NDHWC, scheduled by DaCe's auto-optimize.

The convolution is the GEMM ``Y[M, N] = A[M, K] * B[K, N]`` with

* M = batch * Do * Ho * Wo (row m is the output pixel (b, od, oh, ow)),
* N = output channels,
* K = C * kd * kh * kw (column kk is the tap (kd, kh, kw, c), c fastest),

where ``A`` is never formed: ``A[m, kk]`` is read from the (padded) input at the
pixel and tap that ``m`` and ``kk`` stand for (tap kd of pixel od at ``od*SD + kd*ED``:
stride and dilation per dimension), and ``B[kk, n]`` is the KTRSC
filter ``w[n, kd, kh, kw, c]``.  In NDHWC, ``Y`` is the output itself, row-major
``[M, N]``.  With G groups it is G GEMMs side by side: output channel ``g*K/G + j``
reduces over the C/G input channels of group g only (K = C/G * kd * kh * kw).

The M and K indices are written in their decoded, multi-dimensional form (a map
over (b, od, oh, ow, n), a loop nest over (kd, kh, kw, c)).  Flat indices would
need ``m % Do``-style arithmetic, which DaCe 1.0.2's frontend cannot parse when a
size is 1 (the expression folds to a sympy zero and parsing fails).
"""

import dace

from convbench.registry import ALL_PRECISIONS, FEATURES, Layout, Pass
from convbench.registry import Implementation, register
from impls._common import auto_cpu, auto_gpu, layer_constants, pad_input
from impls._stable import stable_program


def algorithm(layer, dtype, params):
    L = layer_constants(layer, Layout.NDHWC)
    dt, zero = dtype.dace, dtype.zero
    N, KD, KH, KW, G, CG, KG = L.N, L.KD, L.KH, L.KW, L.G, L.CG, L.KG
    OD, OH, OW, SD, SH, SW, ED, EH, EW = L.OD, L.OH, L.OW, L.SD, L.SH, L.SW, L.ED, L.EH, L.EW

    @stable_program
    def implicit_gemm(x: dt[L.xp_shape], w: dt[L.w_shape], y: dt[L.y_shape]):
        # (m, n) with n = g * KG + j: group g's GEMM reads its own CG input channels
        for b, od, oh, ow, g, j in dace.map[0:N, 0:OD, 0:OH, 0:OW, 0:G, 0:KG]:
            acc = zero
            for kd in range(KD):  # kk
                for kh in range(KH):
                    for kw in range(KW):
                        for c in range(CG):
                            acc += (dace.float32(x[b, od * SD + kd * ED, oh * SH + kh * EH,
                                                   ow * SW + kw * EW, g * CG + c])
                                    * dace.float32(w[g * KG + j, kd, kh, kw, c]))
            y[b, od, oh, ow, g * KG + j] = acc

    return pad_input(implicit_gemm, layer, Layout.NDHWC)


register(Implementation(
    name="implicitGemm",
    summary="implicit GEMM (M=N*Do*Ho*Wo, N=K, K=C*kd*kh*kw) on NDHWC, DaCe auto-optimize",
    layout=Layout.NDHWC,
    pass_=Pass.FWD,
    algorithm=algorithm,
    schedules={"cpu": auto_cpu, "gpu": auto_gpu},
    handles=FEATURES,
    precisions=ALL_PRECISIONS,
))
