"""The SIMT filter gradient (``implicitGemmPipelinedBwdFilter``,
``implicitGemmPipelinedNCDHWBwdFilter``) on the pipelined program's skeleton: its tiles and
slices, its gathers, one step of its K loop (the forward's FMA loop,
:func:`convkernels.gpu.simt.mainloop.fma_loop`), its epilogue and the sum of its slices.

The filter gradient is a GEMM of M = K output channels by N = C x taps filter values (in
the order of the stored filter, so that GEMM column n is element n of a filter row)
over a reduction of batch x output pixels.  The reduction is walked in K tiles of
``CTAtileK`` consecutive output pixels of one output row (``b, od, oh``; a row of ``OW``
pixels is ``OWT`` tiles, the last one zero-filled past ``OW``) by counters, with no
division.  Its ``KT`` tiles are split into ``Z`` slices of ``TPS`` consecutive tiles
(split-K): block ``(z, n, m)`` sums slice ``z`` of its output tile into its float32
partial ``ws[z]``, and a second kernel adds the partials of each filter value in the
order z = 0, 1, ..., so the result does not depend on the order the blocks run in.

Per K tile a thread stages ``KVA`` values of its output channel's dL/dy (``A``, one run
of consecutive pixels: in NCDHW a contiguous run, 16-byte copies where rows are whole
tiles; in NDHWC 4-byte copies ``K`` apart, consecutive threads on consecutive channels)
and ``KVB`` values of its filter value's input column (``B``: the input at pixel + tap,
4-byte copies, zero-filled at the border), then runs the forward's FMA loop on the
stage.  A slice's steps past its last tile stage zeros.
"""

import dataclasses
from typing import Optional

import dace

from convkernels.declarations import Param
from convkernels.gpu import tiling as T
from convkernels.gpu.pipeline import skeleton
from convkernels.gpu.pipeline.tasklets import indent
from convkernels.gpu.simt import mainloop
from convkernels.gpu.simt import tiles as simt_tiles
from convkernels.layer import Layer, layer_constants
from convkernels.layouts import Layout, Pass


#: Blocks the automatic split aims at (the forward's rule, :data:`simt_tiles.AUTO_BLOCKS`).
AUTO_BLOCKS = simt_tiles.AUTO_BLOCKS


#: The forward's parameters, with K tiles of 16 pixels in 2 stages by default: the copies
#: of a K tile are 4-byte (pixels are strided in NDHWC, and shifted by the tap in the
#: input), so a longer tile spreads the step's fixed work over more FMAs (81-83% FFMA at
#: 16 on the deep CosmoFlow layers against 77-80% at 8), and 3 stages of it would not fit
#: in 48 KB.
_WGRAD_DEFAULTS = {"CTAtileK": 16, "stages": 2}


_WGRAD_HELP = {"CTAtileM": "output channels (GEMM rows) per thread block",
               "CTAtileN": "filter values (GEMM columns, of C x taps) per thread block",
               "CTAtileK": "output pixels of one output row per K tile (a multiple of 8)"}


WGRAD_PARAMS = tuple(dataclasses.replace(p, default=_WGRAD_DEFAULTS.get(p.name, p.default),
                                         help=_WGRAD_HELP.get(p.name, p.help))
                     for p in simt_tiles.PARAMS) + (
    Param("splitK", 0, "slices of the batch x output-pixel reduction, each summed into its "
          f"own float32 partial and added in order by a second kernel (0: as many as give "
          f"{AUTO_BLOCKS} blocks, at most one per K tile)", minimum=0),)


@dataclasses.dataclass(frozen=True)
class WShape(simt_tiles.Tiles):
    """The constants of one filter-gradient build: the slices besides the tiles."""

    Z: int = 1      # slices
    TPS: int = 1    # K tiles per slice (the last slice may have fewer)

    CT = property(lambda s: s.C * s.taps)               # GEMM columns: one filter row
    PS = property(lambda s: s.K * s.CT)                 # one slice's partial: a filter
    GMp = property(lambda s: T.round_up(s.K, s.TM))     # the GEMM's rows, whole tiles
    GNp = property(lambda s: T.round_up(s.CT, s.TN))
    OP = property(lambda s: s.OD * s.OH * s.OW)
    DHW = property(lambda s: s.D * s.H * s.W)
    OWT = property(lambda s: -(-s.OW // s.TK))          # K tiles per output row
    KT = property(lambda s: s.N * s.OD * s.OH * s.OWT)  # K tiles in all
    #: A K tile never passes the end of its output row
    full = property(lambda s: s.OW % s.TK == 0)

    @property
    def VA(self):  # dL/dy's pixels are contiguous in NCDHW, and aligned in whole tiles
        return simt_tiles.vector_width(self.KVA, 4 if self.layout == Layout.NCDHW and self.full else 1)


def tiles(layer: Layer, tk: int) -> int:
    """K tiles of the filter gradient's reduction: ``CTAtileK`` pixels of an output row."""
    return layer.batch * layer.out_d * layer.out_h * -(-layer.out_w // tk)


def wshape(layer: Layer, layout: Layout, params) -> WShape:
    kt = tiles(layer, params["CTAtileK"])
    taps = layer.k_d * layer.k_h * layer.k_w
    blocks = (-(-layer.out_channels // params["CTAtileM"])
              * -(-layer.in_channels * taps // params["CTAtileN"]))
    z = params["splitK"] or -(-AUTO_BLOCKS // blocks)
    tps = -(-kt // max(1, min(z, kt)))
    return WShape.of(layer, layout, params, Z=-(-kt // tps), TPS=tps)


def wgrad_supports(layer: Layer, params) -> Optional[str]:
    image = max(layer.in_channels * layer.in_d * layer.in_h * layer.in_w,
                layer.out_channels * layer.out_d * layer.out_h * layer.out_w)
    if image > T.INT32_MAX:
        return f"one image of the input or of dL/dy has {image} elements, over int32"
    return None


#: The per-thread state across the K loop.  int32: the K tile to stage next (output row
#: ``od, oh``, first pixel ``ow0``), the tiles left to stage in this slice, the staged
#: filter value's tap less the padding (``kdp, khp, kwp``; ``kdp`` out of any range past
#: the last filter value), the stage it goes to and the stage computed next.  int64: the
#: offsets of the K tile's first pixel in dL/dy (``ya``, channel 0) and of its input row's
#: origin (``xr``: image, ``od * SD, oh * SH``, w 0, channel 0), both stepped, never
#: multiplied; this thread's output channel's offset in dL/dy (``arow``, -1 past the last)
#: and its filter value's in the input (``bcol``: channel and tap).
WST = ("od", "oh", "ow0", "left", "kdp", "khp", "kwp", "sslot", "cslot")


WSB = ("ya", "xr", "arow", "bcol")


#: What the steps change.
WSTEP = (("od", "oh", "ow0", "left", "sslot", "cslot"), ("ya", "xr"))


def _wthread_code(s: WShape, gpu: bool) -> str:
    """This thread's row of the per-thread arrays, tile coordinates, and the row and run
    of A (output channel, pixels) and B (filter value, pixels) it stages."""
    if s.layout == Layout.NCDHW:  # consecutive threads along a row's contiguous pixels
        a = f"(int)t / {s.NT // s.TM}", f"((int)t % {s.NT // s.TM}) * {s.KVA}"
    else:                          # consecutive threads on consecutive channels
        a = f"(int)t % {s.TM}", f"((int)t / {s.TM}) * {s.KVA}"
    return f"""const int tp = {"0" if gpu else "(int)t"};
const int ti = (int)t % {s.NTM}, tj = (int)t / {s.NTM};
const int am = {a[0]}, akv = {a[1]};
const int bn = (int)t % {s.TN}, bkv = ((int)t / {s.TN}) * {s.KVB};
(void)ti; (void)tj; (void)am; (void)akv; (void)bn; (void)bkv;"""


def _steps(s: WShape):
    """Elements between consecutive pixels of dL/dy (``ys``) and of the input (``xs``)."""
    ncdhw = s.layout == Layout.NCDHW
    return (1, 1) if ncdhw else (s.K, s.C)


def _wstage_code(s: WShape) -> str:
    """C++ that stages the next K tile of this slice (zeros once the slice has none left)
    into stage ``sslot``, then steps the counters and offsets to the tile after it."""
    ys, xs = _steps(s)
    a_ok = "live && arow >= 0" + ("" if s.full else f" && ow0 + akv + e < {s.OW}")
    b_ok = (f"rowok && (unsigned)ww < {s.W}u" + ("" if s.full else
                                                  f" && ow0 + bkv + e < {s.OW}"))
    return f"""{{ // stage a K tile: pixels ow0.. of output row (od, oh), or zeros past the slice
    const bool live = left > 0;
    float* adst = As_ + sslot * {s.TM * s.TKP} + am * {s.TKP} + akv;
    const float* asrc = yb + (ya + arow + akv * {ys});
    #pragma unroll
    for (int e = 0; e < {s.KVA}; e += {s.VA}) {{
        const bool ok = {a_ok};
        cb_cp_async<{4 * s.VA}>(adst + e, ok ? asrc + e * {ys} : yb, ok);
    }}
    const int dd = od * {s.SD} + kdp, hh = oh * {s.SH} + khp;
    const bool rowok = live && (unsigned)dd < {s.D}u && (unsigned)hh < {s.H}u;
    float* bdst = Bs_ + sslot * {s.TN * s.TKP} + bn * {s.TKP} + bkv;
    const float* bsrc = xb + (xr + bcol + (ow0 + bkv) * {s.SW * xs});
    #pragma unroll
    for (int e = 0; e < {s.KVB}; ++e) {{
        const int ww = (ow0 + bkv + e) * {s.SW} + kwp;
        const bool ok = {b_ok};
        cb_cp_async<4>(bdst + e, ok ? bsrc + e * {s.SW * xs} : xb, ok);
    }}
{indent(advance_code(s), 4)}
}}
sslot = sslot + 1 == {s.S} ? 0 : sslot + 1;
cb_cp_commit();"""


def advance_code(s: WShape) -> str:
    """C++ stepping the counters and offsets of the K tile to stage to the next one (the
    next ``CTAtileK`` pixels of the output row, or the next row, image), and the tiles
    left in the slice."""
    ys, xs = _steps(s)
    ncdhw = s.layout == Layout.NCDHW
    # past the last output row of an image: the next image's first row
    image_x = (s.C * s.DHW if ncdhw else s.DHW * s.C) - s.OD * s.SD * s.H * s.W * xs
    image_y = f"\n                ya += {(s.K - 1) * s.OP};" if ncdhw else ""
    return f"""if (live) {{
    if (ow0 + {s.TK} < {s.OW}) {{
        ow0 += {s.TK};
        ya += {s.TK * ys};
    }} else {{  // the next output row
        ya += ({s.OW} - ow0) * {ys};
        ow0 = 0;
        xr += {s.SH * s.W * xs};
        if (++oh == {s.OH}) {{
            oh = 0;
            xr += {(s.SD * s.H - s.OH * s.SH) * s.W * xs};
            if (++od == {s.OD}) {{
                od = 0;
                xr += {image_x};{image_y}
            }}
        }}
    }}
}}
--left;"""


def wstate(writable: bool) -> str:
    const = "" if writable else "const "
    ints = "\n".join(f"{const}int {n} = sti[tp * {len(WST)} + {i}];" for i, n in enumerate(WST))
    wide = "\n".join(f"{'' if n in WSTEP[1] else 'const '}int64_t {n} = "
                     f"sbi[tp * {len(WSB)} + {i}];" for i, n in enumerate(WSB))
    return ints + "\n" + wide


def wstore(names, wide) -> str:
    return "\n".join([f"sto[tp * {len(WST)} + {WST.index(n)}] = {n};" for n in names] +
                     [f"sbo[tp * {len(WSB)} + {WSB.index(n)}] = {n};" for n in wide])


#: The names the forward's tasklets give the inputs (x: ``xa``, w: ``wb``) as the filter
#: gradient reads them: A is dL/dy, B the input.
_INPUTS = "const float* yb = xa;\nconst float* xb = wb;\n"


def wgrad_prologue(s: WShape, gpu: bool) -> str:
    """Zero the accumulators; decode this slice's first K tile, the staged output channel
    and filter value; issue the first ``stages - 1`` K tiles and wait for the first."""
    ncdhw = s.layout == Layout.NCDHW
    xs = _steps(s)[1]
    # filter value n: (c, tap) in NCDHW's order (c-major), (tap, c) in NDHWC's
    c, tap = (f"n / {s.taps}", f"n % {s.taps}") if ncdhw else (f"n % {s.C}", f"n / {s.C}")
    return f"""{_INPUTS}{_wthread_code(s, gpu)}
#pragma unroll
for (int i = 0; i < {s.RM * s.RN}; ++i) acco[tp * {s.RM * s.RN} + i] = 0.0f;
{slice_start(s)}
int64_t arow = -1, bcol = 0;
int kdp = 1 << 20, khp = 0, kwp = 0;  // kdp out of range: no filter value to stage
{{
    const int k = (int)blk_m + am;
    if (k < {s.K}) arow = (int64_t)k * {s.OP if ncdhw else 1};
    const int n = (int)blk_n + bn;
    if (n < {s.CT}) {{
        const int c = {c}, tap = {tap};
        kdp = tap / {s.KH * s.KW} - {s.PD};
        khp = (tap / {s.KW}) % {s.KH} - {s.PH};
        kwp = tap % {s.KW} - {s.PW};
        bcol = (int64_t)c * {s.DHW if ncdhw else 1} + ((int64_t)kdp * {s.H} + khp) * {s.W * xs}
               + (int64_t)kwp * {xs};
    }}
}}
int sslot = 0;
const int cslot = 0;
for (int j = 0; j < {s.S - 1}; ++j) {{
{indent(_wstage_code(s), 4)}
}}
{wstore(WST, WSB)}
cb_cp_wait<{s.S - 2}>();
"""


def slice_start(s: WShape) -> str:
    """C++ decoding slice ``blk_z``'s first K tile: its output row and pixel, the tiles
    left, and the offsets of its pixel in dL/dy (``ya``) and of its input row (``xr``)."""
    ncdhw = s.layout == Layout.NCDHW
    return f"""const int first = (int)blk_z * {s.TPS};  // this slice's first K tile
int left = {s.KT} - first < {s.TPS} ? {s.KT} - first : {s.TPS};
const int rowi = first / {s.OWT};
int ow0 = (first - rowi * {s.OWT}) * {s.TK};
int oh = rowi % {s.OH}, od = (rowi / {s.OH}) % {s.OD};
const int64_t img = rowi / {s.OH * s.OD};
int64_t ya = {f"img * {s.K * s.OP} + (int64_t)(rowi - img * {s.OD * s.OH}) * {s.OW} + ow0"
              if ncdhw else f"((int64_t)rowi * {s.OW} + ow0) * {s.K}"};
int64_t xr = {f"img * {s.C * s.DHW} + (od * {s.SD * s.H} + oh * {s.SH}) * {s.W}" if ncdhw
              else f"(img * {s.DHW} + (od * {s.SD * s.H} + oh * {s.SH}) * {s.W}) * {s.C}"};"""


def wgrad_step(s: WShape, gpu: bool) -> str:
    """Step ``kt`` of a slice: stage the tile ``stages - 1`` ahead, compute the tile in
    stage ``cslot`` with the forward's FMA loop, wait for the next."""
    return f"""{_INPUTS}int64_t* sbo = sbs;
{_wthread_code(s, gpu)}
{wstate(writable=True)}
{_wstage_code(s)}
{{
    float* acc = acco + tp * {s.RM * s.RN};
{indent(mainloop.fma_loop(s), 4)}
}}
cslot = cslot + 1 == {s.S} ? 0 : cslot + 1;
{wstore(*WSTEP)}
cb_cp_wait<{s.S - 2}>();
"""


def wgrad_epilogue(s: WShape, gpu: bool) -> str:
    """Store each accumulator to slice ``blk_z``'s partial of its filter value."""
    return f"""{_wthread_code(s, gpu)}
const float* acc = acci + tp * {s.RM * s.RN};
#pragma unroll
for (int r = 0; r < {s.RM}; ++r) {{
    const int64_t k = (int64_t)blk_m + ti + r * {s.NTM};
    #pragma unroll
    for (int c = 0; c < {s.RN}; ++c) {{
        const int64_t n = (int64_t)blk_n + tj + c * {s.NTN};
        if (k < {s.K} && n < {s.CT})
            yo[((int64_t)blk_z * {s.K} + k) * {s.CT} + n] = acc[r * {s.RN} + c];
    }}
}}
"""


def wgrad_reduce(s: WShape, gpu: bool) -> str:
    """Filter value ``i``: its slices' partials added in slice order (deterministic)."""
    return f"""float total = 0.0f;
for (int z = 0; z < {s.Z}; ++z) total += wsi[(int64_t)z * {s.PS} + i];
wo[i] = total;
"""


def wgrad_code():
    """The filter gradient's tasklet code, by role (looked up when called)."""
    return {"prologue": wgrad_prologue, "step": wgrad_step, "epilogue": wgrad_epilogue,
            "reduce": wgrad_reduce}


def wgrad_program(layer: Layer, layout: Layout, dtype, params, s=None,
                  code=None) -> dace.SDFG:
    """dL/dw of ``layer`` in ``layout`` (module docstring): ``x`` the input, ``y``
    dL/dy, ``w`` the result.  ``s`` and ``code``: another main loop's constants and tasklet
    code on the same skeleton (the tensor cores',
    ``convkernels/gpu/mma/filter_gradient.py``); its
    accumulators are ``dtype``'s sums, its stages 4-byte words."""
    s = s or wshape(layer, layout, params)
    L = layer_constants(layer, layout)
    return skeleton.sliced_program((skeleton.unpadded(layer, layout), L.y_shape, L.w_shape),
                                   dtype, s=s, code=code or wgrad_code(),
                                   state=(len(WST), len(WSB)))


def fields(**given):
    """What a pipelined filter-gradient kernel registers with: ``given`` and the rest of
    the registry's ``Implementation`` fields."""
    layout = given["layout"]

    def kernel(layer, params):
        return wshape(layer, layout, params), wgrad_code()
    return dict(
        pass_=Pass.BWD_FILTER,
        algorithm=lambda layer, dtype, values: wgrad_program(layer, layout, dtype, values),
        schedules={t: skeleton.schedule(t, layout, kernel) for t in ("cpu", "gpu")},
        params=WGRAD_PARAMS, check_params=simt_tiles.check_params, supports=wgrad_supports,
        constraints="one image of the input and of dL/dy below 2^31 elements", **given)
