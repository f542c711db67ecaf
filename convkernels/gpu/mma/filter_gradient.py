"""The filter gradient on tensor cores (``implicitGemmMMABwdFilter``, NDHWC): the SIMT
filter gradient's skeleton and slices (:mod:`convkernels.gpu.simt.filter_gradient`: K
tiles of ``CTAtileK`` pixels of one output row, split-K into float32 partials added in
slice order by a second kernel) with the tensor-core main loop
(:mod:`convkernels.gpu.mma.mainloop`).

The GEMM is M = K output channels by N = C x taps filter values (NDHWC's order: tap-major,
``n = tap * C + c``) over the batch's output pixels.  Both operands have their reduction
index (the pixel) strided and their GEMM index contiguous (dL/dy's channels, the input's
channels at one tap).

Both are staged **N-major**: a stage row is one pixel, in 16-byte chunks of 8 (16 bits)
or 4 (TF32) consecutive channels, swizzled as the forward's are
(:mod:`convkernels.gpu.mma.layout`); a thread stages one chunk
column of A (``ac``) and one of B (``bc``) in several pixel rows.  In 16 bits the
fragments come through ``ldmatrix.x4.trans``; in TF32, which ``ldmatrix`` cannot
transpose, through one 32-bit shared load per register (the ``lds`` mode).

The filter value of each B copy (its tap and channel) is the same in every step, decoded
from constants.  The CPU schedule emulates ``ldmatrix`` and the MMAs as the forward's does.
"""

import dataclasses
from typing import Optional

from convkernels.layer import Layer, layer_constants
from convkernels.layouts import Layout, Pass
from convkernels.declarations import Param
from convkernels.gpu.mma import epilogue, gather, layout, mainloop, ptx, tiles as mma_tiles
from convkernels.gpu.pipeline import skeleton
from convkernels.gpu.pipeline.tasklets import indent
from convkernels.gpu.simt import filter_gradient as wg

PARAMS = tuple(dataclasses.replace(p, help="output pixels of one output row per K tile in "
                                   "16 bits (TF32: half as many, the same bytes)")
               if p.name == "CTAtileK" else p for p in mma_tiles.PARAMS) + (
    Param("splitK", 0, "slices of the batch x output-pixel reduction, each summed into its "
          f"own float32 partial and added in order by a second kernel (0: as many as give "
          f"{wg.AUTO_BLOCKS} blocks, at most one per K tile)", minimum=0),
)


@dataclasses.dataclass(frozen=True)
class WTShape(mma_tiles.Warps, wg.WShape):
    """The constants of one tensor-core filter-gradient build (``TK``: pixels)."""

    #: both N-major: ldmatrix.trans in 16 bits, 32-bit loads in TF32
    a_mode = property(lambda s: s.nmajor)
    b_mode = property(lambda s: s.nmajor)
    GA = property(lambda s: s.NT // s.NCA)  # pixel rows of A staged at once
    GB = property(lambda s: s.NT // s.NCH)
    VC = property(lambda s: gather.vector(s.C, s.CE))  # B values per copy (one tap)
    VK = property(lambda s: gather.vector(s.K, s.CE))  # A values per copy


def wtshape(layer: Layer, ctype: str, params, cls=WTShape) -> WTShape:
    """The constants of ``layer`` with the tiles of ``params`` (``cls``: the constants'
    class, another main loop's subclass)."""
    ptx, _ = mma_tiles.PTX[ctype]
    eb = 4 if ptx == "tf32" else 2
    tk = params["CTAtileK"] * 2 // eb
    kt = wg.tiles(layer, tk)
    taps = layer.k_d * layer.k_h * layer.k_w
    blocks = (-(-layer.out_channels // params["CTAtileM"])
              * -(-layer.in_channels * taps // params["CTAtileN"]))
    z = params["splitK"] or -(-wg.AUTO_BLOCKS // blocks)
    tps = -(-kt // max(1, min(z, kt)))
    L = layer_constants(layer, Layout.NDHWC)
    return cls(Layout.NDHWC, L.N, L.C, L.K, L.D, L.H, L.W, L.KD, L.KH, L.KW, L.SD, L.SH,
                   L.SW, L.PD, L.PH, L.PW, L.OD, L.OH, L.OW, params["CTAtileM"],
                   params["CTAtileN"], tk, 1, 1, params["stages"], Z=-(-kt // tps), TPS=tps,
                   WM=params["warpTileM"], WN=params["warpTileN"], EB=eb, ptx=ptx)


def check_params(params) -> Optional[str]:
    """The tensor-core tiles' check, and the N-major pixel rows of both operands splitting
    evenly over the threads in 16 bits and in TF32 (chunks of 8 and of 4 values)."""
    tiles = {k: params[k] for k in ("CTAtileM", "CTAtileN", "CTAtileK", "warpTileM",
                                    "warpTileN", "stages")}
    reason = mma_tiles.check_params(tiles)
    if reason:
        return reason
    tm, tn, tk = params["CTAtileM"], params["CTAtileN"], params["CTAtileK"]
    nt = (tm // params["warpTileM"]) * (tn // params["warpTileN"]) * mma_tiles.WARP
    for cols in (tm, tn):
        for ce, rows in ((8, tk), (4, tk // 2)):  # 16 bits, TF32
            if nt % (cols // ce) or rows % (nt // (cols // ce)):
                return (f"{nt} threads: the {cols // ce} chunks of a {cols}-wide row of "
                        f"{ce} values must divide them, and their rows the K tile's "
                        f"{rows} pixels")
    return None


# ---------------------------------------------------------------------------------------------
# The tasklets' C++
# ---------------------------------------------------------------------------------------------

def _rows(s: WTShape, operand: str, chunk: str, row: str, cpr: int) -> str:
    """C++ of the chunk column and first row this thread stages of an operand's rows of
    ``cpr`` chunks: ``t % cpr`` of row ``t / cpr``, or in TF32 the ``t``-th chunk of the
    blocked layout (``convkernels.gpu.mma.layout.blocked_thread``)."""
    if s.nmajor == "lds":
        r, c = layout.blocked_thread(cpr)
        return f"const int {chunk} = {c}, {row} = {r};"
    return f"const int {chunk} = (int)t % {cpr}, {row} = (int)t / {cpr};"


def thread_code(s: WTShape, gpu: bool) -> str:
    return f"""const int tp = {"0" if gpu else "(int)t"};
const int lane = (int)t % {mma_tiles.WARP}, warp = (int)t / {mma_tiles.WARP};
const int wm = warp % {s.WARPS_M}, wn = warp / {s.WARPS_M};
{_rows(s, "a", "ac", "ar", s.NCA)}
{_rows(s, "b", "bc", "br", s.NCH)}
(void)lane; (void)wm; (void)wn; (void)ac; (void)ar; (void)bc; (void)br;"""


def _stage_code(s: WTShape) -> str:
    """C++ staging the next K tile of this slice (zeros past it) into stage ``sslot``;
    then the counters step (``advance_code``)."""
    return stage_nmajor(s) + f"""
{indent(wg.advance_code(s), 4)}
}}
sslot = sslot + 1 == {s.S} ? 0 : sslot + 1;
cb_cp_commit();"""


def b_tap(s: WTShape, n: str) -> str:
    """C++ decoding filter value ``n`` (tap ``n / C``, channel ``n % C``) into the input
    row's offsets and whether its row is inside the input (``tapok``)."""
    return f"""const int tap = {n} / {s.C}, c = {n} - tap * {s.C};
const int kd = tap / {s.KH * s.KW} - {s.PD}, kh = (tap / {s.KW}) % {s.KH} - {s.PH};
const int kw = tap % {s.KW} - {s.PW};
const int dd = od * {s.SD} + kd, hh = oh * {s.SH} + kh;
const bool tapok = {n} < {s.CT} && (unsigned)dd < {s.D}u && (unsigned)hh < {s.H}u;
const auto* xrow = xb + (xr + ((int64_t)(kd * {s.H} + kh) * {s.W}) * {s.C} + c);"""


def _row_chunk(s: WTShape, operand: str, cpr: int, row: str, chunk: str, rows: int) -> str:
    """C++ of the stored index of this thread's chunk in its ``i``-th row (``row + i *
    rows``); in TF32's blocked layout, ``rows`` (a multiple of 4) rows on from the first's."""
    if s.nmajor == "lds":  # the rounds cover whole blocks of 4 rows, and the K tile
        assert rows % 4 == 0 and s.TK % rows == 0 and rows * cpr == s.NT, (rows, cpr, s.TK)
        return f"({s.swizzle(operand, cpr, row, chunk)} + i * {rows * cpr})"
    return s.swizzle(operand, cpr, "r", chunk)


def stage_nmajor(s: WTShape) -> str:
    """Per pixel row of this thread, a chunk of dL/dy's channels (A) and of the input's
    channels at this chunk's taps (B).  A copy outside the tensors gets its address all
    the same, never read: ``cp.async`` with a source size of 0 reads nothing (and the
    CPU's copies skip it), which saves a select of a 64-bit pointer per copy."""
    full = s.OW % s.TK == 0
    row_ok = "live" if full else f"live && ow0 + r < {s.OW}"
    a_ok = row_ok if s.K % s.TM == 0 and s.VK == s.CE else f"{row_ok} && m + v < {s.K}"
    return f"""{{ // stage a K tile: pixels ow0.. of output row (od, oh), or zeros past the slice
    const bool live = left > 0;
    char* adst = as + sslot * {s.ASB};
    char* bdst = bs + sslot * {s.BSB};
    const int m = blk_m + ac * {s.CE};
    #pragma unroll
    for (int i = 0; i < {s.TK // s.GA}; ++i) {{
        const int r = ar + i * {s.GA};
        const auto* src = yb + (ya + (int64_t)r * {s.K} + m);
        char* d = adst + {_row_chunk(s, "a", s.NCA, "ar", "ac", s.GA)} * {layout.CHUNK};
        #pragma unroll
        for (int v = 0; v < {s.CE}; v += {s.VK}) {{
            const bool ok = {a_ok};
            cb_cp_async<{s.VK * s.EB}>(d + v * {s.EB}, src + v, ok);
        }}
    }}
    #pragma unroll
    for (int v = 0; v < {s.CE}; v += {s.VC}) {{
        const int n = blk_n + bc * {s.CE} + v;  // this copy's filter value
{indent(b_tap(s, "n"), 8)}
        #pragma unroll
        for (int i = 0; i < {s.TK // s.GB}; ++i) {{
            const int r = br + i * {s.GB};
            const int ww = (ow0 + r) * {s.SW} + kw;
            const bool ok = {row_ok} && tapok && (unsigned)ww < {s.W}u;
            cb_cp_async<{s.VC * s.EB}>(bdst + {_row_chunk(s, "b", s.NCH, "br", "bc", s.GB)} * {layout.CHUNK}
                                       + v * {s.EB}, xrow + (int64_t)ww * {s.C}, ok);
        }}
    }}"""


#: dL/dy and the input as the filter gradient's tasklets name them (the program passes
#: them as the forward's ``xa`` and ``wb``), and the stages as bytes.
PREAMBLE = ("const auto* yb = xa;\nconst auto* xb = wb;\n"
             "char* as = reinterpret_cast<char*>(ao);\nchar* bs = reinterpret_cast<char*>(bo);\n")


def prologue_code(s: WTShape, gpu: bool, thread=None, stage=None, ahead=None,
                  wait=None) -> str:
    """Zero the sums, decode the slice's first K tile, stage ``ahead`` K tiles (default
    ``stages - 1``) and ``wait`` for the first.  ``thread`` and ``stage``: another main
    loop's thread coordinates and staging (the wgmma filter gradient's)."""
    ahead = s.S - 1 if ahead is None else ahead
    wait = f"cb_cp_wait<{ahead - 1}>();\n" if wait is None else wait
    return f"""{PREAMBLE}{(thread or thread_code)(s, gpu)}
#pragma unroll
for (int i = 0; i < {s.RR}; ++i) acco[tp * {s.RR} + i] = 0.0f;
{wg.slice_start(s)}
const int64_t arow = 0, bcol = 0;
const int kdp = 0, khp = 0, kwp = 0;
int sslot = 0;
const int cslot = 0;
for (int j = 0; j < {ahead}; ++j) {{
{indent((stage or _stage_code)(s), 4)}
}}
{wg.wstore(wg.WST, wg.WSB)}
{wait}"""


def step_code(s: WTShape, gpu: bool) -> str:
    return f"""{PREAMBLE}int64_t* sbo = sbs;
{thread_code(s, gpu)}
{wg.wstate(writable=True)}
{_stage_code(s)}
{{
    float* acc = acco + tp * {s.RR};
{indent(mainloop.mma_loop(s, gpu), 4)}
}}
cslot = cslot + 1 == {s.S} ? 0 : cslot + 1;
{wg.wstore(*wg.WSTEP)}
cb_cp_wait<{s.S - 2}>();
"""


def epilogue_code(s: WTShape, gpu: bool) -> str:
    """Each accumulator to slice ``blk_z``'s float32 partial of its filter value."""
    return f"{thread_code(s, gpu)}\n" + epilogue.store_code(
        s, s.K, s.CT, f"yo[((int64_t)blk_z * {s.K} + m) * {s.CT} + n]")


def code():
    """The tasklet code by role (the SIMT filter gradient's sum of the slices)."""
    return {"prologue": prologue_code, "step": step_code, "epilogue": epilogue_code,
            "reduce": wg.wgrad_reduce}


# ---------------------------------------------------------------------------------------------
# The program, its schedules and registration
# ---------------------------------------------------------------------------------------------

def program(layer: Layer, dtype, params):
    """The SIMT filter gradient's program of ``layer`` (NDHWC) with the tensor cores'
    tasklet code and, for the CPU, their emulation."""
    s = wtshape(layer, dtype.dace.ctype, params)
    sdfg = wg.wgrad_program(layer, Layout.NDHWC, dtype, params, s=s, code=code())
    sdfg.append_global_code(ptx.helpers(s, gpu=False), "frame")
    return sdfg


def schedule(target: str):
    """The skeleton's schedule for ``target`` with the tensor cores' code and its helpers."""
    def apply(sdfg, layer, params):
        s = wtshape(layer, sdfg.arrays["x"].dtype.ctype, params)
        skeleton.schedule(target, Layout.NDHWC, kernel=lambda *_: (s, code()))(sdfg, layer, params)
        sdfg.append_global_code(ptx.helpers(s, target == "gpu"),
                                "cuda" if target == "gpu" else "frame")
    return apply


def fields(**given):
    """What the tensor-core filter gradient registers with: ``given`` (name, summary,
    ...) and the rest of the registry's ``Implementation`` fields."""
    return dict(
        layout=Layout.NDHWC, pass_=Pass.BWD_FILTER, algorithm=program,
        schedules={t: schedule(t) for t in ("cpu", "gpu")}, params=PARAMS,
        check_params=check_params, supports=wg.wgrad_supports, precisions=mma_tiles.PRECISIONS,
        constraints="one image of the input and of dL/dy below 2^31 elements", **given)
