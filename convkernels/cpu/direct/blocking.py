"""Pieces shared by the register-blocked CPU convolutions on NDHWC
(``directConvNDHWCblocked``, ``directConvNDHWCdot``): tile shapes, loop order,
generated map headers and the OpenMP schedule.

A kernel is described before it is written (:mod:`convkernels.cpu.direct.microkernel`: the
taps each tile runs, the bodies of the width tiles, the statements with the loads they use).
Every decision (which taps run, which tiles get bodies of their own, whether the input is
read in place) is taken on that description; the program text is emitted from it here, last,
and never read back.
"""

import math
from typing import NamedTuple

import dace

from convkernels.cpu.isa import registers_per_vector, vector_floats, widest_isa
from convkernels.cpu.direct.microkernel import (Load, Update, WidthCase, reads_in_place,
                                                tap_ranges, vector_loops, width_cases)


def largest_divisor(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is at most ``limit``."""
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def pixel_tile(layer, pix: int, wmax: int, ragged: bool = False):
    """``(db, hb, wb)``: a micro-tile of up to ``pix`` output pixels, width first (at most
    ``wmax`` along it), then height, then depth, each a divisor of the output size;
    ``ragged``: ``wb`` is ``min(pix, wmax, output width)`` whether it divides the width or
    not (the last width tile is then shorter, see :func:`width_cases`)."""
    wb = (min(layer.out_w, wmax, pix) if ragged
          else largest_divisor(layer.out_w, min(wmax, pix)))
    hb = largest_divisor(layer.out_h, max(1, pix // wb))
    db = largest_divisor(layer.out_d, max(1, pix // (wb * hb)))
    return db, hb, wb


class MicroTile(NamedTuple):
    """A register-blocked micro-tile: ``db x hb x wb`` output pixels times ``nv`` vectors
    of ``nb`` channels (one accumulator vector per pixel and vector)."""

    db: int
    hb: int
    wb: int
    nb: int
    nv: int


def micro_tile(layer, params, channels: int) -> MicroTile:
    """The :class:`MicroTile` of ``params`` (``PIX``, ``WB``, ``NB``, ``NV``, ``EDGE``) on
    ``layer``, with vectors over ``channels``."""
    ragged, _ = edge_modes(params)
    return MicroTile(*pixel_tile(layer, params["PIX"], params["WB"], ragged),
                     *channel_vectors(channels, params["NB"], params["NV"]))


def channel_vectors(channels: int, nb: int, nv: int):
    """``(nb, nv)``: ``nv`` vectors of ``nb`` channels per micro-tile, ``nb`` the largest
    divisor of ``channels`` up to ``NB`` and ``nv`` the largest divisor of the rest up to
    ``NV``."""
    nb = largest_divisor(channels, nb)
    return nb, largest_divisor(channels // nb, nv)


def nv_param(default=1):
    from convkernels.declarations import Param
    return Param("NV", default, "vectors of NB channels per micro-tile: PIX x NV accumulators, "
                          "NV filter loads per PIX broadcasts")


def lanes_param(name, help_):
    """``NB``/``CV``: the channels of one vector, by default one vector of this CPU (16
    floats with AVX-512, 8 with AVX2)."""
    from convkernels.declarations import Param
    lanes = vector_floats()
    return Param(name, lanes, f"{help_} (default {lanes}: one {widest_isa()} vector of this CPU)")


def tile_registers(pixels, vectors, width):
    """Vector registers of a micro-tile of ``pixels`` x ``vectors`` accumulators of
    ``width`` floats each (a vector wider than the CPU's takes several registers)."""
    return pixels * vectors * registers_per_vector(width)


def registers_of(tile_sizes, width_first=True):
    """``registers(layer, params)`` (for the tuner) of a kernel whose ``tile_sizes`` are
    ``(db, hb, wb, width, vectors)``, or ``(db, hb, wb, vectors, width)`` when not
    ``width_first``: the tile's pixels times its accumulator vectors per pixel."""
    def registers(layer, params):
        db, hb, wb, first, second = tile_sizes(layer, params)
        width, vectors = (first, second) if width_first else (second, first)
        return tile_registers(db * hb * wb, vectors, width)
    return registers


def channel_block(channels: int, cblk: int) -> int:
    """``CBLK``: input channels per reduction block (the largest divisor of ``channels``
    up to ``CBLK``), 0 when the reduction is not blocked (``CBLK`` 0 or at least
    ``channels``)."""
    block = largest_divisor(channels, cblk) if cblk else channels
    return block if block < channels else 0


def cblk_param():
    from convkernels.declarations import Param
    return Param("CBLK", 0, "0: each tile reduces over all input channels at once; else "
                            "blocks of CBLK channels (a divisor of C), one pass over the "
                            "tiles per block adding into the output, so that a thread's "
                            "filter block stays in cache", minimum=0)


def channel_tiles_outer(layer, kouter: int) -> bool:
    """``KOUTER``: 1 channel tiles outermost, 0 pixel tiles outermost, 2 (auto) channel
    tiles outermost when the filter has more elements than the input."""
    if kouter != 2:
        return bool(kouter)
    return math.prod(layer.filter_shape) > math.prod(layer.input_shape)


def kouter_param():
    from convkernels.declarations import Param
    return Param("KOUTER", 2, "loop order of the tiles: 1 channel tiles outermost, 0 pixel "
                              "tiles outermost, 2 by operand sizes", minimum=0,
                 check=auto_switch)


def map_header(dims, indent):
    """A ``for ... in dace.map[...]`` header over the ``(name, size)`` dims larger than 1
    (DaCe 1.0.2's frontend folds a size-1 range and then rejects the memlets that use
    it), or None when every dim is 1; and the index text of each dim (``0`` for size 1)."""
    index = {name: (name if size > 1 else "0") for name, size in dims}
    live = [(name, size) for name, size in dims if size > 1]
    if not live:
        return None, index
    names = ", ".join(name for name, _ in live)
    ranges = ", ".join(f"0:{size}" for _, size in live)
    return f"{indent}for {names} in dace.map[{ranges}]:", index


def tile_loop(L, k_blocks, pixel_tile_shape, k_outer):
    """The header of the parallel tile map (batch, output-depth/height/width tiles and
    channel tiles, in ``k_outer`` order), the indentation of its body, and the index
    text of each tile dimension (``b odb ohb owb kb``).  The last width tile may be
    shorter than ``wb`` (``ceil(OW / wb)`` width tiles)."""
    db, hb, wb = pixel_tile_shape
    tiles = [("b", L.N), ("odb", L.OD // db), ("ohb", L.OH // hb), ("owb", -(-L.OW // wb))]
    # Channel tiles outermost when the filter is the larger operand: each thread then
    # sweeps all pixels with one filter block in cache.
    order = [("kb", k_blocks)] + tiles if k_outer else tiles + [("kb", k_blocks)]
    header, index = map_header(order, "    ")
    return ([header] if header else []), ("        " if header else "    "), index


def tap_loops(L, pixel_tile_shape, index, indent):
    """The ``for kd / kh / kw`` loop headers of a micro-tile's reduction (each bounded
    per tile, :class:`convkernels.cpu.direct.microkernel.TapRange`), and the indent after them."""
    lines = []
    for taps in tap_ranges(L, pixel_tile_shape):
        lines.append(taps.loop(index[taps.tile], indent))
        indent += "    "
    return lines, indent


def tile_prologue(L, k_blocks, pixel_tile_shape, k_outer, accumulators, width, locals_=()):
    """The parallel tile map's header and ``acc[accumulators, width]`` (plus ``locals_``,
    ``(name, shape)`` pairs) zeroed at the top of its body; the lines, the body's indent
    and the tile indices (see :func:`tile_loop`)."""
    header, ind, t = tile_loop(L, k_blocks, pixel_tile_shape, k_outer)
    lines = header + [f"{ind}acc = dace.define_local([{accumulators}, {width}], at)"]
    lines += [f"{ind}{name} = dace.define_local([{shape}], at)" for name, shape in locals_]
    lines += [f"{ind}for i0 in range({accumulators}):",
              f"{ind}    for j0 in range({width}):",
              f"{ind}        acc[i0, j0] = 0"]
    return lines, ind, t


def reduction_nest(L, k_blocks, pixel_tile_shape, k_outer, accumulators, width, inner,
                   locals_=()):
    """The generated text shared by the register-blocked kernels up to the innermost
    statements: the parallel tile map, ``acc[accumulators, width]`` (plus ``locals_``,
    ``(name, shape)`` pairs) zeroed, the tap loops with their border bounds, the loop
    ``inner = (name, size)`` and the vector loop ``j < width``.  Returns the lines, the
    indent of the tile body, the indent of the innermost statements and the tile
    indices."""
    assert L.OW % pixel_tile_shape[2] == 0, "width tiles must divide the width here"
    lines, ind, t = tile_prologue(L, k_blocks, pixel_tile_shape, k_outer, accumulators, width,
                                  locals_)
    taps, depth = tap_loops(L, pixel_tile_shape, t, ind)
    lines += taps
    lines.append(f"{depth}for {inner[0]} in range({inner[1]}):")
    depth += "    "
    lines.append(f"{depth}for j in range({width}):")
    return lines, ind, depth + "    ", t


def input_at(t, pixel_tile_shape, offset, S, channel, pads=(0, 0, 0), kw="kw"):
    """``x[...]`` of the tile pixel at ``offset = (di, hi, wi)``, tap ``(kd, kh, kw)``
    (``kw``: the width tap's variable, or a constant); ``pads``: ``x`` is the unpadded
    input (each index less the padding of its dimension)."""
    (db, hb, wb), (di, hi, wi) = pixel_tile_shape, offset
    shift = [f" - {p}" if p else "" for p in pads]
    return (f"x[{t['b']}, ({t['odb']} * {db} + {di}) * {S} + kd{shift[0]}, "
            f"({t['ohb']} * {hb} + {hi}) * {S} + kh{shift[1]}, "
            f"({t['owb']} * {wb} + {wi}) * {S} + {kw}{shift[2]}, {channel}]")


def store_tile(indent, t, pixel_tile_shape, var, channels, value, vectors=1, add=False,
               width=None):
    """The loop ``var < channels`` that writes the tile's outputs: pixel ``p`` (in
    accumulator order), channel ``kb * channels * vectors + v * channels + var`` for each
    of the ``vectors`` channel vectors ``v``, gets the text ``value(p)`` (``vectors`` = 1)
    or ``value(p, v)`` (``add``: plus what it holds).  ``width``: only the tile's first
    ``width`` pixels along the width (a shorter last width tile)."""
    db, hb, wb = pixel_tile_shape
    lines = []
    for p, (di, hi, wi) in enumerate(tile_pixels(pixel_tile_shape)):
        if width is not None and wi >= width:
            continue
        for v in range(vectors):
            channel = (f"{t['kb']} * {channels * vectors} + {v * channels} + {var}" if vectors > 1
                       else f"{t['kb']} * {channels} + {var}")
            out = (f"y[{t['b']}, {t['odb']} * {db} + {di}, {t['ohb']} * {hb} + {hi}, "
                   f"{t['owb']} * {wb} + {wi}, {channel}]")
            lines.append(f"{indent}for {var} in range({channels}):")
            lines.append(f"{indent}    {out} = {out + ' + ' if add else ''}"
                         f"{value(p, v) if vectors > 1 else value(p)}")
    return lines


def edge_param(default=1):
    from convkernels.declarations import Param
    return Param("EDGE", default, "width tiles: 1 the first and last of them run only the "
                                  "taps that read the input, pixel by pixel; 2 that, and tiles "
                                  "of exactly min(PIX, WB, width) pixels (the last one "
                                  "shorter) instead of a divisor of the width; 0 every tile "
                                  "runs the taps of all its pixels", minimum=0,
                 check=auto_switch)


def edge_modes(params):
    """``(ragged, edge)`` of the ``EDGE`` parameter: width tiles that need not divide the
    width (``pixel_tile``), and edge bodies (``blocked_source``)."""
    return params["EDGE"] == 2, params["EDGE"] > 0


def group_param():
    from convkernels.declarations import Param
    return Param("GROUP", 0, "pixels per vector loop: 0 all of the micro-tile's in one loop, "
                             "else loops of GROUP pixels each, so that fewer broadcasts are "
                             "live at a time", minimum=0)


def generated_program(layer, source, function, tag, in_place=False, dtype=None):
    """The SDFG of the generated ``source``, taking the unpadded input as the harness
    passes it: the source reads a zero-padded copy of it, or (``in_place``) the unpadded
    input itself (:func:`reads_in_place`), and then no copy is made.  ``dtype``: the
    precision, whose storage type a 16-bit source names ``STORAGE`` (:func:`signature`);
    a 16-bit input is widened into that copy, padded or not (:func:`signature`)."""
    from convkernels.layouts import Layout
    from convkernels.padding import pad_input
    from convkernels.programs import program_from_source
    half = dtype is not None and widens(dtype.name)
    program = program_from_source(source, function, f"{function}_{layer.key()}_{tag}",
                                  {"STORAGE": dtype.dace} if half else None)
    if in_place:
        return program.to_sdfg(simplify=True)
    return pad_input(program, layer, Layout.NDHWC, halo=True,
                     storage=dtype.dace if half else None)


def tile_pixels(pixel_tile_shape):
    """The ``(di, hi, wi)`` offsets of a micro-tile's pixels, in accumulator order."""
    db, hb, wb = pixel_tile_shape
    return [(di, hi, wi) for di in range(db) for hi in range(hb) for wi in range(wb)]


def signature(L, dtype_name, function, w_shape=None, in_place=False):
    """The generated program's first lines: imports, the storage type ``dt`` and the
    accumulators' ``at`` (float32), and ``function(x, w, y)`` on the padded NDHWC input
    (``in_place``: the unpadded one), the filter (``w_shape``, default ``L.w_shape``) and
    the output, with constant shapes.  In 16 bits the padded input is float32 (``at``):
    :func:`generated_program` widens the input into it once per call, so the inner loop
    broadcasts floats as in float32 instead of widening each value every time it is read
    (a load, a shift and a move more per broadcast: twice the float32 time on AVX2)."""
    x_shape = (L.N, L.D, L.H, L.W, L.C) if in_place else L.xp_shape
    # 16-bit types have no name in DaCe: generated_program sets STORAGE
    storage = f"STORAGE  # {dtype_name}" if widens(dtype_name) else f"dace.{dtype_name}"
    x_type = "at" if widens(dtype_name) and not in_place else "dt"
    return ["import dace", "", f"dt = {storage}", "at = dace.float32", "", "",
            "@dace.program",
            f"def {function}(x: {x_type}[{', '.join(map(str, x_shape))}], "
            f"w: dt[{', '.join(map(str, w_shape or L.w_shape))}], y: dt[{', '.join(map(str, L.y_shape))}]):"]


def widens(dtype_name) -> bool:
    """Whether a kernel of storage ``dtype_name`` widens what it reads (16-bit storage)."""
    return dtype_name != "float32"


def cpu_schedule(sdfg, layer, params):
    """OpenMP over every dimension of each top-level map (collapsed); everything else as
    the frontend wrote it: sequential loops the C++ compiler vectorises and unrolls.  The
    buffers outside the maps (padded input, packed filter, partials) are allocated once
    per loaded program (:func:`convkernels.padding.persistent_buffers`)."""
    from convkernels.padding import persistent_buffers
    for node, _ in sdfg.all_nodes_recursive():
        if isinstance(node, dace.nodes.MapEntry) and node.map.schedule in (
                dace.ScheduleType.Default, dace.ScheduleType.CPU_Multicore):
            node.map.schedule = dace.ScheduleType.CPU_Multicore
            node.map.collapse = len(node.map.params)
    persistent_buffers(sdfg)


def input_modes(L, pixel_tile_shape, params, dtype_name="float32"):
    """``(edge, in_place)`` of a blocked kernel's tile: edge bodies (``EDGE``), and
    whether it reads the input where it lies (``INPLACE`` and :func:`reads_in_place`;
    never in 16 bits, whose input is widened into a float32 copy, see :func:`signature`)."""
    edge = edge_modes(params)[1]
    return edge, (bool(params["INPLACE"]) and not widens(dtype_name)
                  and reads_in_place(L, pixel_tile_shape, edge))


def switch(value) -> "str | None":
    """The check of a 0/1 parameter."""
    return None if value in (0, 1) else "must be 0 or 1"


def auto_switch(value) -> "str | None":
    """The check of a 0/1 parameter with 2 for "chosen per layer"."""
    return None if value in (0, 1, 2) else "must be 0, 1 or 2"


def switch_param(name: str, default: int, help_: str):
    """A parameter that is 0 or 1."""
    from convkernels.declarations import Param
    return Param(name, default, help_, minimum=0, check=switch)


def inplace_param():
    return switch_param("INPLACE", 1, "1: read the unpadded input where it lies when every "
                                      "tap of every tile reads inside it (tiles one pixel "
                                      "deep and high in padded dimensions, and EDGE bodies); "
                                      "0: always copy it into a zero-padded buffer first")


def blocked_source(L, dtype_name, db, hb, wb, nb, k_outer, flip=False, nv=1, pack=True,
                   cblk=0, group=0, edge=False, in_place=False):
    """``directConvNDHWCblocked``'s program text (see its module) for layer constants
    ``L`` and a ``db x hb x wb`` x ``nv * nb`` tile: ``nv`` vectors of ``nb`` output
    channels per pixel.  ``flip``: ``w`` is the filter of the convolution that ``L``
    transposes (``C x taps x K``, see ``directConvNDHWCblockedBwdData``), read flipped in
    space and with its channels swapped.  ``pack``: copy the filter first into
    ``wp[K / (nv nb), taps, C, nv nb]``, so a tile's filter vectors are one contiguous
    stream; without it (``flip`` only, where the filter's vector dimension is already its
    innermost one) the kernel reads them from ``w`` in place.  ``cblk`` (a divisor of
    ``C`` below it): the reduction over input channels runs in blocks of ``cblk``, one
    parallel tile map per block, each adding its tile to ``y`` (zeroed first), so that a
    thread's filter block of ``cblk`` channels stays in cache across its pixel tiles.
    ``group`` (0: all): pixels per vector loop; the tile's statements are cut into vector
    loops of ``group`` pixels each, so that only their broadcasts are live at a time (see
    :func:`vector_loops`).  ``edge``: the first and last width tiles run exactly their
    pixels' taps and ``wb`` need not divide the width (see :func:`width_cases`).
    ``in_place``: ``x`` is the unpadded input (see :func:`reads_in_place`)."""
    assert not in_place or reads_in_place(L, (db, hb, wb), edge), "a tap would read the border"
    assert edge or L.OW % wb == 0, "a width tile that does not divide the width needs edge"
    cw, S = nb * nv, L.S
    kblk = L.K // cw
    pixels = db * hb * wb
    lines = signature(L, dtype_name, "direct_blocked",
                      (L.C, L.KD, L.KH, L.KW, L.K) if flip else None, in_place)
    pads = (L.PD, L.PH, L.PW) if in_place else (0, 0, 0)
    if pack or not flip:
        # packed in float32: 16-bit filters are widened once here, not per tile
        lines.append(f"    wp = dace.define_local([{kblk}, {L.KD}, {L.KH}, {L.KW}, {L.C}, "
                     f"{cw}], at)")
        header, i = map_header([("kb", kblk), ("td", L.KD), ("th", L.KH), ("tw", L.KW),
                                ("c", L.C), ("j", cw)], "    ")
        body = "    " if header is None else "        "
        if header:
            lines.append(header)
        k = f"{i['kb']} * {cw} + {i['j']}"
        taps = (", ".join(f"{n - 1} - {i[d]}" for n, d in ((L.KD, "td"), (L.KH, "th"),
                                                            (L.KW, "tw"))) if flip
                else f"{i['td']}, {i['th']}, {i['tw']}")
        lines.append(f"{body}wp[{i['kb']}, {i['td']}, {i['th']}, {i['tw']}, {i['c']}, {i['j']}] = "
                     + (f"w[{i['c']}, {taps}, {k}]" if flip else f"w[{k}, {taps}, {i['c']}]"))

        def filter_at(kb, lane, c, kw="kw"):
            return f"wp[{kb}, kd, kh, {kw}, {c}, {lane}]"
    else:
        def filter_at(kb, lane, c, kw="kw"):
            return f"w[{c}, {L.KD - 1} - kd, {L.KH - 1} - kh, {L.KW - 1} - {kw}, {kb} * {cw} + {lane}]"
    tile = (db, hb, wb)
    blocks = L.C // cblk if cblk else 1
    if blocks > 1 and widens(dtype_name):
        raise ValueError(f"CBLK={cblk} adds each channel block's float32 partial sums into the "
                         f"{dtype_name} output, rounding them {blocks} times: use CBLK=0 in "
                         "16 bits")
    channel = f"cc * {cblk} + c" if blocks > 1 else "c"
    reduced = L.C // blocks
    nest, ind, t = tile_prologue(L, kblk, tile, k_outer, pixels * nv, nb)
    loads = [Load(f"wv{v}", lambda kw="kw", v=v: filter_at(
        t['kb'], f'{v * nb} + j' if v else 'j', channel, kw)) for v in range(nv)]
    offsets = tile_pixels(tile)
    # the input is float32 unless read in place; the filter vectors too when packed
    widen = "dace.float32({})" if widens(dtype_name) and in_place else "{}"
    statements = [[Update(lambda kw="kw", p=p, v=v, offset=offset:
                          f"acc[{p * nv + v}, j] += "
                          + widen.format(input_at(t, tile, offset, S, channel, pads, kw))
                          + f" * wv{v}",
                          frozenset({f"wv{v}"}))
                   for v in range(nv)] for p, offset in enumerate(offsets)]
    cases = width_cases(L, tile) if edge else [WidthCase(None, None, None, None)]
    for case in cases:
        condition = case.condition(t["owb"])
        body = ind if condition is None else ind + "    "
        if condition is not None:
            nest.append(f"{ind}{condition}:")
        taps, depth = tap_loops(L, tile, t, body)
        if case.taps is None:  # every pixel, the width taps bounded per tile
            nest += taps + [f"{depth}for c in range({reduced}):"]
            nest += vector_loops(depth + "        ", nb, loads, statements, group)
        elif case.taps:  # the width taps unrolled, each with the pixels it reads the input for
            nest += taps[:2]
            depth = body + "        "
            for tap in case.taps:
                groups = [statements[p] for p, offset in enumerate(offsets)
                          if offset[2] in tap.columns]
                nest.append(f"{depth}for c in range({reduced}):")
                nest += vector_loops(depth + "        ", nb, loads, groups, group, at=str(tap.kw))
        nest += store_tile(body, t, tile, "j1", nb, lambda p, v=0: f"acc[{p * nv + v}, j1]",
                           nv, add=blocks > 1, width=case.width)
    if blocks > 1:
        zero, z = map_header([("zb", L.N), ("zd", L.OD), ("zh", L.OH), ("zw", L.OW),
                              ("zk", L.K)], "    ")
        lines += [zero, f"        y[{z['zb']}, {z['zd']}, {z['zh']}, {z['zw']}, {z['zk']}] = 0",
                  f"    for cc in range({blocks}):"]
        nest = ["    " + line for line in nest]
    lines += nest
    return "\n".join(lines) + "\n"
