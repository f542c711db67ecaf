"""``directConvNDHWCblockedBwdFilter``: dL/dw on NDHWC, register-blocked, for the CPU.

``dw[k, kd, kh, kw, c] = sum over (b, od, oh, ow) of dy[b, od, oh, ow, k] *
x_padded[b, od*S + kd, oh*S + kh, ow*S + kw, c]``.  The long reduction over output
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
compiler keeps them in registers).  ``TW`` is the kernel width when ``TAPW`` = 1 (the
width taps share the ``dy`` load: what keeps a one-channel first layer busy), else 1.
The parallel map runs over (slice, channel blocks, the remaining taps), slices
outermost so that a thread's consecutive tiles reuse one slice in cache.
"""

from convbench.registry import Implementation, Layout, Pass, Param, register
from impls._blocked import cpu_schedule, largest_divisor, map_header, signature
from impls._common import layer_constants, pad_input, program_from_source


#: The partial gradients (one per slice, each the size of dL/dw) stay below this many
#: bytes: large filters get few slices.  Slices of few depth planes keep a slice's dy and
#: x in cache while the tiles of its filter elements run one after the other.
PARTIAL_BYTES = 16 << 20


def tile_sizes(layer, params):
    """``(chunks, tw, cb, nb, taps_inner)``: depth chunks per batch element, width taps,
    input channels and output channels per micro-tile, and whether the depth and height
    taps loop inside each output row (else they are dimensions of the parallel map)."""
    tw = layer.k_w if params["TAPW"] else 1
    cb = largest_divisor(layer.in_channels, params["CB"])
    nb = largest_divisor(layer.out_channels, params["NB"])
    inner = bool(params["TAPS"])
    per_slice = 4 * layer.batch * layer.out_channels * layer.in_channels * layer.k_d \
        * layer.k_h * layer.k_w
    slices = max(1, min(params["SLICES"], PARTIAL_BYTES // per_slice))
    return largest_divisor(layer.out_d, slices), tw, cb, nb, inner


def _source(L, dtype_name, chunks, tw, cb, nb, inner):
    ch, S = L.OD // chunks, L.S
    kblk, cblk, wblk = L.K // nb, L.C // cb, L.KW // tw
    lines = signature(L, dtype_name, "bwd_filter_blocked")  # called by keyword: x, y in, w out
    lines.append(f"    part = dace.define_local([{L.N}, {chunks}, {L.K}, {L.KD}, {L.KH}, {L.KW}, "
                 f"{L.C}], dt)")
    dims = [("b", L.N), ("dc", chunks), ("kb", kblk), ("cb", cblk)]
    dims += [("wb", wblk)] if inner else [("kd", L.KD), ("kh", L.KH), ("wb", wblk)]
    header, t = map_header(dims, "    ")
    ind = "        " if header else "    "
    if header:
        lines.append(header)
    acc, taps = tw * cb, L.KD * L.KH if inner else 1
    tap = "kd * {} + kh, ".format(L.KH) if inner else ""
    kd, kh = ("kd", "kh") if inner else (t["kd"], t["kh"])
    lines += [f"{ind}acc = dace.define_local([{taps}, {acc}, {nb}], dt)",
              f"{ind}for i0 in range({taps}):",
              f"{ind}    for i1 in range({acc}):",
              f"{ind}        for j0 in range({nb}):",
              f"{ind}            acc[i0, i1, j0] = 0",
              f"{ind}for t in range({ch}):",
              f"{ind}    for oh in range({L.OH}):"]
    deep = ind + "        "
    if inner:
        lines += [f"{deep}for kd in range({L.KD}):", f"{deep}    for kh in range({L.KH}):"]
        deep += "        "
    lines += [f"{deep}for ow in range({L.OW}):", f"{deep}    for j in range({nb}):"]
    deep += "        "
    od = f"{t['dc']} * {ch} + t"
    lines.append(f"{deep}dv = y[{t['b']}, {od}, oh, ow, {t['kb']} * {nb} + j]")
    # One accumulator per (width tap a, channel ci): its index, and its width and channel.
    slots = [(f"{tap or '0, '}{a * cb + ci}", f"{t['wb']} * {tw} + {a}", f"{t['cb']} * {cb} + {ci}")
             for a in range(tw) for ci in range(cb)]
    for i, kw, c in slots:
        lines.append(f"{deep}acc[{i}, j] += x[{t['b']}, ({od}) * {S} + {kd}, oh * {S} + {kh}, "
                     f"ow * {S} + {kw}, {c}] * dv")
    store = ind
    if inner:
        lines += [f"{ind}for kd in range({L.KD}):", f"{ind}    for kh in range({L.KH}):"]
        store += "        "
    lines.append(f"{store}for j1 in range({nb}):")
    for i, kw, c in slots:
        lines.append(f"{store}    part[{t['b']}, {t['dc']}, {t['kb']} * {nb} + j1, {kd}, {kh}, "
                     f"{kw}, {c}] = acc[{i}, j1]")
    red, r = map_header([("k", L.K), ("kd", L.KD), ("kh", L.KH), ("kw", L.KW), ("c", L.C)],
                        "    ")
    rind = "        " if red else "    "
    if red:
        lines.append(red)
    where = f"{r['k']}, {r['kd']}, {r['kh']}, {r['kw']}, {r['c']}"
    lines += [f"{rind}tot = dace.define_local([1], dt)",
              f"{rind}tot[0] = 0",
              f"{rind}for b in range({L.N}):",
              f"{rind}    for dc in range({chunks}):",
              f"{rind}        tot[0] += part[b, dc, {where}]",
              f"{rind}w[{where}] = tot[0]"]
    return "\n".join(lines) + "\n"


def algorithm(layer, dtype, params):
    L = layer_constants(layer, Layout.NDHWC)
    chunks, tw, cb, nb, inner = tile_sizes(layer, params)
    source = _source(L, dtype.name, chunks, tw, cb, nb, inner)
    program = program_from_source(source, "bwd_filter_blocked", f"bwd_filter_blocked_"
                                  f"{layer.key()}_{chunks}x{tw}x{cb}x{nb}x{int(inner)}")
    return pad_input(program, layer, Layout.NDHWC)


register(Implementation(
    name="directConvNDHWCblockedBwdFilter",
    summary="backward filter on NDHWC for the CPU: the pixel reduction split into "
            "(batch x depth-chunk) slices with private partial gradients, then summed; "
            "register-blocked micro-tiles of (width taps x CB input channels) x NB output "
            "channels (vectors over dy), OpenMP over slices and tiles",
    layout=Layout.NDHWC,
    pass_=Pass.BWD_FILTER,
    algorithm=algorithm,
    schedules={"cpu": cpu_schedule},
    params=(Param("SLICES", 8, "chunks of output depth planes per batch element, each "
                               "with its own partial gradient (the largest divisor of the "
                               f"depth up to SLICES, fewer where the partials would pass "
                               f"{PARTIAL_BYTES >> 20} MiB)"),
            Param("CB", 4, "input channels per micro-tile (a divisor of C)"),
            Param("NB", 16, "output channels per micro-tile, the vector lanes (a divisor "
                            "of K)"),
            Param("TAPW", 1, "1: the kernel's width taps share each dy load in one tile",
                  minimum=0, check=lambda v: None if v in (0, 1) else "must be 0 or 1"),
            Param("TAPS", 0, "1: the depth and height taps loop inside each output row "
                             "(its dy and x rows stay in cache), 0: they are map dimensions",
                  minimum=0, check=lambda v: None if v in (0, 1) else "must be 0 or 1")),
    anisotropic_pad=True,
))
