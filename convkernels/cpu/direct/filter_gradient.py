"""``directConvNDHWCblockedBwdFilter``: dL/dw on NDHWC, register-blocked, for the CPU.

``dw[k, kd, kh, kw, c] = sum over (b, od, oh, ow) of dy[b, od, oh, ow, k] *
x[b, od*S + kd - PD, oh*S + kh - PH, ow*S + kw - PW, c]`` (x zero outside).  The long reduction over output
pixels is cut into slices, one per batch element and chunk of output depth planes
(``SLICES`` chunks, a divisor of the output depth); each slice reduces into its own
partial filter gradient, and a last map sums the partials (as oneDNN's bwd-weights
does with thread-private buffers).  Within a slice, a micro-tile is

    acc[TW * CB, NB] = 0                       # TW taps along the width, CB channels
    for od, oh, ow in the slice:
        for j in 0..NB-1:                      # output channels: contiguous in dy, vectors
            dv = dy[b, od, oh, ow, kb*NB + j]
            acc[kw*CB + ci, j] += x[b, od*S+kd, oh*S+kh, ow*S+kw, cb*CB+ci] * dv
                                               # TW*CB statements, written out

so each ``dy`` vector is loaded once per ``TW * CB`` FMAs into fixed accumulators (the
compiler keeps them in registers).  With ``SPLIT`` = 1 the statements of each width tap
get a vector loop of their own (``for j`` once per tap inside the pixel loop): GCC's
vectoriser materialises every broadcast of a vector loop at the top of its body, so with
one loop per pixel all ``TW * CB`` broadcasts are live at once beside the accumulators
(a 3 x 2 x 2 tile on AVX2: 12 accumulators, 2 ``dy`` vectors and 6 broadcasts for 16
registers, so GCC kept 4 accumulators on the stack, each FMA a load-add-store chain);
split per tap only ``CB`` of them are (the ``dy`` loads are shared between the loops).  With ``NV`` vectors of output channels per tile
(``dv0 .. dv{NV-1}``) each ``x`` value also feeds ``NV`` FMAs; past about 24
accumulators GCC spills some of them to the stack, so ``TW * CB * NV`` stays small.  ``TW`` is the kernel width when ``TAPW`` = 1 (the
width taps share the ``dy`` load: what keeps a one-channel first layer busy), else 1.
With ``ROWS`` = 0 the parallel map runs over (slice, channel blocks, the remaining taps),
slices outermost, and each tile sweeps its whole slice: every tile streams the slice's
``dy`` and ``x`` from the last-level cache.  With ``ROWS`` > 0 the map runs over the
slices only; a slice's partial (lanes innermost) stays in the core's L2 while, for each
block of ``ROWS`` output rows, every tile loads its accumulators from the partial,
sweeps the block (its ``dy`` and ``x`` rows in L1/L2) and stores them back, so each
tile's operands come from the near caches; it pays where the partial fits in L2.

**The border.**  The kernel reads ``x`` where it lies, unpadded (no padded copy, a
pass over x per call), and runs only the work that reads it: a
tile's loops over output planes and rows (row blocks: the rows of each block, and no
rows for a plane of the border) are bounded to those whose input plane and row, for the
tile's depth and height taps, lie inside the input; along the width, the pixels whose
taps all read the input run in the loop, and each border pixel gets its statements of
its own with only the width taps that do (with one width tap per tile, ``TAPW`` = 0,
the pixel loop is bounded instead).  In a padded 16^3 layer a twelfth of each
dimension's work multiplied zeros before.  With ``TAPS`` = 1 (the depth and height taps
inside each row) the kernel keeps the padded input and runs every loop whole.
"""

import dataclasses
from collections import namedtuple
from typing import Dict, List, NamedTuple

from convkernels.cpu.direct.blocking import (channel_vectors, generated_program,
                                             largest_divisor, map_header, signature,
                                             tile_registers, widens)
from convkernels.cpu.direct.microkernel import Load, Update, reads_input, vector_loops
from convkernels.layer import layer_constants
from convkernels.layouts import Layout


def partial_bytes() -> int:
    """The partial gradients (one per slice, each the size of dL/dw) stay below this many
    bytes, half of the last-level cache (:mod:`convkernels.cpu.caches`): large filters get
    few slices.  Slices of few depth planes keep a slice's dy and x in cache while the
    tiles of its filter elements run one after the other."""
    from convkernels.cpu.caches import caches
    return caches().l3 // 2


class FilterTiles(NamedTuple):
    """How the filter gradient is cut, from the parameters and the layer."""

    chunks: int     # depth chunks per batch element (0: no slices, no partials)
    tw: int         # width taps per micro-tile
    cb: int         # broadcast channels per micro-tile
    nb: int         # channels per vector
    nv: int         # vectors per broadcast channel
    inner: bool     # the depth and height taps loop inside each output row (else: map dims)
    form: int       # 0: vectors over the output channels, broadcasts over the input; 1: reverse
    rows: int       # output rows per row block (0: none)
    kfirst: bool    # the vector-channel blocks loop outside the row blocks
    split: bool     # one vector loop per width tap
    planes: int     # depth planes per row block (a divisor of the chunk's planes)


def tile_sizes(layer, params) -> FilterTiles:
    """The :class:`FilterTiles` of ``layer`` with ``params``."""
    form = params["FORM"]
    vec, bcast = ((layer.out_channels, layer.in_channels) if form == 0
                  else (layer.in_channels, layer.out_channels))
    tw = layer.k_w if params["TAPW"] else 1
    cb = largest_divisor(bcast, params["CB"])
    nb, nv = channel_vectors(vec, params["NB"], params["NV"])
    inner = bool(params["TAPS"])
    split = bool(params["SPLIT"]) and tw > 1
    if params["SLICES"] == 0:  # no slices: each tile reduces over every pixel into w
        return FilterTiles(0, tw, cb, nb, nv, inner, form, 0, False, split, 1)
    per_slice = 4 * layer.batch * layer.out_channels * layer.in_channels * layer.k_d \
        * layer.k_h * layer.k_w
    slices = max(1, min(params["SLICES"], partial_bytes() // per_slice))
    rows = largest_divisor(layer.out_h, params["ROWS"]) if params["ROWS"] else 0
    inner = inner and not rows
    chunks = largest_divisor(layer.out_d, slices)
    planes = largest_divisor(layer.out_d // chunks, params["PLANES"]) if rows else 1
    return FilterTiles(chunks, tw, cb, nb, nv, inner, form, rows, bool(params["KFIRST"]), split,
                       planes)


#: One accumulator of a micro-tile: its index in ``acc``; its filter element (output
#: channel ``k``, input channel ``c``, for the lane ``j1`` of the stores, width tap ``kw``);
#: the scalar factor of its statement (``scalar(ow)``, for output column ``ow``) and its
#: vector factor (a :class:`~convkernels.cpu.direct.blocking.Load`'s name); its place in a row-blocked
#: partial.
Slot = namedtuple("Slot", "acc k c kw scalar vector at")


def _zero(indent, array, prefix, dims):
    """Loops over ``dims`` (``(name, size)``) that zero ``array[prefix, names...]``."""
    lines = [f"{indent}{'    ' * n}for {name} in range({size}):"
             for n, (name, size) in enumerate(dims)]
    return lines + [f"{indent}{'    ' * len(dims)}{array}[{prefix}"
                    f"{', '.join(name for name, _ in dims)}] = 0"]


def _reading(tap, pad, size, S, out):
    """``(lo, hi)``, the text of the outputs ``lo <= o < hi`` (of ``out``) whose input
    ``o * S + tap - pad`` lies inside the input (not the zero border) in a dimension
    padded by ``pad`` of ``size``; None when it is not padded.  The others only multiply
    zeros: at 16^3 and padding 1, a twelfth of a dimension's work, at 8^3 a sixth."""
    if not pad:
        return None
    if S == 1:
        return f"max(0, {pad} - ({tap}))", f"min({out}, {size + pad} - ({tap}))"
    # o * S >= pad - tap, and o * S <= size - 1 + pad - tap: o < ceil((size + pad - tap) / S)
    return (f"(max(0, {pad} - ({tap})) + {S - 1}) // {S}",
            f"min({out}, (max(0, {size + pad} - ({tap})) + {S - 1}) // {S})")


def _within(lo, hi, base, size):
    """The bounds (text) of a loop variable ``v < size`` whose output is ``base + v``,
    cut to the outputs ``lo <= o < hi``."""
    return f"max(0, {lo} - {base})", f"min({size}, {hi} - {base})"


@dataclasses.dataclass
class _Kernel:
    """What the emitters of one filter-gradient kernel share: the cut, the sizes derived
    from it, the tile indices (as text: a map parameter, a loop variable or ``0``), the
    indents, and the index text of the output pixel a statement is written for."""

    L: object
    tiles: FilterTiles
    inner: bool          # the depth and height taps loop inside each row (never with rows)
    ch: int              # output depth planes per chunk
    kbs: int             # output channels per tile
    cbs: int             # input channels per tile
    wblk: int            # width-tap blocks
    vblocks: int         # vector-channel blocks
    bcast: int           # broadcast channels
    pads: List[str]      # " - P" per dimension where x is read unpadded
    t: Dict[str, str]    # tile indices
    ind: str             # indent of the tile body
    body: str = ""       # indent inside the row-block loops
    od: str = ""         # output depth, height of a statement
    oh: str = ""
    kd: str = ""         # depth and height taps of a statement
    kh: str = ""
    #: 16-bit storage: the operands read where they lie are widened to float32 (the
    #: padded copy of the input, with ``inner``, is float32 already).
    widen_x: bool = False
    widen_y: bool = False

    @property
    def cw(self) -> int:
        return self.tiles.nb * self.tiles.nv

    def lane(self, base, v, var):
        return f"{base} + {f'{v * self.tiles.nb} + ' if v else ''}{var}"

    def x_at(self, kw, c, ow="ow"):
        t, S, pads = self.t, self.L.S, self.pads
        return _widened(f"x[{t['b']}, ({self.od}) * {S} + {self.kd}{pads[0]}, ({self.oh}) * "
                        f"{S} + {self.kh}{pads[1]}, {ow} * {S} + {kw}{pads[2]}, {c}]",
                        self.widen_x)

    def dy_at(self, k, ow="ow"):
        return _widened(f"y[{self.t['b']}, {self.od}, {self.oh}, {ow}, {k}]", self.widen_y)


def _widened(read: str, widen: bool) -> str:
    return f"dace.float32({read})" if widen else read


def _source(L, dtype_name, tiles: FilterTiles):
    """The program's text for the cut ``tiles``.  ``form`` 0: ``nv`` vectors of ``nb``
    output channels (from dL/dy) times ``cb`` broadcast input channels; 1: ``nv`` vectors
    of ``nb`` input channels (from x) times ``cb`` broadcast output channels.  ``rows`` 0:
    each tile sweeps its whole slice (tiles are map dimensions); else blocks of ``rows``
    output rows, each swept by all tiles in turn; ``kfirst``: the tiles' vector-channel
    blocks loop outside the row blocks (each sweeps the slice with its share of the
    partial); ``planes``: a row block is ``rows`` rows of each of ``planes`` consecutive
    depth planes (a tile's accumulators are loaded and stored once per block: fewer,
    longer sweeps where the partial does not stay in L2)."""
    lines, k = _tile_map(L, dtype_name, tiles)
    slots, loads = _slots(k)
    if tiles.rows:
        lines.append(f"{k.body}for j1 in range({tiles.nb}):")
        lines += [f"{k.body}    acc[{s.acc}, j1] = part[{k.t['b']}, {k.t['dc']}, "
                  f"{s.at}]" for s in slots]
    sweep, deep = _pixel_loops(k)
    return "\n".join(lines + sweep + _width_loops(k, slots, loads, deep)
                     + _stores(k, slots)) + "\n"


def _tile_map(L, dtype_name, tiles: FilterTiles):
    """The signature, the partials, the parallel map over tiles, the accumulators zeroed
    (or, with row blocks, the partial zeroed and the loops over row blocks and tiles);
    the lines and the :class:`_Kernel`."""
    chunks, tw, cb, nb, nv, inner, form, rows, kfirst, _, planes = tiles
    ch, cw = L.OD // max(chunks, 1), nb * nv
    kbs, cbs = (cw, cb) if form == 0 else (cb, cw)  # output and input channels per tile
    wblk = L.KW // tw
    vblocks, bcast = (L.K // cw, L.C) if form == 0 else (L.C // cw, L.K)
    # The input in place, every loop bounded to what reads it; with the taps inside
    # each row (``inner``), the padded input (a copy), every loop whole.
    lines = signature(L, dtype_name, "bwd_filter_blocked", in_place=not inner)
    pads = [f" - {p}" if p and not inner else "" for p in (L.PD, L.PH, L.PW)]
    if rows:
        # Lanes innermost: a tile's accumulators are loaded and stored as whole vectors.
        lines.append(f"    part = dace.define_local([{L.N}, {chunks}, {vblocks}, {L.KD}, "
                     f"{L.KH}, {L.KW}, {bcast}, {cw}], at)")
        header, t = map_header([("b", L.N), ("dc", chunks)], "    ")
        inner = False
    else:
        if chunks:
            lines.append(f"    part = dace.define_local([{L.N}, {chunks}, {L.K}, {L.KD}, "
                         f"{L.KH}, {L.KW}, {L.C}], at)")
        dims = [("b", L.N), ("dc", chunks)] if chunks else []
        dims += [("kb", L.K // kbs), ("cb", L.C // cbs)]
        dims += [("wb", wblk)] if inner else [("kd", L.KD), ("kh", L.KH), ("wb", wblk)]
        header, t = map_header(dims, "    ")
        if not chunks:  # the batch loops inside each tile
            t.update(b="b", dc="0")
    ind = "        " if header else "    "
    if header:
        lines.append(header)
    half = widens(dtype_name)
    k = _Kernel(L, tiles, inner, ch, kbs, cbs, wblk, vblocks, bcast, pads, t, ind,
                widen_x=half and not inner, widen_y=half)
    taps = L.KD * L.KH if inner else 1
    lines.append(f"{ind}acc = dace.define_local([{taps}, {tw * cb * nv}, {nb}], at)")
    k.od = f"{t['dc']} * {ch} + t" + (f" * {planes} + tp" if planes > 1 else "")
    if rows:
        # The slice's partial starts at zero; then, per block of rows, every tile loads
        # its accumulators, sweeps the block and stores them back.
        lines += _zero(ind, "part", f"{t['b']}, {t['dc']}, ",
                       [("z0", vblocks), ("z1", L.KD), ("z2", L.KH), ("z3", L.KW),
                        ("z4", bcast), ("z5", cw)])
        vloop = ("kb", L.K // kbs) if form == 0 else ("cb", L.C // cbs)
        loops = [("kb", L.K // kbs), ("cb", L.C // cbs), ("kd", L.KD), ("kh", L.KH),
                 ("wb", wblk)]
        if kfirst:
            loops.remove(vloop)
        body = ind
        for name, size in ([vloop] if kfirst else []) + [("t", ch // planes),
                                                          ("ob", L.OH // rows)] + loops:
            t[name] = name if size > 1 or name in ("t", "ob") else "0"
            if size > 1 or name in ("t", "ob"):
                lines.append(f"{body}for {name} in range({size}):")
                body += "    "
        k.body, k.oh, k.kd, k.kh = body, f"ob * {rows} + r", t["kd"], t["kh"]
    else:
        lines += _zero(ind, "acc", "", [("i0", taps), ("i1", tw * cb * nv), ("j0", nb)])
        k.oh = "oh"
        k.kd, k.kh = ("kd", "kh") if inner else (t["kd"], t["kh"])
    return lines, k


def _slots(k: _Kernel):
    """The micro-tile's accumulators (:data:`Slot`, one per width tap, broadcast channel
    and vector) and the vector loads their statements use."""
    tw, cb, nb, nv, form = k.tiles.tw, k.tiles.cb, k.tiles.nb, k.tiles.nv, k.tiles.form
    t, kd, kh = k.t, k.kd, k.kh
    k0, c0 = f"{t['kb']} * {k.kbs}", f"{t['cb']} * {k.cbs}"
    tap = "kd * {} + kh, ".format(k.L.KH) if k.inner else ""
    slots = []
    for a in range(tw):
        kw = f"{t['wb']} * {tw} + {a}"
        for ci in range(cb):
            for v in range(nv):
                i = f"{tap or '0, '}{(a * cb + ci) * nv + v}"
                if form == 0:
                    at = f"{t['kb']}, {kd}, {kh}, {kw}, {c0} + {ci}, {v * nb} + j1"
                    slots.append(Slot(i, k.lane(k0, v, "j1"), f"{c0} + {ci}", kw,
                                      lambda ow="ow", kw=kw, ci=ci: k.x_at(kw, f"{c0} + {ci}",
                                                                           ow),
                                      f"dv{v}", at))
                else:
                    at = f"{t['cb']}, {kd}, {kh}, {kw}, {k0} + {ci}, {v * nb} + j1"
                    slots.append(Slot(i, f"{k0} + {ci}", k.lane(c0, v, "j1"), kw,
                                      lambda ow="ow", ci=ci: k.dy_at(f"{k0} + {ci}", ow),
                                      f"xv{a}_{v}", at))
    if form == 0:
        loads = [Load(f"dv{v}", lambda ow="ow", v=v: k.dy_at(k.lane(k0, v, "j"), ow))
                 for v in range(nv)]
    else:
        loads = [Load(f"xv{a}_{v}", lambda ow="ow", a=a, v=v: k.x_at(
            f"{t['wb']} * {tw} + {a}", k.lane(c0, v, "j"), ow))
            for a in range(tw) for v in range(nv)]
    return slots, loads


def _pixel_loops(k: _Kernel):
    """The loops over the slice's output planes and rows (bounded to those whose input
    is not the border), and with the taps inside each row their loops; the lines and
    the indent of the width loop."""
    L, S, t = k.L, k.L.S, k.t
    rows, planes, chunks = k.tiles.rows, k.tiles.planes, k.tiles.chunks
    lines = []
    if rows:
        deep = k.body
        if planes > 1:
            lines.append(f"{deep}for tp in range({planes}):")
            deep += "    "
        # Only the rows, and (as an empty range) planes, whose input is not the border.
        lo, hi = _within(*_reading(k.kh, L.PH, L.H, S, L.OH), f"ob * {rows}", rows) \
            if L.PH else ("0", f"{rows}")
        if L.PD:  # 1 when the plane reads the input, else 0
            first, end = _reading(k.kd, L.PD, L.D, S, L.OD)
            inside = f"min(1, max(0, min(({k.od}) - ({first}) + 1, ({end}) - ({k.od}))))"
            hi = f"min({hi}, {rows} * {inside})"
        lines += [f"{deep}for r in range({lo}, {hi}):"]
    else:
        if not chunks:
            lines.append(f"{k.ind}for b in range({L.N}):")
            ind_b = k.ind + "    "
        else:
            ind_b = k.ind
        deep = ind_b + "    "
        planes_, rows_ = f"{k.ch}", f"{L.OH}"
        if not k.inner:  # the taps are fixed per tile: bound the planes and rows
            if L.PD:
                planes_ = ", ".join(_within(*_reading(k.kd, L.PD, L.D, S, L.OD),
                                            f"{t['dc']} * {k.ch}", k.ch))
            if L.PH:
                rows_ = ", ".join(_reading(k.kh, L.PH, L.H, S, L.OH))
        lines += [f"{ind_b}for t in range({planes_}):", f"{ind_b}    for oh in range({rows_}):"]
        if k.inner:
            lines += [f"{deep}    for kd in range({L.KD}):",
                      f"{deep}        for kh in range({L.KH}):"]
            deep += "        "
    return lines, deep + "    "


def _width_loops(k: _Kernel, slots, loads, deep):
    """The loop over the row's output pixels and the vector loops of the micro-tile:
    every pixel where no width padding is read, else the pixels whose width taps all
    read the input in one loop and each border pixel with the taps that do."""
    L, S, tw = k.L, k.L.S, k.tiles.tw
    per_tap = len(slots) // tw  # slots are in width-tap order
    taps = [[Update(lambda ow="ow", s=s: f"acc[{s.acc}, j] += {s.scalar(ow)} * {s.vector}",
                    frozenset({s.vector}))
             for s in slots[a * per_tap:(a + 1) * per_tap]] for a in range(tw)]
    group, nb = (1 if k.tiles.split else 0), k.tiles.nb
    lines = []
    if not L.PW or k.inner:
        lines.append(f"{deep}for ow in range({L.OW}):")
        lines += vector_loops(deep + "        ", nb, loads, taps, group)
    elif tw == 1:  # one width tap per tile: the pixels that read the input
        lines.append(f"{deep}for ow in range("
                     f"{', '.join(_reading(slots[0].kw, L.PW, L.W, S, L.OW))}):")
        lines += vector_loops(deep + "        ", nb, loads, taps, group)
    else:  # all width taps: the pixels at the border run theirs that read the input
        inside = {ow: [a for a in range(tw) if reads_input(ow, a, S, L.PW, L.W)]
                  for ow in range(L.OW)}
        full = [ow for ow, used in inside.items() if len(used) == tw]
        lo, hi = (full[0], full[-1] + 1) if full else (0, 0)
        if hi > lo:
            lines.append(f"{deep}for ow in range({lo}, {hi}):")
            lines += vector_loops(deep + "        ", nb, loads, taps, group)
        for ow, used in inside.items():
            if lo <= ow < hi or not used:
                continue
            lines += vector_loops(deep + "    ", nb, loads, [taps[a] for a in used], group,
                                  at=str(ow))
        if not full and not any(inside.values()):  # no pixel reads the input
            lines.append(f"{deep}pass")
    return lines


def _stores(k: _Kernel, slots):
    """The accumulators stored: back into the slice's partial (row blocks), or into the
    partial or dL/dw per tap; then, with partials, the map that sums them."""
    L, t, nb, chunks = k.L, k.t, k.tiles.nb, k.tiles.chunks
    if k.tiles.rows:
        lines = [f"{k.body}for j1 in range({nb}):"]
        lines += [f"{k.body}    part[{t['b']}, {t['dc']}, {s.at}] = "
                  f"acc[{s.acc}, j1]" for s in slots]
        return lines + _sum_partials(L, chunks, k.cw, k.tiles.form, k.vblocks)
    store, lines = k.ind, []
    if k.inner:
        lines += [f"{k.ind}for kd in range({L.KD}):", f"{k.ind}    for kh in range({L.KH}):"]
        store += "        "
    lines.append(f"{store}for j1 in range({nb}):")
    out = f"part[{t['b']}, {t['dc']}, " if chunks else "w["
    lines += [f"{store}    {out}{s.k}, {k.kd}, {k.kh}, {s.kw}, "
              f"{s.c}] = acc[{s.acc}, j1]" for s in slots]
    return lines + (_sum_partials(L, chunks) if chunks else [])


def _sum_partials(L, chunks, cw=None, form=0, vblocks=None):
    """The last map: ``w`` is the sum of the slices' partials, stored ``[k, taps, c]``
    (``cw`` None) or ``[vector block, taps, broadcast channel, lane]`` (row blocks)."""
    if cw is None:
        dims = [("k", L.K), ("kd", L.KD), ("kh", L.KH), ("kw", L.KW), ("c", L.C)]
    elif form == 0:
        dims = [("vb", vblocks), ("l", cw), ("kd", L.KD), ("kh", L.KH), ("kw", L.KW), ("c", L.C)]
    else:
        dims = [("k", L.K), ("kd", L.KD), ("kh", L.KH), ("kw", L.KW), ("vb", vblocks), ("l", cw)]
    red, r = map_header(dims, "    ")
    taps = f"{r['kd']}, {r['kh']}, {r['kw']}"
    if cw is None:
        where = src = f"{r['k']}, {taps}, {r['c']}"
    elif form == 0:
        where = f"{r['vb']} * {cw} + {r['l']}, {taps}, {r['c']}"
        src = f"{r['vb']}, {taps}, {r['c']}, {r['l']}"
    else:
        where = f"{r['k']}, {taps}, {r['vb']} * {cw} + {r['l']}"
        src = f"{r['vb']}, {taps}, {r['k']}, {r['l']}"
    rind = "        " if red else "    "
    return ([red] if red else []) + [
        f"{rind}tot = dace.define_local([1], at)",
        f"{rind}tot[0] = 0",
        f"{rind}for b in range({L.N}):",
        f"{rind}    for dc in range({chunks}):",
        f"{rind}        tot[0] += part[b, dc, {src}]",
        f"{rind}w[{where}] = tot[0]"]


def registers(layer, params):
    """Accumulator registers of one micro-tile on this CPU (for the tuner)."""
    tiles = tile_sizes(layer, params)
    return tile_registers(tiles.tw * tiles.cb, tiles.nv, tiles.nb)


def algorithm(layer, dtype, params):
    L = layer_constants(layer, Layout.NDHWC)
    tiles = tile_sizes(layer, params)
    # With the taps inside each row the program reads the padded input.
    return generated_program(layer, _source(L, dtype.name, tiles), "bwd_filter_blocked",
                             "x".join(str(int(v)) for v in tiles), in_place=not tiles.inner,
                             dtype=dtype)
