"""The SIMT main loop's tiles and stages: its tunable parameters, the constants of one
build (:class:`Tiles`, what every pass shares; :class:`Shape`, the forward's and the data
gradient's), their checks, and the layers it supports."""

import dataclasses
from typing import Optional

from convkernels.declarations import Param
from convkernels.gpu import tiling as T
from convkernels.layer import Layer, layer_constants
from convkernels.layouts import Layout


#: Shared-memory rows are padded by this many floats (16 bytes): 8 rows read by a quarter
#: warp land in 8 different groups of four banks for CTAtileK of 8 and 16.
ROW_PAD = 4

PARAMS = (
    Param("CTAtileM", 128, "output pixels (GEMM rows) per thread block", T.power_of_two),
    Param("CTAtileN", 128, "output channels (GEMM columns) per thread block", T.power_of_two),
    Param("CTAtileK", 8, "reduction values per K tile (one tap, that many channels; a "
          "multiple of 8)", T.power_of_two),
    Param("threadTileM", 8, "rows of the per-thread register tile", T.power_of_two),
    Param("threadTileN", 8, "columns of the per-thread register tile", T.power_of_two),
    Param("stages", 3, "K tiles in flight (cp.async stages in shared memory)"),
)


#: Blocks an automatic split aims at: two per SM of an H100 or H200 (132 SMs), so that
#: the grid's last wave is at most half idle.
AUTO_BLOCKS = 264

#: The forward's and the data gradient's split of the reduction (split-K).
SPLIT_K = Param("splitK", 1, "slices of the reduction (split-K), each summed into its own "
                "float32 partial and added in slice order by a second kernel (1: none; 0: "
                f"where the output tiles give fewer than {AUTO_BLOCKS} blocks, as many as "
                "make that many, each of at least `stages` K tiles)", minimum=0)


@dataclasses.dataclass(frozen=True)
class Tiles:
    """The constants of one build: the layer's and the tiles'; what every pass shares."""

    layout: Layout
    N: int
    C: int
    K: int
    D: int
    H: int
    W: int
    KD: int
    KH: int
    KW: int
    SD: int
    SH: int
    SW: int
    PD: int
    PH: int
    PW: int
    OD: int
    OH: int
    OW: int
    TM: int
    TN: int
    TK: int
    RM: int
    RN: int
    S: int

    NTM = property(lambda s: s.TM // s.RM)
    NTN = property(lambda s: s.TN // s.RN)
    NT = property(lambda s: s.NTM * s.NTN)
    TKP = property(lambda s: s.TK + ROW_PAD)
    taps = property(lambda s: s.KD * s.KH * s.KW)
    KVA = property(lambda s: s.TK * s.TM // s.NT)   # A values a thread stages per tile
    KVB = property(lambda s: s.TK * s.TN // s.NT)   # B values a thread stages per tile
    RR = property(lambda s: s.RM * s.RN)            # accumulators per thread
    AS = property(lambda s: s.S * s.TM * s.TKP)     # 4-byte words of A's stages
    BS = property(lambda s: s.S * s.TN * s.TKP)     # and of B's

    @classmethod
    def of(cls, layer: Layer, layout: Layout, params, **more):
        """The constants of ``layer`` in ``layout`` with the tiles of ``params``."""
        L = layer_constants(layer, layout)
        return cls(layout, L.N, L.C, L.K, L.D, L.H, L.W, L.KD, L.KH, L.KW, L.SD, L.SH, L.SW,
                   L.PD, L.PH, L.PW, L.OD, L.OH, L.OW, params["CTAtileM"], params["CTAtileN"],
                   params["CTAtileK"], params["threadTileM"], params["threadTileN"],
                   params["stages"], **more)


@dataclasses.dataclass(frozen=True)
class Shape(Tiles):
    """The forward's (and the data gradient's) constants."""

    #: The data gradient: the layer is ``transposed_layer`` of the forward one, and B is
    #: the forward filter flipped in space with its channel dimensions swapped, read so
    #: while it is staged (no copy): B[(tap, c), n] = w[c, n, taps - 1 - tap].
    flip: bool = False
    #: Split-K: slices of the reduction, and K tiles per slice (the last may have fewer)
    Z: int = 1
    TPS: int = 0

    split = property(lambda s: s.Z > 1)
    PS = property(lambda s: s.GM * s.K)       # one slice's partial: the whole output
    CB = property(lambda s: -(-s.C // s.TK))
    #: Taps packed into K tiles (the NDHWC forward of a layer with at most half a K tile
    #: of channels, such as CosmoFlow's first layers): the reduction is the filter's flat
    #: (tap, channel) index, K tiles of TK of it, so no tile is mostly zeros; each
    #: thread's run of A values is whole taps (C divides it)
    packed = property(lambda s: s.layout == Layout.NDHWC and not s.flip and 2 * s.C <= s.TK
                      and s.KVA % s.C == 0)
    RF = property(lambda s: s.taps * s.C)     # the flat reduction's length
    KT = property(lambda s: -(-s.RF // s.TK) if s.packed else s.taps * s.CB)
    #: The taps the packed K tiles span (the last past the filter's where TK does not
    #: divide RF)
    table_taps = property(lambda s: s.KT * s.TK // s.C)
    #: Packed with several taps per thread run (1 or 2 channels): each thread keeps a mask
    #: of its pixel's taps inside the input (a 32-bit word: the K tiles span at most 32
    #: taps) and reads each tap's offset from a table
    tap_table = property(lambda s: s.packed and s.C < s.KVA and s.table_taps <= 32)
    GM = property(lambda s: s.N * s.OD * s.OH * s.OW)
    GMp = property(lambda s: T.round_up(s.GM, s.TM))
    GNp = property(lambda s: T.round_up(s.K, s.TN))

    @property
    def VA(self): return vector_width(self.KVA, self.C if self.layout == Layout.NDHWC else 1)

    @property
    def VB(self):  # the flipped filter's reduction channels are a whole filter apart
        if self.packed:  # a filter row is the flat reduction, RF values
            return vector_width(self.KVB, self.RF)
        return vector_width(self.KVB, self.C if self.layout == Layout.NDHWC and not self.flip
                            else 1)


def vector_width(run: int, contiguous: int) -> int:
    """Floats per copy: the largest of 4, 2, 1 that divides the run a thread copies and
    the contiguous extent (the channels in NDHWC, 1 where channels are strided)."""
    return next(v for v in (4, 2, 1) if run % v == 0 and contiguous % v == 0)


def shape(layer: Layer, layout: Layout, params, flip: bool = False) -> Shape:
    """The constants of ``layer`` with the tiles of ``params``, and its slices where
    ``params`` has ``splitK`` (:data:`SPLIT_K`)."""
    s = Shape.of(layer, layout, params, flip=flip)
    return split(s, params.get("splitK", 1))


def blocks(rows: int, cols: int, tm: int, tn: int) -> int:
    """Thread blocks of a ``rows x cols`` output in tiles of ``tm x tn`` (what the
    automatic split compares with :data:`AUTO_BLOCKS`)."""
    return -(-rows // tm) * -(-cols // tn)


def split(s: Shape, wanted: int) -> Shape:
    """``s`` with its reduction in ``wanted`` slices (0: :data:`SPLIT_K`'s rule), as many
    K tiles in each but the last; unchanged where that is one slice."""
    if wanted == 0:
        wanted = min(-(-AUTO_BLOCKS // blocks(s.GM, s.K, s.TM, s.TN)), max(1, s.KT // s.S))
    tps = -(-s.KT // max(1, min(wanted, s.KT)))
    z = -(-s.KT // tps)
    return dataclasses.replace(s, Z=z, TPS=tps) if z > 1 else s


def check_params(params) -> Optional[str]:
    tm, tn, tk = params["CTAtileM"], params["CTAtileN"], params["CTAtileK"]
    rm, rn, s = params["threadTileM"], params["threadTileN"], params["stages"]
    if rm > tm or rn > tn:
        return "threadTileM/N must not exceed CTAtileM/N"
    nt = (tm // rm) * (tn // rn)
    smem = s * (tm + tn) * (tk + ROW_PAD) * T.ELEMENT_BYTES
    return T.require(
        (2 <= s <= 4, f"stages={s}: 2 to 4"),
        (tk % 8 == 0, f"CTAtileK={tk} must be a multiple of 8 (128-bit fragment loads from "
                      "rows padded against bank conflicts: with 4, rows 4 apart share banks)"),
        (nt <= T.MAX_THREADS, f"{nt} threads > {T.MAX_THREADS}"),
        (nt % 32 == 0, f"{nt} threads: a whole number of warps"),
        (nt >= tm and nt >= tn, f"{nt} threads: at least one per row of the A tile ({tm}) "
                                f"and of the B tile ({tn}) (each stages a run of one row)"),
        (tk * tm % nt == 0 and tk * tn % nt == 0,
         f"the {tk}-value rows of A and B must split evenly over {nt} threads"),
        (smem <= T.SHARED_BYTES, f"{s} stages of tiles need {smem} bytes of shared memory "
                                 f"> {T.SHARED_BYTES}"),
    )


def supports(layer: Layer, params) -> Optional[str]:
    # the image offsets are 64-bit; a tap's offset within one image is int32
    image = layer.in_channels * layer.in_d * layer.in_h * layer.in_w
    if image > T.INT32_MAX:
        return f"one image of the input has {image} elements, over int32"
    return None
