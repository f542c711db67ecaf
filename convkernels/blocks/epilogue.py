"""A CosmoFlow block's epilogue, fused: after a convolution, its bias, LeakyReLU and (where
the block pools) a 2x2x2 max-pool in one pass over the convolution's output, and their
gradients in one pass back.

A block is ``p = pool(leaky(y + b))``.  The bias and the activation are monotone, so the
window's maximum can be taken first: ``pool(leaky(y + b)) = leaky(max(y) + b)``, and with
IEEE rounding (monotone too) the float32 result is the one torch's three operations give,
bit for bit.  The window is scanned in torch's order (depth, then height, then width) and
the first maximum wins, as in ``torch.nn.functional.max_pool3d``.

* **Forward** (:func:`forward`): reads ``y`` (NDHWC, the convolution's output) once and
  writes the pooled ``p`` and, per pooled value, the window position of its maximum
  (``idx``, one byte: ``4 a + 2 b + c`` for offset ``(a, b, c)``).  The full activation is
  never written.  Without a pool (``POOL=1``), ``p = leaky(y + b)`` and no index.
* **Backward** (:func:`backward`): from the pooled gradient ``g``, the pooled output ``p``
  (its sign is the activation's: the slope applies where ``p <= 0``, where torch's
  LeakyReLU takes it) and ``idx``, writes the convolution's output gradient ``gy`` (each
  window's maximum gets ``g`` times the slope, the other seven zero) and the bias
  gradient ``db`` (the same products summed over the batch and the pooled pixels: each
  row's sums beside its gradient, then the rows in order; deterministic).

The parallel maps are DaCe's (over the rows of pooled outputs ``(n, pd, ph)``, collapsed
for OpenMP; the bias gradient's channels); the body of each is generated C++, a loop over
the row's pooled pixels and, innermost and vectorized, their channels
(:func:`window_code`, :func:`activation_code`, :func:`slope_code`).  float32 only.
"""

import textwrap

import dace

#: CosmoFlow's LeakyReLU slope.
SLOPE = 0.3

#: ``POOL``: the pool window's edge after the block's convolution (2, or 1: no pool).
POOLS = (1, 2)


def _sizes(layer, pool: int):
    N, K = layer.batch, layer.out_channels
    D, H, W = layer.out_d, layer.out_h, layer.out_w
    if pool not in POOLS:
        raise ValueError(f"POOL={pool}: the block pools by 2 or not at all (1)")
    if pool == 2 and (D % 2 or H % 2 or W % 2):
        raise ValueError(f"a 2x2x2 pool needs even output sizes, got {D}x{H}x{W}")
    return N, K, D, H, W, D // pool, H // pool, W // pool


def window_offsets(layer, pool: int):
    """Each window position's offset from the window's first element in ``y`` (NDHWC),
    in torch's scan order."""
    K, H, W = layer.out_channels, layer.out_h, layer.out_w
    return [((a * H + b) * W + c) * K for a in range(pool) for b in range(pool)
            for c in range(pool)]


def window_code(offsets) -> str:
    """C++ of the window's maximum ``m`` and its position ``a`` (the first maximum) for
    channel ``k`` from ``win`` (a pointer to the window's first pixel)."""
    lines = ["float m = win[k];", "unsigned char a = 0;"]
    for j, off in enumerate(offsets[1:], start=1):
        lines.append(f"a = win[{off} + k] > m ? (unsigned char){j} : a;")
        lines.append(f"m = win[{off} + k] > m ? win[{off} + k] : m;")
    return "\n".join(lines)


def activation_code(value: str) -> str:
    """C++ of LeakyReLU of ``value`` (a float expression without side effects)."""
    return f"({value} > 0.0f ? {value} : {value} * {SLOPE}f)"


def slope_code(grad: str, out: str) -> str:
    """C++ of the activation's gradient applied to ``grad`` where the activation's output
    is ``out``."""
    return f"({out} > 0.0f ? {grad} : {grad} * {SLOPE}f)"


def _parallel(state, pooled_dims: int):
    for node in state.nodes():
        if isinstance(node, dace.nodes.MapEntry):
            node.map.schedule = dace.ScheduleType.CPU_Multicore
            node.map.collapse = min(pooled_dims, len(node.map.params))


def _rows(N, PD, PH):
    return dict(n=f"0:{N}", pd=f"0:{PD}", ph=f"0:{PH}")


def forward(layer, dtype, params):
    """The SDFG of the fused forward epilogue: ``(y, b) -> (p, idx)``: one parallel map
    over the rows of pooled outputs (n, pd, ph), each a loop over its pooled pixels and,
    innermost and vectorized, their channels."""
    P = params["POOL"]
    N, K, D, H, W, PD, PH, PW = _sizes(layer, P)
    sdfg = dace.SDFG("block_forward")
    sdfg.add_array("y", [N, D, H, W, K], dace.float32)
    sdfg.add_array("b", [K], dace.float32)
    sdfg.add_array("p", [N, PD, PH, PW, K], dace.float32)
    row = f"n, pd, ph, 0:{PW}, 0:{K}"
    outputs = {"po": dace.Memlet(f"p[{row}]")}
    store = f"po[w * {K} + k] = {activation_code('v')};"
    if P > 1:
        sdfg.add_array("idx", [N, PD, PH, PW, K], dace.uint8)
        outputs["io"] = dace.Memlet(f"idx[{row}]")
        store += f"\n        io[w * {K} + k] = a;"
    code = f"""for (int w = 0; w < {PW}; ++w) {{
    const float* win = yr + w * {P * K};
    #pragma omp simd
    for (int k = 0; k < {K}; ++k) {{
{textwrap.indent(window_code(window_offsets(layer, P)), ' ' * 8)}
        const float v = m + bb[k];
        {store}
    }}
}}"""
    state = sdfg.add_state("epilogue")
    state.add_mapped_tasklet(
        "block_forward", _rows(N, PD, PH),
        {"yr": dace.Memlet(f"y[n, {P} * pd:{P} * pd + {P}, {P} * ph:{P} * ph + {P}, 0:{W}, 0:{K}]"),
         "bb": dace.Memlet(f"b[0:{K}]")}, code, outputs,
        language=dace.Language.CPP, external_edges=True)
    return sdfg


def backward(layer, dtype, params):
    """The SDFG of the fused backward epilogue: ``(g, p, idx) -> (gy, db)``: per row of
    pooled outputs (in parallel) the output gradient of its windows and the row's sums
    for the bias gradient, then those sums in order."""
    P = params["POOL"]
    N, K, D, H, W, PD, PH, PW = _sizes(layer, P)
    rows = N * PD * PH
    sdfg = dace.SDFG("block_backward")
    for name in ("g", "p"):
        sdfg.add_array(name, [N, PD, PH, PW, K], dace.float32)
    sdfg.add_array("gy", [N, D, H, W, K], dace.float32)
    sdfg.add_array("db", [K], dace.float32)
    sdfg.add_array("part", [rows, K], dace.float32, transient=True)
    row = f"n, pd, ph, 0:{PW}, 0:{K}"
    inputs = {"gr": dace.Memlet(f"g[{row}]"), "pr": dace.Memlet(f"p[{row}]")}
    if P > 1:
        sdfg.add_array("idx", [N, PD, PH, PW, K], dace.uint8)
        inputs["ir"] = dace.Memlet(f"idx[{row}]")
        scatter = "\n".join(f"        out[{off} + k] = ii == {j} ? v : 0.0f;"
                            for j, off in enumerate(window_offsets(layer, P)))
        scatter = f"        const unsigned char ii = ir[w * {K} + k];\n" + scatter
    else:
        scatter = "        out[k] = v;"
    code = f"""float acc[{K}];
for (int k = 0; k < {K}; ++k) acc[k] = 0.0f;
for (int w = 0; w < {PW}; ++w) {{
    float* out = gyr + w * {P * K};
    #pragma omp simd
    for (int k = 0; k < {K}; ++k) {{
        const float v = {slope_code(f'gr[w * {K} + k]', f'pr[w * {K} + k]')};
        acc[k] += v;
{scatter}
    }}
}}
for (int k = 0; k < {K}; ++k) part_row[k] = acc[k];"""
    state = sdfg.add_state("gradient")
    state.add_mapped_tasklet(
        "block_backward", _rows(N, PD, PH), inputs, code,
        {"gyr": dace.Memlet(f"gy[n, {P} * pd:{P} * pd + {P}, {P} * ph:{P} * ph + {P}, 0:{W}, 0:{K}]"),
         "part_row": dace.Memlet(f"part[(n * {PD} + pd) * {PH} + ph, 0:{K}]")},
        language=dace.Language.CPP, external_edges=True)
    total = sdfg.add_state_after(state, "bias")
    total.add_mapped_tasklet(
        "block_bias", dict(k=f"0:{K}"), {"col": dace.Memlet(f"part[0:{rows}, k]")},
        f"""float s = 0.0f;
for (int r = 0; r < {rows}; ++r) s += col[r * {K}];
out = s;""",
        {"out": dace.Memlet("db[k]")}, language=dace.Language.CPP, external_edges=True)
    return sdfg


def cpu_schedule(sdfg, layer, params):
    """OpenMP: the rows of pooled outputs in parallel (the map collapsed), the channels
    innermost where the compiler vectorizes them; the bias gradient's channels in
    parallel."""
    dims = {"epilogue": 3, "gradient": 3, "bias": 1}
    for state in sdfg.states():
        _parallel(state, dims[state.label])
