"""The tensor-core kernels' tiles and stages: warp tiles of 16 x 8 MMA tiles, the storage
type's bytes and PTX name, the operands' shared layouts by precision, the tunable
parameters and their checks (:class:`Warps`, what every tensor-core kernel adds to its
skeleton's constants; :class:`Shape`, the forward's and the data gradient's).

**Tiles.**  A block of ``(CTAtileM / warpTileM) x (CTAtileN / warpTileN)`` warps computes
a ``CTAtileM x CTAtileN`` output tile, each warp a ``warpTileM x warpTileN`` tile of
16 x 8 MMA tiles (``FM x FN``).  ``CTAtileK`` counts 16-bit values: a K tile holds that
many float16 or bfloat16 channels, or half as many TF32 ones, so every precision stages
the same bytes (``CTAtileK * 2`` per row) and one parameter check serves all three.
"""

import dataclasses
from typing import Optional

from convkernels.declarations import Param
from convkernels.gpu import tiling as T
from convkernels.gpu.mma.layout import CHUNK, blocked, swizzle
from convkernels.gpu.simt import tiles as simt_tiles
from convkernels.layer import Layer, layer_constants
from convkernels.layouts import Layout


WARP = 32




PARAMS = (
    Param("CTAtileM", 128, "output pixels (GEMM rows) per thread block", T.power_of_two),
    Param("CTAtileN", 128, "output channels (GEMM columns) per thread block", T.power_of_two),
    Param("CTAtileK", 32, "16-bit reduction values per K tile (TF32: half as many, the same "
          "bytes); one tap, that many channels", T.power_of_two),
    Param("warpTileM", 64, "rows of a warp's tile (16-row MMA tiles)", T.power_of_two),
    Param("warpTileN", 64, "columns of a warp's tile (8-column MMA tiles)", T.power_of_two),
    Param("stages", 3, "K tiles in flight (cp.async stages in shared memory)"),
)


#: The precisions of the tensor-core kernels (by label, :mod:`convbench.build.precision`).
PRECISIONS = ("float16", "bfloat16", "float32-tf32")


#: PTX operand type and MMA reduction by the C++ storage type (TF32 is stored as float;
#: int8 is the int8 forward's: m16n8k32 with int32 sums, :mod:`convbench.quant.int8`).
PTX = {"cb_half": ("f16", 16), "cb_bfloat16": ("bf16", 16), "float": ("tf32", 8),
       "int8_t": ("s8", 32)}
#: Bytes per value by PTX operand type (16-bit ones: 2).
VALUE_BYTES = {"tf32": 4, "s8": 1}


@dataclasses.dataclass(frozen=True)
class Warps:
    """What every tensor-core kernel's constants add to its skeleton's: the warp tile,
    the storage type's bytes and PTX name, and the operands' shared layouts (a mixin of
    :class:`Shape` and of the filter gradient's
    :class:`convkernels.gpu.mma.filter_gradient.WTShape`; ``TK``:
    values of the storage type)."""

    WM: int = 64
    WN: int = 64
    EB: int = 2            # bytes per value: 2 (float16, bfloat16), 4 (TF32) or 1 (int8)
    ptx: str = "f16"

    #: The C++ type of the accumulators: int32 sums of int8 products, else float32
    acc_t = property(lambda s: "int" if s.ptx == "s8" else "float")

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
class Shape(Warps, simt_tiles.Shape):
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
    #: Reduction values per stored filter value: 1, or 2 where the filter is stored 2:4
    #: compressed (:mod:`convkernels.gpu.mma.sparse`: K tiles of B hold ``TK / 2`` values)
    BZ = property(lambda s: 1)
    CBK = property(lambda s: s.TN * s.CPR // s.BZ // s.NT)  # chunks of a K-major B per thread

    def filter_extra(self, kt: str) -> str:
        """C++ a stage copies besides the filter's values, for the K tile of index ``kt``
        (C++): nothing (a compressed filter's metadata: :mod:`convkernels.gpu.mma.sparse`)."""
        return ""
    CBN = property(lambda s: s.TK * s.NCH // s.NT)  # chunks of an N-major B per thread


def shape(layer: Layer, ctype: str, params, flip: bool = False) -> Shape:
    """The constants of ``layer`` with the tiles of ``params``, for the storage type of
    C++ name ``ctype`` (:data:`PTX`)."""
    L = layer_constants(layer, Layout.NDHWC)
    ptx, _ = PTX[ctype]
    eb = VALUE_BYTES.get(ptx, 2)
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
    """Every image's offsets in int32 (``convkernels.gpu.simt.tiles.supports``)."""
    return simt_tiles.supports(layer, params)
