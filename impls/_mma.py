"""The tensor-core implicit GEMM: the pipelined kernel's skeleton (``_pipelined.program``:
per-thread gather state, ``stages`` K tiles in flight through ``cp.async``, one barrier
per step) with a warp-level main loop in the shape of CUTLASS's sm80 kernels.  NDHWC;
``mma.sync`` with float32 sums: m16n8k16 on float16 or bfloat16 operands, m16n8k8 on
TF32 operands (float32 storage, ``--math tf32``).

**Tiles.**  A block of ``(CTAtileM / warpTileM) x (CTAtileN / warpTileN)`` warps computes
a ``CTAtileM x CTAtileN`` output tile, each warp a ``warpTileM x warpTileN`` tile of
16 x 8 MMA tiles (``FM x FN``).  ``CTAtileK`` counts 16-bit values: a K tile holds that
many float16 or bfloat16 channels, or half as many TF32 ones, so every precision stages
the same bytes (``CTAtileK * 2`` per row) and one parameter check serves all three.

**Shared memory.**  Operands are staged in 16-byte chunks (8 16-bit or 4 TF32 values):
the unit of ``cp.async.cg`` and of one row of ``ldmatrix``.  An operand whose reduction
values are contiguous in memory (the input pixel's channels, the forward filter's) is
stored **K-major**: row ``r`` (a pixel, an output channel) of ``CPR = TK / CE`` chunks.
Chunk ``c`` of row ``r`` lies at chunk :func:`swizzle` ``(r, c)``: the chunk's index XOR
a 3-bit key of its row (``r % 8`` where a row spans 128 bytes or more, else the index of
its 128-byte line), so the eight rows one ``ldmatrix`` phase reads fall in eight
different groups of four banks.  The data gradient's filter has its output channels
contiguous: it is stored **N-major** (row = reduction value, chunks of 8 or 4
channels).  In 16 bits ``ldmatrix.trans`` reads it; in TF32, which ``ldmatrix`` cannot
transpose (it moves 16-bit values), one 32-bit shared load per register does, from the
:func:`blocked` layout: blocks of 4 rows x 8 values, so that one load's 32 lanes read one
block (32 banks) at an immediate offset from each lane's own address.

**Taps packed.**  A forward layer with at most half a K tile of channels (CosmoFlow's
first layers) walks the filter's flat (tap, channel) reduction in K tiles instead of one
tap's channel blocks (``Shape.packed``, :func:`_packed_stage_code`): no tile is mostly
zeros, and each copy decodes its own tap.

**Main loop** (per K tile, per MMA step of ``KM`` = 16 or 8 reduction values = 2 chunks):
``ldmatrix.x4`` gives a lane its A registers of one 16 x KM tile (matrices: rows 0-7
and 8-15 of chunk 0, then of chunk 1) and its B registers of two KM x 8 tiles; then
``FM x FN`` ``mma.sync``.  Lane ``l`` of ``ldmatrix`` names row ``l % 8`` of matrix
``l / 8``; it receives word ``l % 4`` of row ``l / 4`` of each matrix (with ``.trans``:
the 16-bit values of column ``l / 4`` in rows ``2 (l % 4)`` and ``2 (l % 4) + 1``).  In
TF32, where a 4-byte value is one "pair" of ``ldmatrix``'s 16-bit values, the same loads
give m16n8k8's fragments, which the tensor cores read as TF32 (the low 13 bits of each
float32 ignored: no ``cvt``; the emulation truncates the same way).

**The CPU emulation** runs the same tasklet code thread by thread, with the same address
expressions: each thread builds the registers of all 32 lanes of its warp from shared
memory the way ``ldmatrix`` distributes them (:data:`CPU_HELPERS`), then computes its own
four sums per MMA tile from the lanes and registers where PTX's fragment layout puts
A[r][k] and B[k][n].  A wrong swizzle, lane-to-row mapping, fragment order or
accumulator layout therefore fails on the CPU, not only on the GPU.
"""

import dataclasses
from typing import Optional

import dace

from convbench.registry import Layer, Layout, Param
from impls import _pipelined as P
from impls import _tiling as T
from impls._common import layer_constants
from impls._mma_ptx import helpers

WARP = 32
#: Bytes of one staged chunk: one ``cp.async.cg`` copy, one row of an ``ldmatrix`` matrix.
CHUNK = 16

PARAMS = (
    Param("CTAtileM", 128, "output pixels (GEMM rows) per thread block", T.power_of_two),
    Param("CTAtileN", 128, "output channels (GEMM columns) per thread block", T.power_of_two),
    Param("CTAtileK", 32, "16-bit reduction values per K tile (TF32: half as many, the same "
          "bytes); one tap, that many channels", T.power_of_two),
    Param("warpTileM", 64, "rows of a warp's tile (16-row MMA tiles)", T.power_of_two),
    Param("warpTileN", 64, "columns of a warp's tile (8-column MMA tiles)", T.power_of_two),
    Param("stages", 3, "K tiles in flight (cp.async stages in shared memory)"),
)

#: The precisions of the tensor-core kernels (by label, :mod:`convbench.precision`).
PRECISIONS = ("float16", "bfloat16", "float32-tf32")
#: PTX operand type and MMA reduction by the C++ storage type (TF32 is stored as float).
PTX = {"cb_half": ("f16", 16), "cb_bfloat16": ("bf16", 16), "float": ("tf32", 8)}


@dataclasses.dataclass(frozen=True)
class Warps:
    """What every tensor-core kernel's constants add to its skeleton's: the warp tile,
    the storage type's bytes and PTX name, and the operands' shared layouts (a mixin of
    :class:`Shape` and of the filter gradient's ``impls/_mma_wgrad.WTShape``; ``TK``:
    values of the storage type)."""

    WM: int = 64
    WN: int = 64
    EB: int = 2            # bytes per value: 2 (float16, bfloat16) or 4 (TF32)
    ptx: str = "f16"

    NT = property(lambda s: (s.TM // s.WM) * (s.TN // s.WN) * WARP)
    WARPS_M = property(lambda s: s.TM // s.WM)
    FM = property(lambda s: s.WM // 16)            # MMA tiles per warp along M
    FN = property(lambda s: s.WN // 8)             # and along N
    RR = property(lambda s: s.WM * s.WN // WARP)   # accumulators per thread
    CE = property(lambda s: CHUNK // s.EB)         # values per chunk
    CPR = property(lambda s: s.TK // s.CE)         # chunks per K-major row
    KM = property(lambda s: 2 * s.CE)              # reduction per mma.sync
    ASB = property(lambda s: s.TM * s.TK * s.EB)   # bytes of one stage of A
    BSB = property(lambda s: s.TN * s.TK * s.EB)
    AS = property(lambda s: s.S * s.ASB // 4)
    BS = property(lambda s: s.S * s.BSB // 4)
    NCA = property(lambda s: s.TM // s.CE)         # chunks of an N-major A row
    NCH = property(lambda s: s.TN // s.CE)         # chunks of an N-major B row
    #: How each operand reaches the registers: "ldsm" (K-major, ldmatrix), "trans"
    #: (N-major, ldmatrix.trans: 16-bit values only) or "lds" (N-major TF32: one 32-bit
    #: load per register, ``ldmatrix`` cannot transpose 4-byte values)
    a_mode = property(lambda s: "ldsm")
    b_mode = property(lambda s: "ldsm")

    #: The mode of an N-major operand in this precision: "trans" or (TF32) "lds"
    nmajor = property(lambda s: "trans" if s.EB == 2 else "lds")

    def swizzle(self, operand: str, cpr: int, row: str, chunk: str) -> str:
        """The stored chunk index of operand ``"a"`` or ``"b"`` as its mode reads it:
        :func:`swizzle`, or :func:`blocked` for 32-bit loads."""
        mode = self.a_mode if operand == "a" else self.b_mode
        return (blocked if mode == "lds" else swizzle)(cpr, row, chunk)


@dataclasses.dataclass(frozen=True)
class Shape(Warps, P.Shape):
    """The constants of the forward's and the data gradient's tensor-core builds."""

    #: B stored N-major (the data gradient's filter: its output channels are contiguous),
    #: read with ldmatrix.trans in 16 bits and with 32-bit loads in TF32
    b_mode = property(lambda s: s.nmajor if s.flip else "ldsm")
    CA = property(lambda s: s.TM * s.CPR // s.NT)  # chunks of A a thread stages per tile
    #: Taps packed into K tiles (the forward of a layer with at most half a K tile of
    #: channels, such as CosmoFlow's first): the reduction is the filter's flat (tap,
    #: channel) index, K tiles of TK of it, so no tile is mostly zeros
    packed = property(lambda s: not s.flip and 2 * s.C <= s.TK)
    RF = property(lambda s: s.taps * s.C)          # the flat reduction's length
    KT = property(lambda s: -(-s.RF // s.TK) if s.packed else s.taps * s.CB)
    CBK = property(lambda s: s.TN * s.CPR // s.NT)  # chunks of a K-major B per thread
    CBN = property(lambda s: s.TK * s.NCH // s.NT)  # chunks of an N-major B per thread


def shape(layer: Layer, ctype: str, params, flip: bool = False) -> Shape:
    """The constants of ``layer`` with the tiles of ``params``, for the storage type of
    C++ name ``ctype`` (:data:`PTX`)."""
    L = layer_constants(layer, Layout.NDHWC)
    ptx, _ = PTX[ctype]
    eb = 4 if ptx == "tf32" else 2
    tk = params["CTAtileK"] * 2 // eb
    return Shape(Layout.NDHWC, L.N, L.C, L.K, L.D, L.H, L.W, L.KD, L.KH, L.KW, L.SD, L.SH,
                 L.SW, L.PD, L.PH, L.PW, L.OD, L.OH, L.OW, params["CTAtileM"],
                 params["CTAtileN"], tk, 1, 1, params["stages"], flip=flip,
                 WM=params["warpTileM"], WN=params["warpTileN"], EB=eb, ptx=ptx)


def check_params(params) -> Optional[str]:
    tm, tn, tk = params["CTAtileM"], params["CTAtileN"], params["CTAtileK"]
    wm, wn, s = params["warpTileM"], params["warpTileN"], params["stages"]
    if wm > tm or wn > tn:
        return "warpTileM/N must not exceed CTAtileM/N"
    nt = (tm // wm) * (tn // wn) * WARP
    cpr = tk * 2 // CHUNK
    smem = s * (tm + tn) * tk * 2
    return T.require(
        (2 <= s <= 4, f"stages={s}: 2 to 4"),
        (tk >= 16, f"CTAtileK={tk}: at least 16 (two 16-byte chunks per row: one MMA step)"),
        (wm >= 16 and wn >= 16, f"warp tile {wm} x {wn}: at least 16 x 16 (one ldmatrix.x4 "
                                "of A, one of B)"),
        (wm * wn // WARP <= 128, f"warp tile {wm} x {wn}: {wm * wn // WARP} accumulators "
                                 "per thread > 128 (registers)"),
        (nt <= T.MAX_THREADS, f"{nt} threads > {T.MAX_THREADS}"),
        (nt >= tm and nt >= tn, f"{nt} threads: at least one per row of the A tile ({tm}) "
                                f"and of the B tile ({tn}) (each stages a run of one row)"),
        (tm * cpr % nt == 0 and tn * cpr % nt == 0 and tk * tn // 8 >= nt,
         f"the {cpr}-chunk rows of A and B must split evenly over {nt} threads"),
        (smem <= T.SHARED_BYTES, f"{s} stages of tiles need {smem} bytes of shared memory "
                                 f"> {T.SHARED_BYTES}"),
    )


def supports(layer: Layer, params) -> Optional[str]:
    """Every image's offsets in int32 (``_pipelined.supports``)."""
    return P.supports(layer, params)


# ---------------------------------------------------------------------------------------------
# The shared layout and the lanes' addresses
# ---------------------------------------------------------------------------------------------

def swizzle(cpr: int, row: str, chunk: str) -> str:
    """C++ of the stored chunk index of chunk ``chunk`` of row ``row`` in rows of ``cpr``
    chunks: the index XOR a 3-bit key of the row (see the module docstring)."""
    lin = f"(({row}) * {cpr} + ({chunk}))"
    key = f"(({row}) & 7)" if cpr >= 8 else f"(({lin} >> 3) & 7)"
    return f"({lin} ^ {key})"


def blocked(cpr: int, row: str, chunk: str) -> str:
    """C++ of the stored chunk index of chunk ``chunk`` of row ``row`` in an N-major TF32
    tile of rows of ``cpr`` chunks, read with 32-bit loads: blocks of 4 rows x 2 chunks
    (8 x 4 values, 128 bytes), the blocks of 4 rows in a row, then the next 4 rows.  One
    load's lanes read one block (values ``g`` of rows ``t``: lane ``4 g + t``), so 32
    different banks, at one offset from each lane's own; 8 threads staging a block's 8
    chunks write 128 consecutive bytes."""
    return (f"(((({row}) >> 2) * {cpr // 2} + (({chunk}) >> 1)) * 8 + (({row}) & 3) * 2"
            f" + (({chunk}) & 1))")


def blocked_thread(cpr: int):
    """C++ of the row and the chunk that thread ``t`` stages in each round of an N-major
    TF32 tile (:func:`blocked`): the ``t``-th stored chunk, so that consecutive threads
    write consecutive bytes; a round covers ``NT / cpr`` rows (a multiple of 4)."""
    assert cpr % 2 == 0, cpr
    return (f"(((int)t >> 3) / {cpr // 2}) * 4 + (((int)t & 7) >> 1)",
            f"(((int)t >> 3) % {cpr // 2}) * 2 + ((int)t & 1)")


def a_address(s) -> str:
    """Byte offset of the 16-byte row lane ``ln`` names in ``ldmatrix.x4`` of A's MMA tile
    ``fm`` at MMA step ``kk``: (rows, chunk) = (0-7, 0), (8-15, 0), (0-7, 1), (8-15, 1).
    N-major (``.trans``): matrix ``j`` is reduction rows ``8 (j / 2)`` on of the 8 rows of
    A from ``8 (j % 2)``.  ``lds``: the byte of lane ``ln``'s register ``j`` itself
    (m16n8k8's A fragment: lane ``4 g + t`` holds rows ``g``, ``g + 8`` of columns ``t``,
    ``t + 4``)."""
    if s.a_mode == "lds":  # A[8 kk + t + 4 (j / 2)][wm WM + 16 fm + g + 8 (j % 2)]
        block = f"(kk * 2 + (j >> 1)) * {s.NCA // 2} + wm * {s.WM // 8} + fm * 2 + (j & 1)"
        return f"cb_lds_lane(ln) + ({block}) * 128"
    if s.a_mode == "trans":
        row = "kk * 16 + (ln >> 4) * 8 + (ln & 7)"
        chunk = f"(wm * {s.WM} + fm * 16 + ((ln >> 3) & 1) * 8) / 8"
        return f"{swizzle(s.NCA, row, chunk)} * {CHUNK}"
    row = f"wm * {s.WM} + fm * 16 + (ln & 7) + ((ln >> 3) & 1) * 8"
    return f"{swizzle(s.CPR, row, 'kk * 2 + (ln >> 4)')} * {CHUNK}"


def b_address(s) -> str:
    """Byte offset of the row lane ``ln`` names in ``ldmatrix.x4`` of B's MMA tiles
    ``2 fp`` and ``2 fp + 1``: (tile, chunk) = (0, 0), (0, 1), (1, 0), (1, 1).  N-major
    (``.trans``): matrix ``j`` is reduction rows ``8 (j % 2)`` on of 8 columns from
    ``8 (j / 2)``.  ``lds``: the byte of lane ``ln``'s register ``j`` (registers 0, 1 of
    tile ``2 fp``, then of ``2 fp + 1``; lane ``4 g + t`` holds rows ``t``, ``t + 4`` of
    column ``g``)."""
    if s.b_mode == "lds":  # B[8 kk + t + 4 (j % 2)][wn WN + 8 (2 fp + j / 2) + g]
        block = f"(kk * 2 + (j & 1)) * {s.NCH // 2} + wn * {s.WN // 8} + (fp * 2 + (j >> 1))"
        return f"cb_lds_lane(ln) + ({block}) * 128"
    if s.b_mode == "trans":
        row = "kk * 16 + ((ln >> 3) & 1) * 8 + (ln & 7)"
        chunk = f"(wn * {s.WN} + fp * 16 + (ln >> 4) * 8) / 8"
        return f"{swizzle(s.NCH, row, chunk)} * {CHUNK}"
    row = f"wn * {s.WN} + fp * 16 + (ln & 7) + (ln >> 4) * 8"
    return f"{swizzle(s.CPR, row, 'kk * 2 + ((ln >> 3) & 1)')} * {CHUNK}"


# ---------------------------------------------------------------------------------------------
# The tasklets' C++
# ---------------------------------------------------------------------------------------------

def _thread_code(s: Shape, gpu: bool) -> str:
    """This thread's row of the per-thread arrays, its warp and lane, and the rows and
    chunks of A and B it stages."""
    tpa = s.NT // s.TM
    if s.b_mode == "lds":  # one chunk column of rows bk + i GB (blocked_thread)
        b = "const int bk = {}, bc = {};".format(*blocked_thread(s.NCH))
    elif s.flip:
        tpr = s.NCH // s.CBN  # threads per reduction row of an N-major B
        b = f"const int bk = (int)t / {tpr}, bc = ((int)t % {tpr}) * {s.CBN};"
    else:
        tpb = s.NT // s.TN
        b = f"const int bn = (int)t / {tpb}, bc = ((int)t % {tpb}) * {s.CBK};"
    return f"""const int tp = {"0" if gpu else "(int)t"};
const int lane = (int)t % {WARP}, warp = (int)t / {WARP};
const int wm = warp % {s.WARPS_M}, wn = warp / {s.WARPS_M};
const int am = (int)t / {tpa}, ac = ((int)t % {tpa}) * {s.CA};
{b}
(void)lane; (void)wm; (void)wn; (void)am; (void)ac;"""


def _vector(extent: int, ce: int) -> int:
    """Values per copy: the largest power of two up to a chunk that divides the
    contiguous ``extent`` (one 16-bit value, 2 bytes, is an ordinary copy)."""
    v = ce
    while extent % v:
        v //= 2
    return v


def _copies(s: Shape, dst: str, rows: int, cpr: int, row: str, chunk0: str, first: str,
            limit: int, whole: int, ok: str, vec: int, operand: str) -> str:
    """C++ staging one run of this thread: chunks ``chunk0 + j`` (``j`` < ``rows``) of row
    ``row`` of a stage of ``operand``'s rows of ``cpr`` chunks at ``dst``, from ``src``
    (value ``v`` of chunk ``j`` at ``j * CE + v``), ``vec`` values per ``cp.async``.
    Value ``first + j * CE + v`` past ``limit`` is zero-filled, unless ``limit`` is a
    multiple of ``whole`` (the tile's extent along ``first``): then no value passes it,
    and the run's copies share ``ok`` and constant offsets from one pointer."""
    full = limit % whole == 0 and vec == s.CE
    cond = ok if full else f"{ok} && {first} + j * {s.CE} + v < {limit}"
    source = f"src + j * {s.CE} + v" if full else f"okv ? src + j * {s.CE} + v : base"
    return f"""#pragma unroll
for (int j = 0; j < {rows}; ++j) {{
    char* d = {dst} + {s.swizzle(operand, cpr, row, chunk0 + " + j")} * {CHUNK};
    #pragma unroll
    for (int v = 0; v < {s.CE}; v += {vec}) {{
        const bool okv = {cond};
        cb_cp_async<{vec * s.EB}>(d + v * {s.EB}, {source}, okv);
    }}
}}"""


def _stage_code(s: Shape) -> str:
    """C++ that stages the K tile at (``kd, kh, kw``, ``c0``) into stage ``sslot``, then
    advances those to the next tile and stage (the reduction walks channel blocks, then
    taps, as ``_pipelined`` does).  Each operand's run starts at one pointer, the
    operand's base where the run is outside it (every copy then zero-fills)."""
    if s.packed:
        return _packed_stage_code(s)
    tap = f"((kd * {s.KH} + kh) * {s.KW} + kw)"
    va, vk = _vector(s.C, s.CE), _vector(s.K, s.CE)
    a = f"""{{ // A: this thread's pixel, chunks ac.. of channels c0..
    const int dd = d0 + kd, hh = h0 + kh, ww = w0 + kw;
    const bool inside = abase >= 0 && (unsigned)dd < {s.D}u && (unsigned)hh < {s.H}u
                        && (unsigned)ww < {s.W}u;
    const int ch = c0 + ac * {s.CE};
    const auto* base = xa;
    const auto* src = inside ? xa + abase + (int64_t)((dd * {s.H} + hh) * {s.W} + ww) * {s.C} + ch : xa;
{P.indent(_copies(s, f"as + sslot * {s.ASB}", s.CA, s.CPR, "am", "ac", "ch", s.C, s.TK,
                  "inside", va, "a"), 4)}
}}"""
    if s.b_mode == "lds":  # N-major TF32, blocked: chunk bc of rows bk + i GB
        gb = s.NT // s.NCH
        assert s.NT % s.NCH == 0 and gb % 4 == 0 and s.TK % gb == 0, (s.NT, s.NCH, s.TK)
        b = f"""{{ // B (N-major, blocked): output channels n.., rows c0 + bk + i * {gb}
    const int n = blk_n + bc * {s.CE};
    const auto* row0 = wb + (int64_t)(c0 + bk) * {s.taps * s.K}
                       + ({s.taps - 1} - {tap}) * {s.K} + n;
    char* d0 = bs + sslot * {s.BSB} + {blocked(s.NCH, "bk", "bc")} * {CHUNK};
    #pragma unroll
    for (int i = 0; i < {s.TK // gb}; ++i) {{
        const bool ok = c0 + bk + i * {gb} < {s.C};
        #pragma unroll
        for (int v = 0; v < {s.CE}; v += {vk}) {{
            const bool okv = ok{"" if s.K % s.TN == 0 and vk == s.CE else f" && n + v < {s.K}"};
            cb_cp_async<{vk * s.EB}>(d0 + (i * {gb * s.NCH} * {s.CE} + v) * {s.EB},
                                    okv ? row0 + (int64_t)i * {gb * s.taps * s.K} + v : wb, okv);
        }}
    }}
}}"""
    elif s.flip:  # N-major: rows are reduction channels c0 + bk, chunks output channels
        b = f"""{{ // B (N-major): reduction channel c0 + bk, output channels from blk_n + bc * {s.CE}
    const int ck = c0 + bk, n = blk_n + bc * {s.CE};
    const auto* base = wb;
    const auto* src = ck < {s.C} ? wb + (int64_t)ck * {s.taps * s.K} + ({s.taps - 1} - {tap}) * {s.K} + n : wb;
{P.indent(_copies(s, f"bs + sslot * {s.BSB}", s.CBN, s.NCH, "bk", "bc", "n", s.K, s.TN,
                  f"ck < {s.C}", vk, "b"), 4)}
}}"""
    else:
        b = _kmajor_b(s, f"(int64_t){tap} * {s.C} + ", s.C, va)
    return _staged(s, a, b, f"""if (c0 >= {s.C}) {{
    c0 = 0;
    if (++kw == {s.KW}) {{ kw = 0; if (++kh == {s.KH}) {{ kh = 0; ++kd; }} }}
}}""")


def _kmajor_b(s: Shape, tap: str, limit: int, vec: int) -> str:
    """C++ staging this thread's chunks of its output channel's filter row (B, K-major, at
    ``bbase``): values ``ch = c0 + bc * CE`` on, after ``tap`` (C++ ending in ``+``, or
    empty where ``c0`` indexes the whole row), zero-filled from ``limit`` on."""
    return f"""{{ // B (K-major): output channel's filter row at bbase, values c0 + bc * {s.CE}..
    const int ch = c0 + bc * {s.CE};
    const auto* base = wb;
    const auto* src = bbase >= 0 ? wb + bbase + {tap}ch : wb;
{P.indent(_copies(s, f"bs + sslot * {s.BSB}", s.CBK, s.CPR, "bn", "bc", "ch", limit, s.TK,
                  "bbase >= 0", vec, "b"), 4)}
}}"""


def _staged(s: Shape, a: str, b: str, advance: str) -> str:
    """C++ staging A and B (their code) while a K tile is left, advancing ``c0`` by a K
    tile and then by ``advance``, and moving to the next stage."""
    return f"""if (kd < {s.KD}) {{ // a K tile is left to stage
{P.indent(a, 4)}
{P.indent(b, 4)}
    c0 += {s.TK};
{P.indent(advance, 4)}
}}
sslot = sslot + 1 == {s.S} ? 0 : sslot + 1;
cb_cp_commit();"""


def _packed_stage_code(s: Shape) -> str:
    """:func:`_stage_code` with taps packed (``Shape.packed``): the K tile at ``c0`` of the
    flat reduction ``r = tap * C + channel``.  Each A copy (``vec`` values, which divides
    C: one tap) decodes its own tap and checks it against the input's borders; B is a run
    of the filter row (the filter's own order); values past ``RF`` are zero-filled.
    ``kd`` only marks the end (``KD`` once the reduction is staged)."""
    va, vb = _vector(s.C, s.CE), _vector(s.RF, s.CE)
    a = f"""{{ // A (taps packed): this thread's pixel, chunks ac.. of the flat reduction from c0
    #pragma unroll
    for (int j = 0; j < {s.CA}; ++j) {{
        char* d = as + sslot * {s.ASB} + {swizzle(s.CPR, "am", "ac + j")} * {CHUNK};
        #pragma unroll
        for (int v = 0; v < {s.CE}; v += {va}) {{
            const int r = c0 + (ac + j) * {s.CE} + v;  // tap r / C, channel r % C
            const int tap = r / {s.C}, ch = r - tap * {s.C};
            const int dd = d0 + tap / {s.KH * s.KW}, hh = h0 + (tap / {s.KW}) % {s.KH};
            const int ww = w0 + tap % {s.KW};
            const bool ok = abase >= 0 && r < {s.RF} && (unsigned)dd < {s.D}u
                            && (unsigned)hh < {s.H}u && (unsigned)ww < {s.W}u;
            // (past the borders the address is formed, never read: source size 0)
            cb_cp_async<{va * s.EB}>(d + v * {s.EB},
                                    xa + abase + (int64_t)((dd * {s.H} + hh) * {s.W} + ww) * {s.C} + ch, ok);
        }}
    }}
}}"""
    return _staged(s, a, _kmajor_b(s, "", s.RF, vb), f"if (c0 >= {s.RF}) kd = {s.KD};")


def mma_loop(s: Shape, gpu: bool) -> str:
    """C++ of the main loop on the K tile in stage ``cslot``: per MMA step, the lanes'
    registers through ``ldmatrix.x4`` and the warp tile's ``mma.sync``.  On the CPU each
    thread builds the registers of every lane of its warp (``ln``) and emulates its own
    share of each MMA from them."""
    def load(mode, dst, base, address):
        if mode == "lds":
            return f"cb_lds_x4({dst}, {base}, [&](int ln, int j) {{ return {address}; }}, LN);"
        trans = "true" if mode == "trans" else "false"
        return f"cb_ldsm_x4<{trans}>({dst}, {base}, [&](int ln) {{ return {address}; }}, LN);"
    a_loads = f"""#pragma unroll
for (int fm = 0; fm < {s.FM}; ++fm)
    {load(s.a_mode, "fa[LN][fm]", "as_c", a_address(s))}"""
    b_loads = f"""#pragma unroll
for (int fp = 0; fp < {s.FN // 2}; ++fp) {{
    unsigned r[4];
    {load(s.b_mode, "r", "bs_c", b_address(s))}
    fb[LN][2 * fp][0] = r[0]; fb[LN][2 * fp][1] = r[1];
    fb[LN][2 * fp + 1][0] = r[2]; fb[LN][2 * fp + 1][1] = r[3];
}}"""
    loads = a_loads + "\n" + b_loads
    if gpu:
        frags = f"unsigned fa[1][{s.FM}][4], fb[1][{s.FN}][2];\n" + loads.replace("LN]", "0]")
        frags = frags.replace(", LN)", ", lane)")
        mma = "cb_mma(acc + (fm * {FN} + fn) * 4, fa[0][fm], fb[0][fn]);"
    else:
        frags = (f"unsigned fa[{WARP}][{s.FM}][4], fb[{WARP}][{s.FN}][2];\n"
                 f"for (int LN = 0; LN < {WARP}; ++LN) {{\n{P.indent(loads, 4)}\n}}")
        mma = "cb_mma_emulated(acc + (fm * {FN} + fn) * 4, lane, fa, fb, fm, fn);"
    return f"""const char* as_c = as + cslot * {s.ASB};
const char* bs_c = bs + cslot * {s.BSB};
#pragma unroll
for (int kk = 0; kk < {s.TK // s.KM}; ++kk) {{
{P.indent(frags, 4)}
    #pragma unroll
    for (int fm = 0; fm < {s.FM}; ++fm)
        #pragma unroll
        for (int fn = 0; fn < {s.FN}; ++fn)
            {mma.format(FN=s.FN)}
}}"""


def prologue_code(s: Shape, gpu: bool) -> str:
    """Zero the accumulators, decode the staged pixel and filter row, issue the first
    ``stages - 1`` K tiles, and wait for the first."""
    if s.flip:
        bset = "bbase = 0;"  # its rows are reduction values; columns checked per chunk
        n = ""
    else:
        bset = f"if (n < {s.K}) bbase = n * {s.taps * s.C};"
        n = "const int64_t n = (int64_t)blk_n + bn;"
    return f"""{_thread_code(s, gpu)}
#pragma unroll
for (int i = 0; i < {s.RR}; ++i) acco[tp * {s.RR} + i] = 0.0f;
{P.staged_pixel(s)}
    {n}
    {bset}
}}
int kd = 0, kh = 0, kw = 0, c0 = 0, sslot = 0;
const int cslot = 0;
for (int j = 0; j < {s.S - 1}; ++j) {{
{P.indent(_stage_code(s), 4)}
}}
{P._store_state(P.ST)}
sbo[tp * {len(P.SB)}] = abase;
sbo[tp * {len(P.SB)} + 1] = bbase;
cb_cp_wait<{s.S - 2}>();
"""


def step_code(s: Shape, gpu: bool) -> str:
    """Step ``kt``: issue the next K tile, compute the one in stage ``cslot``, wait for
    the tile after it."""
    return f"""{_thread_code(s, gpu)}
{P._load_state(s, writable=True)}
{_stage_code(s)}
{{
    float* acc = acco + tp * {s.RR};
{P.indent(mma_loop(s, gpu), 4)}
}}
cslot = cslot + 1 == {s.S} ? 0 : cslot + 1;
{P._store_state(("kd", "kh", "kw", "c0", "sslot", "cslot"))}
cb_cp_wait<{s.S - 2}>();
"""


def store_code(s, rows: int, cols: int, target: str) -> str:
    """C++ storing each accumulator of this lane to ``target`` (the C++ of its element,
    given its GEMM row ``m`` and column ``n``) where ``m < rows`` and ``n < cols``: lane
    ``l`` holds rows ``l / 4`` and ``l / 4 + 8``, columns ``2 (l % 4)`` and the next, of
    each MMA tile."""
    return f"""const float* acc = acci + tp * {s.RR};
const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
for (int fm = 0; fm < {s.FM}; ++fm)
    #pragma unroll
    for (int i2 = 0; i2 < 2; ++i2) {{
        const int64_t m = (int64_t)blk_m + wm * {s.WM} + fm * 16 + g + 8 * i2;
        #pragma unroll
        for (int fn = 0; fn < {s.FN}; ++fn)
            #pragma unroll
            for (int i1 = 0; i1 < 2; ++i1) {{
                const int64_t n = (int64_t)blk_n + wn * {s.WN} + fn * 8 + 2 * t4 + i1;
                if (m < {rows} && n < {cols})
                    {target} = acc[(fm * {s.FN} + fn) * 4 + i2 * 2 + i1];
            }}
    }}
"""


def epilogue_code(s: Shape, gpu: bool) -> str:
    """Store each accumulator to its output element."""
    return f"{_thread_code(s, gpu)}\n" + store_code(s, s.GM, s.K, f"yo[m * {s.K} + n]")


#: What the prologue and the steps call the stages, as bytes, before their code.
_PREAMBLE = ("char* as = reinterpret_cast<char*>(ao);\n"
             "char* bs = reinterpret_cast<char*>(bo);\n")


def _roles():
    """The tasklet code by role, for ``_pipelined.set_code``."""
    def staged(f):
        return lambda s, gpu: _PREAMBLE + f(s, gpu)
    return {"prologue": staged(prologue_code), "step": staged(step_code),
            "epilogue": epilogue_code}


# ---------------------------------------------------------------------------------------------
# The program, schedules and registration
# ---------------------------------------------------------------------------------------------

def program(layer: Layer, dtype, params, flip: bool = False, w_shape=None) -> dace.SDFG:
    """The tensor-core implicit GEMM of ``layer`` (NDHWC; module docstring).  ``flip``:
    ``layer`` is a data gradient's ``transposed_layer`` and the program takes the forward
    filter, of shape ``w_shape``."""
    s = shape(layer, dtype.dace.ctype, params, flip)
    sdfg = P.program(layer, Layout.NDHWC, dtype, params, flip=flip, w_shape=w_shape, s=s,
                     code=_roles())
    sdfg.append_global_code(helpers(s, gpu=False), "frame")
    return sdfg


def schedule(target: str, flip: bool = False, layer_of=lambda layer: layer):
    """``_pipelined``'s tiled schedule (block map on the grid, thread map on the block's
    threads, stages in shared memory, accumulators and state in registers) with the
    tensor-core code of the target.  ``layer_of``: the layer the program computes (the
    data gradient's transposed one)."""
    def apply(sdfg, layer, params):
        s = shape(layer_of(layer), sdfg.arrays["x"].dtype.ctype, params, flip)
        P.schedule(target, Layout.NDHWC, kernel=lambda *_: (s, _roles()))(sdfg, layer, params)
        sdfg.append_global_code(helpers(s, target == "gpu"), "cuda" if target == "gpu" else "frame")
    return apply


def implementation(**fields):
    """The registration of a tensor-core kernel on NDHWC: ``fields`` (name, summary, pass,
    algorithm, supports, constraints, schedules) and what every one shares."""
    from convbench.registry import Implementation
    return Implementation(layout=Layout.NDHWC, params=PARAMS, check_params=check_params,
                          precisions=PRECISIONS, **fields)
