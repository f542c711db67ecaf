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
  gradient ``db`` (the same products summed over the batch and the pooled pixels: per
  row of pooled planes in parallel, then the rows in order; deterministic).

The maps are DaCe's (one parallel map over the pooled outputs, collapsed for OpenMP); the
code inside each map is the C++ below, generated per layer (:func:`window_code`,
:func:`activation_code`, :func:`slope_code`).  float32 only.
"""

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
    """C++ of the window's maximum ``m`` and its position ``a`` (the first maximum) from
    ``win`` (a pointer to the window's first element)."""
    lines = ["float m = win[0];", "unsigned char a = 0;"]
    for j, off in enumerate(offsets[1:], start=1):
        lines.append(f"a = win[{off}] > m ? (unsigned char){j} : a;")
        lines.append(f"m = win[{off}] > m ? win[{off}] : m;")
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


def forward(layer, dtype, params):
    """The SDFG of the fused forward epilogue: ``(y, b) -> (p, idx)``."""
    P = params["POOL"]
    N, K, D, H, W, PD, PH, PW = _sizes(layer, P)
    sdfg = dace.SDFG("block_forward")
    sdfg.add_array("y", [N, D, H, W, K], dace.float32)
    sdfg.add_array("b", [K], dace.float32)
    sdfg.add_array("p", [N, PD, PH, PW, K], dace.float32)
    outputs = {"o": dace.Memlet("p[n, pd, ph, pw, k]")}
    if P > 1:
        sdfg.add_array("idx", [N, PD, PH, PW, K], dace.uint8)
        outputs["j"] = dace.Memlet("idx[n, pd, ph, pw, k]")
    window = ", ".join(f"{P} * {v}:{P} * {v} + {P}" for v in ("pd", "ph", "pw"))
    # a one-element memlet is a scalar in C++ (no pool: the window is one value)
    code = (window_code(window_offsets(layer, P)) if P > 1 else "const float m = win;") + "\n"
    code += f"const float v = m + bb;\no = {activation_code('v')};\n"
    if P > 1:
        code += "j = a;\n"
    state = sdfg.add_state("epilogue")
    state.add_mapped_tasklet(
        "block_forward", dict(n=f"0:{N}", pd=f"0:{PD}", ph=f"0:{PH}", pw=f"0:{PW}", k=f"0:{K}"),
        {"win": dace.Memlet(f"y[n, {window}, k]"), "bb": dace.Memlet("b[k]")}, code, outputs,
        language=dace.Language.CPP, external_edges=True)
    return sdfg


def backward(layer, dtype, params):
    """The SDFG of the fused backward epilogue: ``(g, p, idx) -> (gy, db)``."""
    P = params["POOL"]
    N, K, D, H, W, PD, PH, PW = _sizes(layer, P)
    sdfg = dace.SDFG("block_backward")
    for name in ("g", "p"):
        sdfg.add_array(name, [N, PD, PH, PW, K], dace.float32)
    sdfg.add_array("gy", [N, D, H, W, K], dace.float32)
    sdfg.add_array("db", [K], dace.float32)
    sdfg.add_array("part", [N * PD, K], dace.float32, transient=True)
    inputs = {"gg": dace.Memlet("g[n, pd, ph, pw, k]"), "pp": dace.Memlet("p[n, pd, ph, pw, k]")}
    window = ", ".join(f"{P} * {v}:{P} * {v} + {P}" for v in ("pd", "ph", "pw"))
    code = f"const float v = {slope_code('gg', 'pp')};\n"
    if P > 1:
        sdfg.add_array("idx", [N, PD, PH, PW, K], dace.uint8)
        inputs["ii"] = dace.Memlet("idx[n, pd, ph, pw, k]")
        code += "\n".join(f"out[{off}] = ii == {j} ? v : 0.0f;"
                          for j, off in enumerate(window_offsets(layer, P)))
    else:
        code += "out = v;"
    scatter = sdfg.add_state("gradient")
    scatter.add_mapped_tasklet(
        "block_backward", dict(n=f"0:{N}", pd=f"0:{PD}", ph=f"0:{PH}", pw=f"0:{PW}", k=f"0:{K}"),
        inputs, code, {"out": dace.Memlet(f"gy[n, {window}, k]")},
        language=dace.Language.CPP, external_edges=True)
    # the bias gradient: per row of pooled planes (n, pd) its sums, then the rows in order
    plane = PH * PW
    rows = sdfg.add_state_after(scatter, "bias_rows")
    rows.add_mapped_tasklet(
        "block_bias_rows", dict(n=f"0:{N}", pd=f"0:{PD}"),
        {"gpl": dace.Memlet(f"g[n, pd, 0:{PH}, 0:{PW}, 0:{K}]"),
         "ppl": dace.Memlet(f"p[n, pd, 0:{PH}, 0:{PW}, 0:{K}]")},
        f"""float acc[{K}];
for (int k = 0; k < {K}; ++k) acc[k] = 0.0f;
for (int q = 0; q < {plane}; ++q)
    for (int k = 0; k < {K}; ++k)
        acc[k] += {slope_code(f'gpl[q * {K} + k]', f'ppl[q * {K} + k]')};
for (int k = 0; k < {K}; ++k) row[k] = acc[k];""",
        {"row": dace.Memlet(f"part[n * {PD} + pd, 0:{K}]")},
        language=dace.Language.CPP, external_edges=True)
    total = sdfg.add_state_after(rows, "bias")
    total.add_mapped_tasklet(
        "block_bias", dict(k=f"0:{K}"), {"col": dace.Memlet(f"part[0:{N * PD}, k]")},
        f"""float s = 0.0f;
for (int r = 0; r < {N * PD}; ++r) s += col[r * {K}];
out = s;""",
        {"out": dace.Memlet("db[k]")}, language=dace.Language.CPP, external_edges=True)
    return sdfg


def cpu_schedule(sdfg, layer, params):
    """OpenMP: each parallel map collapsed over its pooled dimensions (the channel loop
    innermost, where the compiler vectorizes it)."""
    dims = {"epilogue": 4, "gradient": 4, "bias_rows": 2, "bias": 1}
    for state in sdfg.states():
        _parallel(state, dims[state.label])
