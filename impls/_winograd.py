"""3D Winograd F(m^3, 3^3) for the CPU, on NDHWC (``winogradF2``, ``winogradF2BwdData``;
the algorithm and its error bound: :mod:`convbench.winograd`, docs/winograd.md).

The output is cut into tiles of ``m^3`` pixels (``m = 2``: 8 pixels, 64 transform points
``p``), numbered batch, depth, height, width, and the tiles into blocks of ``T``.  One
work item is a block times a group of ``KG`` output channels:

1. per chunk of ``CB`` input channels, the input transform of the block's tiles (three
   passes of ``B^T`` over a tile's ``4 x 4 x 4 x CB`` patch, channels innermost and
   vectorised) into ``V[p, t, c]``;
2. per block of ``KB`` output channels and per transform point, the GEMM
   ``M[p, t, :] += V[p, t, :] U[p, :, :]`` on the chunk, register-blocked over ``RT`` tiles
   times ``NV`` vectors of output channels (``KB = NV`` vectors), channels summed in
   sequence across the chunks;
3. per tile and block of ``KB`` output channels, the output transform (three passes of
   ``A^T``) into ``y``.

``V`` and ``M`` live in a thread's scratch buffer, sized by ``T``, ``CB`` and ``KG`` to
stay in its cache; only with ``SHARE`` (one block of all tiles, the deep layers) is the
block's ``V`` made once in a shared buffer, sized to stay in the last-level cache.

The transformed filter ``U`` is stored in chunks ``[K / KB][C / CB][p][CB][KB]``, one
contiguous stream per GEMM.  Either a pass before the items computes it once per call
(``FUSE`` 0: each block reads it from memory, so its cost is divided among them), or each
item transforms its chunks itself as it needs them (``FUSE`` 1: no transformed filter in
memory at all, the choice for layers of few tiles and many channels, where ``U`` would
be the largest array of the call).  Training changes the filter every step, so neither
keeps it across calls.

``flip``: the data gradient of a stride-1 layer, the same kernel on the transposed layer
(:mod:`impls._transposed`) with the original filter ``w[k, taps, c]`` read flipped in
space and with its channels swapped while it is transformed.
"""

import os
from typing import NamedTuple

import dace

from convbench import winograd
from convbench.isa import accumulator_budget, vector_floats, vector_registers
from impls._blocked import largest_divisor
from impls._winograd_sdfg import call_map, finish, layer_sdfg

R = 3
#: The output tile edge of each shipped variant.
M_OUT = 2


class Blocking(NamedTuple):
    """A kernel's blocking for one layer (see the module): tiles per block ``T``, output
    channels per work item ``KG``, input channels per chunk ``CB``, output channels per
    register block ``KB = NV x VL``, tiles per register block ``RT``, ``fuse``, ``share``
    (see :func:`params`)."""

    T: int
    KG: int
    CB: int
    KB: int
    RT: int
    NV: int
    VL: int
    fuse: bool
    share: bool


def refusal(layer, m: int = M_OUT, algorithm: str = ""):
    """Why F(m^3, 3^3) (or ``algorithm``, by name) does not compute ``layer`` ("" where
    it does)."""
    if (layer.k_d, layer.k_h, layer.k_w) != (R, R, R):
        return (f"kernel {layer.k_d}x{layer.k_h}x{layer.k_w}: {algorithm or f'F({m}^3, 3^3)'} "
                "needs 3x3x3")
    if any(s != 1 for s in layer.strides):
        return f"stride {layer.strides}: Winograd tiles need stride 1"
    if any(d != 1 for d in layer.dilations):
        return f"dilation {layer.dilations}: Winograd tiles need dilation 1"
    if layer.groups != 1:
        return f"groups {layer.groups}: one GEMM per transform point needs groups 1"
    return ""


def tiles(size: int, m: int = M_OUT) -> int:
    """Output tiles along a dimension of ``size`` outputs (the last one cut short where
    ``m`` does not divide ``size``: its input beyond the padded array reads as zero, its
    output beyond ``size`` is not stored)."""
    return -(-size // m)


def tile_count(L, m: int = M_OUT) -> int:
    return L.N * tiles(L.OD, m) * tiles(L.OH, m) * tiles(L.OW, m)


#: Bytes of one thread's scratch that the default blocking keeps its ``V`` and ``M`` in
#: (half of a 2 MiB L2; the other half holds the filter chunk that streams through).
SCRATCH_BYTES = 1 << 20
#: The most bytes of ``M`` one work item of the few-tiles regime holds (all tiles times one
#: register block of output channels; the 2 MiB L2 of the machines measured).
ITEM_BYTES = 2 << 20
#: The transformed filter chunk (all transform points, ``CB x KB``) that a work item of
#: ``FUSE`` makes and uses at once.
FUSED_CHUNK_BYTES = 1 << 20
#: The largest transformed input that ``SHARE`` 2 computes once for all work items (half
#: of a 32 MiB last-level cache).
SHARED_BYTES = 16 << 20
#: Tiles per block the default blocking aims at: each value of the transformed filter
#: is used once per tile of a block, so fewer would make the filter stream the bottleneck.
TARGET_TILES = 24


def vector_of(K: int):
    """``VL``: the floats of one vector of this CPU, or the largest power of two below it
    that divides ``K`` (1 for odd ``K``)."""
    vl = vector_floats()
    while K % vl:
        vl //= 2
    return vl


def default_nv() -> int:
    """Output-channel vectors per register block: 4 with 32 vector registers, 2 with 16."""
    return 4 if vector_registers() >= 32 else 2


def blocking(L, params, m: int = M_OUT, threads: int = 0) -> Blocking:
    """The :class:`Blocking` of ``params`` (``T``, ``KG``, ``CB``, ``NV``, ``RT``, ``FUSE``,
    ``SHARE``; 0, or 2 for ``FUSE`` and ``SHARE``: chosen here) on layer constants ``L``
    for ``threads`` (default: this machine's cores).

    Two regimes.  Few tiles (every tile's ``M`` for one register block of output
    channels within :data:`ITEM_BYTES`, as in the deep layers of small spatial size and
    many channels): one block of all tiles, one item per ``KB`` output channels, the input
    transformed once for all of them and the filter in the items, so that each value is
    transformed once.  Many tiles: blocks of about :data:`TARGET_TILES` tiles or more,
    output and input channels cut until a block's ``V`` and ``M`` fit
    :data:`SCRATCH_BYTES`, and the filter transformed in one pass before them."""
    P = (m + R - 1) ** 3
    vl = vector_of(L.K)
    nv = largest_divisor(L.K // vl, params["NV"] or default_nv())
    kb = nv * vl
    # the accumulators, the NV filter vectors and a broadcast in the registers
    rt = params["RT"] or max(1, min((vector_registers() - nv - 1) // nv,
                                    accumulator_budget() // nv))
    count = tile_count(L, m)
    threads = threads or os.cpu_count() or 1
    if 4 * P * count * kb <= ITEM_BYTES:
        t, kg, cb = count, kb, L.C
    else:
        target = min(max(TARGET_TILES, rt), -(-count // rt) * rt)
        kg, cb = L.K, L.C
        while 4 * P * target * (cb + kg) > SCRATCH_BYTES:
            if kg % (2 * kb) == 0:
                kg //= 2
            elif cb % 2 == 0 and cb > vl:
                cb //= 2
            else:
                break
        t = None
    kg = kb * largest_divisor(L.K // kb, max(1, (params["KG"] or kg) // kb))
    cb = largest_divisor(L.C, params["CB"] or cb)
    t = min(params["T"] or t or max(rt, SCRATCH_BYTES // (4 * P * (cb + kg)) // rt * rt), count)
    blocks = -(-count // t)
    if not params["T"]:  # as many blocks, evened out: no block mostly empty
        t = -(-count // blocks)
    if not params["KG"]:  # every thread two items at least
        while blocks * (L.K // kg) < 2 * threads and kg % (2 * kb) == 0:
            kg //= 2
    fuse = params["FUSE"]
    if fuse == 2:  # each item transforms its own chunks where there are too few blocks
        fuse = blocks <= 2  # to share the cost of writing U and reading it back
    if fuse and not params["CB"]:  # the filter chunk an item transforms stays in L2
        cb = largest_divisor(L.C, max(vl, FUSED_CHUNK_BYTES // (4 * P * kb)))
    share = params["SHARE"]
    if share == 2:  # where several items would transform the same tiles' input, all of
        # one block (with more, an item's own block in its L2 is faster than a shared one
        # in the last-level cache), and it stays in the last-level cache
        share = blocks == 1 and L.K // kg > 1 and 4 * P * t * L.C <= SHARED_BYTES
    return Blocking(t, kg, cb, kb, rt, nv, vl, bool(fuse), bool(share))


def input_parts(b: Blocking) -> int:
    """Parts of a block's tiles in the shared input transform (``SHARE``): up to 8."""
    return min(b.T, 8)


def padded(floats: int) -> int:
    """The stride between transform points of an array of ``floats`` per point, padded by
    one cache line: strides of a multiple of 4 KiB would put the 64 points of a transform
    in one set of the L1 cache."""
    return floats + 16


def vector_code(vl: int) -> str:
    """The C++ every Winograd kernel starts with: the vector types of ``vl`` floats, the
    in-register transposition and the transform passes."""
    return "\n".join([f"typedef float wg_v __attribute__((vector_size({4 * vl})));",
                      f"typedef float wg_vu __attribute__((vector_size({4 * vl}), aligned(4)));",
                      f"static constexpr int VL = {vl};", transpose_code(vl), PASSES])


def micro_code(name: str, nv: int, vl: int, row_b: int, step_b: int, step_v: int,
               row_m: int) -> str:
    """``name<RR>(b, v, m, n, add)``: the register-blocked GEMM step of every Winograd
    kernel, ``m[r][NV VL] (+)= sum_{j < n} b[r row_b + j step_b] v[j step_v + .]`` for ``RR``
    rows: ``RR x nv`` accumulator vectors, one broadcast of ``b`` per row and reduction
    step, ``nv`` vectors of ``v`` per step.  ``add``: start from ``m`` instead of zeros.
    Inlined where it is called, so a constant ``n`` or ``add`` folds there."""
    return f"""
template <int RR>
static inline __attribute__((always_inline)) void {name}(
        const float* __restrict b, const float* __restrict v, float* __restrict m, int n,
        bool add) {{
    wg_v acc[RR][{nv}];
    #pragma GCC unroll 32
    for (int r = 0; r < RR; ++r)
        #pragma GCC unroll 8
        for (int q = 0; q < {nv}; ++q)
            acc[r][q] = add ? *(const wg_vu*)(m + (long)r * {row_m} + q * {vl}) : (wg_v){{}};
    for (int j = 0; j < n; ++j) {{
        wg_v w[{nv}];
        #pragma GCC unroll 8
        for (int q = 0; q < {nv}; ++q) w[q] = *(const wg_vu*)(v + (long)j * {step_v} + q * {vl});
        #pragma GCC unroll 32
        for (int r = 0; r < RR; ++r) {{
            const wg_v s = (wg_v){{}} + b[(long)r * {row_b} + (long)j * {step_b}];
            #pragma GCC unroll 8
            for (int q = 0; q < {nv}; ++q) acc[r][q] += s * w[q];
        }}
    }}
    #pragma GCC unroll 32
    for (int r = 0; r < RR; ++r)
        #pragma GCC unroll 8
        for (int q = 0; q < {nv}; ++q) *(wg_vu*)(m + (long)r * {row_m} + q * {vl}) = acc[r][q];
}}"""


def _matrix(name, mat):
    rows = ", ".join("{" + ", ".join(f"{float(v)!r}f" for v in row) + "}" for row in mat)
    return f"static constexpr float {name}[{len(mat)}][{len(mat[0])}] = {{{rows}}};"


def transpose_code(vl: int) -> str:
    """``wg_transpose(r)``: a ``vl x vl`` block of floats in ``vl`` vectors transposed in
    registers.  Per step ``h`` (``vl / 2`` down to 1), rows ``i`` and ``i + h`` swap their
    off-diagonal ``h``-blocks, with one two-source shuffle per row (``vpermt2ps`` with
    AVX-512); after all steps element ``(i, j)`` is at ``(j, i)``."""
    if vl <= 1:
        return "static inline void wg_transpose(wg_v (&)[1]) {}"
    lines = [f"typedef int wg_vi __attribute__((vector_size({4 * vl})));",
             f"static inline void wg_transpose(wg_v (&r)[{vl}]) {{"]
    h = vl // 2
    while h >= 1:
        lo = [vl + j - h if j & h else j for j in range(vl)]
        hi = [vl + j if j & h else j + h for j in range(vl)]
        lines.append(f"    {{ const wg_vi lo = {{{', '.join(map(str, lo))}}}, "
                     f"hi = {{{', '.join(map(str, hi))}}};")
        for i in range(vl):
            if not i & h:
                lines.append(f"      const wg_v a{i} = r[{i}], b{i} = r[{i + h}]; "
                             f"r[{i}] = __builtin_shuffle(a{i}, b{i}, lo); "
                             f"r[{i + h}] = __builtin_shuffle(a{i}, b{i}, hi);")
        lines.append("    }")
        h //= 2
    lines.append("}")
    return "\n".join(lines)


PASSES = r"""
// The 1D transform M (NO x NI, a constant: its zeros and ones fold away) applied to
// vectors of V floats.  A point (i, j, l) of a 3D array lies at base + i si + j sj + l sl.
template <int NO, int NI, int V>
static inline __attribute__((always_inline)) void wg_line(
        const float (&M)[NO][NI], const float* __restrict in, long sa, long sb, long se,
        float* __restrict out, long oa, long ob, long oe) {
    // along the first axis, for each of the NI x NI lines (b, e)
    for (int b = 0; b < NI; ++b)
    for (int e = 0; e < NI; ++e) {
        const float* src = in + b * sb + e * se;
        float* dst = out + b * ob + e * oe;
        for (int v = 0; v + VL <= V; v += VL) {
            wg_v x[NI];
            #pragma GCC unroll 8
            for (int j = 0; j < NI; ++j) x[j] = *(const wg_vu*)(src + j * sa + v);
            #pragma GCC unroll 8
            for (int i = 0; i < NO; ++i) {
                wg_v o = (wg_v){};
                #pragma GCC unroll 8
                for (int j = 0; j < NI; ++j) {
                    const float c = M[i][j];
                    if (c == 1.0f) o += x[j];
                    else if (c == -1.0f) o -= x[j];
                    else if (c != 0.0f) o += c * x[j];
                }
                *(wg_vu*)(dst + i * oa + v) = o;
            }
        }
        for (int v = V / VL * VL; v < V; ++v)  // fewer channels than a vector
            for (int i = 0; i < NO; ++i) {
                float o = 0.0f;
                for (int j = 0; j < NI; ++j) o += M[i][j] * src[j * sa + v];
                dst[i * oa + v] = o;
            }
    }
}
template <int NO, int NI, int V>
static inline __attribute__((always_inline)) void wg_plane(
        const float (&M)[NO][NI], const float* __restrict in, long sb, long se,
        float* __restrict out, long ob, long oe) {
    // both axes of an NI x NI plane in registers
    for (int v = 0; v + VL <= V; v += VL) {
        wg_v x[NI][NI], t[NO][NI];
        #pragma GCC unroll 8
        for (int b = 0; b < NI; ++b)
            #pragma GCC unroll 8
            for (int e = 0; e < NI; ++e) x[b][e] = *(const wg_vu*)(in + b * sb + e * se + v);
        #pragma GCC unroll 8
        for (int j = 0; j < NO; ++j)
            #pragma GCC unroll 8
            for (int e = 0; e < NI; ++e) {
                wg_v o = (wg_v){};
                #pragma GCC unroll 8
                for (int b = 0; b < NI; ++b) {
                    const float c = M[j][b];
                    if (c == 1.0f) o += x[b][e];
                    else if (c == -1.0f) o -= x[b][e];
                    else if (c != 0.0f) o += c * x[b][e];
                }
                t[j][e] = o;
            }
        #pragma GCC unroll 8
        for (int j = 0; j < NO; ++j)
            #pragma GCC unroll 8
            for (int l = 0; l < NO; ++l) {
                wg_v o = (wg_v){};
                #pragma GCC unroll 8
                for (int e = 0; e < NI; ++e) {
                    const float c = M[l][e];
                    if (c == 1.0f) o += t[j][e];
                    else if (c == -1.0f) o -= t[j][e];
                    else if (c != 0.0f) o += c * t[j][e];
                }
                *(wg_vu*)(out + j * ob + l * oe + v) = o;
            }
    }
    for (int v = V / VL * VL; v < V; ++v) {
        float t[NO][NI];
        for (int j = 0; j < NO; ++j)
            for (int e = 0; e < NI; ++e) {
                float o = 0.0f;
                for (int b = 0; b < NI; ++b) o += M[j][b] * in[b * sb + e * se + v];
                t[j][e] = o;
            }
        for (int j = 0; j < NO; ++j)
            for (int l = 0; l < NO; ++l) {
                float o = 0.0f;
                for (int e = 0; e < NI; ++e) o += M[l][e] * t[j][e];
                out[j * ob + l * oe + v] = o;
            }
    }
}
// the 3D transform: the first axis into tmp ([NO][NI][NI] vectors), then a plane per output
template <int NO, int NI, int V>
static inline void wg_3d(const float (&M)[NO][NI], const float* in, long sa, long sb, long se,
                         float* out, long oa, long ob, long oe, float* tmp) {
    wg_line<NO, NI, V>(M, in, sa, sb, se, tmp, NI * NI * V, NI * V, V);
    for (int i = 0; i < NO; ++i)
        wg_plane<NO, NI, V>(M, tmp + (long)i * NI * NI * V, NI * V, V, out + i * oa, ob, oe);
}
"""


def global_code(L, b: Blocking, m: int = M_OUT, flip: bool = False, matrices=None) -> str:
    """The C++ of the kernel (see the module) for layer constants ``L`` and blocking
    ``b``, with the transforms ``matrices`` (default :func:`convbench.winograd.transforms`'
    for ``m``) written in as constants."""
    at, g, bt = matrices or winograd.transforms(m, R)
    n = m + R - 1
    P = n ** 3
    C, K = L.C, L.K
    count = tile_count(L, m)
    TD, TH, TW = tiles(L.OD, m), tiles(L.OH, m), tiles(L.OW, m)
    T, KG, CB, KB, RT, NV, VL = b.T, b.KG, b.CB, b.KB, b.RT, b.NV, b.VL
    wide = max(CB, KB)
    VP, MP, UP = padded(T * CB), padded(T * KB), padded(CB * KB)
    parts = input_parts(b)
    if flip:  # w[c][taps][k] of the forward layer; its tap 26 - t is the transposed's t
        gather = f"""
    for (int c = 0; c < {CB}; ++c)
        for (int t = 0; t < 27; ++t)
            std::memcpy(g + (long)t * {UP} + (long)c * {KB}, w + ((long)(c0 + c) * 27 + 26 - t) * {K} + k0,
                        sizeof(float) * {KB});"""
    elif CB % VL == 0 and VL > 1:  # w[k][taps][c]: transposed in VL x VL blocks as read
        gather = f"""
    for (int j0 = 0; j0 < {KB}; j0 += {VL})
        for (int t = 0; t < 27; ++t)
            for (int c = 0; c < {CB}; c += {VL}) {{
                wg_v r[{VL}];
                #pragma GCC unroll 16
                for (int j = 0; j < {VL}; ++j)
                    r[j] = *(const wg_vu*)(w + ((long)(k0 + j0 + j) * 27 + t) * {C} + c0 + c);
                wg_transpose(r);
                #pragma GCC unroll 16
                for (int j = 0; j < {VL}; ++j)
                    *(wg_vu*)(g + (long)t * {UP} + (long)(c + j) * {KB} + j0) = r[j];
            }}"""
    else:  # a channel chunk narrower than a vector: element by element
        gather = f"""
    for (int j = 0; j < {KB}; ++j)
        for (int t = 0; t < 27; ++t)
            for (int c = 0; c < {CB}; ++c)
                g[(long)t * {UP} + (long)c * {KB} + j] = w[((long)(k0 + j) * 27 + t) * {C} + c0 + c];"""
    rem = T % RT
    micro_calls = f"""
            for (int t = 0; t + {RT} <= {T}; t += {RT})
                wg_micro<{RT}>(Vp + (long)t * {CB}, up, Mp + (long)t * {KB}, {CB}, add);"""
    if rem:
        micro_calls += f"""
            wg_micro<{rem}>(Vp + (long)({T - rem}) * {CB}, up, Mp + (long)({T - rem}) * {KB}, {CB}, add);"""
    return "\n".join([
        "#include <vector>", "#include <cstring>",
        _matrix("WG_AT", at), _matrix("WG_G", g), _matrix("WG_BT", bt),
        vector_code(VL),
        f"""
// U chunk [p][CB][KB] of output channels k0.. and input channels c0.. (g: 27 x CB x KB)
static void wg_filter(const float* __restrict w, float* __restrict u, long k0, long c0,
                      float* g, float* tmp) {{{gather}
    for (int c = 0; c < {CB}; ++c)
        wg_3d<{n}, {R}, {KB}>(WG_G, g + (long)c * {KB}, {9 * UP}, {3 * UP}, {UP},
                              u + (long)c * {KB}, {n * n * UP}, {n * UP}, {UP}, tmp);
}}

// the tile's first output pixel (batch nb, depth d0, height h0, width w0) of tile i
static inline void wg_tile(long i, long& nb, long& d0, long& h0, long& w0) {{
    w0 = {m} * (i % {TW});
    h0 = {m} * (i / {TW} % {TH});
    d0 = {m} * (i / {TW * TH} % {TD});
    nb = i / {TW * TH * TD};
}}

// V[p][t][CB] of the block's tiles from input channels c0.. (x: NDHWC, unpadded)
static void wg_input(const float* __restrict x, float* __restrict V, long tile0, long c0,
                     float* patch, float* tmp, int t0 = 0, int t1 = {T}) {{
    for (int t = t0; t < t1; ++t) {{
        const long i = tile0 + t;
        float* Vt = V + (long)t * {CB};
        if (i >= {count}) {{
            for (int p = 0; p < {P}; ++p) std::memset(Vt + (long)p * {VP}, 0, sizeof(float) * {CB});
            continue;
        }}
        long nb, d0, h0, w0;
        wg_tile(i, nb, d0, h0, w0);
        d0 -= {L.PD}; h0 -= {L.PH}; w0 -= {L.PW};
        if (d0 >= 0 && h0 >= 0 && w0 >= 0 && d0 + {n} <= {L.D} && h0 + {n} <= {L.H}
                && w0 + {n} <= {L.W}) {{  // inside: read in place
            wg_3d<{n}, {n}, {CB}>(WG_BT, x + (((nb * {L.D} + d0) * {L.H} + h0) * {L.W} + w0) * {C} + c0,
                                  {L.H * L.W * C}, {L.W * C}, {C},
                                  Vt, {n * n * VP}, {n * VP}, {VP}, tmp);
            continue;
        }}
        for (int a = 0; a < {n}; ++a)  // on the border: padding and cut-short tiles read zeros
        for (int bb = 0; bb < {n}; ++bb)
        for (int e = 0; e < {n}; ++e) {{
            float* to = patch + ((a * {n} + bb) * {n} + e) * {CB};
            const long d = d0 + a, h = h0 + bb, ww = w0 + e;
            if (d >= 0 && h >= 0 && ww >= 0 && d < {L.D} && h < {L.H} && ww < {L.W})
                std::memcpy(to, x + (((nb * {L.D} + d) * {L.H} + h) * {L.W} + ww) * {C} + c0,
                            sizeof(float) * {CB});
            else
                std::memset(to, 0, sizeof(float) * {CB});
        }}
        wg_3d<{n}, {n}, {CB}>(WG_BT, patch, {n * n * CB}, {n * CB}, {CB},
                              Vt, {n * n * VP}, {n * VP}, {VP}, tmp);
    }}
}}

{micro_code('wg_micro', NV, VL, row_b=CB, step_b=1, step_v=KB, row_m=KB)}

// the transformed filter of the whole layer, chunk (kb, cb) of {K // KB} x {C // CB}
static void wg_filter_chunk(const float* w, float* U, long kb, long cb) {{
    static thread_local std::vector<float> scratch;
    const long need = {27 * UP} + {P * KB};
    if ((long)scratch.size() < need) scratch.resize(need);
    float* g = scratch.data();
    wg_filter(w, U + (kb * {C // CB} + cb) * {P * UP}, kb * {KB}, cb * {CB}, g,
              g + {27 * UP});
}}

// SHARE: the transformed input of block tb, chunk cb, for every work item of the block
// (its tiles in {parts} parts, so that every thread has some where there is one block)
static void wg_input_chunk(const float* x, float* Vs, long tb, long cb, long part) {{
    static thread_local std::vector<float> scratch;
    if ((long)scratch.size() < {2 * P * CB}) scratch.resize({2 * P * CB});
    wg_input(x, Vs + (tb * {C // CB} + cb) * {P * VP}, tb * {T}, cb * {CB}, scratch.data(),
             scratch.data() + {P * CB}, part * {T} / {parts}, (part + 1) * {T} / {parts});
}}

// one work item: tiles [tb T, tb T + T) x output channels [kg KG, kg KG + KG)
static void wg_item(const float* x, const float* w, const float* U, const float* Vs, float* y,
                    long tb, long kg) {{
    static thread_local std::vector<float> scratch;
    const long need = {0 if b.share else P * VP} + {KG // KB * P * MP} + 2L * {P * wide} + {27 * UP if b.fuse else 0}
                      + {P * UP if b.fuse else 0};
    if ((long)scratch.size() < need) scratch.resize(need);
    float* Vbuf = scratch.data();                  // [P][T][CB] (SHARE: none)
    const float* V = Vbuf;
    float* M = scratch.data() + {0 if b.share else P * VP};  // [KG / KB][P][T][KB] (+ pad)
    float* patch = M + {KG // KB * P * MP};               // [P][max(CB, KB)] each
    float* tmp = patch + {P * wide};
    float* g = tmp + {P * wide};                   // FUSE: [CB][27][KB] and [P][CB][KB]
    float* uc = g + {27 * UP if b.fuse else 0};
    (void)g; (void)uc; (void)U; (void)w; (void)Vs; (void)x;
    const long tile0 = tb * {T};
    for (int cb = 0; cb < {C // CB}; ++cb) {{
        {"V = Vs + (tb * %d + cb) * %dL;" % (C // CB, P * VP) if b.share
         else "wg_input(x, Vbuf, tile0, cb * %d, patch, tmp);" % CB}
        const bool add = cb > 0;
        for (int kq = 0; kq < {KG // KB}; ++kq) {{
            const long kb = kg * {KG // KB} + kq;
            const float* u;
            {"wg_filter(w, uc, kb * %d, cb * %d, g, tmp); u = uc;" % (KB, CB) if b.fuse
             else "u = U + (kb * %d + cb) * %dL;" % (C // CB, P * UP)}
            for (int p = 0; p < {P}; ++p) {{
                const float* Vp = V + (long)p * {VP};
                const float* up = u + (long)p * {UP};
                float* Mp = M + ((long)kq * {P} + p) * {MP};{micro_calls}
            }}
        }}
    }}
    for (int kq = 0; kq < {KG // KB}; ++kq) {{
        const long k0 = kg * {KG} + kq * {KB};
        for (int t = 0; t < {T}; ++t) {{
            const long i = tile0 + t;
            if (i >= {count}) break;
            long nb, d0, h0, w0;
            wg_tile(i, nb, d0, h0, w0);
            const float* Mt = M + (long)kq * {P * MP} + (long)t * {KB};
            if (d0 + {m} <= {L.OD} && h0 + {m} <= {L.OH} && w0 + {m} <= {L.OW}) {{
                wg_3d<{m}, {n}, {KB}>(WG_AT, Mt, {n * n * MP}, {n * MP}, {MP},
                                      y + (((nb * {L.OD} + d0) * {L.OH} + h0) * {L.OW} + w0) * {K} + k0,
                                      {L.OH * L.OW * K}, {L.OW * K}, {K}, tmp);
                continue;
            }}
            // a cut-short tile: only the pixels inside the output
            wg_3d<{m}, {n}, {KB}>(WG_AT, Mt, {n * n * MP}, {n * MP}, {MP},
                                  patch, {m * m * KB}, {m * KB}, {KB}, tmp);
            for (int a = 0; a < {m}; ++a)
            for (int bb = 0; bb < {m}; ++bb)
            for (int e = 0; e < {m}; ++e)
                if (d0 + a < {L.OD} && h0 + bb < {L.OH} && w0 + e < {L.OW})
                    std::memcpy(y + (((nb * {L.OD} + d0 + a) * {L.OH} + h0 + bb) * {L.OW} + w0 + e) * {K} + k0,
                                patch + ((a * {m} + bb) * {m} + e) * {KB}, sizeof(float) * {KB});
        }}
    }}
}}
"""])


def program(layer, L, params, m: int = M_OUT, flip: bool = False, matrices=None, w_shape=None):
    """The SDFG (see the module): the filter pass unless fused, the shared input pass where
    ``SHARE``, then the parallel map over work items.  The kernel reads the unpadded input
    and treats the border itself."""
    b = blocking(L, params, m)
    P = (m + R - 1) ** 3
    blocks = -(-tile_count(L, m) // b.T)
    tag = "_".join(map(str, (b.T, b.KG, b.CB, b.KB, b.RT, int(b.fuse), int(b.share))))
    sdfg = layer_sdfg(f"winograd_f{m}_{'bwdd_' if flip else ''}{layer.key()}_{tag}", layer, L,
                      w_shape)
    code = global_code(L, b, m, flip, matrices)
    state = sdfg.add_state("filter_transform", is_start_block=True)
    if not b.fuse:
        sdfg.add_array("U", (L.K // b.KB * (L.C // b.CB) * P * padded(b.CB * b.KB),),
                       dace.float32, transient=True)
        call_map(state, "filter_chunk", {"kb": f"0:{L.K // b.KB}", "cb": f"0:{L.C // b.CB}"},
                 {"win": "w"}, "wg_filter_chunk(win, uout, kb, cb);", {"uout": "U"})
    if b.share:
        sdfg.add_array("Vs", (blocks * (L.C // b.CB) * P * padded(b.T * b.CB),), dace.float32,
                       transient=True)
        state = sdfg.add_state_after(state, "input_transform")
        call_map(state, "input_chunk", {"tb": f"0:{blocks}", "cb": f"0:{L.C // b.CB}",
                                        "part": f"0:{input_parts(b)}"},
                 {"xin": "x"}, "wg_input_chunk(xin, vout, tb, cb, part);", {"vout": "Vs"})
    items = sdfg.add_state_after(state, "tiles")
    inputs = {"xin": "x", "win": "w"}
    if not b.fuse:
        inputs["uin"] = "U"
    if b.share:
        inputs["vin"] = "Vs"
    call_map(items, "tile_block", {"tb": f"0:{blocks}", "kg": f"0:{L.K // b.KG}"}, inputs,
             f"wg_item(xin, win, {'nullptr' if b.fuse else 'uin'}, "
             f"{'vin' if b.share else 'nullptr'}, yout, tb, kg);", {"yout": "y"})
    return finish(sdfg, code)
