"""The exact int8 Winograd forward for the CPU (``winogradF2int8``): F(2^3, 3^3) on uint8
activations with a zero point and int8 filters, in integers throughout, so that its int32
sums equal the direct convolution's bit for bit (the int8 convention of
:mod:`convkernels.cpu.direct.int8_dot`, whose requantizing store it shares).

**The arithmetic.**  With ``d = x - zx`` (zero past the border), the F(2, 3) transforms
``B^T`` and ``A^T`` have entries 0 and +-1, and ``2 G`` (``G`` has halves) is integer too:

- ``V = B^T d B`` (per axis) grows ``|d| <= 255`` to at most ``8 x 255 = 2040``: int16;
- ``U = (2G) g (2G)^T`` grows ``|g| <= 128`` to at most ``27 x 128 = 3456``: int16,
  made once per filter by :func:`pack` (as the direct kernel packs its filter);
- ``M = sum_c U V`` per transform point: 16-bit dot products into int32 lanes
  (``vpdpwssd``, or ``vpmaddwd`` and an add on AVX2), two channels per instruction;
- ``8 y = A^T M A``, and ``y`` is that shifted right by 3, exactly.

Every step adds, subtracts or multiplies integers, and int32 arithmetic that wraps is
arithmetic modulo 2^32: a partial sum may leave int32 and come back, and ``8 y`` is right
as long as it fits, which :func:`refusal` checks (``8 x 27 C x 255 x 128 < 2^31``).
Against a float32 Winograd this trades the rounding error for exactness; against the
direct int8 kernel, 3.375x fewer products at half of ``vpdpbusd``'s products per
instruction.

**Work.**  The output is cut into 2 x 2 x 2 tiles, the tiles into blocks of ``T``.  A
work item is a block times ``KQ`` blocks of ``KBW = NV x VL`` output channels: it
transforms its tiles' input (``V[p][t][c]``, within a thread's L2), then per block of
output channels the register-blocked GEMMs (``RT`` tiles x ``NV`` vectors of int32 sums,
each product with its tile's channel pair broadcast from memory) of the 64 transform
points, then the output transform and the store (int32 sums, ``OUT`` 0, or requantized
to uint8, ``OUT`` 1).  ``GROUP`` 1 runs that per group of ``RT`` tiles, so that the
group's sums stay near the core; 0 per block of ``T`` tiles.  The C++ is
``include/winograd_int8.h``.

**Plant** (``PLANT`` 1, tests only): the last transform point's products are dropped.
"""

import numpy as np

import dace

from convkernels.cpu.direct import int8_dot
from convkernels.cpu.direct.blocking import largest_divisor
from convkernels.cpu.winograd.forward import header

#: The F(2, 3) transforms: B^T, 2 G and A^T.
BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]])
G2 = np.array([[2, 0, 0], [1, 1, 1], [1, -1, 1], [0, 0, 2]])
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]])

def budgets():
    """``(V, M)``: bytes of a work item's transformed input and of its int32 sums for one
    block of output channels: half and a quarter of the L2 (:mod:`convkernels.cpu.caches`;
    beside them, the filter slab that streams through)."""
    from convkernels.cpu.caches import caches
    l2 = caches().l2
    return l2 // 2, l2 // 4
#: The 16-bit dot product per ``ISA`` value (int8_dot's numbering).
DOT16 = {
    1: """static inline cb_vi cb_dot16(cb_vi acc, cb_vi w, const int16_t* pair) {
    // the pair broadcast from memory inside the instruction: no shuffle beside the products
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int*)pair));
    return acc;
}""",
    2: """static inline cb_vi cb_dot16(cb_vi acc, cb_vi w, const int16_t* pair) {
    return _mm256_dpwssd_avx_epi32(acc, w, cb_bcast(cb_u32(reinterpret_cast<const uint8_t*>(pair))));
}""",
    3: """static inline cb_vi cb_dot16(cb_vi acc, cb_vi w, const int16_t* pair) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(w, cb_bcast(cb_u32(reinterpret_cast<const uint8_t*>(pair)))));
}"""}
#: The main loop's product instruction per ``ISA`` value (its instruction mix counts it).
PRODUCTS = {1: "vpdpwssd", 2: "vpdpwssd", 3: "vpmaddwd"}


def params():
    from convkernels.declarations import Param
    from convkernels.cpu.direct.blocking import switch_param
    return (
        Param("ISA", 0, "1 vpdpwssd zmm (AVX512-VNNI), 2 vpdpwssd ymm (AVX-VNNI), 3 vpmaddwd "
                        "(AVX2); 0: the first this CPU has", minimum=0,
              check=lambda v: None if v in (0, 1, 2, 3) else "0, 1, 2 or 3"),
        Param("T", 0, "output tiles per block, a multiple of RT (0: as many as keep the "
                      "block's transformed input and sums in a thread's L2)", minimum=0),
        Param("NV", 0, "vectors of output channels per register block (0: 1 per group of "
                       "RT tiles, 2 per block)", minimum=0),
        Param("RT", 0, "tiles per register block (0: with 32 vector registers 10 per group, "
                       "8 per block; with 16, 12 and 6)", minimum=0),
        Param("KQ", 0, "blocks of output channels per work item (0: all, halved until every "
                       "thread has two items)", minimum=0),
        Param("GROUP", 2, "1: per group of RT tiles, its sums for one block of output "
                          "channels stay in L1; 0: per block of T tiles; 2: 1 where C <= 128",
              minimum=0, check=lambda v: None if v in (0, 1, 2) else "0, 1 or 2"),
        switch_param("OUT", 1, "0 stores the int32 sums, 1 requantizes them to uint8"),
        switch_param("PLANT", 0, "tests only: 1 drops the last transform point"),
    )


def tiles(layer):
    """Tiles per axis (depth, height, width) and in all."""
    from convkernels.winograd.tiles import tiles as along
    td, th, tw = (along(n) for n in layer.output_shape[2:])
    return td, th, tw, layer.batch * td * th * tw


def group_of(layer, p) -> bool:
    """Whether the GEMMs run per group of ``RT`` tiles (``GROUP``; 2: where C <= 128)."""
    return p["GROUP"] == 1 or (p["GROUP"] == 2 and layer.in_channels <= 128)


def blocking(layer, p):
    """``(T, RT, NV, VL, KQ)`` of parameters ``p`` on ``layer`` (see :func:`params`).
    Measured on an AVX-512 EPYC (docs/int8.md): per group of RT tiles, one vector of
    output channels and 10 tiles; per block, two vectors and 8 tiles."""
    import os
    isa = int8_dot.isa_of(p)
    vl = int8_dot.ISAS[isa][2] if isa else 16
    group = group_of(layer, p)
    nv = largest_divisor(layer.out_channels // vl, p["NV"] or (1 if group else 2))
    rt = p["RT"] or {(True, 16): 10, (False, 16): 8, (True, 8): 12, (False, 8): 6}[group, vl]
    kbw = nv * vl
    count = tiles(layer)[3]
    v_bytes, m_bytes = budgets()
    budget = v_bytes // (128 * layer.in_channels)
    if not group:  # the block's sums too
        budget = min(budget, m_bytes // (256 * kbw))
    t = p["T"] or max(rt, budget // rt * rt)
    t = min(t, -(-count // rt) * rt)
    blocks = -(-count // t)
    kbs = layer.out_channels // kbw
    kq = largest_divisor(kbs, p["KQ"] or kbs)
    if not p["KQ"]:
        while blocks * (kbs // kq) < 2 * (os.cpu_count() or 1) and kq % 2 == 0:
            kq //= 2
    return t, rt, nv, vl, kq


def refusal(layer, p) -> str:
    """Why the kernel does not build ``layer`` with ``p`` on this CPU ("" where it does)."""
    why = int8_dot.refusal(layer, p)
    if why:
        return why
    if (layer.k_d, layer.k_h, layer.k_w) != (3, 3, 3) or any(s != 1 for s in layer.strides):
        return "F(2^3, 3^3): 3 x 3 x 3 filters at stride 1 only"
    if layer.in_channels % 2:
        return f"C = {layer.in_channels}: the 16-bit dot products take channels in pairs"
    if 8 * 27 * layer.in_channels * 255 * 128 >= 2 ** 31:
        return f"C = {layer.in_channels}: 8 y may leave int32"
    if tuple(layer.pads) != tuple(getattr(layer, "pads_end", layer.pads)):
        return "the padding must be the same at both ends"
    return ""


def supports(layer, p):
    return refusal(layer, p) or None


def prelude(layer, p) -> str:
    from convkernels.layer import layer_constants
    from convkernels.layouts import Layout
    L = layer_constants(layer, Layout.NDHWC)
    t, rt, nv, vl, kq = blocking(layer, p)
    td, th, tw, count = tiles(layer)
    values = dict(N=L.N, C=L.C, K=L.K, D=L.D, H=L.H, W=L.W, PD=L.PD, PH=L.PH, PW=L.PW,
                  OD=L.OD, OH=L.OH, OW=L.OW, TD=td, TH=th, TW=tw, COUNT=count, T=t, RT=rt,
                  NV=nv, VL=vl, KBW=nv * vl, KQ=kq, OUT=p["OUT"], PLANT=p["PLANT"], VB=4 * vl,
                  GROUP=int(group_of(layer, p)))
    return "\n".join(f"static constexpr long WQ_{k} = {v};" for k, v in values.items())


def packed_shape(layer, p):
    """The transformed filter's shape: ``[K / KBW][64][C / 2][KBW][2]`` int16."""
    _, _, nv, vl, _ = blocking(layer, p)
    kbw = nv * vl
    return (layer.out_channels // kbw, 64, layer.in_channels // 2, kbw, 2)


def pack(layer, p, w) -> np.ndarray:
    """``U`` of the int8 filter ``w`` (logical ``K x C x 3 x 3 x 3``, any integer array):
    ``(2G) g (2G)^T`` along each axis, in int16 and in the order of :func:`packed_shape`."""
    g = np.asarray(w, dtype=np.int64)
    u = np.einsum("ia,jb,le,kcabe->kcijl", G2, G2, G2, g)
    if np.abs(u).max(initial=0) > 32767:
        raise ValueError("pack: the transformed filter leaves int16")
    blocks, _, c2, kbw, _ = packed_shape(layer, p)
    u = u.reshape(blocks, kbw, c2, 2, 64)               # (kb, j, c2, e, p)
    return np.ascontiguousarray(u.transpose(0, 4, 2, 1, 3)).astype(np.int16)


def program(layer, dtype, p):
    """The SDFG: ``(x uint8 NDHWC, u int16 (:func:`packed_shape`), zp int32[2] = (zx, zy),
    qs float32[2, K] = (m, bq), y)`` with ``y`` int32 (``OUT`` 0) or uint8 (1); one
    parallel map over the work items."""
    from convkernels.layer import layer_constants
    from convkernels.layouts import Layout
    L = layer_constants(layer, Layout.NDHWC)
    isa = int8_dot.isa_of(p)
    t, rt, nv, vl, kq = blocking(layer, p)
    count = tiles(layer)[3]
    name = (f"winograd_int8_{layer.key()}_{int8_dot.ISAS[isa][0]}_t{t}r{rt}n{nv}q{kq}"
            f"g{p['GROUP']}_o{p['OUT']}_p{p['PLANT']}")
    sdfg = dace.SDFG(name)
    sdfg.add_array("x", (L.N, L.D, L.H, L.W, L.C), dace.uint8)
    sdfg.add_array("u", packed_shape(layer, p), dace.int16)
    sdfg.add_array("zp", (2,), dace.int32)
    sdfg.add_array("qs", (2, L.K), dace.float32)
    sdfg.add_array("y", L.y_shape, dace.int32 if p["OUT"] == 0 else dace.uint8)
    state = sdfg.add_state("items", is_start_block=True)
    whole = lambda a: dace.Memlet.from_array(a, sdfg.arrays[a])
    state.add_mapped_tasklet(
        "item", {"tb": f"0:{-(-count // t)}", "kq": f"0:{L.K // (nv * vl) // kq}"},
        {c: whole(a) for c, a in (("xin", "x"), ("uin", "u"), ("zpin", "zp"), ("qsin", "qs"))},
        "wq_item(xin, uin, zpin, qsin, yout, tb, kq);", {"yout": whole("y")},
        language=dace.Language.CPP, external_edges=True,
        schedule=dace.ScheduleType.CPU_Multicore)
    sdfg.append_global_code("\n".join([int8_dot.global_code(isa), DOT16[isa], prelude(layer, p),
                                       header("winograd_int8.h")]))
    for node, _ in sdfg.all_nodes_recursive():  # every connector a pointer to its array
        if isinstance(node, dace.nodes.Tasklet):
            for conns, arrays in ((node.in_connectors, {"xin": "x", "uin": "u", "zpin": "zp",
                                                        "qsin": "qs"}),
                                  (node.out_connectors, {"yout": "y"})):
                for c in conns:
                    conns[c] = dace.pointer(sdfg.arrays[arrays[c]].dtype)
    return sdfg
