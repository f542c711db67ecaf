"""3D Winograd F(2^3, 3^3) for the data gradient as the forward's adjoint, on NDHWC
(``winogradF2BwdDataAdjoint``).

The forward computes, per output tile ``t`` of 2^3 pixels, ``y_t = A^T [sum_c U_c *
(B^T x_t,c)]`` from the tile's 4^3 input patch.  Its adjoint takes dL/dy's tile back
the same way: the patch's gradient is ``B [sum_k U_k * (A dy_t,k)]``, and the patches of
neighbouring tiles overlap by two pixels per axis, so they are added up.  It does the
forward's 64 products per tile, channel pair and point, where the data gradient as a
convolution of its own (``winogradF2BwdData``, on the transposed layer) tiles dL/dx,
which is larger than y wherever the forward layer is unpadded (v1 conv5: 10^3 against 8^3,
1.95 times the products; conv6: 6^3 against 4^3, 3.4 times).

Work items are blocks of ``CG`` input channels of the forward layer (dL/dx's channels),
so that no two items add into one element: an item transforms its part of the filter
(``U[p][K][CG]``, 27 taps through ``G`` per output channel), then, in blocks of ``T``
tiles, dL/dy's tiles through ``A`` (all output channels; each item does so again, a small
cost beside its GEMMs), one GEMM per transform point summing over the output channels
(``RT`` tiles x ``NV`` vectors of channels per register block), and ``B`` along three
axes into a 4^3 patch that it adds to dL/dx.
"""

import os
from typing import NamedTuple

from convkernels.winograd import algebra
from convkernels.cpu.caches import caches
from convkernels.cpu.isa import accumulator_budget, vector_registers
from convkernels.cpu.direct.blocking import largest_divisor
from convkernels.cpu.winograd.forward import _matrix, micro_code, padded, vector_code, vector_of
from convkernels.cpu.calls import call_map, finish, layer_sdfg
from convkernels.winograd.tiles import R, tile_count, tiles

M_OUT = 2
N_IN = M_OUT + R - 1
P = N_IN ** 3
def filter_bytes() -> int:
    """An item's transformed filter (64 points x K x CG) stays within this many bytes: the
    L2 (:mod:`convkernels.cpu.caches`; it is read once per block of tiles)."""
    return caches().l2


def block_bytes() -> int:
    """A block's transformed dL/dy (64 points x T tiles x K) stays within this many bytes:
    a quarter of the L2."""
    return caches().l2 // 4


class Blocking(NamedTuple):
    T: int
    CG: int
    RT: int
    NV: int
    VL: int


def blocking(L, params, threads: int = 0) -> Blocking:
    """``CG`` channels per item (0: halved from all until the item's filter fits
    :func:`filter_bytes` and every thread has two items), ``T`` tiles per block (0: a
    block's transformed dL/dy within :func:`block_bytes`), ``RT`` x ``NV`` register
    block."""
    threads = threads or os.cpu_count() or 1
    vl = vector_of(L.C)
    cg = params["CG"]
    if not cg:
        cg = L.C
        while (4 * P * L.K * cg > filter_bytes() or L.C // cg < 2 * threads) \
                and cg % 2 == 0 and cg // 2 >= vl:
            cg //= 2
    cg = largest_divisor(L.C, cg)
    vl = vector_of(cg)
    nv = largest_divisor(cg // vl, params["NV"] or 4)
    rt = params["RT"] or max(1, min((vector_registers() - nv - 1) // nv,
                                    accumulator_budget() // nv))
    count = tile_count(L, M_OUT)
    t = params["T"] or max(rt, block_bytes() // (4 * P * L.K) // rt * rt)
    return Blocking(min(t, count), cg, min(rt, t, count), nv, vl)


def global_code(L, b: Blocking, matrices=None) -> str:
    """The C++ of the kernel for the forward layer's constants ``L`` and blocking ``b``."""
    at, g, bt = matrices or algebra.transforms(M_OUT, R)
    n, m = N_IN, M_OUT
    C, K = L.C, L.K
    T, CG, RT, NV, VL = b.T, b.CG, b.RT, b.NV, b.VL
    count = tile_count(L, m)
    blocks = -(-count // T)
    TD, TH, TW = tiles(L.OD, m), tiles(L.OH, m), tiles(L.OW, m)
    UP, DP, MP = padded(K * CG), padded(T * K), padded(T * CG)
    calls = f"""
            for (int cq = 0; cq < {CG}; cq += {NV * VL}) {{
                int t = 0;
                for (; t + {RT} <= nt; t += {RT})
                    wga_micro<{RT}>(Dp + (long)t * {K}, Up + cq, Mp + (long)t * {CG} + cq, {K}, false);
                for (; t < nt; ++t)  // the block's last tiles, or a last block cut short
                    wga_micro<1>(Dp + (long)t * {K}, Up + cq, Mp + (long)t * {CG} + cq, {K}, false);
            }}"""
    return "\n".join([
        "#include <vector>", "#include <cstring>",
        _matrix("WG_G", g), _matrix("WG_A", at.T), _matrix("WG_B", bt.T),
        vector_code(VL),
        f"""
// m[t][CG part] = sum_k d[t][k] u[k][CG part] for RR tiles, over all K channels
{micro_code('wga_micro', NV, VL, row_b=K, step_b=1, step_v=CG, row_m=CG)}

// one item: dL/dx's channels [cg CG, cg CG + CG) from all tiles (w: [K][27][C], forward's)
static void wga_item(const float* __restrict dy, const float* __restrict w,
                     float* __restrict dx, long cg) {{
    static thread_local std::vector<float> scratch;
    const long wide = {n ** 3 * max(CG, K)};
    const long need = {P * UP} + {P * DP} + {P * MP} + 2 * wide;
    if ((long)scratch.size() < need) scratch.resize(need);
    float* U = scratch.data();          // [64][K][CG] (+ pad)
    float* D = U + {P * UP};            // [64][T][K]
    float* M = D + {P * DP};            // [64][T][CG]
    float* patch = M + {P * MP};
    float* tmp = patch + wide;
    const long c0 = cg * {CG};
    for (long px = 0; px < {L.N * L.D * L.H * L.W}; ++px)
        std::memset(dx + px * {C} + c0, 0, sizeof(float) * {CG});
    for (int k = 0; k < {K}; ++k)
        wg_3d<{n}, {R}, {CG}>(WG_G, w + (long)k * {27 * C} + c0, {9 * C}, {3 * C}, {C},
                              U + (long)k * {CG}, {n * n * UP}, {n * UP}, {UP}, tmp);
    for (long blk = 0; blk < {blocks}; ++blk) {{
        const long first = blk * {T};
        const int nt = (int)({count} - first < {T} ? {count} - first : {T});
        for (int t = 0; t < nt; ++t) {{  // A along three axes: D[p][t][K]
            const long i = first + t;
            const long w0 = {m} * (i % {TW}), h0 = {m} * (i / {TW} % {TH}),
                       d0 = {m} * (i / {TW * TH} % {TD}), nb = i / {TW * TH * TD};
            if (d0 + {m} <= {L.OD} && h0 + {m} <= {L.OH} && w0 + {m} <= {L.OW}) {{
                wg_3d<{n}, {m}, {K}>(WG_A, dy + (((nb * {L.OD} + d0) * {L.OH} + h0) * {L.OW} + w0) * {K},
                                     {L.OH * L.OW * K}, {L.OW * K}, {K},
                                     D + (long)t * {K}, {n * n * DP}, {n * DP}, {DP}, tmp);
                continue;
            }}
            for (int a = 0; a < {m}; ++a)  // a cut-short tile: zeros past the output
            for (int bb = 0; bb < {m}; ++bb)
            for (int e = 0; e < {m}; ++e) {{
                float* to = patch + ((a * {m} + bb) * {m} + e) * {K};
                if (d0 + a < {L.OD} && h0 + bb < {L.OH} && w0 + e < {L.OW})
                    std::memcpy(to, dy + (((nb * {L.OD} + d0 + a) * {L.OH} + h0 + bb) * {L.OW} + w0 + e) * {K},
                                sizeof(float) * {K});
                else
                    std::memset(to, 0, sizeof(float) * {K});
            }}
            wg_3d<{n}, {m}, {K}>(WG_A, patch, {m * m * K}, {m * K}, {K},
                                 D + (long)t * {K}, {n * n * DP}, {n * DP}, {DP}, tmp);
        }}
        for (int p = 0; p < {P}; ++p) {{
            const float* Dp = D + (long)p * {DP};
            const float* Up = U + (long)p * {UP};
            float* Mp = M + (long)p * {MP};{calls}
        }}
        for (int t = 0; t < nt; ++t) {{  // B along three axes, the patch added into dL/dx
            const long i = first + t;
            const long w0 = {m} * (i % {TW}) - {L.PW}, h0 = {m} * (i / {TW} % {TH}) - {L.PH},
                       d0 = {m} * (i / {TW * TH} % {TD}) - {L.PD}, nb = i / {TW * TH * TD};
            wg_3d<{n}, {n}, {CG}>(WG_B, M + (long)t * {CG}, {n * n * MP}, {n * MP}, {MP},
                                  patch, {n * n * CG}, {n * CG}, {CG}, tmp);
            for (int a = 0; a < {n}; ++a) {{
                const long d = d0 + a;
                if (d < 0 || d >= {L.D}) continue;
                for (int bb = 0; bb < {n}; ++bb) {{
                    const long h = h0 + bb;
                    if (h < 0 || h >= {L.H}) continue;
                    for (int e = 0; e < {n}; ++e) {{
                        const long ww = w0 + e;
                        if (ww < 0 || ww >= {L.W}) continue;
                        float* o = dx + (((nb * {L.D} + d) * {L.H} + h) * {L.W} + ww) * {C} + c0;
                        const float* s = patch + ((a * {n} + bb) * {n} + e) * {CG};
                        #pragma GCC ivdep
                        for (int c = 0; c < {CG}; ++c) o[c] += s[c];
                    }}
                }}
            }}
        }}
    }}
}}
"""])


def program(layer, L, params, matrices=None):
    """One map over the items (blocks of dL/dx's channels): dL/dy as ``y`` and the
    forward filter ``w`` in, dL/dx as ``x`` out."""
    b = blocking(L, params)
    sdfg = layer_sdfg(f"winograd_f2_adjoint_{layer.key()}_{'_'.join(map(str, b[:4]))}",
                      layer, L)
    call_map(sdfg.add_state("items", is_start_block=True), "channel_items",
             {"cg": f"0:{L.C // b.CG}"}, {"yin": "y", "win": "w"},
             "wga_item(yin, win, xout, cg);", {"xout": "x"})
    return finish(sdfg, global_code(L, b, matrices))


#: What ``convbench tune`` tries by default.
SEARCH_SPACE = "T=0,8,32;CG=0,32"


def params():
    from convkernels.declarations import Param
    return (
        Param("T", 0, "tiles per block (0: as many as keep the block's transformed dL/dy "
                      "within 512 KiB)", minimum=0),
        Param("CG", 0, "dL/dx channels per work item (0: all, halved until the item's "
                       "transformed filter fits 2 MiB and every thread has two items)",
              minimum=0),
        Param("NV", 0, "vectors of channels per register block (0: up to 4)", minimum=0),
        Param("RT", 0, "tiles per register block (0: as many as the registers hold)",
              minimum=0),
    )


def registers(layer, params):
    from convkernels.layouts import Layout
    from convkernels.layer import layer_constants
    b = blocking(layer_constants(layer, Layout.NDHWC), params)
    return b.RT * b.NV


def bound(layer, dy, w, tol_factor=None, random_inputs: bool = False):
    """:func:`convkernels.winograd.algebra.adjoint_error_bound` for ``layer`` (dL/dy and the filter
    NCDHW), shaped like dL/dx: statistical in the sum over the output channels on random
    inputs (with ``tol_factor``), else rigorous."""
    import numpy as np
    import torch
    shape = (layer.in_d, layer.in_h, layer.in_w)
    return torch.from_numpy(np.ascontiguousarray(algebra.adjoint_error_bound(
        dy, w, shape, layer.pads, tol_factor=tol_factor or 0.0, random_inputs=random_inputs)))
