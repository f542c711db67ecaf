"""Tensor-core implicit GEMM: the GEMM of ``_igemm`` (tables, padded filter matrix) with
its inner product on warp-wide ``mma.sync`` tiles with float32 sums: m16n8k16 on float16
or bfloat16 operands, m16n8k8 on TF32 operands (float32 storage, ``--math tf32``).

A block of ``warpsM x warpsN`` warps computes a ``TM x TN`` output tile; each warp owns
``fragsM x fragsN`` tiles of 16 x 8.  Per K step of ``k`` (16, or 8 in TF32):

1. the block's threads stage ``A[TM, k]`` and ``B[k, TN]`` in shared memory (``As``,
   ``Bs``, row-major, flat) through the offset tables, as ``implicitGemmWarpTiled`` does;
2. each lane loads its fragments from there (``fa``: ``k / 2`` values of A per 16 x k
   tile, ``fb``: ``k / 4`` values of B per k x 8 tile), in the register layout of PTX's
   m16n8k16 and m16n8k8 (group ``g = lane / 4``, ``t = lane % 4``, ``e`` values per
   32-bit register: 2 in 16 bits, 1 in TF32, and ``h = k / 2``):

   - ``fa[q]`` = A[g + 8 ((q / e) % 2), e t + q % e + h (q / 2e)]
   - ``fb[q]`` = B[e t + q % e + h (q / e), g]
   - ``acc[i]`` = C[g + 8 (i / 2), 2 t + i % 2]

   (in 16 bits: ``fa[q]`` = A[g + 8 ((q / 2) % 2), 2 t + q % 2 + 8 (q / 4)]).

3. ``mma``: on the GPU one ``mma.sync`` per tile and lane (:func:`_gpu_mma`); on the
   CPU (:func:`_emulation`) each lane computes its four C elements from the fragments
   of the whole warp, finding A[r, k] and B[k, n] in the lane and register where the
   layout above put them.  The CPU check therefore fails if the loads, the layout or
   the stores are wrong, not only if the arithmetic is.  In TF32 both round each
   operand to TF32 first, to nearest with ties away from zero (``cvt.rna.tf32.f32``:
   given raw float32 bits, the tensor cores would ignore the low 13 bits instead).

Lane and warp coordinates are decoded inside tasklets (``//`` and ``%`` in subscripts
trip DaCe 1.0.2's frontend; docs/adding-an-implementation.md).
"""

from typing import NamedTuple, Optional

import dace
import numpy as np

from convbench.registry import Layer, Layout, Param
from impls import _tiling as T
from impls._igemm import finish, geometry

#: Rows (M) and columns (N) of one ``mma.sync`` tile.
MMA_M, MMA_N = 16, 8
WARP = 32


class Shape(NamedTuple):
    """The ``mma.sync`` of a storage type: reduction ``k`` per instruction, ``e`` values
    per 32-bit operand register, PTX operand type."""

    k: int
    e: int
    ptx: str

    @property
    def a_regs(self) -> int:  # values of A per lane and tile
        return self.k // 2

    @property
    def b_regs(self) -> int:  # values of B per lane and tile
        return self.k // 4


#: By the C++ storage type of the fragments (convbench/halfprec.h; TF32 is stored as float).
SHAPES = {"cb_half": Shape(16, 2, "f16"), "cb_bfloat16": Shape(16, 2, "bf16"),
          "float": Shape(8, 1, "tf32")}
#: The precisions of the tensor-core kernels (by label, :mod:`convbench.precision`).
PRECISIONS = ("float16", "bfloat16", "float32-tf32")
#: The smallest K step of every shape: the staging splits it between the warps.
MMA_K = min(shape.k for shape in SHAPES.values())

PARAMS = (
    Param("warpsM", 2, "warps per block along the output pixels (GEMM rows)",
          T.power_of_two),
    Param("warpsN", 2, "warps per block along the output channels (GEMM columns)",
          T.power_of_two),
    Param("fragsM", 2, "16-row MMA tiles per warp along the output pixels", T.power_of_two),
    Param("fragsN", 4, "8-column MMA tiles per warp along the output channels",
          T.power_of_two),
)


def tile_shape(params):
    """``(TM, TN, warps)`` of a block."""
    warps = params["warpsM"] * params["warpsN"]
    return (params["warpsM"] * params["fragsM"] * MMA_M,
            params["warpsN"] * params["fragsN"] * MMA_N, warps)


def check_params(params) -> Optional[str]:
    TM, TN, NW = tile_shape(params)
    return T.require(
        (NW * WARP <= T.MAX_THREADS, f"{NW} warps = {NW * WARP} threads > {T.MAX_THREADS}"),
        (TM % WARP == 0 and TN % WARP == 0,
         f"block tile {TM} x {TN}: both sides must be multiples of {WARP} (staging)"),
        (MMA_K % NW == 0, f"{NW} warps must divide the K step of {MMA_K} (staging; 8 is "
                          "TF32's step, and the check does not know the precision)"),
    )


#: C++ of TF32's rounding of a float32 operand: to nearest, ties away from zero, as
#: ``cvt.rna.tf32.f32`` does (infinities and NaNs as they are).
TF32_ROUND = """auto op = [](float v) {
    unsigned u; __builtin_memcpy(&u, &v, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
    float f; __builtin_memcpy(&f, &u, 4); return f;
};"""


def _emulation(FM: int, FN: int, shape: Shape = SHAPES["cb_half"]) -> str:
    """The CPU tasklet: the four sums of lane ``tj`` of warp ``ti`` in each tile, from the
    fragments of the whole warp in ``a`` (``fa``) and ``b`` (``fb``)."""
    k, e, h, AR, BR = shape.k, shape.e, shape.k // 2, shape.a_regs, shape.b_regs
    op = TF32_ROUND if shape.ptx == "tf32" else "auto op = [](float v) { return v; };"
    return f"""
// mma.sync m16n8k{k} emulated: C[r][n] += sum_k A[r][k] B[k][n] for this lane's C
const int g = (int)tj / 4, t = (int)tj % 4;
{op}
for (int fm = 0; fm < {FM}; ++fm)
for (int fn = 0; fn < {FN}; ++fn)
for (int i = 0; i < 4; ++i) {{
    const int r = g + 8 * (i / 2), n = 2 * t + i % 2;
    const int c = ((ti * {WARP} + tj) * {FM * FN} + fm * {FN} + fn) * 4 + i;
    float s = cin[c];
    for (int k = 0; k < {k}; ++k) {{
        const int la = (r % 8) * 4 + (k % {h}) / {e}, qa = k % {e} + {e} * (r / 8) + {2 * e} * (k / {h});
        const int lb = n * 4 + (k % {h}) / {e}, qb = k % {e} + {e} * (k / {h});
        s += (op((float)a[(ti * {WARP} + la) * {FM * AR} + fm * {AR} + qa])
              * op((float)b[(ti * {WARP} + lb) * {FN * BR} + fn * {BR} + qb]));
    }}
    cout[c] = s;
}}
"""


def _registers(name: str, base: str, count: int, shape: Shape) -> str:
    """C++ declaring ``unsigned name[count]``: the operand registers of one tile, from the
    fragment array ``name`` (``a`` or ``b``) at ``base``.  Two 16-bit values are packed
    explicitly, lower index in the lower half (no cast of the array's address, whose
    alignment nothing promises); a TF32 operand is rounded from its float32."""
    if shape.e == 2:
        values = [f"((unsigned){name}[{base} + {2 * q}].bits | "
                  f"((unsigned){name}[{base} + {2 * q + 1}].bits << 16))" for q in range(count)]
    else:
        values = [f"cb_tf32({name}[{base} + {q}])" for q in range(count)]
    return f"const unsigned r{name}[{count}] = {{{', '.join(values)}}};"


def _gpu_mma(ctype: str, FM: int, FN: int) -> str:
    """The GPU tasklet: one warp-wide ``mma.sync`` per tile ``(fm, fn)`` on this lane's
    fragments (``a``: 4 registers per tile, ``b``: 2)."""
    shape = SHAPES[ctype]
    ptx, AR, BR = shape.ptx, shape.a_regs, shape.b_regs
    tf32 = ("""auto cb_tf32 = [](float v) {
    unsigned u; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(v)); return u;
};""" if ptx == "tf32" else "")
    return f"""{tf32}
#pragma unroll
for (int fm = 0; fm < {FM}; ++fm) {{
    #pragma unroll
    for (int fn = 0; fn < {FN}; ++fn) {{
        {_registers("a", f"fm * {AR}", 4, shape)}
        {_registers("b", f"fn * {BR}", 2, shape)}
        const int c = (fm * {FN} + fn) * 4;
        float d0 = cin[c], d1 = cin[c + 1], d2 = cin[c + 2], d3 = cin[c + 3];
        asm volatile("mma.sync.aligned.m16n8k{shape.k}.row.col.f32.{ptx}.{ptx}.f32 "
                     "{{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};\\n"
                     : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
                     : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]));
        cout[c] = d0; cout[c + 1] = d1; cout[c + 2] = d2; cout[c + 3] = d3;
    }}
}}
"""


def shape_of(dtype) -> Shape:
    """The MMA of a precision (float32 storage means TF32 operands)."""
    return SHAPES[dtype.dace.ctype]


def program(layer: Layer, layout: Layout, dtype, params, w_shape=None,
            filter_matrix=None) -> dace.SDFG:
    """The tensor-core implicit GEMM of ``layer`` (see the module docstring).
    ``w_shape`` and ``filter_matrix`` (``_igemm.finish``): the filter the program takes
    and how its GEMM operand is made from it (default: ``layer``'s own)."""
    WM, WN, FM, FN = (params[k] for k in ("warpsM", "warpsN", "fragsM", "fragsN"))
    TM, TN, NW = tile_shape(params)
    shape = shape_of(dtype)
    TK, E, H, AR, BR = shape.k, shape.e, shape.k // 2, shape.a_regs, shape.b_regs
    UA, VK, UB = TM // WARP, TK // NW, TN // WARP
    G = geometry(layer, layout, TM, TN, TK)
    w_shape = w_shape or G.L.w_shape
    dt, at, i32, zero = dtype.dace, dtype.acc_dace, dace.int32, dtype.zero
    GM, GN, GMp, GNp, GKp, YC = G.GM, G.GN, G.GMp, G.GNp, G.GKp, G.YC

    @dace.program
    def igemm_mma(x: dt[G.L.xp_shape], w: dt[w_shape], y: dt[G.L.y_shape],
                  rowoff: i32[GMp], coloff: i32[GKp], yrow: i32[GMp], Bp: dt[GKp, GNp]):
        xf = np.reshape(x, [G.XS])
        yf = np.reshape(y, [G.YS])
        for blk_n, blk_m in dace.map[0:GNp:TN, 0:GMp:TM]:  # blk_m fastest: grid x
            acc = np.ndarray([NW, WARP, FM * FN * 4], at)  # per lane: [fm, fn, i]
            fa = np.ndarray([NW, WARP, FM * AR], dt)  # per lane: [fm, q]
            fb = np.ndarray([NW, WARP, FN * BR], dt)  # per lane: [fn, q]
            for ti, tj in dace.map[0:NW, 0:WARP]:
                for e in dace.map[0:FM * FN * 4]:
                    acc[ti, tj, e] = zero
            for k0 in dace.map[0:GKp:TK]:
                As = np.ndarray([TM * TK], dt)
                Bs = np.ndarray([TK * TN], dt)
                for ti, tj in dace.map[0:NW, 0:WARP]:
                    for u, v in dace.map[0:UA, 0:VK]:
                        with dace.tasklet:  # A[m, kk] through the tables
                            xa << xf(1)[:]
                            ro << rowoff[blk_m + tj + u * WARP]
                            co << coloff[k0 + ti + v * NW]
                            out >> As[(tj + u * WARP) * TK + ti + v * NW]
                            out = xa[ro + co]
                    for v, u in dace.map[0:VK, 0:UB]:
                        Bs[(ti + v * NW) * TN + tj + u * WARP] = Bp[k0 + ti + v * NW,
                                                                    blk_n + tj + u * WARP]
                for ti, tj in dace.map[0:NW, 0:WARP]:
                    for fm, q in dace.map[0:FM, 0:AR]:
                        with dace.tasklet:
                            s << As(1)[:]
                            out >> fa[ti, tj, fm * AR + q]
                            r = ((ti // WN) * FM + fm) * 16 + tj // 4 + 8 * ((q // E) % 2)
                            out = s[r * TK + E * (tj % 4) + q % E + H * (q // (2 * E))]
                    for fn, q in dace.map[0:FN, 0:BR]:
                        with dace.tasklet:
                            s << Bs(1)[:]
                            out >> fb[ti, tj, fn * BR + q]
                            k = E * (tj % 4) + q % E + H * (q // E)
                            out = s[k * TN + ((ti % WN) * FN + fn) * 8 + tj // 4]
                for ti, tj in dace.map[0:NW, 0:WARP]:
                    with dace.tasklet:  # the warp's MMAs: the code is set below
                        # Whole arrays: DaCe 1.0.2's frontend fails on sliced array
                        # connectors here; the code indexes them (the GPU schedule makes
                        # them the lane's own registers).
                        a << fa(1)[:, :, :]
                        b << fb(1)[:, :, :]
                        cin << acc(1)[:, :, :]
                        cout >> acc(1)[:, :, :]
                        cout[0, 0, 0] = cin[0, 0, 0] + a[0, 0, 0] * b[0, 0, 0]
            for ti, tj in dace.map[0:NW, 0:WARP]:
                for fm, fn, i in dace.map[0:FM, 0:FN, 0:4]:
                    with dace.tasklet:
                        c << acc[ti, tj, (fm * FN + fn) * 4 + i]
                        yr << yrow(1)[:]
                        out >> yf(-1)[:]
                        m = blk_m + ((ti // WN) * FM + fm) * 16 + tj // 4 + 8 * (i // 2)
                        n = blk_n + ((ti % WN) * FN + fn) * 8 + 2 * (tj % 4) + i % 2
                        if m < GM and n < GN:
                            row = yr[m]
                            out[row + n * YC] = c

    sdfg = finish(igemm_mma, layer, layout, G, filter_matrix)
    (mma, state), = [(n, st) for n, st in sdfg.all_nodes_recursive()
                     if n in set(_mma_tasklets(sdfg))]
    mma.code = dace.properties.CodeBlock(_emulation(FM, FN, shape), dace.Language.CPP)
    # The frontend names the fragment arrays after the statements that write them; the
    # schedule finds them by name.
    for edge in state.in_edges(mma):
        if edge.dst_conn in ("a", "b") and edge.data.data != FRAGMENTS[edge.dst_conn]:
            state.parent.replace(edge.data.data, FRAGMENTS[edge.dst_conn])
    return sdfg


#: The fragment arrays, by the MMA tasklet's connector that reads them.
FRAGMENTS = {"a": "fa", "b": "fb"}


def _mma_tasklets(sdfg):
    """The tasklets that compute one MMA tile (inputs a, b, cin; output cout)."""
    for node, _ in sdfg.all_nodes_recursive():
        if (isinstance(node, dace.nodes.Tasklet) and set(node.in_connectors) == {"a", "b", "cin"}
                and set(node.out_connectors) == {"cout"}):
            yield node


def _storage_ctype(sdfg) -> str:
    """The C++ type of the fragments (``fa``) of an MMA program."""
    for sd in sdfg.all_sdfgs_recursive():
        if "fa" in sd.arrays:
            return sd.arrays["fa"].dtype.ctype
    raise ValueError(f"{sdfg.name}: no fragment array 'fa'")


def implementation(**fields):
    """The registration of a tensor-core kernel on NDHWC: ``fields`` (name, summary, pass,
    algorithm, supports, constraints) and what every one shares (schedules, parameters,
    precisions)."""
    from convbench.registry import Implementation
    return Implementation(layout=Layout.NDHWC, schedules={"cpu": schedule("cpu"),
                                                          "gpu": schedule("gpu")},
                          params=PARAMS, check_params=check_params, precisions=PRECISIONS,
                          **fields)


def schedule(target: str):
    """The tiled schedule (``_tiling.tiled_schedule``) with, on the GPU, the emulated MMA
    replaced by ``mma.sync``."""
    base = T.tiled_schedule(target, sequential=("k0",), shared=("As", "Bs"),
                            private={"acc": 2, "fa": 2, "fb": 2})

    def apply(sdfg, layer, params):
        base(sdfg, layer, params)
        # Maps that the frontend inlined into the top-level state read as element-wise
        # kernels to tiled_schedule: inside the block they are the K loop and a
        # thread's loops (those unrolled on the GPU).
        for state in sdfg.all_states():
            scopes = state.scope_dict()
            for node in state.nodes():
                if (isinstance(node, dace.nodes.MapEntry) and scopes[node] is not None
                        and node.map.params[0] != "ti"):
                    node.map.schedule = dace.ScheduleType.Sequential
                    node.map.unroll = target == "gpu" and node.map.params[0] != "k0"
                    node.map.collapse = 1
        if target == "gpu":
            code = _gpu_mma(_storage_ctype(sdfg), params["fragsM"], params["fragsN"])
            for node in _mma_tasklets(sdfg):
                node.code = dace.properties.CodeBlock(code, dace.Language.CPP)
            T.const_inputs(sdfg, ("xa",))

    return apply
