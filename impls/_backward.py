"""The backward passes as implicit GEMMs on NDHWC (shared by the backward modules).

Backward data, dL/dx = "full" convolution of dL/dy with the flipped filter: the GEMM
``dX[M, C] = A[M, K*J] * B[K*J, C]`` with M = N*D*H*W input pixels.  For input
position ``d`` (per dimension), the taps that reach it are ``kd = (d + P) % S + S*j``
for ``j < J = ceil(kd/S)``, at output position ``od = (d + P) // S - j``; a tap is
valid if ``kd < KD`` and ``0 <= od < OD``.  So every stride phase visits only its own
taps (no zero insertion: for stride 2 and a 3-tap kernel, 2 taps per dimension instead
of 3 on a 2x dilated grid).  The tap tables ``od`` and ``kd`` per (position, j) and
dimension are computed by small maps in front of the GEMM; an invalid tap points at a
zero plane appended to dL/dy and at tap 0 of the filter, so it adds exactly zero.

Backward filter, dL/dw[k, kd, kh, kw, c] = sum over (b, od, oh, ow) of
dL/dy[b, od, oh, ow, k] * x_padded[b, od*S + kd, oh*S + kh, ow*S + kw, c]: the GEMM
``dW[K, C*taps] = dY^T[K, M] * A[M, C*taps]`` with the long reduction over the
M = N*Do*Ho*Wo output pixels.  With ``nsplit > 1`` (split-K), output depth planes are
cut into ``nsplit`` chunks of ``ceil(Do / nsplit)`` planes; chunk s reduces its planes
into ``part[s]`` (every chunk is written in full: dL/dy is zero-extended to whole
chunks, the input to match), and a second map sums the partials.
"""

import dace
import numpy as np

from convbench.registry import Layout
from impls._common import layer_constants, pad_input


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _add_tap_table(sdfg, pos_table: str, tap_table: str, size: int, J: int, P: int, S: int,
                   KX: int, OX: int) -> None:
    """Make the program arguments ``pos_table`` and ``tap_table`` (shape ``[size, J]``)
    transients, filled by a map in front of the computation: for position ``i`` and
    ``j < J``, the tap ``(i + P) % S + S*j`` of ``i``'s stride phase and the output
    position ``(i + P) // S - j`` it meets, or the zero plane ``OX`` and tap 0 where
    that tap does not exist (beyond the kernel or the output)."""
    for name in (pos_table, tap_table):
        sdfg.arrays[name].transient = True
    state = sdfg.add_state_before(sdfg.start_state, f"fill_{pos_table}")
    state.add_mapped_tasklet(
        f"fill_{pos_table}", {"i": f"0:{size}", "j": f"0:{J}"}, {},
        f"tap = (i + {P}) % {S} + {S} * j\n"
        f"pos = (i + {P}) // {S} - j\n"
        f"ok = tap < {KX} and pos >= 0 and pos < {OX}\n"
        f"o = pos if ok else {OX}\n"
        "t = tap if ok else 0",
        {"o": dace.Memlet(f"{pos_table}[i, j]"), "t": dace.Memlet(f"{tap_table}[i, j]")},
        external_edges=True)


def bwd_data_algorithm(layer, dtype, params):
    L = layer_constants(layer, Layout.NDHWC)
    dt, zero = dtype.dace, dtype.numpy(0)
    N, C, K, S = L.N, L.C, L.K, L.S
    D, H, W, KD, KH, KW, OD, OH, OW = L.D, L.H, L.W, L.KD, L.KH, L.KW, L.OD, L.OH, L.OW
    JD, JH, JW = _ceil_div(KD, S), _ceil_div(KH, S), _ceil_div(KW, S)
    x_shape = (N, D, H, W, C)
    i32 = dace.int32

    @dace.program
    def bwd_data(y: dt[L.y_shape], w: dt[L.w_shape], x: dt[x_shape],
                 od_t: i32[D, JD], kd_t: i32[D, JD], oh_t: i32[H, JH], kh_t: i32[H, JH],
                 ow_t: i32[W, JW], kw_t: i32[W, JW]):
        # dL/dy with one zero plane appended per spatial dimension (index OD, OH, OW)
        yz = np.zeros((N, OD + 1, OH + 1, OW + 1, K), dtype=dt)
        yz[:, 0:OD, 0:OH, 0:OW, :] = y
        for b, d, h, v, c in dace.map[0:N, 0:D, 0:H, 0:W, 0:C]:
            acc = zero
            for jd in range(JD):
                for jh in range(JH):
                    for jw in range(JW):
                        for k in range(K):
                            acc += (yz[b, od_t[d, jd], oh_t[h, jh], ow_t[v, jw], k]
                                    * w[k, kd_t[d, jd], kh_t[h, jh], kw_t[v, jw], c])
            x[b, d, h, v, c] = acc

    sdfg = bwd_data.to_sdfg(simplify=True)
    for pos, tap, size, J, P, KX, OX in (("od_t", "kd_t", D, JD, L.PD, KD, OD),
                                         ("oh_t", "kh_t", H, JH, L.PH, KH, OH),
                                         ("ow_t", "kw_t", W, JW, L.PW, KW, OW)):
        _add_tap_table(sdfg, pos, tap, size, J, P, S, KX, OX)
    return sdfg


def bwd_filter_algorithm(layer, dtype, params, nsplit: int = 1):
    L = layer_constants(layer, Layout.NDHWC)
    dt, zero = dtype.dace, dtype.numpy(0)
    N, C, K, S = L.N, L.C, L.K, L.S
    KD, KH, KW, OD, OH, OW = L.KD, L.KH, L.KW, L.OD, L.OH, L.OW

    if nsplit == 1:
        @dace.program
        def bwd_filter(x: dt[L.xp_shape], y: dt[L.y_shape], w: dt[L.w_shape]):
            for n, kd, kh, kw, c in dace.map[0:K, 0:KD, 0:KH, 0:KW, 0:C]:
                acc = zero
                for b in range(N):
                    for od in range(OD):
                        for oh in range(OH):
                            for ow in range(OW):
                                acc += (y[b, od, oh, ow, n]
                                        * x[b, od * S + kd, oh * S + kh, ow * S + kw, c])
                w[n, kd, kh, kw, c] = acc

        return pad_input(bwd_filter, layer, Layout.NDHWC)

    CH = _ceil_div(OD, nsplit)           # output planes per chunk
    ODZ = nsplit * CH                    # dL/dy depth, zero-extended to whole chunks
    DZ = max(L.DP, (ODZ - 1) * S + KD)   # input depth the chunks read, zero-extended
    DP, HP, WP = L.DP, L.HP, L.WP

    @dace.program
    def bwd_filter_split(x: dt[L.xp_shape], y: dt[L.y_shape], w: dt[L.w_shape]):
        yz = np.zeros((N, ODZ, OH, OW, K), dtype=dt)
        yz[:, 0:OD, :, :, :] = y
        xz = np.zeros((N, DZ, HP, WP, C), dtype=dt)
        xz[:, 0:DP, :, :, :] = x
        part = np.ndarray((nsplit, K, KD, KH, KW, C), dtype=dt)
        for s, n, kd, kh, kw, c in dace.map[0:nsplit, 0:K, 0:KD, 0:KH, 0:KW, 0:C]:
            acc = zero
            for b in range(N):
                for t in range(CH):
                    for oh in range(OH):
                        for ow in range(OW):
                            acc += (yz[b, s * CH + t, oh, ow, n]
                                    * xz[b, (s * CH + t) * S + kd, oh * S + kh, ow * S + kw, c])
            part[s, n, kd, kh, kw, c] = acc
        for n, kd, kh, kw, c in dace.map[0:K, 0:KD, 0:KH, 0:KW, 0:C]:
            total = zero
            for s in range(nsplit):
                total += part[s, n, kd, kh, kw, c]
            w[n, kd, kh, kw, c] = total

    return pad_input(bwd_filter_split, layer, Layout.NDHWC)
