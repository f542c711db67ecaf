"""``directConvNDHWCblocked``: a register-blocked direct convolution for the CPU, on NDHWC.

The output is cut into micro-tiles of ``wb`` consecutive output pixels along the
width times ``nb`` consecutive output channels.  One micro-tile is computed by

    acc[wb, nb] = 0
    for kd, kh, kw, c:                       # the reduction, C * kd * kh * kw steps
        for j in 0..nb-1:                    # contiguous output channels: one SIMD vector
            wv = wp[kb, kd, kh, kw, c, j]
            acc[0, j] += x[b, od*S+kd, oh*S+kh, (ow0+0)*S+kw, c] * wv
            ...                              # wb statements, written out (unrolled)
            acc[wb-1, j] += x[..., (ow0+wb-1)*S+kw, c] * wv

and stored.  With ``nb`` = 16 floats the ``j`` loop is one AVX-512 vector; the ``wb``
statements are ``wb`` broadcast-FMAs on ``wb`` accumulator vectors, whose addresses are
constant, so the C++ compiler keeps the whole ``acc`` tile in registers across the
reduction (16 x 16 floats = 16 of the 32 zmm registers).  Each filter vector is loaded
once per ``wb`` FMAs and each input value once per ``nb`` FMAs.

* **Filter packing**: the KTRSC filter is first copied into ``wp[K/nb, kd, kh, kw, C,
  nb]``, so the ``nb`` channels of one tap are contiguous (one aligned vector load).
* **Unrolling**: GCC ignores the ``#pragma unroll`` DaCe emits for unrolled maps, and
  DaCe 1.0.2's ``dace.unroll`` fails on this loop nest, so the ``wb`` statements are
  generated in the program's source text (:func:`impls._common.program_from_source`).
  The ``j`` and reduction loops are plain loops: a map nested inside the reduction
  loops is miscompiled by DaCe 1.0.2's frontend (its input memlets lose the loop
  offsets).
* **Parallelism**: the tile map (batch, od, oh, output-width tile, channel tile) is an
  OpenMP loop collapsed over all five dimensions.
* **Per-layer specialisation**: every size is a constant; ``wb`` is the largest divisor
  of the output width up to ``WB``, ``nb`` the largest divisor of K up to ``NB``.
"""

import dace

from convbench.layouts import Layout, Pass
from convbench.registry import Implementation, Param, register
from impls._common import layer_constants, pad_input, program_from_source


def largest_divisor(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is at most ``limit``."""
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def tile_sizes(layer, params):
    """``(db, hb, wb, nb)``: a micro-tile of ``db x hb x wb`` output pixels (width first,
    then height, then depth, up to ``PIX`` pixels: one accumulator vector each) times
    ``nb`` output channels."""
    wb = largest_divisor(layer.out_w, min(params["WB"], params["PIX"]))
    hb = largest_divisor(layer.out_h, max(1, params["PIX"] // wb))
    db = largest_divisor(layer.out_d, max(1, params["PIX"] // (wb * hb)))
    return db, hb, wb, largest_divisor(layer.out_channels, params["NB"])


def channel_tiles_outer(layer, params) -> bool:
    """``KOUTER``: 1 channel tiles outermost, 0 pixel tiles outermost, 2 (auto) channel
    tiles outermost when the filter has more elements than the input."""
    if params["KOUTER"] != 2:
        return bool(params["KOUTER"])
    filt = 1
    for s in layer.filter_shape:
        filt *= s
    inp = 1
    for s in layer.input_shape:
        inp *= s
    return filt > inp


def _map(dims, indent):
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


def _source(L, dtype_name, db, hb, wb, nb, k_outer):
    """The program's text for layer constants ``L`` and a ``db x hb x wb`` x ``nb`` tile."""
    kblk, S = L.K // nb, L.S
    pixels = db * hb * wb
    lines = ["import dace", "", f"dt = dace.{dtype_name}", "", "",
             "@dace.program",
             f"def direct_blocked(x: dt[{', '.join(map(str, L.xp_shape))}], "
             f"w: dt[{', '.join(map(str, L.w_shape))}], y: dt[{', '.join(map(str, L.y_shape))}]):",
             f"    wp = dace.define_local([{kblk}, {L.KD}, {L.KH}, {L.KW}, {L.C}, {nb}], dt)"]
    header, i = _map([("kb", kblk), ("td", L.KD), ("th", L.KH), ("tw", L.KW), ("c", L.C),
                      ("j", nb)], "    ")
    body = "    " if header is None else "        "
    if header:
        lines.append(header)
    lines.append(f"{body}wp[{i['kb']}, {i['td']}, {i['th']}, {i['tw']}, {i['c']}, {i['j']}] = "
                 f"w[{i['kb']} * {nb} + {i['j']}, {i['td']}, {i['th']}, {i['tw']}, {i['c']}]")
    tiles = [("b", L.N), ("odb", L.OD // db), ("ohb", L.OH // hb), ("owb", L.OW // wb)]
    # Channel tiles outermost when the filter is the larger operand: each thread then
    # sweeps all pixels with one packed filter block (C*kd*kh*kw*nb floats) in cache.
    order = [("kb", kblk)] + tiles if k_outer else tiles + [("kb", kblk)]
    header, t = _map(order, "    ")
    ind = "    " if header is None else "        "
    if header:
        lines.append(header)
    lines += [f"{ind}acc = dace.define_local([{pixels}, {nb}], dt)",
              f"{ind}for i0 in range({pixels}):",
              f"{ind}    for j0 in range({nb}):",
              f"{ind}        acc[i0, j0] = 0"]
    depth = ind
    for name, size in (("kd", L.KD), ("kh", L.KH), ("kw", L.KW), ("c", L.C)):
        lines.append(f"{depth}for {name} in range({size}):")
        depth += "    "
    lines.append(f"{depth}for j in range({nb}):")
    depth += "    "
    lines.append(f"{depth}wv = wp[{t['kb']}, kd, kh, kw, c, j]")
    p = 0
    for di in range(db):
        for hi in range(hb):
            for wi in range(wb):
                lines.append(
                    f"{depth}acc[{p}, j] += x[{t['b']}, ({t['odb']} * {db} + {di}) * {S} + kd, "
                    f"({t['ohb']} * {hb} + {hi}) * {S} + kh, ({t['owb']} * {wb} + {wi}) * {S} + kw, "
                    f"c] * wv")
                p += 1
    lines.append(f"{ind}for j1 in range({nb}):")
    p = 0
    for di in range(db):
        for hi in range(hb):
            for wi in range(wb):
                lines.append(f"{ind}    y[{t['b']}, {t['odb']} * {db} + {di}, {t['ohb']} * {hb} + {hi}, "
                             f"{t['owb']} * {wb} + {wi}, {t['kb']} * {nb} + j1] = acc[{p}, j1]")
                p += 1
    return "\n".join(lines) + "\n"


def algorithm(layer, dtype, params):
    L = layer_constants(layer, Layout.NDHWC)
    db, hb, wb, nb = tile_sizes(layer, params)
    k_outer = channel_tiles_outer(layer, params)
    program = program_from_source(_source(L, dtype.name, db, hb, wb, nb, k_outer),
                                  "direct_blocked",
                                  f"direct_blocked_{layer.key()}_{db}x{hb}x{wb}x{nb}_{int(k_outer)}")
    return pad_input(program, layer, Layout.NDHWC)


def cpu_schedule(sdfg, layer, params):
    """OpenMP over every dimension of the tile map (collapsed); everything else as the
    frontend wrote it: sequential loops the C++ compiler vectorises and unrolls."""
    for node, _ in sdfg.all_nodes_recursive():
        if isinstance(node, dace.nodes.MapEntry) and node.map.schedule in (
                dace.ScheduleType.Default, dace.ScheduleType.CPU_Multicore):
            node.map.schedule = dace.ScheduleType.CPU_Multicore
            node.map.collapse = len(node.map.params)


register(Implementation(
    name="directConvNDHWCblocked",
    summary="direct convolution on NDHWC for the CPU: register-blocked micro-tiles of WB "
            "output pixels x NB output channels (one AVX-512 vector), packed filter, "
            "unrolled broadcast-FMAs, OpenMP over all tiles",
    layout=Layout.NDHWC,
    pass_=Pass.FWD,
    algorithm=algorithm,
    schedules={"cpu": cpu_schedule},
    params=(Param("PIX", 16, "output pixels per micro-tile: accumulator vectors (width "
                             "first, then height and depth, by divisors of the output size)"),
            Param("WB", 16, "at most this many of them along the width"),
            Param("NB", 16, "output channels per micro-tile (the largest divisor of K up "
                            "to NB; 16 floats = one AVX-512 vector)"),
            Param("KOUTER", 2, "loop order of the tiles: 1 channel tiles outermost, 0 pixel "
                               "tiles outermost, 2 by operand sizes", minimum=0,
                  check=lambda v: None if v in (0, 1, 2) else "must be 0, 1 or 2")),
    anisotropic_pad=True,
))
