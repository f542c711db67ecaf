"""The int8 forward convolution for the CPU: unsigned 8-bit activations with a zero point,
signed 8-bit filters with a scale per output channel, int32 sums (``vpdpbusd``), and an
epilogue that either stores the int32 sums or requantizes them to uint8 with the bias
folded in.  The convention is oneDNN's and fbgemm's (torch's quantized ``Conv3d``).

**The arithmetic.**  With ``xq`` the uint8 input, ``zx`` its zero point and ``wq`` the
int8 filter (symmetric: no zero point), the exact sums are

    acc[k] = sum over taps and channels of (xq - zx) * wq[k]
           = sum xq * wq[k]  -  zx * sum wq[k]

when the padded border holds ``zx`` (the quantized zero), as the kernel's padded copy
does: the second term is then one constant per output channel (``comp = zx wsum``, from
the filter's sums given with the packed filter), and the first is what ``vpdpbusd`` computes, four u8 x s8 products
added to each int32 lane per instruction, never saturating (the sums of CosmoFlow's
layers stay far below 2^31; :func:`refusal` checks the bound per layer).

``OUT`` = 0 stores ``acc`` (int32, exact: checked bit for bit), 1 stores

    y = clamp(round_half_even(float(acc) * m[k] + bq[k]) + zy, 0, 255)

with ``m[k] = sx * sw[k] / sy`` and ``bq[k] = bias[k] / sy`` (float32, given by the
caller as ``qs[0, k]`` and ``qs[1, k]``) and ``zy`` the output's zero point.

**The quads.**  For one output pixel and one tap ``(kd, kh)`` the ``KW x C`` input bytes
of the reduction lie one after the other in NDHWC memory, so four consecutive ones are one
32-bit load broadcast to every lane; the filter comes packed (:func:`packed_shape`, once
per filter, as torch's quantized modules pack theirs when it is set) into
``wpk[K / CW, KD, KH, Q, CW, 4]`` with ``Q = ceil(KW C / 4)``: lane ``j`` holds channel
``j``'s four filter bytes of the same reduction positions, zero past the run (so the
input bytes read there, which belong to the next pixel or to the buffer's slack, add
nothing).

**The instruction per ISA** (``ISA``): ``vnni512`` (AVX512-VNNI, 16 lanes:
``_mm512_dpbusd_epi32``), ``avxvnni`` (AVX-VNNI, 8 lanes: ``_mm256_dpbusd_avx_epi32``),
``avx2`` (8 lanes, no VNNI: the four products formed exactly as two ``vpmaddwd`` of the
even and the odd bytes widened to 16 bits; ``vpmaddubsw`` would saturate).  0 picks the
first the CPU has; one it lacks is refused with the reason.

**The tile** is :mod:`convkernels.cpu.direct.blocking`'s: ``db x hb x wb`` output pixels
(divisors of the output size) times ``nv`` vectors of output channels, one accumulator
register each, the statements written out per pixel and vector.  The tile map is an
OpenMP loop over all its dimensions (:func:`convkernels.cpu.direct.blocking.cpu_schedule`).

**Plants** (``PLANT``, tests only): 1 drops the last ``(kd, kh)`` row of taps of every
tile, so that a check that cannot see a dropped tap is caught.
"""

import dace

from convkernels.cpu.isa import has_feature
from convkernels.cpu.direct.blocking import largest_divisor, pixel_tile, tile_pixels

#: The instructions by ``ISA`` value: (name, /proc/cpuinfo flag, int32 lanes).
ISAS = {1: ("vnni512", "avx512_vnni", 16), 2: ("avxvnni", "avx_vnni", 8), 3: ("avx2", "avx2", 8)}
#: The main loop's product instruction per ``ISA`` value (what its instruction mix counts).
PRODUCTS = {1: "vpdpbusd", 2: "vpdpbusd", 3: "vpmaddwd"}
#: Bytes of slack after the padded input: the last quad of the last pixel reads past it.
SLACK = 64


def isa_of(params) -> int:
    """The ``ISA`` value the kernel uses: the one asked for, or (0) the first the CPU has
    (0 where it has none)."""
    if params["ISA"]:
        return params["ISA"]
    return next((value for value, (_, flag, _) in ISAS.items() if has_feature(flag)), 0)


def lanes(params) -> int:
    isa = isa_of(params)
    return ISAS[isa][2] if isa else 16


def refusal(layer, params) -> str:
    """Why the kernel does not build ``layer`` with ``params`` on this CPU ("" where it
    does)."""
    isa = isa_of(params)
    if not isa:
        return "this CPU has none of AVX512-VNNI, AVX-VNNI and AVX2"
    name, flag, width = ISAS[isa]
    if not has_feature(flag):
        return f"ISA={isa} ({name}): this CPU has no {flag}"
    if layer.groups != 1 or any(d != 1 for d in layer.dilations):
        return "groups and dilation break the contiguous reduction runs"
    if layer.out_channels % width:
        return f"K = {layer.out_channels} is not a multiple of {width} ({name} lanes)"
    taps = layer.k_d * layer.k_h * layer.k_w * layer.in_channels
    if taps * 255 * 128 >= 2 ** 31:
        return f"a reduction of {taps} products may overflow the int32 sums"
    return ""


def supports(layer, params):
    return refusal(layer, params) or None


def tile_of(layer, params):
    """``((db, hb, wb), nv)``: the tile's pixels and its vectors of output channels."""
    width = lanes(params)
    return (pixel_tile(layer, params["PIX"], params["WB"]),
            largest_divisor(layer.out_channels // width, params["NV"]))


def k_outer(layer, params) -> bool:
    """Whether the tile map runs the channel blocks outermost (``KOUTER`` 1, or 2 and the
    packed filter larger than :func:`filter_bytes`): a thread's consecutive tiles then
    read one block's filter, which stays in its cache, instead of every block's in turn."""
    if params["KOUTER"] != 2:
        return bool(params["KOUTER"])
    return layer.out_channels * layer.k_d * layer.k_h * layer.k_w * layer.in_channels > filter_bytes()


def filter_bytes() -> int:
    """The packed filter's bytes above which ``KOUTER=2`` runs the channel blocks
    outermost: half of the L2 (:mod:`convkernels.cpu.caches`)."""
    from convkernels.cpu.caches import caches
    return caches().l2 // 2


def global_code(isa: int) -> str:
    """The C++ helpers of one ISA: a vector type ``cb_vi``, and ``cb_dot``, ``cb_bcast``,
    ``cb_load``, ``cb_sub``, ``cb_store32`` and ``cb_store8`` (the requantizing store)."""
    name = ISAS[isa][0]
    head = f"""
#include <immintrin.h>
#include <cstdint>
#include <cstring>
static inline int cb_u32(const uint8_t* p) {{ int u; memcpy(&u, p, 4); return u; }}
#define CB_ISA_{name.upper()} 1
"""
    if name == "vnni512":
        return head + """
#if !defined(__AVX512VNNI__)
#error "the int8 kernel's ISA=1 needs AVX512-VNNI (-march of such a CPU)"
#endif
typedef __m512i cb_vi;
static inline cb_vi cb_zero() { return _mm512_setzero_si512(); }
static inline cb_vi cb_bcast(int q) { return _mm512_set1_epi32(q); }
static inline cb_vi cb_load(const void* p) { return _mm512_loadu_si512(p); }
// GCC's _mm512_dpbusd_epi32 copies each accumulator out of its register and back around
// every instruction (two moves per vpdpbusd in the tile loop); the asm ties it in place.
static inline cb_vi cb_dot(cb_vi acc, cb_vi a, cb_vi b) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "vm"(b));
    return acc;
}
static inline cb_vi cb_sub(cb_vi a, const int32_t* c) { return _mm512_sub_epi32(a, _mm512_loadu_si512(c)); }
static inline void cb_store32(int32_t* p, cb_vi v) { _mm512_storeu_si512(p, v); }
static inline void cb_store8(uint8_t* p, cb_vi acc, const float* m, const float* b, int zy) {
    __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_loadu_ps(m), _mm512_loadu_ps(b));
    f = _mm512_min_ps(_mm512_max_ps(f, _mm512_set1_ps(-1e9f)), _mm512_set1_ps(1e9f));
    __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(f), _mm512_set1_epi32(zy));
    q = _mm512_max_epi32(q, _mm512_setzero_si512());
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtusepi32_epi8(q));
}
"""
    dot = ("return _mm256_dpbusd_avx_epi32(acc, a, b);" if name == "avxvnni" else
           # u8 x s8 exactly: even and odd bytes widened to 16 bits, two vpmaddwd
           "const __m256i lo = _mm256_set1_epi16(0x00FF);\n"
           "    __m256i p0 = _mm256_madd_epi16(_mm256_and_si256(a, lo),"
           " _mm256_srai_epi16(_mm256_slli_epi16(b, 8), 8));\n"
           "    __m256i p1 = _mm256_madd_epi16(_mm256_srli_epi16(a, 8), _mm256_srai_epi16(b, 8));\n"
           "    return _mm256_add_epi32(acc, _mm256_add_epi32(p0, p1));")
    guard = ("#if !defined(__AVXVNNI__)\n#error \"the int8 kernel's ISA=2 needs AVX-VNNI\"\n#endif"
             if name == "avxvnni" else
             "#if !defined(__AVX2__)\n#error \"the int8 kernel's ISA=3 needs AVX2\"\n#endif")
    return head + guard + f"""
typedef __m256i cb_vi;
static inline cb_vi cb_zero() {{ return _mm256_setzero_si256(); }}
static inline cb_vi cb_bcast(int q) {{ return _mm256_set1_epi32(q); }}
static inline cb_vi cb_load(const void* p) {{ return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }}
static inline cb_vi cb_dot(cb_vi acc, cb_vi a, cb_vi b) {{
    {dot}
}}
static inline cb_vi cb_sub(cb_vi a, const int32_t* c) {{ return _mm256_sub_epi32(a, cb_load(c)); }}
static inline void cb_store32(int32_t* p, cb_vi v) {{ _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }}
static inline void cb_store8(uint8_t* p, cb_vi acc, const float* m, const float* b, int zy) {{
    __m256 f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_loadu_ps(m), _mm256_loadu_ps(b));
    f = _mm256_min_ps(_mm256_max_ps(f, _mm256_set1_ps(-1e9f)), _mm256_set1_ps(1e9f));
    __m256i q = _mm256_add_epi32(_mm256_cvtps_epi32(f), _mm256_set1_epi32(zy));
    q = _mm256_min_epi32(_mm256_max_epi32(q, _mm256_setzero_si256()), _mm256_set1_epi32(255));
    alignas(32) int32_t t[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(t), q);
    for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(t[i]);
}}
"""


def tile_code(L, tile, nv, Q, width, out, plant=0):
    """The C++ of one tile: ``n, td, th, tw, kb`` are the map's parameters."""
    db, hb, wb = tile
    cw = width * nv
    pixels = tile_pixels(tile)
    acc = [[f"a{p}_{v}" for v in range(nv)] for p in range(len(pixels))]
    x_off = [((di * L.SD * L.HP + hi * L.SH) * L.WP + wi * L.SW) * L.C
             for di, hi, wi in pixels]
    y_off = [((di * L.OH + hi) * L.OW + wi) * L.K for di, hi, wi in pixels]
    rows = L.KD * L.KH - (1 if plant == 1 else 0)
    lines = [
        "const uint8_t* X = reinterpret_cast<const uint8_t*>(xin);",
        "const int8_t* Wp = reinterpret_cast<const int8_t*>(win);",
        f"const long od0 = td * {db}, oh0 = th * {hb}, ow0 = tw * {wb};",
    ]
    lines += [f"cb_vi {a} = cb_zero();" for row in acc for a in row]
    lines += [
        f"for (int t = 0; t < {rows}; ++t) {{",
        f"    const int kd = t / {L.KH}, kh = t % {L.KH};",
        f"    const uint8_t* xr = X + (((n * {L.DP} + od0 * {L.SD} + kd) * {L.HP}"
        f" + oh0 * {L.SH} + kh) * {L.WP} + ow0 * {L.SW}) * {L.C};",
        f"    const int8_t* wr = Wp + ((kb * {L.KD} + kd) * {L.KH} + kh) * {Q * cw * 4};",
        f"    for (int q = 0; q < {Q}; ++q) {{",
    ]
    lines += [f"        cb_vi w{v} = cb_load(wr + q * {cw * 4} + {v * width * 4});"
              for v in range(nv)]
    for p, off in enumerate(x_off):
        lines.append(f"        {{ cb_vi b = cb_bcast(cb_u32(xr + {off} + 4 * q));")
        lines += [f"          {acc[p][v]} = cb_dot({acc[p][v]}, b, w{v});" for v in range(nv)]
        lines.append("        }")
    lines += ["    }", "}"]
    base = (f"(((n * {L.OD} + od0) * {L.OH} + oh0) * {L.OW} + ow0) * {L.K} + kb * {cw}")
    lines.append(f"const long yt = {base};")
    for v in range(nv):
        lines.append(f"const int32_t* c{v} = compin + kb * {cw} + {v * width};")
    if out == 1:
        lines.append("uint8_t* Y = reinterpret_cast<uint8_t*>(yout);")
        lines.append("const int zy = zpin[1];")
    else:
        lines.append("int32_t* Y = reinterpret_cast<int32_t*>(yout);")
    for p, off in enumerate(y_off):
        for v in range(nv):
            value = f"cb_sub({acc[p][v]}, c{v})"
            if out == 1:
                k0 = f"kb * {cw} + {v * width}"
                lines.append(f"cb_store8(Y + yt + {off + v * width}, {value}, qsin + {k0}, "
                             f"qsin + {L.K} + {k0}, zy);")
            else:
                lines.append(f"cb_store32(Y + yt + {off + v * width}, {value});")
    return "\n".join(lines)


def pad_code(L):
    """The C++ that copies the uint8 input into the padded buffer, the border set to the
    input's zero point ``zpin[0]`` (one write per byte)."""
    (pd, ph, pw) = (L.PD, L.PH, L.PW)
    row = L.WP * L.C
    return f"""
const uint8_t* X = reinterpret_cast<const uint8_t*>(xin);
uint8_t* P = reinterpret_cast<uint8_t*>(xout);
const uint8_t zx = static_cast<uint8_t>(zpin[0]);
#pragma omp parallel for collapse(2)
for (int n = 0; n < {L.N}; ++n)
for (int d = 0; d < {L.DP}; ++d)
for (int h = 0; h < {L.HP}; ++h) {{
    uint8_t* r = P + ((long)(n * {L.DP} + d) * {L.HP} + h) * {row};
    const int id = d - {pd}, ih = h - {ph};
    if (id < 0 || id >= {L.D} || ih < 0 || ih >= {L.H}) {{ memset(r, zx, {row}); continue; }}
    memset(r, zx, {pw * L.C});
    memcpy(r + {pw * L.C}, X + ((long)(n * {L.D} + id) * {L.H} + ih) * {L.W * L.C}, {L.W * L.C});
    memset(r + {(pw + L.W) * L.C}, zx, {(L.WP - pw - L.W) * L.C});
}}
memset(P + {L.N * L.DP * L.HP * row}L, zx, {SLACK});
for (int k = 0; k < {L.K}; ++k) compout[k] = zpin[0] * wsumin[k];
"""


def packed_shape(layer, params):
    """The shape of the packed filter the kernel takes, ``(K / CW, KD, KH, Q, CW, 4)``:
    quads along ``KW x C`` (``Q = ceil(KW C / 4)``, zero past the run), ``CW`` output
    channels per tile (lane ``j`` of a vector holds channel ``j``'s quad).  Packed once,
    as torch's quantized modules pack their filter when it is set (the kernel's caller:
    :func:`convbench.quant.int8.pack_filter`)."""
    _, nv = tile_of(layer, params)
    cw = lanes(params) * nv
    Q = (layer.k_w * layer.in_channels + 3) // 4
    return (layer.out_channels // cw, layer.k_d, layer.k_h, Q, cw, 4)


def int8_sdfg(layer, L, params, name):
    """The SDFG of the kernel: ``(x uint8 NDHWC, wpk int8 packed (:func:`packed_shape`),
    wsum int32[K] (each channel's filter sum), zp int32[2] = (zx, zy), qs float32[2, K] =
    (m, bq), y)`` with ``y`` int32 (``OUT`` 0) or uint8 (1): pad the input with its zero
    point, then one tasklet per tile."""
    isa = isa_of(params)
    width = ISAS[isa][2]
    tile, nv = tile_of(layer, params)
    cw = width * nv
    shape = packed_shape(layer, params)
    Q = shape[3]
    out = params["OUT"]
    sdfg = dace.SDFG(name)
    sdfg.add_array("x", (L.N, L.D, L.H, L.W, L.C), dace.uint8)
    sdfg.add_array("wpk", shape, dace.int8)
    sdfg.add_array("wsum", (L.K,), dace.int32)
    sdfg.add_array("zp", (2,), dace.int32)
    sdfg.add_array("qs", (2, L.K), dace.float32)
    sdfg.add_array("y", L.y_shape, dace.int32 if out == 0 else dace.uint8)
    sdfg.add_array("xp", (L.N * L.DP * L.HP * L.WP * L.C + SLACK,), dace.uint8, transient=True)
    sdfg.add_array("comp", (L.K,), dace.int32, transient=True)
    whole = lambda a: dace.Memlet.from_array(a, sdfg.arrays[a])
    prepare = sdfg.add_state("prepare", is_start_block=True)
    t = prepare.add_tasklet("pad", {"xin", "zpin", "wsumin"}, {"xout", "compout"}, pad_code(L),
                            language=dace.Language.CPP, code_global=global_code(isa))
    for conn, array in (("xin", "x"), ("zpin", "zp"), ("wsumin", "wsum")):
        prepare.add_edge(prepare.add_read(array), None, t, conn, whole(array))
    for conn, array in (("xout", "xp"), ("compout", "comp")):
        prepare.add_edge(t, conn, prepare.add_write(array), None, whole(array))
    compute = sdfg.add_state_after(prepare, "tiles")
    db, hb, wb = tile
    ranges = {"n": f"0:{L.N}", "td": f"0:{L.OD // db}", "th": f"0:{L.OH // hb}",
              "tw": f"0:{L.OW // wb}", "kb": f"0:{L.K // cw}"}
    if k_outer(layer, params):  # each thread's run of tiles shares one filter slab
        ranges = {"kb": ranges.pop("kb"), **ranges}
    compute.add_mapped_tasklet(
        "tile", ranges,
        {"xin": whole("xp"), "win": whole("wpk"), "compin": whole("comp"),
         "qsin": whole("qs"), "zpin": whole("zp")},
        tile_code(L, tile, nv, Q, width, out, params["PLANT"]),
        {"yout": whole("y")},  # each tile writes its own part
        language=dace.Language.CPP, external_edges=True)
    return sdfg


def algorithm(layer, dtype, params):
    from convkernels.layer import layer_constants
    from convkernels.layouts import Layout
    L = layer_constants(layer, Layout.NDHWC)
    (db, hb, wb), nv = tile_of(layer, params)
    return int8_sdfg(layer, L, params,
                     f"direct_int8_{layer.key()}_{ISAS[isa_of(params)][0]}_{db}x{hb}x{wb}x{nv}"
                     f"_k{int(k_outer(layer, params))}_o{params['OUT']}_p{params['PLANT']}")
