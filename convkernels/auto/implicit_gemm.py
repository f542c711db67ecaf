"""The implicit GEMM in all three passes on NDHWC, written as DaCe dataflow and scheduled by
DaCe's auto-optimize (``implicitGemm``, ``implicitGemmBwdData``, ``implicitGemmBwdFilter``,
``implicitGemmsplitKBwdFilter``).

All three handle the whole layer model: per-dimension stride ``S`` and dilation ``E`` (tap
``kd`` reads input ``od*S + kd*E``) and groups (channel ``g*C/G + c`` meets only the
output channels ``g*K/G + j`` of its group g).

**Forward** (:func:`forward`).  The convolution is the GEMM ``Y[M, N] = A[M, K] * B[K, N]`` with

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

**Data gradient** (:func:`data_gradient`), dL/dx = "full" convolution of dL/dy with the
flipped filter: the GEMM
``dX[M, C] = A[M, K*J] * B[K*J, C]`` with M = N*D*H*W input pixels.  For input
position ``d`` (per dimension), the taps that reach it are ``kd = (d + P) % S + S*j``
for ``j < J = ceil(kd/S)``, at output position ``od = (d + P) // S - j``; a tap is
valid if ``kd < KD`` and ``0 <= od < OD``.  So every stride phase visits only its own
taps (no zero insertion: for stride 2 and a 3-tap kernel, 2 taps per dimension instead
of 3 on a 2x dilated grid).  The tap tables ``od`` and ``kd`` per (position, j) and
dimension are computed by small maps in front of the GEMM; an invalid tap points at a
zero plane appended to dL/dy and at tap 0 of the filter, so it adds exactly zero.

**Filter gradient** (:func:`filter_gradient`), dL/dw[k, kd, kh, kw, c] = sum over (b, od, oh, ow) of
dL/dy[b, od, oh, ow, k] * x_padded[b, od*S + kd, oh*S + kh, ow*S + kw, c]: the GEMM
``dW[K, C*taps] = dY^T[K, M] * A[M, C*taps]`` with the long reduction over the
M = N*Do*Ho*Wo output pixels.  With ``nsplit > 1`` (split-K), output depth planes are
cut into ``nsplit`` chunks of ``ceil(Do / nsplit)`` planes; chunk s reduces its planes
into ``part[s]`` (every chunk is written in full: dL/dy is zero-extended to whole
chunks, the input to match), and a second map sums the partials.
"""

import dace
import numpy as np

from convkernels.layouts import Layout
from convkernels.layer import layer_constants
from convkernels.padding import pad_input
from convkernels.programs import stable_program


def forward(layer, dtype, params):
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


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _add_tap_table(sdfg, pos_table: str, tap_table, size: int, J: int, P: int, S: int,
                   E: int, KX: int, OX: int) -> None:
    """Make the program arguments ``pos_table`` and ``tap_table`` (shape ``[size, J]``)
    transients, filled by a map in front of the computation: for position ``i`` and
    ``j < J``, the ``j``-th tap that reaches ``i`` and the output position it meets, or the
    zero plane ``OX`` and tap 0 where that tap does not exist (beyond the kernel or the
    output).  Without dilation (``E == 1``) the taps of ``i``'s stride phase are
    ``(i + P) % S + S*j`` at output ``(i + P) // S - j``.  With dilation, or with
    ``tap_table=None`` (a table per tap, ``J = KX``: tap ``j`` itself), tap ``j`` reaches
    ``i`` from output ``(i + P - E*j) / S`` where that divides."""
    for name in (pos_table, tap_table):
        if name is not None:
            sdfg.arrays[name].transient = True
    state = sdfg.add_state_before(sdfg.start_state, f"fill_{pos_table}")
    if E == 1 and tap_table is not None:
        code = (f"tap = (i + {P}) % {S} + {S} * j\n"
                f"pos = (i + {P}) // {S} - j\n"
                f"ok = tap < {KX} and pos >= 0 and pos < {OX}\n")
    else:
        code = (f"q = i + {P} - {E} * j\n"
                "tap = j\n"
                f"pos = q // {S} if q >= 0 else -1\n"
                f"ok = q >= 0 and q % {S} == 0 and pos < {OX}\n")
    outputs = {"o": dace.Memlet(f"{pos_table}[i, j]")}
    code += f"o = pos if ok else {OX}"
    if tap_table is not None:
        outputs["t"] = dace.Memlet(f"{tap_table}[i, j]")
        code += "\nt = tap if ok else 0"
    state.add_mapped_tasklet(f"fill_{pos_table}", {"i": f"0:{size}", "j": f"0:{J}"}, {}, code,
                             outputs, external_edges=True)


def add_position_tables(sdfg, L, names=("od_t", "oh_t", "ow_t")) -> None:
    """Per-tap tables of the direct backward-data pass: ``od_t[d, kd]`` is the output
    plane that tap ``kd`` reaches input plane ``d`` from, or the zero plane ``OD``
    (likewise for height and width)."""
    for name, size, P, S, E, KX, OX in zip(names, (L.D, L.H, L.W), (L.PD, L.PH, L.PW),
                                           (L.SD, L.SH, L.SW), (L.ED, L.EH, L.EW),
                                           (L.KD, L.KH, L.KW), (L.OD, L.OH, L.OW)):
        _add_tap_table(sdfg, name, None, size, KX, P, S, E, KX, OX)


def taps_per_position(k: int, s: int, e: int) -> int:
    """The table width J of one dimension: ``ceil(k/s)`` taps per stride phase, or every
    tap with dilation (see :func:`_add_tap_table`)."""
    return _ceil_div(k, s) if e == 1 else k


def data_gradient(layer, dtype, params):
    L = layer_constants(layer, Layout.NDHWC)
    dt, zero = dtype.dace, dtype.zero
    N, C, K, G, CG, KG = L.N, L.C, L.K, L.G, L.CG, L.KG
    D, H, W, KD, KH, KW, OD, OH, OW = L.D, L.H, L.W, L.KD, L.KH, L.KW, L.OD, L.OH, L.OW
    JD, JH, JW = (taps_per_position(k, s, e) for k, s, e in
                  ((KD, L.SD, L.ED), (KH, L.SH, L.EH), (KW, L.SW, L.EW)))
    x_shape = (N, D, H, W, C)
    i32 = dace.int32

    @stable_program
    def bwd_data(y: dt[L.y_shape], w: dt[L.w_shape], x: dt[x_shape],
                 od_t: i32[D, JD], kd_t: i32[D, JD], oh_t: i32[H, JH], kh_t: i32[H, JH],
                 ow_t: i32[W, JW], kw_t: i32[W, JW]):
        # dL/dy with one zero plane appended per spatial dimension (index OD, OH, OW)
        yz = np.zeros((N, OD + 1, OH + 1, OW + 1, K), dtype=dt)
        yz[:, 0:OD, 0:OH, 0:OW, :] = y
        # input channel g * CG + c meets the KG output channels of its group g
        for b, d, h, v, g, c in dace.map[0:N, 0:D, 0:H, 0:W, 0:G, 0:CG]:
            acc = zero
            for jd in range(JD):
                for jh in range(JH):
                    for jw in range(JW):
                        for k in range(KG):
                            acc += (dace.float32(yz[b, od_t[d, jd], oh_t[h, jh], ow_t[v, jw], g * KG + k])
                                    * dace.float32(w[g * KG + k, kd_t[d, jd], kh_t[h, jh],
                                                     kw_t[v, jw], c]))
            x[b, d, h, v, g * CG + c] = acc

    sdfg = bwd_data.to_sdfg(simplify=True)
    for pos, tap, size, J, P, S, E, KX, OX in (
            ("od_t", "kd_t", D, JD, L.PD, L.SD, L.ED, KD, OD),
            ("oh_t", "kh_t", H, JH, L.PH, L.SH, L.EH, KH, OH),
            ("ow_t", "kw_t", W, JW, L.PW, L.SW, L.EW, KW, OW)):
        _add_tap_table(sdfg, pos, tap, size, J, P, S, E, KX, OX)
    return sdfg


def filter_gradient(layer, dtype, params, nsplit: int = 1):
    L = layer_constants(layer, Layout.NDHWC)
    dt, at, zero = dtype.dace, dtype.acc_dace, dtype.zero
    N, C, K, G, CG, KG = L.N, L.C, L.K, L.G, L.CG, L.KG
    KD, KH, KW, OD, OH, OW = L.KD, L.KH, L.KW, L.OD, L.OH, L.OW
    SD, SH, SW, ED, EH, EW = L.SD, L.SH, L.SW, L.ED, L.EH, L.EW

    if nsplit == 1:
        @stable_program
        def bwd_filter(x: dt[L.xp_shape], y: dt[L.y_shape], w: dt[L.w_shape]):
            # filter g * KG + j of group g sees the CG input channels of that group
            for g, j, kd, kh, kw, c in dace.map[0:G, 0:KG, 0:KD, 0:KH, 0:KW, 0:CG]:
                acc = zero
                for b in range(N):
                    for od in range(OD):
                        for oh in range(OH):
                            for ow in range(OW):
                                acc += (dace.float32(y[b, od, oh, ow, g * KG + j])
                                        * dace.float32(x[b, od * SD + kd * ED, oh * SH + kh * EH,
                                                         ow * SW + kw * EW, g * CG + c]))
                w[g * KG + j, kd, kh, kw, c] = acc

        return pad_input(bwd_filter, layer, Layout.NDHWC)

    CH = _ceil_div(OD, nsplit)                     # output planes per chunk
    ODZ = nsplit * CH                              # dL/dy depth, zero-extended to whole chunks
    DZ = max(L.DP, (ODZ - 1) * SD + (KD - 1) * ED + 1)  # input depth the chunks read
    DP, HP, WP = L.DP, L.HP, L.WP

    @stable_program
    def bwd_filter_split(x: dt[L.xp_shape], y: dt[L.y_shape], w: dt[L.w_shape]):
        yz = np.zeros((N, ODZ, OH, OW, K), dtype=dt)
        yz[:, 0:OD, :, :, :] = y
        xz = np.zeros((N, DZ, HP, WP, C), dtype=dt)
        xz[:, 0:DP, :, :, :] = x
        part = np.ndarray((nsplit, K, KD, KH, KW, CG), dtype=at)  # float32 partial sums
        for s, g, j, kd, kh, kw, c in dace.map[0:nsplit, 0:G, 0:KG, 0:KD, 0:KH, 0:KW, 0:CG]:
            acc = zero
            for b in range(N):
                for t in range(CH):
                    for oh in range(OH):
                        for ow in range(OW):
                            acc += (dace.float32(yz[b, s * CH + t, oh, ow, g * KG + j])
                                    * dace.float32(xz[b, (s * CH + t) * SD + kd * ED,
                                                      oh * SH + kh * EH, ow * SW + kw * EW,
                                                      g * CG + c]))
            part[s, g * KG + j, kd, kh, kw, c] = acc
        for n, kd, kh, kw, c in dace.map[0:K, 0:KD, 0:KH, 0:KW, 0:CG]:
            total = zero
            for s in range(nsplit):
                total += part[s, n, kd, kh, kw, c]
            w[n, kd, kh, kw, c] = total

    return pad_input(bwd_filter_split, layer, Layout.NDHWC)
