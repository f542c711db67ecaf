"""The pipelined implicit GEMM: a main loop in the shape of CUTLASS's SIMT kernels, one
program for NDHWC and NCDHW (``implicitGemmPipelined``, ``implicitGemmPipelinedNCDHW``).

The GEMM is the implicit GEMM of ``_igemm`` (M = output pixels, N = output channels,
K = filter taps x input channels), with the reduction ordered **tap-major**: K tile ``j``
is tap ``j / CB`` (``kd, kh, kw``) and channel block ``j % CB`` of ``CTAtileK`` channels,
``CB`` = channels / CTAtileK rounded up.  Per block of ``NT`` threads (``t``; ``ti = t %
NTM`` along M, ``tj = t / NTM`` along N):

* **Gather, once per thread.**  Before the K loop each thread decodes the one output
  pixel whose A values it stages (its window origin and image offset) and the one output
  channel whose B values it stages, into registers (``st``).  No table, no padded copy
  of the input: a tap outside the input is a zero-filled copy.
* **Staging by cp.async.**  Per K tile a thread copies a run of ``KVA`` consecutive
  reduction values of its pixel into shared memory (``As[stage][m][k]``, m-major, rows
  padded to ``TK + 4`` floats against bank conflicts) and ``KVB`` values of its filter
  row (``Bs[stage][n][k]``), in vectors of 16, 8 or 4 bytes where the layout keeps them
  contiguous (NDHWC, channels a multiple of the vector) and of 4 bytes otherwise, with
  ``cp.async`` and its zero-fill for the border (the source size is 0).
* **Stages.**  ``stages`` K tiles are in flight: the prologue issues tiles 0 to
  ``stages - 2``; step ``kt`` issues tile ``kt + stages - 1`` into the stage that step
  ``kt - 1`` computed from, computes tile ``kt`` from its stage, and waits until at most
  ``stages - 2`` groups of its copies are pending, so that tile ``kt + 1`` is complete;
  the block's barrier at the end of the step makes every thread's copies visible.
* **The FMA loop.**  For each 4 reduction values a thread loads its ``threadTileM`` rows
  of A and ``threadTileN`` columns of B as 128-bit vectors (``LDS.128``) and issues
  ``4 * threadTileM * threadTileN`` FMAs into its accumulators.  Its rows are ``ti + r *
  NTM`` and its columns ``tj + s * NTN``: a quarter warp reads 8 different rows (the
  padding puts them in different banks) and one column (a broadcast).
* **Epilogue.**  Each accumulator is stored to its output element, bounds-checked.

On the CPU the same tasklet code runs thread by thread: ``cp.async`` is a copy (or a
zero fill), the waits do nothing, and a stage is never written while another thread of
the step reads it (steps run in order, and a step writes the stage the previous step
read).  So the CPU check covers the gather, the staging layout, the fragments and the
epilogue; only the asynchronous copies and the barrier are the GPU's own.
"""


import dataclasses
from typing import Optional

import dace
import numpy as np

from convbench.registry import Layer, Layout, Param
from impls import _tiling as T
from impls._common import layer_constants
from impls._pipelined_tasklets import set_code  # (P.set_code: _pipelined_bwd)
from impls._stable import stable_program

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

    CB = property(lambda s: -(-s.C // s.TK))
    KT = property(lambda s: s.taps * s.CB)
    GM = property(lambda s: s.N * s.OD * s.OH * s.OW)
    GMp = property(lambda s: T.round_up(s.GM, s.TM))
    GNp = property(lambda s: T.round_up(s.K, s.TN))

    @property
    def VA(self): return vector_width(self.KVA, self.C if self.layout == Layout.NDHWC else 1)

    @property
    def VB(self):  # the flipped filter's reduction channels are a whole filter apart
        return vector_width(self.KVB, self.C if self.layout == Layout.NDHWC and not self.flip
                            else 1)


def vector_width(run: int, contiguous: int) -> int:
    """Floats per copy: the largest of 4, 2, 1 that divides the run a thread copies and
    the contiguous extent (the channels in NDHWC, 1 where channels are strided)."""
    return next(v for v in (4, 2, 1) if run % v == 0 and contiguous % v == 0)


def shape(layer: Layer, layout: Layout, params, flip: bool = False) -> Shape:
    return Shape.of(layer, layout, params, flip=flip)


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


# ---------------------------------------------------------------------------------------------
# The tasklets' C++
# ---------------------------------------------------------------------------------------------

#: The per-thread state, in registers across the K loop.  ``st`` (int32): the staged
#: pixel's window origin; the next K tile to stage (its tap ``kd, kh, kw`` and first
#: channel ``c0``; ``kd`` reaches the filter depth past the last tile); the stage it goes
#: to and the stage the next step computes from.  ``sb`` (int64): the staged pixel's image
#: offset (-1 past the GEMM's rows) and the staged filter row's (-1 past the channels).
ST = ("d0", "h0", "w0", "kd", "kh", "kw", "c0", "sslot", "cslot")
SB = ("abase", "bbase")


def _load_state(s: Shape, writable: bool) -> str:
    """C++ locals of the state (``sti``/``sbi``: the arrays, row ``tp``)."""
    const = "" if writable else "const "
    ints = "\n".join(f"{const}int {n} = sti[tp * {len(ST)} + {i}];" for i, n in enumerate(ST))
    wide = "\n".join(f"const int64_t {n} = sbi[tp * {len(SB)} + {i}];" for i, n in enumerate(SB))
    return ints + "\n" + wide


def _store_state(names) -> str:
    return "\n".join(f"sto[tp * {len(ST)} + {ST.index(n)}] = {n};" for n in names)


def _stage_code(s: Shape) -> str:
    """C++ that stages the K tile at (``kd, kh, kw``, ``c0``) into stage ``sslot`` (this
    thread's part), then advances those to the next tile and stage: no division, the
    reduction walks channel blocks, then taps.  Where the channels fill whole K tiles,
    a run never passes the last channel: one address and one predicate per run, the
    run's copies at constant distances from it."""
    ndhwc = s.layout == Layout.NDHWC
    full = s.C % s.TK == 0
    spatial = "((dd * {H} + hh) * {W} + ww)".format(H=s.H, W=s.W)
    a_step, b_step = (1, 1) if ndhwc else (s.D * s.H * s.W, s.taps)
    if s.flip:  # a reduction channel of the flipped filter is an output channel of w
        b_step = s.taps * s.K
    # a run's first channel; where a K tile may reach past the last channel, clamped to it
    # (the copies past it are zero fills), so that no offset leaves the image's int32 range
    ca = "(c0 + akv)" if full else f"(c0 + akv < {s.C} ? c0 + akv : {s.C - 1})"
    cb = "(c0 + bkv)" if full else f"(c0 + bkv < {s.C} ? c0 + bkv : {s.C - 1})"
    a_off = (f"abase + (int64_t)({spatial} * {s.C} + {ca})" if ndhwc else
             f"abase + (int64_t)({ca} * {a_step} + {spatial})")
    tap = f"((kd * {s.KH} + kh) * {s.KW} + kw)"
    if s.flip:  # w[c][n][taps-1-tap] (NCDHW), w[c][taps-1-tap][n] (NDHWC); bbase: n's part
        flipped = f"({s.taps - 1} - {tap})"
        b_off = (f"bbase + (int64_t)({cb} * {b_step} + {flipped} * {s.K})" if ndhwc
                 else f"bbase + (int64_t)({cb} * {b_step} + {flipped})")
    else:
        b_off = (f"bbase + (int64_t)({tap} * {s.C} + {cb})" if ndhwc
                 else f"bbase + (int64_t)({cb} * {b_step} + {tap})")

    def copies(dst, run, vec, step, ok):
        if full:
            return f"""    #pragma unroll
    for (int e = 0; e < {run}; e += {vec})
        cb_cp_async<{4 * vec}>({dst} + e, src + e * {step}, {ok});"""
        return f"""    #pragma unroll
    for (int e = 0; e < {run}; e += {vec}) {{
        const bool oke = {ok} && c0 + {dst[0]}kv + e < {s.C};
        cb_cp_async<{4 * vec}>({dst} + e, oke ? src + e * {step} : base, oke);
    }}"""
    return f"""if (kd < {s.KD}) {{ // a K tile is left to stage: tap (kd, kh, kw), channels c0..
    const int dd = d0 + kd, hh = h0 + kh, ww = w0 + kw;
    const bool inside = abase >= 0 && (unsigned)dd < {s.D}u && (unsigned)hh < {s.H}u
                        && (unsigned)ww < {s.W}u;
    float* adst = As_ + sslot * {s.TM * s.TKP} + am * {s.TKP} + akv;
    {{
    const float* base = xa;
    const float* src = inside ? xa + ({a_off}) : xa;
{copies("adst", s.KVA, s.VA, a_step, "inside")}
    }}
    float* bdst = Bs_ + sslot * {s.TN * s.TKP} + bn * {s.TKP} + bkv;
    {{
    const float* base = wb;
    const float* src = bbase >= 0 ? wb + ({b_off}) : wb;
{copies("bdst", s.KVB, s.VB, b_step, "bbase >= 0")}
    }}
    c0 += {s.TK};
    if (c0 >= {s.C}) {{
        c0 = 0;
        if (++kw == {s.KW}) {{ kw = 0; if (++kh == {s.KH}) {{ kh = 0; ++kd; }} }}
    }}
}}
sslot = sslot + 1 == {s.S} ? 0 : sslot + 1;
cb_cp_commit();"""


def _thread_code(s: Shape, gpu: bool) -> str:
    """C++ that names this thread's row in the per-thread arrays (``tp``: 0 on the GPU,
    where each thread's arrays are its own registers), its tile coordinates, and the row
    and run of A and B values it stages."""
    tp = "0" if gpu else "(int)t"
    return f"""const int tp = {tp};
const int ti = (int)t % {s.NTM}, tj = (int)t / {s.NTM};
const int am = {_a_row(s)}, akv = {_a_run(s)};
const int bn = {_b_row(s)}, bkv = {_b_run(s)};
(void)ti; (void)tj; (void)am; (void)akv; (void)bn; (void)bkv;"""


def _a_row(s: Shape) -> str:
    # NCDHW: consecutive threads on consecutive pixels (consecutive w: coalesced);
    # NDHWC: consecutive threads on consecutive channel runs of one pixel
    return f"(int)t % {s.TM}" if s.layout == Layout.NCDHW else f"(int)t / {s.NT // s.TM}"


def _a_run(s: Shape) -> str:
    return (f"((int)t / {s.TM}) * {s.KVA}" if s.layout == Layout.NCDHW
            else f"((int)t % {s.NT // s.TM}) * {s.KVA}")


def _b_row(s: Shape) -> str:
    return f"(int)t % {s.TN}" if s.layout == Layout.NCDHW else f"(int)t / {s.NT // s.TN}"


def _b_run(s: Shape) -> str:
    return (f"((int)t / {s.TN}) * {s.KVB}" if s.layout == Layout.NCDHW
            else f"((int)t % {s.NT // s.TN}) * {s.KVB}")


def prologue_code(s: Shape, gpu: bool) -> str:
    """Zero the accumulators, decode the staged pixel and filter row, issue the first
    ``stages - 1`` K tiles, and wait for the first."""
    return f"""{_thread_code(s, gpu)}
#pragma unroll
for (int i = 0; i < {s.RM * s.RN}; ++i) acco[tp * {s.RM * s.RN} + i] = 0.0f;
{staged_pixel(s)}
    const int64_t n = (int64_t)blk_n + bn;
    if (n < {s.K}) bbase = n * {_b_row_stride(s)};
}}
int kd = 0, kh = 0, kw = 0, c0 = 0, sslot = 0;
const int cslot = 0;
for (int j = 0; j < {s.S - 1}; ++j) {{
{indent(_stage_code(s), 4)}
}}
{_store_state(ST)}
sbo[tp * {len(SB)}] = abase;
sbo[tp * {len(SB)} + 1] = bbase;
cb_cp_wait<{s.S - 2}>();
"""


def staged_pixel(s) -> str:
    """C++ declaring the staged pixel's window origin (``d0, h0, w0``), its image's offset
    (``abase``, -1 past the GEMM's rows) and ``bbase`` (-1), and decoding the output
    pixel of A's row ``am``; it leaves a block open for the caller's filter row."""
    plane = s.OD * s.OH * s.OW
    return f"""int d0 = 0, h0 = 0, w0 = 0;
int64_t abase = -1, bbase = -1;
{{
    const int64_t m = (int64_t)blk_m + am;
    if (m < {s.GM}) {{
        const int64_t b = m / {plane};
        const int p = (int)(m - b * {plane});
        const int od = p / {s.OH * s.OW};
        const int oh = (p - od * {s.OH * s.OW}) / {s.OW};
        const int ow = p - od * {s.OH * s.OW} - oh * {s.OW};
        d0 = od * {s.SD} - {s.PD};
        h0 = oh * {s.SH} - {s.PH};
        w0 = ow * {s.SW} - {s.PW};
        abase = b * {s.C * s.D * s.H * s.W};
    }}"""


def _b_row_stride(s: Shape) -> int:
    """Elements between the filter values of consecutive GEMM columns (output channels)."""
    if not s.flip:
        return s.taps * s.C
    return s.taps if s.layout == Layout.NCDHW else 1


def indent(text: str, n: int) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())


def fma_loop(s: Shape) -> str:
    """C++ of the main loop's arithmetic, the part every pass shares: from stage ``cslot``
    of ``As_`` (rows of A, m-major) and ``Bs_`` (rows of B, n-major), per 4 reduction
    values this thread's ``threadTileM`` rows and ``threadTileN`` columns as 128-bit
    loads, then their FMAs into ``acc``.  A pass differs in its gathers (what it stages)
    and its epilogue (where it stores), not here."""
    body = []
    for r in range(s.RM):
        for c in range(s.RN):
            body.append(f"acc[{r * s.RN + c}] += av[{r}].{{q}} * bv[{c}].{{q}};")
    fmas = "\n        ".join(line.format(q=q) for q in "xyzw" for line in body)
    return f"""const float* a = As_ + cslot * {s.TM * s.TKP} + ti * {s.TKP};
const float* b = Bs_ + cslot * {s.TN * s.TKP} + tj * {s.TKP};
#pragma unroll
for (int k4 = 0; k4 < {s.TK}; k4 += 4) {{
    cb_f4 av[{s.RM}], bv[{s.RN}];
    #pragma unroll
    for (int r = 0; r < {s.RM}; ++r) av[r] = cb_ld4(a + r * {s.NTM * s.TKP} + k4);
    #pragma unroll
    for (int c = 0; c < {s.RN}; ++c) bv[c] = cb_ld4(b + c * {s.NTN * s.TKP} + k4);
    {{
        {fmas}
    }}
}}"""


def step_code(s: Shape, gpu: bool) -> str:
    """Step ``kt`` of the K loop: issue the next K tile, compute the K tile in stage
    ``cslot``, wait for the tile after it."""
    return f"""{_thread_code(s, gpu)}
{_load_state(s, writable=True)}
{_stage_code(s)}
{{
    float* acc = acco + tp * {s.RM * s.RN};
{indent(fma_loop(s), 4)}
}}
cslot = cslot + 1 == {s.S} ? 0 : cslot + 1;
{_store_state(("kd", "kh", "kw", "c0", "sslot", "cslot"))}
cb_cp_wait<{s.S - 2}>();
"""


def epilogue_code(s: Shape, gpu: bool) -> str:
    """Store each accumulator to its output element."""
    plane = s.OD * s.OH * s.OW
    if s.layout == Layout.NDHWC:
        store = f"yo[m * {s.K} + n] = acc[r * {s.RN} + c];"
    else:
        store = (f"{{ const int64_t b = m / {plane}; "
                 f"yo[(b * {s.K} + n) * {plane} + (m - b * {plane})] = acc[r * {s.RN} + c]; }}")
    return f"""{_thread_code(s, gpu)}
const float* acc = acci + tp * {s.RM * s.RN};
#pragma unroll
for (int r = 0; r < {s.RM}; ++r) {{
    const int64_t m = (int64_t)blk_m + ti + r * {s.NTM};
    #pragma unroll
    for (int c = 0; c < {s.RN}; ++c) {{
        const int64_t n = (int64_t)blk_n + tj + c * {s.NTN};
        if (m < {s.GM} && n < {s.K}) {store}
    }}
}}
"""


def forward_code():
    """The forward's tasklet code, by role (looked up when called)."""
    return {"prologue": prologue_code, "step": step_code, "epilogue": epilogue_code}


# ---------------------------------------------------------------------------------------------
# The program
# ---------------------------------------------------------------------------------------------

def program(layer: Layer, layout: Layout, dtype, params, flip: bool = False,
            w_shape=None, s=None, code=None) -> dace.SDFG:
    """The pipelined implicit GEMM of ``layer`` in ``layout`` (module docstring); the
    tasklets hold the CPU's C++ until a schedule sets its target's.  ``flip``: ``layer``
    is a data gradient's ``transposed_layer`` and the program takes the forward filter,
    of shape ``w_shape``.  ``s`` and ``code``: another main loop's constants and tasklet
    code on the same skeleton (the tensor-core kernels, ``impls/_mma.py``); its
    accumulators are ``dtype``'s sums, its stages 4-byte words."""
    s = s or shape(layer, layout, params, flip)
    L = layer_constants(layer, layout)
    x_shape = unpadded(layer, layout)
    w_shape = tuple(w_shape or L.w_shape)
    XS, WS, YS = int(np.prod(x_shape)), int(np.prod(w_shape)), int(np.prod(L.y_shape))
    dt, at = dtype.dace, dtype.acc_dace
    NT, RR, KT = s.NT, s.RR, s.KT
    NSI, NSB = len(ST), len(SB)
    AS, BS = s.AS, s.BS

    @stable_program
    def igemm_pipelined(x: dt[x_shape], w: dt[w_shape], y: dt[L.y_shape]):
        xf = np.reshape(x, [XS])
        wf = np.reshape(w, [WS])
        yf = np.reshape(y, [YS])
        for blk_n, blk_m in dace.map[0:s.GNp:s.TN, 0:s.GMp:s.TM]:  # blk_m: grid x
            acc = np.ndarray([NT, RR], at)
            st = np.ndarray([NT, NSI], dace.int32)
            sb = np.ndarray([NT, NSB], dace.int64)
            As = np.ndarray([AS], dace.float32)
            Bs = np.ndarray([BS], dace.float32)
            for t in dace.map[0:NT]:
                with dace.tasklet:  # the prologue: its C++ is set below
                    xa << xf(1)[:]
                    wb << wf(1)[:]
                    acco >> acc(-1)[:, :]
                    sto >> st(-1)[:, :]
                    sbo >> sb(-1)[:, :]
                    ao >> As(-1)[:]
                    bo >> Bs(-1)[:]
                    acco[0, 0] = xa[0] + wb[0]
                    sto[0, 0] = 0
                    sbo[0, 0] = 0
                    ao[0] = 0
                    bo[0] = 0
            for kt in dace.map[0:KT]:
                for t in dace.map[0:NT]:
                    with dace.tasklet:  # one step of the K loop
                        xa << xf(1)[:]
                        wb << wf(1)[:]
                        sti << st(1)[:, :]
                        sbi << sb(1)[:, :]
                        ai << As(1)[:]
                        bi << Bs(1)[:]
                        acci << acc(1)[:, :]
                        acco >> acc(-1)[:, :]
                        sto >> st(-1)[:, :]
                        ao >> As(-1)[:]
                        bo >> Bs(-1)[:]
                        acco[0, 0] = acci[0, 0] + ai[0] * bi[0] + xa[0] + wb[0] + sbi[0, 0]
                        sto[0, 0] = sti[0, 0]
                        ao[0] = 0
                        bo[0] = 0
            for t in dace.map[0:NT]:
                with dace.tasklet:  # the epilogue
                    acci << acc(1)[:, :]
                    yo >> yf(-1)[:]
                    yo[0] = acci[0, 0]

    sdfg = igemm_pipelined.to_sdfg(simplify=True)
    set_code(sdfg, s, gpu=False, code=code or forward_code())
    return sdfg


def unpadded(layer: Layer, layout: Layout):
    from convbench.registry import stored_shape
    return stored_shape(layout, "x", layer.input_shape)


# ---------------------------------------------------------------------------------------------
# Schedules and registration
# ---------------------------------------------------------------------------------------------

def schedule(target: str, layout: Layout, kernel=None):
    """The tiled schedule (``_tiling.tiled_schedule``: block map on the grid or the CPU's
    cores, the thread map on a block's threads or a loop, the stages in shared memory, the
    accumulators and the staging state in registers), then the target's C++.  ``kernel(
    layer, params) -> (shape, code)``: what :func:`set_code` gets (the forward's by
    default).  On the GPU a transient between kernels (the filter gradient's partials)
    is allocated once, with the program."""
    base = T.tiled_schedule(target, threads=("t",), sequential=("kt",), shared=("As", "Bs"),
                            private={"acc": 1, "st": 1, "sb": 1})
    kernel = kernel or (lambda layer, params: (shape(layer, layout, params), forward_code()))

    def apply(sdfg, layer, params):
        base(sdfg, layer, params)
        gpu = target == "gpu"
        s, code = kernel(layer, params)
        set_code(sdfg, s, gpu, code)
        if gpu:
            T.vector_shared(sdfg, ("As", "Bs"), ("ai", "ao", "bi", "bo"))
            T.const_inputs(sdfg, ("xa", "wb"))
            for desc in sdfg.arrays.values():
                if (desc.transient and desc.storage == dace.StorageType.GPU_Global
                        and not isinstance(desc, dace.data.View)):
                    desc.lifetime = dace.AllocationLifetime.Persistent

    return apply


def implementation(**fields):
    """The registration of a pipelined forward kernel: ``fields`` (name, summary, layout)
    and what both layouts share."""
    from convbench.registry import Implementation, Pass
    layout = fields["layout"]
    return Implementation(
        pass_=Pass.FWD, algorithm=lambda layer, dtype, values: program(layer, layout, dtype,
                                                                         values),
        schedules={t: schedule(t, layout) for t in ("cpu", "gpu")}, params=PARAMS,
        check_params=check_params, supports=supports,
        constraints="one image of the input below 2^31 elements",
        **dict({"default_for": ("best-of",)}, **fields))

