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

The parallel maps are DaCe's (over the rows of pooled outputs ``(n, pd, ph)`` and blocks
of ``KB`` channels; the bias gradient's sums); the body of each is generated C++, a loop
over the row's pooled pixels and, innermost, the block's channels (:func:`window_code`,
:func:`activation_code`, :func:`slope_code`).  The CPU takes all channels in one point
(``KB=0``: the loop vectorized, the rows collapsed for OpenMP), the GPU one channel a
thread (``KB=1``: consecutive threads on consecutive channels).  float32 only.
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


def channels_per_point(params, K: int) -> int:
    """``KB``: the channels one map point loops over (0: all of them, the CPU's choice:
    one point a row, its channels a vectorized loop; 1: a point per channel, the GPU's:
    consecutive threads on consecutive channels)."""
    KB = params.get("KB", 0) or K
    if K % KB:
        raise ValueError(f"KB={KB} does not divide the {K} channels")
    return KB


def _rows(N, PD, PH, K, KB):
    """The map over rows of pooled outputs, and over channel blocks where KB < K."""
    rows = dict(n=f"0:{N}", pd=f"0:{PD}", ph=f"0:{PH}")
    return rows if KB == K else dict(rows, kb=f"0:{K // KB}")


def _channels(K, KB):
    """The memlet range of a map point's channels, and C++ of its first."""
    return (f"0:{K}", "0") if KB == K else (f"{KB} * kb:{KB} * kb + {KB}", f"{KB} * kb")


def _pointers(tasklet, **types) -> None:
    """Type the named connectors of ``tasklet`` as pointers: the code indexes them even
    where a memlet is one element (a row of one pooled pixel, one channel a point), which
    DaCe would otherwise make a scalar."""
    for name, dtype in types.items():
        conns = tasklet.in_connectors if name in tasklet.in_connectors else tasklet.out_connectors
        conns[name] = dace.pointer(dtype)


F32, U8 = dace.float32, dace.uint8


def forward(layer, dtype, params):
    """The SDFG of the fused forward epilogue: ``(y, b) -> (p, idx)``: one parallel map
    over the rows of pooled outputs (n, pd, ph) and blocks of ``KB`` channels, each point
    a loop over its row's pooled pixels and, innermost, its channels."""
    P = params["POOL"]
    N, K, D, H, W, PD, PH, PW = _sizes(layer, P)
    KB = channels_per_point(params, K)
    sdfg = dace.SDFG("block_forward")
    sdfg.add_array("y", [N, D, H, W, K], dace.float32)
    sdfg.add_array("b", [K], dace.float32)
    sdfg.add_array("p", [N, PD, PH, PW, K], dace.float32)
    ch, k0 = _channels(K, KB)
    row = f"n, pd, ph, 0:{PW}, {ch}"
    outputs = {"po": dace.Memlet(f"p[{row}]")}
    store = f"po[w * {K} + k] = {activation_code('v')};"
    if P > 1:
        sdfg.add_array("idx", [N, PD, PH, PW, K], dace.uint8)
        outputs["io"] = dace.Memlet(f"idx[{row}]")
        store += f"\n        io[w * {K} + k] = a;"
    code = f"""for (int w = 0; w < {PW}; ++w) {{
    const float* win = yr + w * {P * K};
    #pragma omp simd
    for (int k = 0; k < {KB}; ++k) {{
{textwrap.indent(window_code(window_offsets(layer, P)), ' ' * 8)}
        const float v = m + bb[{'k' if KB == K else f'{k0} + k'}];
        {store}
    }}
}}"""
    state = sdfg.add_state("epilogue")
    tasklet, _, _ = state.add_mapped_tasklet(
        "block_forward", _rows(N, PD, PH, K, KB),
        {"yr": dace.Memlet(f"y[n, {P} * pd:{P} * pd + {P}, {P} * ph:{P} * ph + {P}, 0:{W}, {ch}]"),
         "bb": dace.Memlet(f"b[0:{K}]")}, code, outputs,
        language=dace.Language.CPP, external_edges=True)
    _pointers(tasklet, yr=F32, bb=F32, po=F32, **({"io": U8} if P > 1 else {}))
    return sdfg


def backward(layer, dtype, params):
    """The SDFG of the fused backward epilogue: ``(g, p, idx) -> (gy, db)``: per row of
    pooled outputs and block of ``KB`` channels (in parallel) the output gradient of its
    windows and the row's sums for the bias gradient; then per (n, pd) the sums of its
    rows, and those in order (two short sums, not one long one: parallel on the GPU)."""
    P = params["POOL"]
    N, K, D, H, W, PD, PH, PW = _sizes(layer, P)
    KB = channels_per_point(params, K)
    rows = N * PD * PH
    sdfg = dace.SDFG("block_backward")
    for name in ("g", "p"):
        sdfg.add_array(name, [N, PD, PH, PW, K], dace.float32)
    sdfg.add_array("gy", [N, D, H, W, K], dace.float32)
    sdfg.add_array("db", [K], dace.float32)
    sdfg.add_array("part", [rows, K], dace.float32, transient=True)
    sdfg.add_array("part2", [N * PD, K], dace.float32, transient=True)
    ch, _ = _channels(K, KB)
    row = f"n, pd, ph, 0:{PW}, {ch}"
    inputs = {"gr": dace.Memlet(f"g[{row}]"), "pr": dace.Memlet(f"p[{row}]")}
    if P > 1:
        sdfg.add_array("idx", [N, PD, PH, PW, K], dace.uint8)
        inputs["ir"] = dace.Memlet(f"idx[{row}]")
        scatter = "\n".join(f"        out[{off} + k] = ii == {j} ? v : 0.0f;"
                            for j, off in enumerate(window_offsets(layer, P)))
        scatter = f"        const unsigned char ii = ir[w * {K} + k];\n" + scatter
    else:
        scatter = "        out[k] = v;"
    code = f"""float acc[{KB}];
for (int k = 0; k < {KB}; ++k) acc[k] = 0.0f;
for (int w = 0; w < {PW}; ++w) {{
    float* out = gyr + w * {P * K};
    #pragma omp simd
    for (int k = 0; k < {KB}; ++k) {{
        const float v = {slope_code(f'gr[w * {K} + k]', f'pr[w * {K} + k]')};
        acc[k] += v;
{scatter}
    }}
}}
for (int k = 0; k < {KB}; ++k) part_row[k] = acc[k];"""
    state = sdfg.add_state("gradient")
    tasklet, _, _ = state.add_mapped_tasklet(
        "block_backward", _rows(N, PD, PH, K, KB), inputs, code,
        {"gyr": dace.Memlet(f"gy[n, {P} * pd:{P} * pd + {P}, {P} * ph:{P} * ph + {P}, 0:{W}, {ch}]"),
         "part_row": dace.Memlet(f"part[(n * {PD} + pd) * {PH} + ph, {ch}]")},
        language=dace.Language.CPP, external_edges=True)
    _pointers(tasklet, gr=F32, pr=F32, gyr=F32, part_row=F32, **({"ir": U8} if P > 1 else {}))
    planes = sdfg.add_state_after(state, "bias_planes")
    first = f"(n * {PD} + pd) * {PH}"
    tasklet, _, _ = planes.add_mapped_tasklet(
        "block_bias_planes", dict(n=f"0:{N}", pd=f"0:{PD}", k=f"0:{K}"),
        {"col": dace.Memlet(f"part[{first}:{first} + {PH}, k]")},
        f"""float s = 0.0f;
for (int r = 0; r < {PH}; ++r) s += col[r * {K}];
out = s;""",
        {"out": dace.Memlet(f"part2[n * {PD} + pd, k]")}, language=dace.Language.CPP,
        external_edges=True)
    _pointers(tasklet, col=F32)
    total = sdfg.add_state_after(planes, "bias")
    tasklet, _, _ = total.add_mapped_tasklet(
        "block_bias", dict(k=f"0:{K}"), {"col": dace.Memlet(f"part2[0:{N * PD}, k]")},
        f"""float s = 0.0f;
for (int r = 0; r < {N * PD}; ++r) s += col[r * {K}];
out = s;""",
        {"out": dace.Memlet("db[k]")}, language=dace.Language.CPP, external_edges=True)
    _pointers(tasklet, col=F32)
    return sdfg


def cpu_schedule(sdfg, layer, params):
    """OpenMP: the rows of pooled outputs in parallel (the map collapsed), the channels
    innermost where the compiler vectorizes them; the bias gradient's channels in
    parallel."""
    dims = {"epilogue": 3, "gradient": 3, "bias_planes": 2, "bias": 1}
    for state in sdfg.states():
        _parallel(state, dims[state.label])


#: The GPU's map points: a thread per (row, channel), consecutive threads on consecutive
#: channels (``KB=1``), in blocks of this many threads.
GPU_BLOCK = 128


def gpu_schedule(sdfg, layer, params):
    """CUDA: every array in GPU memory (the network passes torch's CUDA tensors), each map
    a kernel with a thread per map point, built with ``KB=1`` (a point per channel)."""
    if channels_per_point(params, layer.out_channels) != 1:
        raise ValueError("the GPU schedule needs KB=1 (a thread per channel)")
    for desc in sdfg.arrays.values():
        desc.storage = dace.StorageType.GPU_Global
        if desc.transient:  # the bias sums' rows: allocated once, not on every call
            desc.lifetime = dace.AllocationLifetime.Persistent
    for state in sdfg.states():
        for node in state.nodes():
            if isinstance(node, dace.nodes.MapEntry):
                node.map.schedule = dace.ScheduleType.GPU_Device
                # x: the channels (coalesced), y: more rows where the channels are few
                # (a map over the channels alone has no y)
                x = min(GPU_BLOCK, layer.out_channels)
                y = max(1, GPU_BLOCK // x) if len(node.map.params) > 1 else 1
                node.map.gpu_block_size = [x, y, 1]
