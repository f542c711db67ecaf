"""The filter gradient on Hopper's tensor cores (``implicitGemmWGMMABwdFilter``, NDHWC): the
slices of the pipelined filter gradient (:mod:`convkernels.gpu.simt.filter_gradient`: K
tiles of pixels of one output row, split-K into float32 partials that a second kernel adds
in slice order) with the wgmma main loop of :mod:`convkernels.gpu.wgmma.program`.

The GEMM is M = K output channels by N = C x taps filter values (``n = tap * C + c``) over
the batch's output pixels, as in the mma.sync kernel
(:mod:`convkernels.gpu.mma.filter_gradient`).  Both operands have their M or N index
contiguous in memory (dL/dy's channels, the input's channels at one tap) and the
reduction index (the pixel) strided, so the two precisions stage them differently:

- **16 bits: M- and N-major.**  ``wgmma`` reads both operands transposed (its transpose
  flags set).  A stage holds, per 64 consecutive channels (a *slab*, 128 bytes a pixel),
  the K tile's 64 pixels as rows of 128 bytes, swizzled in 128-byte atoms of 8 pixel
  rows: element (channel ``m``, pixel ``p``) at ``(m / 64) SLAB + 128 p + 2 (m % 64)``
  with the 16-byte chunk XOR ``p % 8``.  The descriptors carry SBO = 1024 (8 pixel rows)
  and LBO = SLAB = 8 KiB (the next 64 channels); a wgmma step (16 pixels) is 2048 bytes
  on.  Each ``cp.async`` copies one 16-byte chunk (8 channels of one pixel), the copies
  of the mma.sync kernel (:func:`convkernels.gpu.mma.filter_gradient.stage_nmajor`) into
  this layout.
- **TF32: K-major.**  TF32 ``wgmma`` has no transpose, so the stage is the forward's
  layout (a row of 128 bytes, 32 pixels, per channel or filter value; 8-row atoms, SBO
  1024) and each ``cp.async`` copies one 4-byte value into it: the copies transpose.  A
  warp's 32 copies are 8 consecutive channels x 4 consecutive pixels: 32 bytes of each
  of 4 pixels from global memory, 32 different banks in shared memory.

The steps keep the forward's pipeline: ``stages - 2`` K tiles ahead, one wgmma group in
flight while the next tile lands, the stage of a group overwritten two steps after it was
issued.  The CPU schedule runs the same code thread by thread and decodes both descriptors
(:mod:`convkernels.gpu.wgmma.ptx`, M- and N-major in 16 bits), so a wrong swizzle mode,
SBO, LBO or accumulator mapping fails on the CPU.
"""

import dataclasses
from typing import Optional

from convkernels.gpu import dynamic_shared
from convkernels.gpu.mma import epilogue
from convkernels.gpu.mma import filter_gradient as mma_wgrad
from convkernels.gpu.pipeline import skeleton
from convkernels.gpu.pipeline.tasklets import indent
from convkernels.gpu.simt import filter_gradient as wg
from convkernels.gpu.wgmma import program as wgmma
from convkernels.gpu.wgmma import ptx as wptx
from convkernels.layer import Layer
from convkernels.layouts import Layout, Pass

#: The forward's tiles and stages, read as the filter gradient's GEMM, and the slices.
_HELP = {"CTAtileM": "output channels (GEMM rows) per thread block: 64 per warpgroup",
         "CTAtileN": "filter values (GEMM columns, of C x taps) per thread block: the N of "
                     "each wgmma (64 to 256)",
         "CTAtileK": "output pixels of one output row per K tile in 16 bits (TF32: 32): 128 "
                     "bytes, the width of the 128-byte swizzle (fixed)"}
PARAMS = tuple(dataclasses.replace(p, help=_HELP.get(p.name, p.help)) for p in wgmma.PARAMS) \
    + tuple(p for p in mma_wgrad.PARAMS if p.name == "splitK")

#: The tiles and stages a search tries (the GPU tune space is the same).
SEARCH_SPACE = wgmma.SEARCH_SPACE

#: What the tests plant: the descriptors' fields.  ``lbo`` None: the slab (16 bits, where
#: it is read) or the K-major default (TF32, where it is not).
DESCRIPTOR = {"mode": wptx.SWIZZLE_MODE, "sbo": wptx.SBO_BYTES, "lbo": None}

#: Pixel rows of one 8-row swizzle atom, and a warp's TF32 copies: 8 values x 4 pixels.
ATOM_ROWS, COPY_ROWS = 8, 8


@dataclasses.dataclass(frozen=True)
class WGShape(mma_wgrad.WTShape):
    """The constants of one build: the mma.sync filter gradient's with a warp tile of 16 x
    ``CTAtileN`` (a warpgroup's 64 rows in four warps) and the wgmma staging."""

    #: 16-bit operands staged M- and N-major; TF32 ones K-major
    mn_major = property(lambda s: s.EB == 2)
    #: Bytes from one 64-value slab of an MN-major stage to the next (the LBO)
    SLAB = property(lambda s: s.TK * wptx.ROW_BYTES)
    #: wgmma per K tile: 16 pixels each (16 bits), or 32 bytes of the rows (TF32)
    STEPS = property(lambda s: s.TK // s.KM if s.mn_major else s.TK * s.EB // 32)

    def swizzle(self, operand: str, cpr: int, row: str, chunk: str) -> str:
        """The stored chunk of chunk ``chunk`` (8 channels) of pixel row ``row`` in the
        slab layout (module docstring); the mma.sync kernel's copies call it."""
        return (f"((({chunk}) >> 3) * {self.TK * ATOM_ROWS} + ({row}) * {ATOM_ROWS}"
                f" + ((({chunk}) & 7) ^ (({row}) & 7)))")


def _mma_params(params):
    return {**params, "warpTileM": 16, "warpTileN": params["CTAtileN"]}


def shape(layer: Layer, ctype: str, params) -> WGShape:
    return mma_wgrad.wtshape(layer, ctype, _mma_params(params), cls=WGShape)


def check_params(params) -> Optional[str]:
    """The forward's tile checks, and each operand's copies splitting evenly over the
    threads in both stagings."""
    reason = wgmma.check_params(params)
    if reason:
        return reason
    tm, tn = params["CTAtileM"], params["CTAtileN"]
    nt = tm // wgmma.GROUP_ROWS * wgmma.WARPGROUP
    for rows in (tm, tn):
        chunks = rows // 8  # 16 bits: 16-byte chunks of a pixel row
        if nt % chunks or 64 % (nt // chunks):
            return (f"{nt} threads: the {chunks} chunks of a {rows}-value pixel row must "
                    f"divide them, and their rows the K tile's 64 pixels")
        warps, groups = nt // 32, rows // COPY_ROWS  # TF32: 8 x 4 copies a warp at once
        if (groups % warps and warps % groups) or groups * 8 % warps:
            return (f"{nt} threads: the {rows} x 32 TF32 copies of a K tile must split "
                    f"evenly over their {warps} warps")
    return None


# ---------------------------------------------------------------------------------------------
# The tasklets' C++
# ---------------------------------------------------------------------------------------------

def _kmajor(row: str, pixel: str) -> str:
    """C++ of the byte of TF32 value (``row``, ``pixel``) in a K-major stage."""
    return f"(({row}) * 128 + (((({pixel}) >> 2) ^ (({row}) & 7)) << 4) + (({pixel}) & 3) * 4)"


def _split(s: WGShape, rows: int):
    """How a TF32 operand of ``rows`` rows splits over the warps: each warp instruction
    copies 8 rows x 4 pixels (a *quad*), so the operand is ``rows / 8`` row groups x
    ``TK / 4`` quads.  With at least as many groups as warps a warp takes whole groups
    (``groups`` of them, every quad); else a warp takes one group and every ``stride``-th
    quad.  Returns C++ of the group of round ``gi`` and of the quad of round ``qi``, and
    the rounds of each."""
    warps, groups, quads = s.NT // 32, rows // COPY_ROWS, s.TK // 4
    if groups >= warps:
        return f"warp + gi * {warps}", "qi", groups // warps, quads
    return f"warp % {groups}", f"warp / {groups} + qi * {warps // groups}", 1, quads * groups // warps


def _copies(s: WGShape, rows: int, per_row: str, copy: str) -> str:
    """C++ of this thread's TF32 copies of an operand of ``rows`` rows (:func:`_split`):
    per row ``r`` it owns, ``per_row`` (what the row's copies share), then per pixel ``p``
    the ``copy``."""
    group, quad, rounds, per = _split(s, rows)
    return f"""#pragma unroll
for (int gi = 0; gi < {rounds}; ++gi) {{
    const int r = ({group}) * {COPY_ROWS} + (int)t % {COPY_ROWS};
{indent(per_row, 4)}
    #pragma unroll
    for (int qi = 0; qi < {per}; ++qi) {{
        const int p = ({quad}) * 4 + ((int)t / {COPY_ROWS}) % 4;
{indent(copy, 8)}
    }}
}}"""


def _stage_kmajor(s: WGShape) -> str:
    """C++ staging the next K tile of this slice K-major (TF32): 4-byte copies, a row per
    output channel (A) and per filter value (B), zeros past the slice and the borders; a
    thread decodes each of its rows once and copies its pixels."""
    row_ok = "live" if s.full else f"live && ow0 + p < {s.OW}"
    a_ok = row_ok if s.K % s.TM == 0 else f"{row_ok} && m < {s.K}"
    a = _copies(s, s.TM, "const int m = blk_m + r;\nconst auto* ysrc = yb + (ya + m);",
                f"const bool ok = {a_ok};\n"
                f"cb_cp_async<4>(adst + {_kmajor('r', 'p')}, ysrc + (int64_t)p * {s.K}, ok);")
    b = _copies(s, s.TN, "const int n = blk_n + r;\n" + mma_wgrad.b_tap(s, "n"),
                f"const int ww = (ow0 + p) * {s.SW} + kw;\n"
                f"const bool ok = {row_ok} && tapok && (unsigned)ww < {s.W}u;\n"
                f"cb_cp_async<4>(bdst + {_kmajor('r', 'p')}, xrow + (int64_t)ww * {s.C}, ok);")
    return f"""{{ // stage a K tile: pixels ow0.. of output row (od, oh), or zeros past the slice
    const bool live = left > 0;
    char* adst = as + sslot * {s.ASB};
    char* bdst = bs + sslot * {s.BSB};
{indent(a, 4)}
{indent(b, 4)}"""


def _stage_code(s: WGShape) -> str:
    """C++ staging the next K tile (16 bits: the mma.sync kernel's copies into the slab
    layout; TF32: :func:`_stage_kmajor`), stepping the counters, committing the copies."""
    copies = mma_wgrad.stage_nmajor(s) if s.mn_major else _stage_kmajor(s)
    return copies + f"""
{indent(wg.advance_code(s), 4)}
}}
sslot = sslot + 1 == {s.S} ? 0 : sslot + 1;
cb_cp_commit();"""


def _thread_code(s: WGShape, gpu: bool) -> str:
    """The mma.sync kernel's thread coordinates (its chunk columns and rows serve the
    16-bit copies; the TF32 copies read ``t`` themselves)."""
    return mma_wgrad.thread_code(s, gpu) if s.mn_major else f"""const int tp = {"0" if gpu else "(int)t"};
const int lane = (int)t % 32, warp = (int)t / 32;
const int wm = warp % {s.WARPS_M}, wn = warp / {s.WARPS_M};
(void)lane; (void)wm; (void)wn;"""


def _group(s: WGShape, gpu: bool) -> str:
    """This warpgroup's wgmma group on the K tile (:func:`convkernels.gpu.wgmma.program.group_code`):
    its 64 output channels are a slab (16 bits) or 64 rows (TF32) on."""
    if s.mn_major:
        return wgmma.group_code(s, gpu, f"(warp / 4) * {s.SLAB}", s.STEPS,
                                s.KM * wptx.ROW_BYTES)
    return wgmma.group_code(s, gpu, f"(warp / 4) * {wgmma.GROUP_ROWS * wptx.ROW_BYTES}",
                            s.STEPS, 32)


def prologue_code(s: WGShape, gpu: bool) -> str:
    """The mma.sync filter gradient's prologue with this staging: ``stages - 2`` tiles
    ahead, the first waited for and fenced for the async proxy."""
    return mma_wgrad.prologue_code(s, gpu, thread=_thread_code, stage=_stage_code,
                                   ahead=s.S - 2, wait=wgmma.step_wait(s))


def step_code(s: WGShape, gpu: bool) -> str:
    """Stage the tile ``stages - 2`` ahead, issue this tile's wgmma group, wait for the
    previous group and for the next tile."""
    return f"""{mma_wgrad.PREAMBLE}int64_t* sbo = sbs;
{_thread_code(s, gpu)}
{wg.wstate(writable=True)}
{_stage_code(s)}
{_group(s, gpu)}
{wg.wstore(*wg.WSTEP)}
{wgmma.step_wait(s)}"""


def epilogue_code(s: WGShape, gpu: bool) -> str:
    """Wait for the last group; each sum to slice ``blk_z``'s float32 partial."""
    return (wgmma.drain_code(s, gpu) + f"{_thread_code(s, gpu)}\n" + epilogue.store_code(
        s, s.K, s.CT, f"yo[((int64_t)blk_z * {s.K} + m) * {s.CT} + n]"))


def code():
    """The tasklet code by role (looked up when called, so a test can plant a bug)."""
    return {"prologue": prologue_code, "step": step_code, "epilogue": epilogue_code,
            "reduce": wg.wgrad_reduce}


def helpers(s: WGShape, gpu: bool) -> str:
    """The wgmma helpers of a build (M- and N-major in 16 bits), with :data:`DESCRIPTOR`."""
    lbo = DESCRIPTOR["lbo"] or (s.SLAB if s.mn_major else wptx.LBO_BYTES)
    return wptx.helpers(s.ptx, s.KM, s.TN, gpu, mode=DESCRIPTOR["mode"],
                        sbo=DESCRIPTOR["sbo"], lbo=lbo, mn_major=s.mn_major)


# ---------------------------------------------------------------------------------------------
# The program, its schedules and registration
# ---------------------------------------------------------------------------------------------

def program(layer: Layer, dtype, params):
    """The pipelined filter gradient's program of ``layer`` (NDHWC) with the wgmma code and,
    for the CPU, its emulation."""
    s = shape(layer, dtype.dace.ctype, params)
    sdfg = wg.wgrad_program(layer, Layout.NDHWC, dtype, params, s=s, code=code())
    sdfg.append_global_code(helpers(s, gpu=False), "frame")
    return sdfg


def schedule(target: str):
    """The skeleton's schedule with the wgmma code; on the GPU the stages go to dynamic
    shared memory."""
    def apply(sdfg, layer, params):
        if target == "gpu":
            dynamic_shared.register()
        s = shape(layer, sdfg.arrays["x"].dtype.ctype, params)
        skeleton.schedule(target, Layout.NDHWC, kernel=lambda *_: (s, code()))(sdfg, layer, params)
        sdfg.append_global_code(helpers(s, target == "gpu"),
                                "cuda" if target == "gpu" else "frame")
    return apply


def fields(**given):
    """What the wgmma filter gradient registers with: ``given`` (name, summary, ...) and
    the rest of the registry's fields."""
    return wgmma.fields(
        pass_=Pass.BWD_FILTER, algorithm=program,
        schedules={t: schedule(t) for t in ("cpu", "gpu")}, supports=wg.wgrad_supports,
        constraints="one image of the input and of dL/dy below 2^31 elements",
        search_space=SEARCH_SPACE, params=PARAMS, check_params=check_params, **given)
