"""3D Winograd F(2^3, 3^3) as a tiled program for the GPU (``winogradF2Tiled``,
``winogradF2TiledBwdData``), whose CPU schedule keeps the same structure.

The same algorithm as ``convkernels/cpu/winograd/forward.py``
(:mod:`convkernels.winograd.algebra`'s transforms), cut as the implicit GEMMs are
(``tiling.py``):

1. an element-wise map makes the transformed filter ``U[p, c, k]`` (27 terms each);
2. a block of ``TT`` tiles x ``TK`` output channels (a thread block of ``TT x TK``
   threads on the GPU), per chunk of ``CC`` input channels (the sequential ``c0`` loop):
   the block's threads transform the input of its tiles into the shared ``Vs[p, t, c]``
   (thread ``(ti, tj)``: tile ``ti``, channels ``tj``, ``tj + TK``, ...), then each thread
   adds the chunk's products of its tile and output channel to its 64 sums ``acc[p]``,
   one per transform point (``Vs`` read by all ``TK`` threads of a tile, ``U`` by all
   ``TT`` threads of a channel);
3. each thread's output transform of its 64 sums, straight into ``y``.

The tasklets are C++ (the transforms are straight-line code with the matrices' zeros
and ones folded); the CPU schedule runs blocks in parallel and threads in sequence, so
the CPU check verifies the indexing that the GPU runs.  On the GPU ``acc`` is each
thread's own (registers), on the CPU one array per block: the two differ in where a
thread's sums start (:func:`gemm_code`).
"""

import math

import dace
import numpy as np

from convkernels.winograd import algebra
from convkernels.gpu import tiling
from convkernels.winograd.tiles import M_OUT, R, tile_count, tiles
from convkernels.programs import stable_program

P = (M_OUT + R - 1) ** 3
N_IN = M_OUT + R - 1


def transform_code(mat, src: str, dst: str, n_in: int, n_out: int, prefix: str) -> str:
    """Straight-line C++: ``dst[(i n_out + j) n_out + l] = sum M[i][a] M[j][b] M[l][e]
    src[(a n_in + b) n_in + e]`` for the constant ``mat`` (n_out x n_in), in three passes
    through local arrays ``{prefix}1``, ``{prefix}2``; zero terms left out, ones folded."""
    def combo(terms):
        out = []
        for coef, ref in terms:
            if coef == 0:
                continue
            if coef == 1:
                out.append(f"+ {ref}")
            elif coef == -1:
                out.append(f"- {ref}")
            else:
                out.append(f"+ {float(coef)!r}f * {ref}")
        text = " ".join(out) or "0.0f"
        return text[2:] if text.startswith("+ ") else text

    lines = [f"float {prefix}1[{n_out * n_in * n_in}], {prefix}2[{n_out * n_out * n_in}];"]
    for i in range(n_out):          # first axis: [n_out][n_in][n_in]
        for b in range(n_in):
            for e in range(n_in):
                terms = [(mat[i][a], f"{src}[{(a * n_in + b) * n_in + e}]") for a in range(n_in)]
                lines.append(f"{prefix}1[{(i * n_in + b) * n_in + e}] = {combo(terms)};")
    for i in range(n_out):          # second axis: [n_out][n_out][n_in]
        for j in range(n_out):
            for e in range(n_in):
                terms = [(mat[j][b], f"{prefix}1[{(i * n_in + b) * n_in + e}]")
                         for b in range(n_in)]
                lines.append(f"{prefix}2[{(i * n_out + j) * n_in + e}] = {combo(terms)};")
    for i in range(n_out):          # third axis
        for j in range(n_out):
            for l in range(n_out):
                terms = [(mat[l][e], f"{prefix}2[{(i * n_out + j) * n_in + e}]")
                         for e in range(n_in)]
                lines.append(f"{dst}[{(i * n_out + j) * n_out + l}] = {combo(terms)};")
    return "\n".join(lines)


def _decode(L, t: str) -> str:
    """C++ declaring the tile's batch ``tn`` and first output pixel ``d0, h0, w0``."""
    TD, TH, TW = tiles(L.OD), tiles(L.OH), tiles(L.OW)
    return (f"const long tw_ = {t} % {TW}, th_ = {t} / {TW} % {TH}, td_ = {t} / {TW * TH} % {TD}, "
            f"tn = {t} / {TW * TH * TD};\n"
            f"const long d0 = {M_OUT} * td_, h0 = {M_OUT} * th_, w0 = {M_OUT} * tw_;")


def filter_code(L, flip: bool, matrices=None) -> str:
    """``u = U[up, uc, uk]``: 27 filter taps through ``G`` along three axes.  ``flip``: the
    filter is the forward layer's ``w[c][taps][k]`` (data gradient)."""
    g = (matrices or algebra.transforms(M_OUT, R))[1]
    terms = []
    for i in range(R):
        for j in range(R):
            for l in range(R):
                tap = (i * R + j) * R + l
                index = (f"(uc * 27 + {26 - tap}) * {L.K} + uk" if flip
                         else f"(uk * 27 + {tap}) * {L.C} + uc")
                terms.append(f"Gd[a][{i}] * Gd[b][{j}] * Gd[e][{l}] * wa[{index}]")
    rows = ", ".join("{" + ", ".join(f"{float(v)!r}f" for v in row) + "}" for row in g)
    return (f"const float Gd[{N_IN}][{R}] = {{{rows}}};\n"
            f"const int a = up / {N_IN * N_IN}, b = up / {N_IN} % {N_IN}, e = up % {N_IN};\n"
            f"u = {' + '.join(terms)};")


def input_code(L, TT: int, TK: int, CC: int, matrices=None) -> str:
    """Thread ``(ti, tj)``: tile ``blk_t + ti``, channels ``c0 + tj``, ``c0 + tj + TK``, ...
    of the chunk: its 4 x 4 x 4 patch (zeros outside the input) through ``B^T`` into
    ``vs[(p TT + ti) CC + cc]``."""
    bt = (matrices or algebra.transforms(M_OUT, R))[2]
    NT = tile_count(L)
    return f"""
const long t = blk_t + ti;
{_decode(L, "t")}
for (int cc = tj; cc < {CC}; cc += {TK}) {{
    const long c = c0 + cc;
    float d[{P}], v[{P}];
    for (int a = 0; a < {N_IN}; ++a)
    for (int b = 0; b < {N_IN}; ++b)
    for (int e = 0; e < {N_IN}; ++e) {{
        const long dd = d0 + a - {L.PD}, hh = h0 + b - {L.PH}, ww = w0 + e - {L.PW};
        d[(a * {N_IN} + b) * {N_IN} + e] =
            (t < {NT} && c < {L.C} && dd >= 0 && hh >= 0 && ww >= 0 && dd < {L.D}
             && hh < {L.H} && ww < {L.W})
            ? xa[(((tn * {L.D} + dd) * {L.H} + hh) * {L.W} + ww) * {L.C} + c] : 0.0f;
    }}
{transform_code(bt, "d", "v", N_IN, N_IN, "bi")}
    for (int p = 0; p < {P}; ++p) vs[(p * {TT} + ti) * {CC} + cc] = v[p];
}}
"""


def gemm_code(L, TT: int, TK: int, CC: int, gpu: bool) -> str:
    """Thread ``(ti, tj)`` adds the chunk's products to its 64 sums (on the GPU its own
    ``acc``; on the CPU the block's, at its offset)."""
    base = "0" if gpu else f"(ti * {TK} + tj) * {P}"
    return f"""
const long k = blk_k + tj;
const int base = {base};
const int n = ({L.C} - c0) < {CC} ? (int)({L.C} - c0) : {CC};
if (k < {L.K}) {{
    for (int p = 0; p < {P}; ++p) {{
        float s = cin[base + p];
        for (int cc = 0; cc < n; ++cc)
            s += vv[(p * {TT} + ti) * {CC} + cc] * uu[((long)p * {L.C} + c0 + cc) * {L.K} + k];
        cout[base + p] = s;
    }}
}}
"""


def output_code(L, TK: int, gpu: bool, matrices=None) -> str:
    """Thread ``(ti, tj)``: its 64 sums through ``A^T`` into the tile's pixels of output
    channel ``blk_k + tj`` that lie inside ``y``."""
    at = (matrices or algebra.transforms(M_OUT, R))[0]
    base = "0" if gpu else f"(ti * {TK} + tj) * {P}"
    m = M_OUT
    return f"""
const long t = blk_t + ti, k = blk_k + tj;
if (t < {tile_count(L)} && k < {L.K}) {{
    {_decode(L, "t")}
    const int base = {base};
    float s[{P}], o[{m ** 3}];
    for (int p = 0; p < {P}; ++p) s[p] = acc_in[base + p];
{transform_code(at, "s", "o", N_IN, m, "ao")}
    for (int i = 0; i < {m}; ++i)
    for (int j = 0; j < {m}; ++j)
    for (int l = 0; l < {m}; ++l)
        if (d0 + i < {L.OD} && h0 + j < {L.OH} && w0 + l < {L.OW})
            out[(((tn * {L.OD} + d0 + i) * {L.OH} + h0 + j) * {L.OW} + w0 + l) * {L.K} + k] =
                o[(i * {m} + j) * {m} + l];
}}
"""


def program(layer, L, params, flip: bool = False, w_shape=None, matrices=None) -> dace.SDFG:
    """The tiled SDFG (see the module), with the CPU's tasklet code."""
    from convkernels.layouts import Layout, stored_shape
    TT, TK, CC = params["TT"], params["TK"], params["CC"]
    NT = tile_count(L)
    NTp, Kp, Cp = (-(-NT // TT) * TT, -(-L.K // TK) * TK, -(-L.C // CC) * CC)
    C, K = L.C, L.K
    x_shape = stored_shape(Layout.NDHWC, "x", layer.input_shape)
    w_shape = w_shape or L.w_shape
    XS, WS, YS = math.prod(x_shape), math.prod(w_shape), math.prod(L.y_shape)
    f32 = dace.float32

    @stable_program
    def winograd_tiled(x: f32[x_shape], w: f32[w_shape], y: f32[L.y_shape]):
        xf = np.reshape(x, [XS])
        wf = np.reshape(w, [WS])
        yf = np.reshape(y, [YS])
        U = np.ndarray([P * C * K], f32)
        for up, uc, uk in dace.map[0:P, 0:C, 0:K]:
            with dace.tasklet:
                wa << wf(1)[:]
                u >> U[(up * C + uc) * K + uk]
                u = wa[0]
        for blk_t, blk_k in dace.map[0:NTp:TT, 0:Kp:TK]:  # blk_t fastest: grid x
            acc = np.ndarray([TT, TK, P], f32)
            Vs = np.ndarray([P * TT * CC], f32)
            for ti, tj in dace.map[0:TT, 0:TK]:
                for q in dace.map[0:P]:
                    acc[ti, tj, q] = 0
            for c0 in dace.map[0:Cp:CC]:
                for ti, tj in dace.map[0:TT, 0:TK]:
                    with dace.tasklet:
                        xa << xf(1)[:]
                        vs >> Vs(-1)[:]
                        vs[0] = xa[0]
                for ti, tj in dace.map[0:TT, 0:TK]:
                    with dace.tasklet:
                        vv << Vs(1)[:]
                        uu << U(1)[:]
                        cin << acc(1)[:, :, :]
                        cout >> acc(1)[:, :, :]
                        cout[0, 0, 0] = cin[0, 0, 0] + vv[0] * uu[0]
            for ti, tj in dace.map[0:TT, 0:TK]:
                with dace.tasklet:
                    acc_in << acc(1)[:, :, :]
                    out >> yf(-1)[:]
                    out[0] = acc_in[0, 0, 0]

    sdfg = winograd_tiled.to_sdfg(simplify=True)
    # simplify keeps the input tasklet's output temporary in place of ``Vs``: the schedule
    # finds the staging buffer by its name
    staged = {e.data.data for st in sdfg.states() for n in st.nodes()
              if isinstance(n, dace.nodes.Tasklet) and "vs" in n.out_connectors
              for e in st.out_edges(n)}
    if staged != {"Vs"}:
        sdfg.replace(staged.pop(), "Vs")
    codes = {"filter": filter_code(L, flip, matrices),
             "input": input_code(L, TT, TK, CC, matrices),
             "gemm": gemm_code(L, TT, TK, CC, gpu=False),
             "output": output_code(L, TK, gpu=False, matrices=matrices)}
    for node, role in _tasklets(sdfg):
        node.code = dace.properties.CodeBlock(codes[role], dace.Language.CPP)
        # whole arrays are pointers, also those of one element (DaCe would pass a value)
        for conns in (node.in_connectors, node.out_connectors):
            for name in set(conns) - {"u"}:
                conns[name] = dace.pointer(f32)
    sdfg.name = f"winograd_tiled_{'bwdd_' if flip else ''}{layer.key()}_{TT}_{TK}_{CC}"
    return sdfg


def _tasklets(sdfg):
    """``(tasklet, role)`` of the program's four tasklets, by their connectors."""
    roles = {frozenset({"wa"}): "filter", frozenset({"xa"}): "input",
             frozenset({"vv", "uu", "cin"}): "gemm", frozenset({"acc_in"}): "output"}
    for node, _ in sdfg.all_nodes_recursive():
        if isinstance(node, dace.nodes.Tasklet):
            role = roles.get(frozenset(node.in_connectors))
            if role:
                yield node, role


def schedule(target: str, transposed: bool = False):
    """``tiling.tiled_schedule`` (blocks, threads, the sequential chunk loop, ``Vs`` in
    shared memory, ``acc`` per thread), with the GPU's tasklets indexing a thread's own
    ``acc``.  ``transposed``: the program computes the data gradient (its forward layer
    is the transposed one)."""
    base = tiling.tiled_schedule(target, sequential=("c0",), shared=("Vs",),
                                  private={"acc": 2})

    def apply(sdfg, layer, params):
        base(sdfg, layer, params)
        if target == "gpu":
            from convkernels.layouts import Layout
            from convkernels.layer import layer_constants
            from convkernels.transposed import transposed_layer
            L = layer_constants(transposed_layer(layer) if transposed else layer, Layout.NDHWC)
            TT, TK, CC = params["TT"], params["TK"], params["CC"]
            for node, role in _tasklets(sdfg):
                if role in ("gemm", "output"):
                    code = (gemm_code(L, TT, TK, CC, gpu=True) if role == "gemm"
                            else output_code(L, TK, gpu=True))
                    node.code = dace.properties.CodeBlock(code, dace.Language.CPP)
            tiling.const_inputs(sdfg, ("xa", "wa", "uu", "vv"))

    return apply


#: The most threads of a CUDA block, and the shared memory a block gets without opting in.
MAX_THREADS, MAX_SHARED_BYTES = 1024, 48 << 10


def check_params(values) -> "str | None":
    """Why a block of ``TT x TK`` threads with a ``64 x TT x CC`` shared input chunk cannot
    launch (None where it can)."""
    threads, shared = values["TT"] * values["TK"], 4 * P * values["TT"] * values["CC"]
    if threads > MAX_THREADS:
        return f"TT x TK = {threads} threads per block, more than {MAX_THREADS}"
    if shared > MAX_SHARED_BYTES:
        return f"the shared input chunk takes {shared} bytes, more than {MAX_SHARED_BYTES}"
    return None


def params():
    from convkernels.declarations import Param
    return (Param("TT", 8, "output tiles per thread block"),
            Param("TK", 32, "output channels per thread block (threads: TT x TK)"),
            Param("CC", 8, "input channels per chunk staged in shared memory"))
