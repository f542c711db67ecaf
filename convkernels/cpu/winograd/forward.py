"""3D Winograd F(m^3, 3^3) for the CPU, on NDHWC (``winogradF2``, ``winogradF2BwdData``;
the algorithm and its error bound: :mod:`convkernels.winograd.algebra`, docs/winograd.md).

The output is cut into tiles of ``m^3`` pixels (``m = 2``: 8 pixels, 64 transform points
``p``), numbered batch, depth, height, width, and the tiles into blocks of ``T``.  One
work item is a block times a group of ``KG`` output channels:

1. per chunk of ``CB`` input channels, the input transform of the block's tiles (three
   passes of ``B^T`` over a tile's ``4 x 4 x 4 x CB`` patch, channels innermost and
   vectorised) into ``V[p, t, c]``;
2. per block of ``KB`` output channels and per transform point, the GEMM
   ``M[p, t, :] += V[p, t, :] U[p, :, :]`` on the chunk, register-blocked over ``RT`` tiles
   times ``NV`` vectors of output channels (``KB = NV`` vectors), channels summed in
   sequence across the chunks;
3. per tile and block of ``KB`` output channels, the output transform (three passes of
   ``A^T``) into ``y``.

``V`` and ``M`` live in a thread's scratch buffer, sized by ``T``, ``CB`` and ``KG`` to
stay in its cache; only with ``SHARE`` (one block of all tiles, the deep layers) is the
block's ``V`` made once in a shared buffer, sized to stay in the last-level cache.

The transformed filter ``U`` is stored in chunks ``[K / KB][C / CB][p][CB][KB]``, one
contiguous stream per GEMM.  Either a pass before the items computes it once per call
(``FUSE`` 0: each block reads it from memory, so its cost is divided among them), or each
item transforms its chunks itself as it needs them (``FUSE`` 1: no transformed filter in
memory at all, the choice for layers of few tiles and many channels, where ``U`` would
be the largest array of the call).  Training changes the filter every step, so neither
keeps it across calls.

The kernel's C++ is ``include/winograd_forward.h`` (and ``include/winograd_common.h``, which
the other Winograd CPU kernels share); :func:`global_code` puts a prelude of the layer's
and the blocking's constants before it.

``flip``: the data gradient of a stride-1 layer, the same kernel on the transposed layer
(:mod:`convkernels.transposed`) with the original filter ``w[k, taps, c]`` read flipped in
space and with its channels swapped while it is transformed.
"""

import os
from typing import NamedTuple

import dace

from convkernels.winograd import algebra
from convkernels.cpu.caches import caches
from convkernels.cpu.isa import accumulator_budget, vector_floats, vector_registers
from convkernels.cpu.direct.blocking import largest_divisor, auto_switch
from convkernels.cpu.calls import call_map, finish, include, layer_sdfg
from convkernels.winograd.tiles import M_OUT, R, tile_count, tiles


class Blocking(NamedTuple):
    """A kernel's blocking for one layer (see the module): tiles per block ``T``, output
    channels per work item ``KG``, input channels per chunk ``CB``, output channels per
    register block ``KB = NV x VL``, tiles per register block ``RT``, ``fuse``, ``share``
    (see :func:`params`)."""

    T: int
    KG: int
    CB: int
    KB: int
    RT: int
    NV: int
    VL: int
    fuse: bool
    share: bool


# The budgets of the default blocking, from this machine's caches
# (:mod:`convkernels.cpu.caches`; with its reference 2 MiB L2 and 32 MiB last-level cache
# they are 1 MiB, 2 MiB, 1 MiB and 16 MiB).

def scratch_bytes() -> int:
    """Bytes of one thread's scratch that the default blocking keeps its ``V`` and ``M``
    in: half of the L2 (the other half holds the filter chunk that streams through)."""
    return caches().l2 // 2


def item_bytes() -> int:
    """The most bytes of ``M`` one work item of the few-tiles regime holds (all tiles
    times one register block of output channels): the L2."""
    return caches().l2


def fused_chunk_bytes() -> int:
    """The transformed filter chunk (all transform points, ``CB x KB``) that a work item of
    ``FUSE`` makes and uses at once: half of the L2."""
    return caches().l2 // 2


def shared_bytes() -> int:
    """The largest transformed input that ``SHARE`` 2 computes once for all work items:
    half of the last-level cache."""
    return caches().l3 // 2
#: Tiles per block the default blocking aims at: each value of the transformed filter
#: is used once per tile of a block, so fewer would make the filter stream the bottleneck.
TARGET_TILES = 24


def vector_of(K: int):
    """``VL``: the floats of one vector of this CPU, or the largest power of two below it
    that divides ``K`` (1 for odd ``K``)."""
    vl = vector_floats()
    while K % vl:
        vl //= 2
    return vl


def default_nv() -> int:
    """Output-channel vectors per register block: 4 with 32 vector registers, 2 with 16."""
    return 4 if vector_registers() >= 32 else 2


def blocking(L, params, m: int = M_OUT, threads: int = 0) -> Blocking:
    """The :class:`Blocking` of ``params`` (``T``, ``KG``, ``CB``, ``NV``, ``RT``, ``FUSE``,
    ``SHARE``; 0, or 2 for ``FUSE`` and ``SHARE``: chosen here) on layer constants ``L``
    for ``threads`` (default: this machine's cores).

    Two regimes.  Few tiles (every tile's ``M`` for one register block of output
    channels within :func:`item_bytes`, as in the deep layers of small spatial size and
    many channels): one block of all tiles, one item per ``KB`` output channels, the input
    transformed once for all of them and the filter in the items, so that each value is
    transformed once.  Many tiles: blocks of about :data:`TARGET_TILES` tiles or more,
    output and input channels cut until a block's ``V`` and ``M`` fit
    :func:`scratch_bytes`, and the filter transformed in one pass before them."""
    P = (m + R - 1) ** 3
    vl = vector_of(L.K)
    nv = largest_divisor(L.K // vl, params["NV"] or default_nv())
    kb = nv * vl
    # the accumulators, the NV filter vectors and a broadcast in the registers
    rt = params["RT"] or max(1, min((vector_registers() - nv - 1) // nv,
                                    accumulator_budget() // nv))
    count = tile_count(L, m)
    threads = threads or os.cpu_count() or 1
    scratch = scratch_bytes()
    if 4 * P * count * kb <= item_bytes():
        t, kg, cb = count, kb, L.C
    else:
        target = min(max(TARGET_TILES, rt), -(-count // rt) * rt)
        kg, cb = L.K, L.C
        while 4 * P * target * (cb + kg) > scratch:
            if kg % (2 * kb) == 0:
                kg //= 2
            elif cb % 2 == 0 and cb > vl:
                cb //= 2
            else:
                break
        t = None
    kg = kb * largest_divisor(L.K // kb, max(1, (params["KG"] or kg) // kb))
    cb = largest_divisor(L.C, params["CB"] or cb)
    t = min(params["T"] or t or max(rt, scratch // (4 * P * (cb + kg)) // rt * rt), count)
    blocks = -(-count // t)
    if not params["T"]:  # as many blocks, evened out: no block mostly empty
        t = -(-count // blocks)
    if not params["KG"]:  # every thread two items at least
        while blocks * (L.K // kg) < 2 * threads and kg % (2 * kb) == 0:
            kg //= 2
    fuse = params["FUSE"]
    if fuse == 2:  # each item transforms its own chunks where there are too few blocks
        fuse = blocks <= 2  # to share the cost of writing U and reading it back
    if fuse and not params["CB"]:  # the filter chunk an item transforms stays in L2
        cb = largest_divisor(L.C, max(vl, fused_chunk_bytes() // (4 * P * kb)))
    share = params["SHARE"]
    if share == 2:  # where several items would transform the same tiles' input, all of
        # one block (with more, an item's own block in its L2 is faster than a shared one
        # in the last-level cache), and it stays in the last-level cache
        share = blocks == 1 and L.K // kg > 1 and 4 * P * t * L.C <= shared_bytes()
    return Blocking(t, kg, cb, kb, rt, nv, vl, bool(fuse), bool(share))


def input_parts(b: Blocking) -> int:
    """Parts of a block's tiles in the shared input transform (``SHARE``): up to 8."""
    return min(b.T, 8)


def padded(floats: int) -> int:
    """The stride between transform points of an array of ``floats`` per point, padded by
    one cache line: strides of a multiple of 4 KiB would put the 64 points of a transform
    in one set of the L1 cache."""
    return floats + 16


def header(name: str) -> str:
    """The text of ``convkernels/cpu/winograd/include/<name>``: the C++ the Winograd
    kernels share and the forward kernel, included by content in each kernel's generated
    code (:func:`convkernels.cpu.calls.include`)."""
    return include(__file__, name)


def vector_code(vl: int) -> str:
    """The C++ every Winograd kernel starts with: the vector types of ``vl`` floats, the
    in-register transposition, the transform passes and the GEMM step
    (``include/winograd_common.h``)."""
    return "\n".join([f"typedef float wg_v __attribute__((vector_size({4 * vl})));",
                      f"typedef float wg_vu __attribute__((vector_size({4 * vl}), aligned(4)));",
                      f"static constexpr int VL = {vl};", transpose_code(vl),
                      header("winograd_common.h")])


def micro_code(name: str, nv: int, vl: int, row_b: int, step_b: int, step_v: int,
               row_m: int) -> str:
    """``name<RR>(b, v, m, n, add)``: the register-blocked GEMM step of a Winograd kernel,
    ``m[r][NV VL] (+)= sum_{j < n} b[r row_b + j step_b] v[j step_v + .]`` for ``RR`` rows
    (``wg_gemm`` of ``include/winograd_common.h`` with these strides; ``vl`` is the
    kernel's ``VL``)."""
    return f"""
template <int RR>
static inline __attribute__((always_inline)) void {name}(
        const float* __restrict b, const float* __restrict v, float* __restrict m, int n,
        bool add) {{
    wg_gemm<RR, {nv}, {row_b}, {step_b}, {step_v}, {row_m}>(b, v, m, n, add);
}}"""


def _matrix(name, mat):
    rows = ", ".join("{" + ", ".join(f"{float(v)!r}f" for v in row) + "}" for row in mat)
    return f"static constexpr float {name}[{len(mat)}][{len(mat[0])}] = {{{rows}}};"


def transpose_code(vl: int) -> str:
    """``wg_transpose(r)``: a ``vl x vl`` block of floats in ``vl`` vectors transposed in
    registers.  Per step ``h`` (``vl / 2`` down to 1), rows ``i`` and ``i + h`` swap their
    off-diagonal ``h``-blocks, with one two-source shuffle per row (``vpermt2ps`` with
    AVX-512); after all steps element ``(i, j)`` is at ``(j, i)``."""
    if vl <= 1:
        return "static inline void wg_transpose(wg_v (&)[1]) {}"
    lines = [f"typedef int wg_vi __attribute__((vector_size({4 * vl})));",
             f"static inline void wg_transpose(wg_v (&r)[{vl}]) {{"]
    h = vl // 2
    while h >= 1:
        lo = [vl + j - h if j & h else j for j in range(vl)]
        hi = [vl + j if j & h else j + h for j in range(vl)]
        lines.append(f"    {{ const wg_vi lo = {{{', '.join(map(str, lo))}}}, "
                     f"hi = {{{', '.join(map(str, hi))}}};")
        for i in range(vl):
            if not i & h:
                lines.append(f"      const wg_v a{i} = r[{i}], b{i} = r[{i + h}]; "
                             f"r[{i}] = __builtin_shuffle(a{i}, b{i}, lo); "
                             f"r[{i + h}] = __builtin_shuffle(a{i}, b{i}, hi);")
        lines.append("    }")
        h //= 2
    lines.append("}")
    return "\n".join(lines)


def global_code(L, b: Blocking, m: int = M_OUT, flip: bool = False, matrices=None) -> str:
    """The C++ of the kernel (``include/winograd_forward.h``, see the module) for layer
    constants ``L`` and blocking ``b``: a prelude of compile-time constants, with the
    transforms ``matrices`` (default :func:`convkernels.winograd.algebra.transforms`' for ``m``)
    written in, before the header's text."""
    at, g, bt = matrices or algebra.transforms(m, R)
    n = m + R - 1
    ints = dict(WG_M=m, WG_N=n, WG_R=R, WG_P=n ** 3, WG_T=b.T, WG_KG=b.KG, WG_CB=b.CB,
                WG_KB=b.KB, WG_RT=b.RT, WG_NV=b.NV, WG_PARTS=input_parts(b))
    longs = dict(WG_C=L.C, WG_K=L.K, WG_D=L.D, WG_H=L.H, WG_W=L.W, WG_PD=L.PD, WG_PH=L.PH,
                 WG_PW=L.PW, WG_OD=L.OD, WG_OH=L.OH, WG_OW=L.OW, WG_TD=tiles(L.OD, m),
                 WG_TH=tiles(L.OH, m), WG_TW=tiles(L.OW, m), WG_COUNT=tile_count(L, m),
                 WG_VP=padded(b.T * b.CB), WG_MP=padded(b.T * b.KB), WG_UP=padded(b.CB * b.KB),
                 WG_WIDE=max(b.CB, b.KB))
    flags = dict(WG_FUSE=b.fuse, WG_SHARE=b.share, WG_FLIP=flip)
    return "\n".join(
        ["#include <vector>", "#include <cstring>",
         _matrix("WG_AT", at), _matrix("WG_G", g), _matrix("WG_BT", bt), vector_code(b.VL)]
        + [f"static constexpr int {k} = {v};" for k, v in ints.items()]
        + [f"static constexpr long {k} = {v};" for k, v in longs.items()]
        + [f"static constexpr bool {k} = {str(bool(v)).lower()};" for k, v in flags.items()]
        + [header("winograd_forward.h")])


def program(layer, L, params, m: int = M_OUT, flip: bool = False, matrices=None, w_shape=None):
    """The SDFG (see the module): the filter pass unless fused, the shared input pass where
    ``SHARE``, then the parallel map over work items.  The kernel reads the unpadded input
    and treats the border itself."""
    b = blocking(L, params, m)
    P = (m + R - 1) ** 3
    blocks = -(-tile_count(L, m) // b.T)
    tag = "_".join(map(str, (b.T, b.KG, b.CB, b.KB, b.RT, int(b.fuse), int(b.share))))
    sdfg = layer_sdfg(f"winograd_f{m}_{'bwdd_' if flip else ''}{layer.key()}_{tag}", layer, L,
                      w_shape)
    code = global_code(L, b, m, flip, matrices)
    state = sdfg.add_state("filter_transform", is_start_block=True)
    if not b.fuse:
        sdfg.add_array("U", (L.K // b.KB * (L.C // b.CB) * P * padded(b.CB * b.KB),),
                       dace.float32, transient=True)
        call_map(state, "filter_chunk", {"kb": f"0:{L.K // b.KB}", "cb": f"0:{L.C // b.CB}"},
                 {"win": "w"}, "wg_filter_chunk(win, uout, kb, cb);", {"uout": "U"})
    if b.share:
        sdfg.add_array("Vs", (blocks * (L.C // b.CB) * P * padded(b.T * b.CB),), dace.float32,
                       transient=True)
        state = sdfg.add_state_after(state, "input_transform")
        call_map(state, "input_chunk", {"tb": f"0:{blocks}", "cb": f"0:{L.C // b.CB}",
                                        "part": f"0:{input_parts(b)}"},
                 {"xin": "x"}, "wg_input_chunk(xin, vout, tb, cb, part);", {"vout": "Vs"})
    items = sdfg.add_state_after(state, "tiles")
    inputs = {"xin": "x", "win": "w"}
    if not b.fuse:
        inputs["uin"] = "U"
    if b.share:
        inputs["vin"] = "Vs"
    call_map(items, "tile_block", {"tb": f"0:{blocks}", "kg": f"0:{L.K // b.KG}"}, inputs,
             f"wg_item(xin, win, {'nullptr' if b.fuse else 'uin'}, "
             f"{'vin' if b.share else 'nullptr'}, yout, tb, kg);", {"yout": "y"})
    return finish(sdfg, code)


#: What ``convbench tune`` tries by default.
SEARCH_SPACE = "T=0,24,48;NV=0,2;FUSE=2,1"


def params():
    """The tunable parameters of the Winograd kernels (0: chosen by :func:`blocking`)."""
    from convkernels.declarations import Param
    return (
        Param("T", 0, "output tiles per block (0: as many as keep the block's transformed "
                      "input and output within a thread's scratch budget)", minimum=0),
        Param("KG", 0, "output channels per work item, a multiple of KB (0: all, split "
                       "until the block fits and every thread has two items)", minimum=0),
        Param("CB", 0, "input channels per chunk of the input transform and the GEMMs "
                       "(0: all, unless the block would not fit)", minimum=0),
        Param("NV", 0, "vectors of output channels per register block (0: 4 with 32 "
                       "vector registers, 2 with 16)", minimum=0),
        Param("RT", 0, "tiles per register block (0: as many as the registers hold)",
              minimum=0),
        Param("SHARE", 2, "1: one pass transforms the whole input first and the work items "
                          "of a tile block share it; 0: each item transforms its block's "
                          "input; 2: shared where there is one block, split among items by "
                          "output channels, and its transformed input fits half of the last-level cache", minimum=0,
              check=auto_switch),
        Param("FUSE", 2, "1: each work item transforms the filter chunks it uses; 0: one "
                         "pass transforms the whole filter first; 2: fused where there are "
                         "at most two tile blocks", minimum=0,
              check=auto_switch),
    )


def registers_of(pass_):
    """``registers(layer, params)`` for the tuner: the register block's accumulators (for
    the data gradient, on the transposed layer, whose output channels are ``layer``'s
    input channels)."""
    from convkernels.layouts import Layout, Pass
    from convkernels.layer import layer_constants
    from convkernels.transposed import transposed_layer

    def registers(layer, params):
        t = layer if Pass(pass_) == Pass.FWD else transposed_layer(layer)
        b = blocking(layer_constants(t, Layout.NDHWC), params)
        return b.RT * b.NV

    return registers
