"""3D Winograd for the filter gradient, F(3^3, 2^3), on NDHWC (``winogradF2BwdFilter``).

The filter gradient of a 3x3x3 stride-1 layer, per output tile of 2^3 pixels ``t``, is
the correlation of the tile's 4^3 input patch with its 2^3 dL/dy values: three outputs
per axis from a two-tap "filter", F(3, 2).  Its matrices are the forward F(2, 3)'s,
transposed into other roles: summing ``dy . y`` over a tile, ``y = A^T[(G w) * (B^T d)]``
gives ``dw = G^T [(A dy) * (B^T d)]`` (docs/winograd.md).  So per transform point ``p``

    M[p, k, c] = sum over tiles t of (A dy_t)[p, k] (B^T x_t)[p, c]

one GEMM per point whose reduction runs over the tiles, and ``dw = G^T M`` along the three
axes once at the end.  Work items are (plane ``ip`` of the first transform axis, block of
``CB`` input channels): an item transforms only its plane of each tile (the first axis
of ``B^T`` and ``A`` reduced to row ``ip``, then both axes of the plane), in blocks of
``TB`` tiles, and adds the block's products to its 16 points' sums, which stay in its
cache across blocks (``acc[16][K][CB]``).  The register block: ``RK`` output channels
(broadcasts of ``A dy``) times ``NV`` vectors of input channels (``B^T x``).  Last, each
item applies ``G^T`` along the plane's two axes into ``Q[ip][k][9][C]``, and a map over
output channels sums the four planes through ``G^T``'s first axis into ``dw``: no two
items write the same element.
"""

import os
from typing import NamedTuple

import dace
import numpy as np

from convkernels.winograd import algebra
from convkernels.cpu.caches import caches
from convkernels.cpu.isa import accumulator_budget, vector_registers
from convkernels.cpu.direct.blocking import largest_divisor
from convkernels.cpu.winograd.forward import _matrix, micro_code, padded, vector_code, vector_of
from convkernels.winograd.fields import tile_padded
from convkernels.cpu.calls import call_map, finish, layer_sdfg
from convkernels.winograd.tiles import R, tile_count, tiles

M_OUT = 2
N_IN = M_OUT + R - 1
PLANE = N_IN * N_IN
def acc_bytes() -> int:
    """The bytes of one item's accumulators (16 points x K x CB) the default blocking keeps
    within: half of the L2 (:mod:`convkernels.cpu.caches`)."""
    return caches().l2 // 2


def block_bytes() -> int:
    """The bytes of a block's transformed operands (16 points x TB tiles x (K + CB)): a
    quarter of the L2."""
    return caches().l2 // 4


class Blocking(NamedTuple):
    TB: int
    CB: int
    RK: int
    NV: int
    VL: int


def blocking(L, params, threads: int = 0) -> Blocking:
    """``TB`` tiles per block, ``CB`` input channels per item, ``RK`` x ``NV`` register
    block (0: chosen here: the item's sums within :func:`acc_bytes`, at least as many
    items as threads where channels allow, the block within :func:`block_bytes`)."""
    threads = threads or os.cpu_count() or 1
    vl = vector_of(L.C)
    cb = params["CB"]
    if not cb:
        cb = L.C
        while (4 * PLANE * L.K * cb > acc_bytes() or N_IN * (L.C // cb) < threads) \
                and cb % 2 == 0 and cb // 2 >= vl:
            cb //= 2
    cb = largest_divisor(L.C, cb)
    vl = vector_of(cb)
    nv = largest_divisor(cb // vl, params["NV"] or 4)
    rk = params["RK"] or max(1, min((vector_registers() - nv - 1) // nv,
                                    accumulator_budget() // nv))
    rk = min(rk, L.K)
    tb = params["TB"] or max(8, block_bytes() // (4 * PLANE * (L.K + cb)))
    return Blocking(min(tb, tile_count(L, M_OUT)), cb, rk, nv, vl)


def _row(name, row):
    return f"static constexpr float {name}[1][{len(row)}] = {{{{{', '.join(f'{float(v)!r}f' for v in row)}}}}};"


def global_code(L, b: Blocking, matrices=None) -> str:
    """The C++ of the kernel for layer constants ``L`` (the forward layer) and ``b``."""
    at, g, bt = matrices or algebra.transforms(M_OUT, R)
    a = at.T              # 4 x 2: dy's transform
    gt = g.T              # 3 x 4: the output transform
    n, m = N_IN, M_OUT
    C, K = L.C, L.K
    TB, CB, RK, NV, VL = b.TB, b.CB, b.RK, b.NV, b.VL
    count = tile_count(L, m)
    blocks = -(-count // TB)
    TD, TH, TW = tiles(L.OD, m), tiles(L.OH, m), tiles(L.OW, m)
    XP, DP, AP = padded(TB * CB), padded(TB * K), padded(K * CB)
    rem = K % RK
    # register blocks: RK output channels x NV vectors of the item's CB input channels
    calls = f"""
            for (int cq = 0; cq < {CB}; cq += {NV * VL}) {{
                for (int k = 0; k + {RK} <= {K}; k += {RK})
                    wgf_micro<{RK}>(Dp + k, Xp + cq, Ap + (long)k * {CB} + cq, n, true);"""
    if rem:
        calls += f"""
                wgf_micro<{rem}>(Dp + {K - rem}, Xp + cq, Ap + (long)({K - rem}) * {CB} + cq, n, true);"""
    calls += """
            }"""
    rows = [_row(f"WGF_BT{i}", bt[i]) for i in range(n)] + [_row(f"WGF_A{i}", a[i]) for i in range(n)]
    pick = lambda name: "(ip == 0 ? %s0 : ip == 1 ? %s1 : ip == 2 ? %s2 : %s3)" % ((name,) * 4)
    return "\n".join([
        "#include <vector>", "#include <cstring>",
        _matrix("WG_BT", bt), _matrix("WG_A", a), _matrix("WGF_GT", gt), *rows,
        vector_code(VL),
        f"""
// acc[r][CB] += sum_t dy_t[k0 + r] x_t[CB] over the block's n tiles
{micro_code('wgf_micro', NV, VL, row_b=1, step_b=K, step_v=CB, row_m=CB)}

// plane ip of tile i's transforms: X[16][t][CB] (B^T x, channels c0..) and D[16][t][K] (A dy)
static void wgf_tile(const float* __restrict x, const float* __restrict dy, float* X, float* D,
                     long i, int t, int ip, long c0, float* patch, float* tmp) {{
    const long w0 = {m} * (i % {TW}), h0 = {m} * (i / {TW} % {TH}),
               d0 = {m} * (i / {TW * TH} % {TD}), nb = i / {TW * TH * TD};
    const float (&brow)[1][{n}] = {pick("WGF_BT")};
    const float (&arow)[1][{m}] = {pick("WGF_A")};
    const long xd = d0 - {L.PD}, xh = h0 - {L.PH}, xw = w0 - {L.PW};
    const float* xs;
    long sa, sb, se;
    if (xd >= 0 && xh >= 0 && xw >= 0 && xd + {n} <= {L.D} && xh + {n} <= {L.H} && xw + {n} <= {L.W}) {{
        xs = x + (((nb * {L.D} + xd) * {L.H} + xh) * {L.W} + xw) * {C} + c0;  // inside: in place
        sa = {L.H * L.W * C}; sb = {L.W * C}; se = {C};
    }} else {{  // on the border: zeros outside the input
        for (int a = 0; a < {n}; ++a)
        for (int bb = 0; bb < {n}; ++bb)
        for (int e = 0; e < {n}; ++e) {{
            float* to = patch + ((a * {n} + bb) * {n} + e) * {CB};
            const long d = xd + a, h = xh + bb, w = xw + e;
            if (d >= 0 && h >= 0 && w >= 0 && d < {L.D} && h < {L.H} && w < {L.W})
                std::memcpy(to, x + (((nb * {L.D} + d) * {L.H} + h) * {L.W} + w) * {C} + c0,
                            sizeof(float) * {CB});
            else
                std::memset(to, 0, sizeof(float) * {CB});
        }}
        xs = patch; sa = {n * n * CB}; sb = {n * CB}; se = {CB};
    }}
    wg_line<1, {n}, {CB}>(brow, xs, sa, sb, se, tmp, {n * n * CB}, {n * CB}, {CB});
    wg_plane<{n}, {n}, {CB}>(WG_BT, tmp, {n * CB}, {CB}, X + (long)t * {CB}, {n * XP}, {XP});
    const float* ds;
    if (d0 + {m} <= {L.OD} && h0 + {m} <= {L.OH} && w0 + {m} <= {L.OW}) {{
        ds = dy + (((nb * {L.OD} + d0) * {L.OH} + h0) * {L.OW} + w0) * {K};
        sa = {L.OH * L.OW * K}; sb = {L.OW * K}; se = {K};
    }} else {{  // a cut-short tile: zeros past the output
        for (int a = 0; a < {m}; ++a)
        for (int bb = 0; bb < {m}; ++bb)
        for (int e = 0; e < {m}; ++e) {{
            float* to = patch + ((a * {m} + bb) * {m} + e) * {K};
            if (d0 + a < {L.OD} && h0 + bb < {L.OH} && w0 + e < {L.OW})
                std::memcpy(to, dy + (((nb * {L.OD} + d0 + a) * {L.OH} + h0 + bb) * {L.OW} + w0 + e) * {K},
                            sizeof(float) * {K});
            else
                std::memset(to, 0, sizeof(float) * {K});
        }}
        ds = patch; sa = {m * m * K}; sb = {m * K}; se = {K};
    }}
    wg_line<1, {m}, {K}>(arow, ds, sa, sb, se, tmp, {m * m * K}, {m * K}, {K});
    wg_plane<{n}, {m}, {K}>(WG_A, tmp, {m * K}, {K}, D + (long)t * {K}, {n * DP}, {DP});
}}

// one item: plane ip, input channels [cb CB, cb CB + CB): Q[ip][k][9][C] of its channels
static void wgf_item(const float* x, const float* dy, float* Q, long ip, long cb) {{
    static thread_local std::vector<float> scratch;
    const long wide = {max(n ** 3 * max(CB, K), 1)};
    const long need = {PLANE * XP} + {PLANE * DP} + {PLANE * AP} + 2 * wide;
    if ((long)scratch.size() < need) scratch.resize(need);
    float* X = scratch.data();          // [16][TB][CB] (+ pad)
    float* D = X + {PLANE * XP};        // [16][TB][K]
    float* acc = D + {PLANE * DP};      // [16][K][CB]
    float* patch = acc + {PLANE * AP};
    float* tmp = patch + wide;
    const long c0 = cb * {CB};
    for (int p = 0; p < {PLANE}; ++p) std::memset(acc + (long)p * {AP}, 0, sizeof(float) * {K * CB});
    for (long blk = 0; blk < {blocks}; ++blk) {{
        const long first = blk * {TB};
        const int n = (int)({count} - first < {TB} ? {count} - first : {TB});
        for (int t = 0; t < n; ++t)
            wgf_tile(x, dy, X, D, first + t, t, (int)ip, c0, patch, tmp);
        for (int p = 0; p < {PLANE}; ++p) {{
            const float* Dp = D + (long)p * {DP};
            const float* Xp = X + (long)p * {XP};
            float* Ap = acc + (long)p * {AP};{calls}
        }}
    }}
    for (int k = 0; k < {K}; ++k)  // G^T along the plane's two axes
        wg_plane<{R}, {n}, {CB}>(WGF_GT, acc + (long)k * {CB}, {n * AP}, {AP},
                                 Q + ((ip * {K} + k) * 9L) * {C} + c0, {R * C}, {C});
}}

// dw[k][a][9][C] = sum over planes ip of G^T[a][ip] Q[ip][k][9][C]
static void wgf_combine(const float* __restrict Q, float* __restrict dw, long k) {{
    for (int a = 0; a < {R}; ++a) {{
        float* out = dw + (k * 27 + a * 9L) * {C};
        for (long j = 0; j < {9 * C}; ++j) {{
            float s = 0.0f;
            for (int ip = 0; ip < {n}; ++ip) s += WGF_GT[a][ip] * Q[(ip * {K} + k) * {9 * C} + j];
            out[j] = s;
        }}
    }}
}}
"""])


def program(layer, L, params, matrices=None):
    """Two maps: the items (planes x input-channel blocks) into ``Q``, then the sum of the
    planes per output channel into ``w`` (dL/dw)."""
    b = blocking(L, params)
    sdfg = layer_sdfg(f"winograd_f2_bwdf_{layer.key()}_{'_'.join(map(str, b[:4]))}",
                      layer, L)
    sdfg.add_array("Q", (N_IN * L.K * 9 * L.C,), dace.float32, transient=True)
    items = sdfg.add_state("items", is_start_block=True)
    call_map(items, "plane_items", {"ip": f"0:{N_IN}", "cb": f"0:{L.C // b.CB}"},
             {"xin": "x", "yin": "y"}, "wgf_item(xin, yin, qout, ip, cb);", {"qout": "Q"})
    call_map(sdfg.add_state_after(items, "combine"), "planes", {"k": f"0:{L.K}"},
             {"qin": "Q"}, "wgf_combine(qin, wout, k);", {"wout": "w"})
    return finish(sdfg, global_code(L, b, matrices))


#: What ``convbench tune`` tries by default.
SEARCH_SPACE = "TB=0,32,128;CB=0,16"


def params():
    from convkernels.declarations import Param
    return (
        Param("TB", 0, "tiles per block of the transforms and the GEMMs (0: as many as keep "
                       "the block's transformed operands within 512 KiB)", minimum=0),
        Param("CB", 0, "input channels per work item (0: all, halved until an item's sums "
                       "fit 1 MiB and every thread has an item)", minimum=0),
        Param("NV", 0, "vectors of input channels per register block (0: up to 4)", minimum=0),
        Param("RK", 0, "output channels per register block (0: as many as the registers "
                       "hold)", minimum=0),
    )


def registers(layer, params):
    from convkernels.layouts import Layout
    from convkernels.layer import layer_constants
    b = blocking(layer_constants(layer, Layout.NDHWC), params)
    return b.RK * b.NV


def bound(layer, x, dy, tol_factor: float, random_inputs: bool = False):
    """:func:`convkernels.winograd.algebra.filter_gradient_bound` for ``layer`` on ``x`` (NCDHW,
    unpadded) and ``dy`` (NCDHW), shaped like dL/dw (K, C, 3, 3, 3)."""
    import torch
    xp, (od, oh, ow) = tile_padded(layer, x, M_OUT)
    dyp = torch.nn.functional.pad(dy.double(), (0, ow, 0, oh, 0, od))
    return torch.from_numpy(np.ascontiguousarray(
        algebra.filter_gradient_bound(xp, dyp, tol_factor, random_inputs)))
