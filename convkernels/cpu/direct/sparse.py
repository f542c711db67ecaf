"""A sparse forward convolution for the CPU: the filter pruned in blocks of one input
position (tap and input channel) times one vector of output channels, stored compressed,
and a kernel that runs the kept blocks only.

**The blocks.**  A block is ``w[k0:k0+V, c, kd, kh, kw]`` for ``V`` consecutive output
channels (one vector: 16 floats with AVX-512, 8 with AVX2): the unit a register-blocked
kernel multiplies a broadcast input value with.  Pruning keeps, per vector of output
channels, the ``NNZ = round(DENSITY% x KD KH KW C)`` blocks of largest norm, so every
vector does the same work (the threads stay balanced) and ``NNZ`` is a constant of the
build.  (Single weights pruned alone leave a vector of 16 with all zeros too rarely to
skip: at 25% density, about one vector in 100, 0.75^16.)

**The compressed filter** (made once per filter, by the caller:
:func:`convbench.quant.sparse.compress`): ``wv[K / V, NNZ, V]``, the kept blocks' values,
and ``offs[K / V, NNZ]``, where each one reads in the padded NDHWC input relative to the
tile's first pixel: ``((kd HP + kh) WP + kw) C + c``.

**The tile**: ``wb`` output pixels along the width (a divisor of it, up to ``PIX``) times
one vector, an accumulator register per pixel.  Per kept block: one vector load of the
block, then per pixel a broadcast of its input value and a fused multiply-add; the work
is proportional to the density.  The input is padded (zero border) into a copy first,
as the dense kernels do.  The tile map is an OpenMP loop over all its dimensions.

``PLANT`` (tests only): 1 skips the last kept block of every vector.
"""

import dace

from convkernels.cpu.isa import vector_floats
from convkernels.cpu.direct.blocking import largest_divisor


def lanes() -> int:
    """Output channels per block: one vector of floats on this CPU."""
    return vector_floats()


def kept(layer, density: int) -> int:
    """Blocks kept per vector of output channels at ``density`` percent (at least one)."""
    total = layer.k_d * layer.k_h * layer.k_w * layer.in_channels
    return max(1, min(total, round(total * density / 100)))


def refusal(layer, params) -> str:
    if layer.groups != 1 or any(d != 1 for d in layer.dilations):
        return "groups and dilation are not handled"
    if lanes() < 8:
        return "this CPU has neither AVX2 nor AVX-512"
    if layer.out_channels % lanes():
        return f"K = {layer.out_channels} is not a multiple of {lanes()} (one vector)"
    if not 1 <= params["DENSITY"] <= 100:
        return "DENSITY is a percentage, 1 to 100"
    return ""


def supports(layer, params):
    return refusal(layer, params) or None


def tile_code(L, wb, nnz, width, plant=0):
    """The C++ of one tile: ``n, od, oh, tw, kb`` are the map's parameters."""
    vec = "__m512" if width == 16 else "__m256"
    pre = "_mm512" if width == 16 else "_mm256"
    steps = nnz - (1 if plant == 1 else 0)
    lines = [
        f"const float* xt = xin + (((long)(n * {L.DP} + od * {L.SD}) * {L.HP} + oh * {L.SH})"
        f" * {L.WP} + tw * {wb * L.SW}) * {L.C};",
        f"const int* off = offin + kb * {nnz};",
        f"const float* wk = win + (long)kb * {nnz * width};",
    ]
    lines += [f"{vec} a{p} = {pre}_setzero_ps();" for p in range(wb)]
    lines += [f"for (int i = 0; i < {steps}; ++i) {{",
              "    const float* xr = xt + off[i];",
              f"    const {vec} w = {pre}_loadu_ps(wk + i * {width});"]
    lines += [f"    a{p} = {pre}_fmadd_ps({pre}_set1_ps(xr[{p * L.SW * L.C}]), w, a{p});"
              for p in range(wb)]
    lines.append("}")
    lines.append(f"float* yt = yout + (((long)(n * {L.OD} + od) * {L.OH} + oh) * {L.OW}"
                 f" + tw * {wb}) * {L.K} + kb * {width};")
    lines += [f"{pre}_storeu_ps(yt + {p * L.K}, a{p});" for p in range(wb)]
    return "\n".join(lines)


def tile_width(layer, params) -> int:
    return largest_divisor(layer.out_w, params["PIX"])


def sparse_sdfg(layer, L, params, name):
    """``(x, wv, offs, y)``: ``x`` NDHWC float32 (padded here), the compressed filter
    (module docstring), ``y`` NDHWC float32."""
    from convkernels.padding import pad_sdfg
    from convkernels.layouts import Layout
    width = lanes()
    nnz = kept(layer, params["DENSITY"])
    wb = tile_width(layer, params)
    sdfg = dace.SDFG(name)
    sdfg.add_array("x", L.xp_shape, dace.float32)
    sdfg.add_array("wv", (L.K // width, nnz, width), dace.float32)
    sdfg.add_array("offs", (L.K // width, nnz), dace.int32)
    sdfg.add_array("y", L.y_shape, dace.float32)
    whole = lambda a: dace.Memlet.from_array(a, sdfg.arrays[a])
    state = sdfg.add_state("tiles", is_start_block=True)
    tasklet, _, _ = state.add_mapped_tasklet(
        "tile", {"n": f"0:{L.N}", "od": f"0:{L.OD}", "oh": f"0:{L.OH}",
                 "tw": f"0:{L.OW // wb}", "kb": f"0:{L.K // width}"},
        {"xin": whole("x"), "win": whole("wv"), "offin": whole("offs")},
        tile_code(L, wb, nnz, width, params["PLANT"]),
        {"yout": whole("y")},  # each tile writes its own part
        language=dace.Language.CPP, external_edges=True)
    tasklet.code_global = dace.properties.CodeBlock("#include <immintrin.h>", dace.Language.CPP)
    return pad_sdfg(sdfg, layer, Layout.NDHWC, halo=True)


def algorithm(layer, dtype, params):
    from convkernels.layer import layer_constants
    from convkernels.layouts import Layout
    L = layer_constants(layer, Layout.NDHWC)
    return sparse_sdfg(layer, L, params,
                       f"direct_sparse_{layer.key()}_d{params['DENSITY']}_w{tile_width(layer, params)}"
                       f"_p{params['PLANT']}")


def offsets(L):
    """The offset of every input position ``(kd, kh, kw, c)`` (C order) in the padded NDHWC
    input, relative to a tile's first pixel (the ``offs`` entries)."""
    return [((kd * L.HP + kh) * L.WP + kw) * L.C + c
            for kd in range(L.KD) for kh in range(L.KH) for kw in range(L.KW)
            for c in range(L.C)]
