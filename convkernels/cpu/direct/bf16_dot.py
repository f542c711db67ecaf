"""The bfloat16 micro-kernel of ``directConvNDHWCblocked`` for CPUs with AVX512_BF16:
``vdpbf16ps`` on pairs of the reduction, float32 sums, no widening.

Widening a 16-bit operand before each FMA (the generic path of
:mod:`convkernels.cpu.direct.blocking`) costs instructions, not bandwidth, so it cannot beat
float32.  ``vdpbf16ps`` instead multiplies two pairs of bfloat16 numbers per float32 lane
and adds both products to the lane: twice the products of an FMA per instruction.

**The pairs.**  For one output pixel and one filter tap ``(kd, kh)``, the ``KW x C``
input values of the reduction lie one after the other in NDHWC memory (for any stride,
with dilation 1), so consecutive pairs of that run are 32-bit loads, broadcast to all
16 lanes.  The filter is packed once per call into ``wpk[K / CW, KD, KH, Q, CW, 2]``,
``Q = ceil(KW C / 2)``: lane ``j`` of a vector holds the filter values of output channel
``j`` for the same two reduction positions.  An odd run ends in a pair whose second
half is zero on both sides (the input's is not read).

**The tile** is :mod:`convkernels.cpu.direct.blocking`'s: ``db x hb x wb`` pixels (divisors
of the output size) times ``nv`` vectors of 16 output channels, one ``__m512`` accumulator
each, kept in registers (the statements are written out per pixel and vector).  The store
rounds to bfloat16 to nearest even (``vcvtneps2bf16``).

**Rounding.**  The products of bfloat16 numbers are exact in float32 and each lane adds
them in float32, as the widening path does, so the same tolerance holds.  The
instructions treat subnormal inputs as zero and flush subnormal results, so layers whose
operands or results are subnormal (below 2^-126) are not computed exactly as the check
assumes there.

The tile map is an OpenMP loop like the other blocked kernels'
(:func:`convkernels.cpu.direct.blocking.cpu_schedule`).
"""

import dace

from convkernels.cpu.isa import has_feature
from convkernels.layouts import Layout
from convkernels.cpu.direct.blocking import (largest_divisor, pixel_tile, switch_param,
                                             tile_pixels)

#: float32 lanes of the 512-bit accumulators (and 16-bit pairs per filter vector).
LANES = 16
FEATURE = "avx512_bf16"


def dot_param():
    return switch_param("DOT", 1, "bfloat16 on a CPU with AVX512_BF16: 1 the vdpbf16ps "
                                  "kernel (pairs of the reduction per instruction, "
                                  "convkernels/cpu/direct/bf16_dot.py) where the layer allows it, 0 the generic "
                                  "kernel (operands widened to float32)")


def refusal(layer, dtype_name) -> str:
    """Why the dot-product kernel does not apply to ``layer`` in ``dtype_name`` on this
    CPU ("" where it does)."""
    if dtype_name != "bfloat16":
        return "bfloat16 only"
    if layer.groups != 1 or any(d != 1 for d in layer.dilations):
        return "groups and dilation break the contiguous reduction runs"
    if layer.out_channels % LANES:
        return f"K = {layer.out_channels} is not a multiple of {LANES}"
    if not has_feature(FEATURE):
        return f"this CPU has no {FEATURE}"
    return ""


def _u32(expr):
    return f"cb_u32({expr})"


def tile_code(L, tile, nv, Q):
    """The C++ of one tile: ``n, td, th, tw, kb`` are the map's parameters."""
    db, hb, wb = tile
    cw = LANES * nv
    run = L.KW * L.C
    pixels = tile_pixels(tile)
    acc = [[f"a{p}_{v}" for v in range(nv)] for p in range(len(pixels))]
    # offsets of each pixel's run from the tile's first, in the padded input
    x_off = [((di * L.SD * L.HP + hi * L.SH) * L.WP + wi * L.SW) * L.C
             for di, hi, wi in pixels]
    y_off = [((di * L.OH + hi) * L.OW + wi) * L.K for di, hi, wi in pixels]
    lines = [
        "const uint16_t* X = reinterpret_cast<const uint16_t*>(xin);",
        "const uint16_t* Wp = reinterpret_cast<const uint16_t*>(win);",
        "uint16_t* Y = reinterpret_cast<uint16_t*>(yout);",
        f"const long od0 = td * {db}, oh0 = th * {hb}, ow0 = tw * {wb};",
    ]
    lines += [f"__m512 {a} = _mm512_setzero_ps();" for row in acc for a in row]
    lines += [
        f"for (int kd = 0; kd < {L.KD}; ++kd)",
        f"for (int kh = 0; kh < {L.KH}; ++kh) {{",
        f"    const uint16_t* xr = X + (((n * {L.DP} + od0 * {L.SD} + kd) * {L.HP}"
        f" + oh0 * {L.SH} + kh) * {L.WP} + ow0 * {L.SW}) * {L.C};",
        f"    const uint16_t* wr = Wp + ((kb * {L.KD} + kd) * {L.KH} + kh) * {Q * cw * 2};",
    ]

    def step(q_expr, pair):
        body = [f"__m512bh w{v} = (__m512bh)_mm512_loadu_si512(wr + ({q_expr}) * {cw * 2}"
                f" + {v * LANES * 2});" for v in range(nv)]
        for p, off in enumerate(x_off):
            body.append(f"{{ __m512bh b = (__m512bh)_mm512_set1_epi32({pair(off)});")
            body += [f"  {acc[p][v]} = _mm512_dpbf16_ps({acc[p][v]}, b, w{v});"
                     for v in range(nv)]
            body.append("}")
        return body

    full = run // 2
    if full:
        lines.append(f"    for (int q = 0; q < {full}; ++q) {{")
        lines += ["        " + s for s in step("q", lambda off: _u32(f"xr + {off} + 2 * q"))]
        lines.append("    }")
    if run % 2:  # the last value alone, its partner zero
        lines += ["    {"] + ["        " + s for s in step(
            str(full), lambda off: f"(int)xr[{off + run - 1}]")] + ["    }"]
    lines.append("}")
    lines.append(f"uint16_t* yt = Y + (((n * {L.OD} + od0) * {L.OH} + oh0) * {L.OW} + ow0)"
                 f" * {L.K} + kb * {cw};")
    for p, off in enumerate(y_off):
        for v in range(nv):
            lines.append(f"_mm256_storeu_si256(reinterpret_cast<__m256i*>(yt + {off + v * LANES}),"
                         f" (__m256i)_mm512_cvtneps_pbh({acc[p][v]}));")
    return "\n".join(lines)


def pack_code(L, nv, Q, flip=False):
    """The C++ that packs ``w[K, KD, KH, KW, C]`` into ``wpk`` (pairs along ``KW x C``,
    a zero after an odd run).  ``flip``: ``L`` is the transposed layer of a data
    gradient (``transposed_layer``) and ``w`` the original filter ``[C, KD, KH, KW, K]``
    in ``L``'s names, read flipped in space with its channels swapped."""
    cw = LANES * nv
    run = L.KW * L.C
    if flip:  # w[c][KD-1-kd][KH-1-kh][KW-1-kw][k] with kw = r / C, c = r % C
        read = (f"W[(((r % {L.C}) * {L.KD} + {L.KD - 1} - kd) * {L.KH} + {L.KH - 1} - kh)"
                f" * {L.KW * L.K} + ({L.KW - 1} - r / {L.C}) * {L.K} + k]")
    else:
        read = f"W[((k * {L.KD} + kd) * {L.KH} + kh) * {run} + r]"
    return f"""
const uint16_t* W = reinterpret_cast<const uint16_t*>(win);
uint16_t* P = reinterpret_cast<uint16_t*>(wout);
#pragma omp parallel for collapse(2)
for (int kb = 0; kb < {L.K // cw}; ++kb)
for (int kd = 0; kd < {L.KD}; ++kd)
for (int kh = 0; kh < {L.KH}; ++kh)
for (int q = 0; q < {Q}; ++q)
for (int j = 0; j < {cw}; ++j)
for (int e = 0; e < 2; ++e) {{
    const int r = 2 * q + e, k = kb * {cw} + j;
    P[((((kb * {L.KD} + kd) * {L.KH} + kh) * {Q} + q) * {cw} + j) * 2 + e] =
        r < {run} ? {read} : (uint16_t)0;
}}
"""


GLOBAL = """
#include <immintrin.h>
#include <cstring>
#if !defined(__AVX512BF16__)
#error "directConvNDHWCblocked's bfloat16 dot-product kernel needs AVX512_BF16 (-march of such a CPU)"
#endif
static inline int cb_u32(const uint16_t* p) { int u; memcpy(&u, p, 4); return u; }
"""


def tile_of(layer, params):
    """``((db, hb, wb), nv)``: the pixels of a tile (divisors of the output size, as
    :func:`convkernels.cpu.direct.blocking.pixel_tile` cuts them) and its vectors of 16 channels."""
    return (pixel_tile(layer, params["PIX"], params["WB"]),
            largest_divisor(layer.out_channels // LANES, params["NV"]))


def dpbf16_sdfg(layer, L, dtype, tile, nv, name, flip=False):
    """The SDFG of the kernel for ``layer`` (constants ``L``, NDHWC) in ``dtype``
    (bfloat16) with ``tile`` pixels x ``nv`` vectors (:func:`tile_of`), taking the
    unpadded input: pack the filter, pad the input (in bfloat16, where the layer is
    padded), then one tasklet per tile.  ``flip``: a data gradient's transposed layer,
    whose filter is the original one (:func:`pack_code`)."""
    from convkernels.padding import pad_sdfg
    cw = LANES * nv
    Q = (L.KW * L.C + 1) // 2
    bf = dtype.dace
    sdfg = dace.SDFG(name)
    sdfg.add_array("x", L.xp_shape, bf)
    sdfg.add_array("w", (L.C, L.KD, L.KH, L.KW, L.K) if flip else L.w_shape, bf)
    sdfg.add_array("y", L.y_shape, bf)
    sdfg.add_array("wpk", (L.K // cw, L.KD, L.KH, Q, cw, 2), bf, transient=True)
    whole = lambda a: dace.Memlet.from_array(a, sdfg.arrays[a])
    pack = sdfg.add_state("pack_filter", is_start_block=True)
    t = pack.add_tasklet("pack", {"win"}, {"wout"}, pack_code(L, nv, Q, flip),
                         language=dace.Language.CPP, code_global=GLOBAL)
    pack.add_edge(pack.add_read("w"), None, t, "win", whole("w"))
    pack.add_edge(t, "wout", pack.add_write("wpk"), None, whole("wpk"))
    compute = sdfg.add_state_after(pack, "tiles")
    db, hb, wb = tile
    ranges = {"n": f"0:{L.N}", "td": f"0:{L.OD // db}", "th": f"0:{L.OH // hb}",
              "tw": f"0:{L.OW // wb}", "kb": f"0:{L.K // cw}"}
    compute.add_mapped_tasklet(
        "tile", ranges, {"xin": whole("x"), "win": whole("wpk")},
        tile_code(L, tile, nv, Q),
        {"yout": whole("y")},  # each tile writes its own part (tile_code's yt)
        language=dace.Language.CPP, external_edges=True)
    return pad_sdfg(sdfg, layer, Layout.NDHWC, halo=True)
