"""3D Winograd F(2^3, 3^3) for the CPU, on NDHWC (``winogradF2``; the algorithm and its
error bound: :mod:`convbench.winograd`, docs/winograd.md).

Per call: the filter transform ``U[p, c, k]`` (64 transform points; done in the call,
since training changes the filter every step), then a parallel map over blocks of ``TB``
output tiles of 2 x 2 x 2 along the width.  One block:

1. the input transform of each tile's 4 x 4 x 4 x C patch (three passes of ``B^T``, the
   channels innermost and vectorised) into ``V[p, t, c]``;
2. per transform point, the GEMM ``M[t, p, :] = sum_c V[p, t, c] U[p, c, :]``, register
   blocked over ``TB`` tiles x 64 output channels, channels summed in sequence;
3. the output transform of each tile (three passes of ``A^T``) into ``y``.

A block's ``V`` and ``M`` live in a thread's scratch buffer (cache-sized for the
CosmoFlow layers), never in a whole transformed tensor.  The transform matrices are
:func:`convbench.winograd.transforms`' (points 0, +-1), written into the code.
"""

import dace

from convbench import winograd
from impls._blocked import largest_divisor

M_OUT, R = 2, 3
N_IN = M_OUT + R - 1


def refusal(layer):
    """Why F(2^3, 3^3) does not compute ``layer`` ("" where it does)."""
    if (layer.k_d, layer.k_h, layer.k_w) != (3, 3, 3):
        return f"kernel {layer.k_d}x{layer.k_h}x{layer.k_w}: F(2^3, 3^3) needs 3x3x3"
    if any(s != 1 for s in layer.strides):
        return f"stride {layer.strides}: Winograd tiles need stride 1"
    return ""


def tiles(size: int) -> int:
    """Output tiles along a dimension of ``size`` outputs (the last one cut short where
    ``size`` is odd: its input beyond the padded array reads as zero, its output beyond
    ``size`` is not stored)."""
    return -(-size // M_OUT)


def _matrix(name, mat):
    rows = ", ".join("{" + ", ".join(f"{v!r}f" for v in row) + "}" for row in mat)
    return f"static constexpr float {name}[{len(mat)}][{len(mat[0])}] = {{{rows}}};"


def global_code(matrices=None):
    """The transforms and the pass that applies one along the first axis (then moved last,
    so that three passes restore the order)."""
    at, g, bt = matrices or winograd.transforms(M_OUT, R)
    return "\n".join([
        "#include <vector>", "#include <cstring>",
        _matrix("WG_AT", at), _matrix("WG_G", g), _matrix("WG_BT", bt),
        """
// in: [NI][n1][n2][V] -> out: [n1][n2][NO][V], out[i] = sum_j M[i][j] in[j]
template <int NO, int NI>
static inline void wg_pass(const float (&M)[NO][NI], const float* in, float* out,
                           int n1, int n2, int V) {
    for (int b = 0; b < n1; ++b)
    for (int e = 0; e < n2; ++e)
    #pragma GCC unroll 8
    for (int i = 0; i < NO; ++i) {
        float* o = out + ((long)(b * n2 + e) * NO + i) * V;
        for (int v = 0; v < V; ++v) o[v] = 0.0f;
        #pragma GCC unroll 8
        for (int j = 0; j < NI; ++j) {
            const float m = M[i][j];
            if (m == 0.0f) continue;
            const float* s = in + ((long)(j * n1 + b) * n2 + e) * V;
            for (int v = 0; v < V; ++v) o[v] += m * s[v];
        }
    }
}
// three passes: [n][n][n][V] -> [no][no][no][V]
template <int NO, int NI>
static inline void wg_3d(const float (&M)[NO][NI], const float* in, float* out, float* tmp,
                         int V) {
    wg_pass<NO, NI>(M, in, tmp, NI, NI, V);                 // [NI][NI][NO]
    wg_pass<NO, NI>(M, tmp, out, NI, NO, V);                // [NI][NO][NO]
    wg_pass<NO, NI>(M, out, tmp, NO, NO, V);                // [NO][NO][NO]
    std::memcpy(out, tmp, sizeof(float) * NO * NO * NO * V);
}
"""])


def filter_code(L):
    """``U[p][c][k]`` from ``w[k][kd][kh][kw][c]`` (NDHWC filter)."""
    return f"""
#pragma omp parallel for
for (int k = 0; k < {L.K}; ++k) {{
    float g[27], u[64], tmp[64];
    for (int c = 0; c < {L.C}; ++c) {{
        for (int t = 0; t < 27; ++t) g[t] = win[((long)k * 27 + t) * {L.C} + c];
        wg_3d<4, 3>(WG_G, g, u, tmp, 1);
        for (int p = 0; p < 64; ++p) uout[((long)p * {L.C} + c) * {L.K} + k] = u[p];
    }}
}}
"""


def tile_code(L, tb, kb):
    """One block of ``tb`` tiles along the width: map parameters ``n, td, th, twb``."""
    C, K = L.C, L.K
    return f"""
static thread_local std::vector<float> scratch;
const long need = 64L * {tb} * {C} + {tb} * 64L * {K} + 3 * 64L * {max(C, K)};
if ((long)scratch.size() < need) scratch.resize(need);
float* V = scratch.data();                       // [64][TB][C]
float* Mt = V + 64L * {tb} * {C};                // [TB][64][K]
float* patch = Mt + {tb} * 64L * {K};            // [64][max(C, K)] each
float* tmp = patch + 64L * {max(C, K)};
float* out = tmp + 64L * {max(C, K)};
for (int t = 0; t < {tb}; ++t) {{
    const long tw = (long)twb * {tb} + t;
    for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 4; ++b)
    for (int e = 0; e < 4; ++e) {{
        float* to = patch + ((a * 4 + b) * 4 + e) * {C};
        const long d = 2 * td + a, h = 2 * th + b, w = 2 * tw + e;
        if (d < {L.DP} && h < {L.HP} && w < {L.WP})
            std::memcpy(to, xin + (((n * {L.DP} + d) * {L.HP} + h) * {L.WP} + w) * {C},
                        sizeof(float) * {C});
        else  // past the input: a cut-short tile of an odd output size
            std::memset(to, 0, sizeof(float) * {C});
    }}
    wg_3d<4, 4>(WG_BT, patch, out, tmp, {C});
    for (int p = 0; p < 64; ++p)
        std::memcpy(V + ((long)p * {tb} + t) * {C}, out + (long)p * {C}, sizeof(float) * {C});
}}
for (int p = 0; p < 64; ++p) {{
    const float* Up = uin + (long)p * {C} * {K};
    for (int k0 = 0; k0 < {K}; k0 += {kb}) {{
        float acc[{tb}][{kb}];
        for (int t = 0; t < {tb}; ++t)
            for (int j = 0; j < {kb}; ++j) acc[t][j] = 0.0f;
        for (int c = 0; c < {C}; ++c) {{
            const float* u = Up + (long)c * {K} + k0;
            #pragma GCC unroll 8
            for (int t = 0; t < {tb}; ++t) {{
                const float v = V[((long)p * {tb} + t) * {C} + c];
                for (int j = 0; j < {kb}; ++j) acc[t][j] += v * u[j];
            }}
        }}
        for (int t = 0; t < {tb}; ++t)
            std::memcpy(Mt + ((long)t * 64 + p) * {K} + k0, acc[t], sizeof(float) * {kb});
    }}
}}
for (int t = 0; t < {tb}; ++t) {{
    const long tw = (long)twb * {tb} + t;
    wg_3d<2, 4>(WG_AT, Mt + (long)t * 64 * {K}, out, tmp, {K});
    for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
    for (int l = 0; l < 2; ++l)
        if (2 * td + i < {L.OD} && 2 * th + j < {L.OH} && 2 * tw + l < {L.OW})
        std::memcpy(yout + ((((long)n * {L.OD} + 2 * td + i) * {L.OH} + 2 * th + j) * {L.OW}
                            + 2 * tw + l) * {K},
                    out + ((i * 2 + j) * 2 + l) * {K}, sizeof(float) * {K});
}}
"""


def program(layer, L, tb_max=4, matrices=None):
    """The SDFG: filter transform, then the parallel map over tile blocks (the input
    padded first where the layer is)."""
    from convbench.registry import Layout
    from impls._common import pad_sdfg
    tw = tiles(L.OW)
    tb = largest_divisor(tw, tb_max)
    kb = 64 if L.K % 64 == 0 else L.K
    sdfg = dace.SDFG(f"winograd_f2_{layer.key()}_{tb}")
    f32 = dace.float32
    sdfg.add_array("x", L.xp_shape, f32)
    sdfg.add_array("w", L.w_shape, f32)
    sdfg.add_array("y", L.y_shape, f32)
    sdfg.add_array("U", (64, L.C, L.K), f32, transient=True)
    whole = lambda a: dace.Memlet.from_array(a, sdfg.arrays[a])
    glob = global_code(matrices)
    first = sdfg.add_state("filter_transform", is_start_block=True)
    t = first.add_tasklet("filter", {"win"}, {"uout"}, filter_code(L),
                          language=dace.Language.CPP, code_global=glob)
    first.add_edge(first.add_read("w"), None, t, "win", whole("w"))
    first.add_edge(t, "uout", first.add_write("U"), None, whole("U"))
    blocks = sdfg.add_state_after(first, "tiles")
    ranges = {"n": f"0:{L.N}", "td": f"0:{tiles(L.OD)}", "th": f"0:{tiles(L.OH)}",
              "twb": f"0:{tw // tb}"}
    blocks.add_mapped_tasklet(
        "tile_block", ranges, {"xin": whole("x"), "uin": whole("U")}, tile_code(L, tb, kb),
        {"yout": whole("y")}, schedule=dace.ScheduleType.CPU_Multicore,
        language=dace.Language.CPP, external_edges=True)
    return pad_sdfg(sdfg, layer, Layout.NDHWC, halo=True)
