"""The 2:4 sparse tensor-core forward (``implicitGemmMMASparse``): the tensor-core forward's
stages, gather and pipeline with the filter stored 2:4 compressed along the reduction and
``mma.sp`` (m16n8k32, 16-bit operands, float32 sums) in the main loop.

**Roles.**  ``mma.sp`` takes the sparse operand as A, so the filter is A here: an MMA
tile is 16 output channels (rows) by 8 output pixels (columns), and the dense forward's
A stage (pixels, K-major) is read as B.  The warp tile is the dense kernel's
(``warpTileM`` pixels by ``warpTileN`` channels), cut into ``warpTileN / 16`` by
``warpTileM / 8`` MMA tiles.

**The filter as built** (:func:`pack`, once per filter): every group of 4 consecutive
input channels of a tap keeps 2 values (:func:`prune_2to4`), stored in the filter's own
order (``K x taps x C / 2``), then, 16-byte aligned, the metadata: per K tile, per 16
output channels, per ``mma.sp`` step, the 16 words that lanes ``4 g`` and ``4 g + 1`` of
each group ``g`` pass (sparsity selector 0): lane ``4 g + h`` holds the 4-bit indices of
columns ``16 h .. 16 h + 15`` of row ``g`` in its low half and of row ``g + 8`` in its
high half, group ``j``'s in bits ``4 j ..`` (first kept index in the low two bits).  A
K tile stages its channels' compressed values (``TK / 2`` per row) and its metadata
words into the B stage.

**The CPU emulation** builds every lane's registers as ``ldmatrix`` distributes them and
computes each sum from the lanes and registers where PTX puts A's kept values, B's values
and the metadata; an invalid or unordered index pair gives NaN.  The output ``y`` holds
the float32 sums.
"""

import dataclasses
from typing import Optional

import dace
import numpy as np

from convkernels.gpu.mma import gather, layout, mainloop, program as dense
from convkernels.gpu.mma.tiles import PARAMS, WARP, Shape, check_params, shape
from convkernels.gpu.pipeline import skeleton
from convkernels.gpu.pipeline.tasklets import indent
from convkernels.layer import Layer
from convkernels.layouts import Layout

#: The 16-bit precisions ``mma.sp`` m16n8k32 takes with float32 sums.
PRECISIONS = ("float16", "bfloat16")
#: Metadata words per 16 rows of A per ``mma.sp``, and an index pair for an all-zero group.
WORDS = 16
FILLER = 0x4  # indices 0 and 1


@dataclasses.dataclass(frozen=True)
class SparseShape(Shape):
    """:class:`Shape` with the filter 2:4 compressed (``BZ`` = 2)."""

    BZ = property(lambda s: 2)
    KS = property(lambda s: s.TK // 32)             # mma.sp steps per K tile
    FC = property(lambda s: s.WN // 16)             # MMA tiles per warp along the channels
    FP = property(lambda s: s.WM // 8)              # and along the pixels
    NQ = property(lambda s: s.GNp // 16)            # 16-channel tiles of the padded GEMM
    MOFF = property(lambda s: s.TN * s.TK * s.EB // 2)  # metadata's byte in a B stage
    MC = property(lambda s: s.TN * s.KS * 4 // layout.CHUNK)  # its chunks per stage
    #: The filter's values (``K x taps x C / 2``), rounded up to 8 (16 bytes), where its
    #: metadata words begin; and the whole array's length, in stored values
    WOFF = property(lambda s: -(-s.K * s.taps * s.C // 2 // 8) * 8)
    WLEN = property(lambda s: s.WOFF + 2 * s.KT * s.NQ * s.KS * WORDS)

    def filter_extra(self, kt: str) -> str:
        """The K tile's metadata words for this block's channels (``MC`` 16-byte chunks
        from word ``(kt NQ + blk_n / 16) KS 16`` on) into the stage after its values."""
        src = (f"reinterpret_cast<const char*>(wb + {self.WOFF}) + ((int64_t)({kt}) * "
               f"{self.NQ} + blk_n / 16) * {self.KS * WORDS * 4}")
        return f"""
for (int j = (int)t; j < {self.MC}; j += {self.NT})  // the K tile's metadata
    cb_cp_async<16>(bs + sslot * {self.BSB} + {self.MOFF} + j * 16, {src} + j * 16, true);"""


def sparse_shape(layer: Layer, ctype: str, params) -> SparseShape:
    s = shape(layer, ctype, params)
    return SparseShape(**{f.name: getattr(s, f.name) for f in dataclasses.fields(s)})


def helpers(s: SparseShape, gpu: bool) -> str:
    """``cb_mma_sp`` (GPU) or ``cb_mma_sp_emulated`` (CPU), beside the dense kernels'
    ``ldmatrix`` helpers."""
    base = dense.helpers(s, gpu)
    if gpu:
        return base + f"""
__device__ __forceinline__ void cb_mma_sp(float* d, const unsigned* a, const unsigned* b, unsigned e) {{
    asm volatile("mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.{s.ptx}.{s.ptx}.f32 "
                 "{{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9,%10,%11}}, {{%0,%1,%2,%3}}, %12, 0x0;\\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]),
                   "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(e));
}}
"""
    value = {"f16": "cb_half_to_float", "bf16": "cb_bf16_to_float"}[s.ptx]
    return base + f"""
#ifndef CB_MMA_SP_CPU
#define CB_MMA_SP_CPU
#include <cmath>
// mma.sp m16n8k32 (selector 0) as lane `lane` sees it: its sums D[g + 8 (i / 2)][2 t + i % 2]
// of tile (fc, fp).  Row r's kept value c (of 16) is A[r][c] of the dense m16n8k16 layout;
// group q's index pair is the nibble q % 4 of the half r / 8 of lane (r % 8) 4 + q / 4's
// metadata; B[k][n] is in lane 4 n + (k % 8) / 2, register k / 8.
template <class FA, class FB, class FE>
static inline void cb_mma_sp_emulated(float* d, int lane, const FA& fa, const FB& fb,
                                      const FE& fe, int fc, int fp) {{
    const int g = lane / 4, t = lane % 4;
    auto half = [](unsigned w, int i) {{ return (uint16_t)(i % 2 ? w >> 16 : w & 0xffffu); }};
    for (int i = 0; i < 4; ++i) {{
        const int r = g + 8 * (i / 2), n = 2 * t + i % 2;
        float sum = d[i];
        for (int q = 0; q < 8; ++q) {{
            const unsigned nib = (fe[(r % 8) * 4 + q / 4][fc] >> (16 * (r / 8) + 4 * (q % 4))) & 0xfu;
            const int i0 = nib & 3, i1 = nib >> 2;
            if (i0 >= i1) {{ sum = NAN; continue; }}
            for (int e = 0; e < 2; ++e) {{
                const int c = 2 * q + e, k = 4 * q + (e ? i1 : i0);
                const float av = {value}(half(fa[(r % 8) * 4 + (c % 8) / 2][fc][r / 8 + 2 * (c / 8)], c));
                const float bv = {value}(half(fb[n * 4 + (k % 8) / 2][fp][k / 8], k));
                sum += av * bv;
            }}
        }}
        d[i] = sum;
    }}
}}
#endif
"""


def a_address(s: SparseShape) -> str:
    """Byte offset of the row lane ``ln`` names in ``ldmatrix.x4`` of the filter's kept
    values (A) of channel tile ``fc`` at step ``kk``: (rows, chunk) = (0-7, 0), (8-15, 0),
    (0-7, 1), (8-15, 1) of its 16 channels and two chunks (the dense A fragment)."""
    row = f"wn * {s.WN} + fc * 16 + (ln & 7) + ((ln >> 3) & 1) * 8"
    return f"{layout.swizzle(s.CPR // 2, row, 'kk * 2 + (ln >> 4)')} * {layout.CHUNK}"


def b_address(s: SparseShape) -> str:
    """Byte offset of the row lane ``ln`` names in ``ldmatrix.x4`` of the pixels' values
    (B) of pixel tile ``fp`` at step ``kk``: matrix ``j`` is chunk ``j`` of the step's 4
    (reduction values ``8 j ..``) of its 8 pixels, so register ``j`` holds ``B[8 j + 2 t]``
    and the next of pixel ``g``."""
    row = f"wm * {s.WM} + fp * 8 + (ln & 7)"
    return f"{layout.swizzle(s.CPR, row, 'kk * 4 + (ln >> 3)')} * {layout.CHUNK}"


def meta_slot(lane: str) -> str:
    """C++ of the metadata word (of a tile's 16) lane ``lane`` passes: ``2 g + h`` for lane
    ``4 g + h`` (lanes ``4 g + 2`` and ``4 g + 3`` repeat them; selector 0 ignores them)."""
    return f"({lane} >> 2) * 2 + ({lane} & 1)"


def nibble(i0, i1):
    """The 4-bit metadata of a group whose kept values sit at indices ``i0 < i1``."""
    return i0 | (i1 << 2)


def sparse_loop(s: SparseShape, gpu: bool) -> str:
    """C++ of the main loop on the K tile in stage ``cslot``: per ``mma.sp`` step, the
    filter's kept values (A: ``ldmatrix.x4`` of 16 channel rows, two chunks), the pixels'
    values (B: ``ldmatrix.x4`` of 8 pixel rows, four chunks), the metadata word of each
    channel tile, and the warp tile's ``mma.sp``."""
    meta = f"ms_c[((wn * {s.FC} + fc) * {s.KS} + kk) * {WORDS} + {meta_slot('LN')}]"
    loads = f"""#pragma unroll
for (int fc = 0; fc < {s.FC}; ++fc) {{
    cb_ldsm_x4<false>(fa[LN][fc], bs_c, [&](int ln) {{ return {a_address(s)}; }}, LN);
    fe[LN][fc] = {meta};
}}
#pragma unroll
for (int fp = 0; fp < {s.FP}; ++fp)
    cb_ldsm_x4<false>(fb[LN][fp], as_c, [&](int ln) {{ return {b_address(s)}; }}, LN);"""
    if gpu:
        frags = (f"unsigned fa[1][{s.FC}][4], fb[1][{s.FP}][4], fe[1][{s.FC}];\n"
                 + loads.replace("LN]", "0]").replace(", LN)", ", lane)").replace("LN", "lane"))
        mma = f"cb_mma_sp(acc + (fc * {s.FP} + fp) * 4, fa[0][fc], fb[0][fp], fe[0][fc]);"
    else:
        frags = (f"unsigned fa[{WARP}][{s.FC}][4], fb[{WARP}][{s.FP}][4], fe[{WARP}][{s.FC}];\n"
                 f"for (int LN = 0; LN < {WARP}; ++LN) {{\n{indent(loads, 4)}\n}}")
        mma = f"cb_mma_sp_emulated(acc + (fc * {s.FP} + fp) * 4, lane, fa, fb, fe, fc, fp);"
    return f"""const char* as_c = as + cslot * {s.ASB};
const char* bs_c = bs + cslot * {s.BSB};
const unsigned* ms_c = reinterpret_cast<const unsigned*>(bs_c + {s.MOFF});
#pragma unroll
for (int kk = 0; kk < {s.KS}; ++kk) {{
{indent(frags, 4)}
    #pragma unroll
    for (int fc = 0; fc < {s.FC}; ++fc)
        #pragma unroll
        for (int fp = 0; fp < {s.FP}; ++fp)
            {mma}
}}"""


def epilogue_code(s: SparseShape, gpu: bool) -> str:
    """Each lane's sums to their output elements: channel ``g + 8 (i / 2)`` of the MMA
    tile's 16, pixel ``2 t + i % 2`` of its 8."""
    return f"""{gather.thread_code(s, gpu)}
const float* acc = acci + tp * {s.RR};
const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
for (int fc = 0; fc < {s.FC}; ++fc)
    #pragma unroll
    for (int fp = 0; fp < {s.FP}; ++fp)
        #pragma unroll
        for (int i = 0; i < 4; ++i) {{
            const int64_t n = (int64_t)blk_n + wn * {s.WN} + fc * 16 + g + 8 * (i >> 1);
            const int64_t m = (int64_t)blk_m + wm * {s.WM} + fp * 8 + 2 * t4 + (i & 1);
            if (m < {s.GM} && n < {s.K})
                yo[m * {s.K} + n] = acc[(fc * {s.FP} + fp) * 4 + i];
        }}
"""


def code():
    """The tasklet code by role (:func:`convkernels.gpu.mma.program.code` with the sparse
    main loop and epilogue)."""
    roles = dense.code()
    return dict(roles, step=lambda s, gpu: dense.PREAMBLE + mainloop.step_code(s, gpu, sparse_loop),
                epilogue=epilogue_code)


def program(layer: Layer, dtype, params) -> dace.SDFG:
    """The forward with the packed filter ``w`` (:func:`pack`, ``WLEN`` values) and the
    float32 sums in ``y``."""
    s = sparse_shape(layer, dtype.dace.ctype, params)
    sdfg = skeleton.program(layer, Layout.NDHWC, dtype, params, w_shape=(s.WLEN,), s=s,
                            code=code())
    sdfg.append_global_code(helpers(s, gpu=False), "frame")
    return dense.retype_output(sdfg, dace.float32)


def schedule(target: str):
    def apply(sdfg, layer, params):
        s = sparse_shape(layer, sdfg.arrays["x"].dtype.ctype, params)
        skeleton.schedule(target, Layout.NDHWC, kernel=lambda *_: (s, code()))(sdfg, layer, params)
        sdfg.append_global_code(helpers(s, target == "gpu"), "cuda" if target == "gpu" else "frame")
    return apply


def sparse_check_params(params) -> Optional[str]:
    """The dense kernel's checks, K tiles of whole ``mma.sp`` steps, and the compressed
    filter rows splitting evenly over the threads."""
    why = check_params(params)
    if why:
        return why
    tm, tn, tk = params["CTAtileM"], params["CTAtileN"], params["CTAtileK"]
    nt = (tm // params["warpTileM"]) * (tn // params["warpTileN"]) * WARP
    if tk % 32:
        return f"CTAtileK={tk}: a multiple of 32 (one mma.sp m16n8k32 step)"
    if tn * tk // 16 % nt:
        return f"the {tk // 16}-chunk compressed filter rows must split evenly over {nt} threads"
    return None


def supports(layer: Layer, params=None) -> Optional[str]:
    """Why the sparse forward does not handle ``layer``, or None: 2:4 groups of one tap's
    channels, so C a multiple of 4; no groups or dilation (the dense forward's)."""
    if layer.in_channels % 4:
        return f"C = {layer.in_channels}: the 2:4 groups are 4 channels of one tap, so C must be a multiple of 4"
    return dense.supports(layer, params)


# -- the filter as the kernel reads it ---------------------------------------------------------

def prune_2to4(w: np.ndarray) -> np.ndarray:
    """``w`` (``K x taps... x C``, channels last, C a multiple of 4) with the 2 smallest
    magnitudes of every 4 consecutive channels zeroed (the first of equal ones kept)."""
    g = w.reshape(-1, 4)
    order = np.argsort(-np.abs(g), axis=1, kind="stable")
    keep = np.zeros(g.shape, bool)
    np.put_along_axis(keep, order[:, :2], True, axis=1)
    return np.where(keep, g, 0).reshape(w.shape)


def _compress(groups: np.ndarray):
    """Per group of 4 (at most 2 nonzero): its two kept values and their index nibble
    (increasing indices; the first unused ones fill a group with fewer nonzeros)."""
    nz = groups != 0
    if (nz.sum(axis=1) > 2).any():
        raise ValueError("pack: the filter is not 2:4 sparse (prune it with prune_2to4)")
    # rank positions: nonzeros first, then zeros, each in index order; keep the first two
    key = np.where(nz, 0, 4) + np.arange(4)
    idx = np.sort(np.argsort(key, axis=1, kind="stable")[:, :2], axis=1)
    values = np.take_along_axis(groups, idx, axis=1)
    return values, nibble(idx[:, 0], idx[:, 1]).astype(np.uint32)


def pack(layer: Layer, params, w: np.ndarray, ctype: str = "cb_half") -> np.ndarray:
    """The array the kernel reads as ``w`` (``WLEN`` 16-bit values, as ``w``'s dtype):
    the 2:4 filter ``w`` (NDHWC: ``K x KD x KH x KW x C``) compressed, then its metadata
    words in the kernel's order (module docstring)."""
    s = sparse_shape(layer, ctype, params)
    values, nib = _compress(np.asarray(w).reshape(-1, 4))
    out = np.zeros(s.WLEN, dtype=w.dtype)
    out[:values.size] = values.reshape(-1)
    # each K tile's group nibbles per output channel (a group past C or RF: the filler)
    nib = nib.reshape(s.K, s.taps * s.C // 4)
    tiles = np.full((s.GNp, s.KT, s.TK // 4), FILLER, np.uint32)
    for kt in range(s.KT):
        if s.packed:
            first = kt * s.TK // 4
            cols = np.arange(first, first + s.TK // 4)
        else:
            tap, cb = divmod(kt, s.CB)
            ch = cb * s.TK // 4 + np.arange(s.TK // 4)
            cols = np.where(ch < s.C // 4, tap * (s.C // 4) + ch, nib.shape[1])
        ok = cols < nib.shape[1]
        tiles[:s.K, kt, ok] = nib[:, cols[ok]]
    # 16-bit halves: 4 groups each (group j in bits 4 j); rows g and g + 8 share a word
    halves = tiles.reshape(s.GNp, s.KT, s.KS, 2, 4)
    halves = (halves << (4 * np.arange(4, dtype=np.uint32))).sum(axis=-1, dtype=np.uint32)
    rows = halves.reshape(s.NQ, 2, 8, s.KT, s.KS, 2)          # (q, row / 8, g, kt, ks, h)
    words = rows[:, 0] | (rows[:, 1] << 16)                    # (q, g, kt, ks, h)
    words = words.transpose(2, 0, 3, 1, 4).astype(np.uint32)   # (kt, q, ks, g, h)
    out[s.WOFF:] = words.reshape(-1).view(np.uint16).view(w.dtype)
    return out


def fields(**given):
    """What the sparse forward registers with (``given``: its name, summary and pass)."""
    return dict(dense.fields(algorithm=program, supports=supports,
                             schedules={t: schedule(t) for t in ("cpu", "gpu")}, **given),
                check_params=sparse_check_params, precisions=PRECISIONS)


__all__ = ["PARAMS", "SparseShape", "pack", "prune_2to4", "program", "schedule", "supports"]
