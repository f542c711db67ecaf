"""Sparse convolution: magnitude pruning in blocks, the compressed filter, the sparse
kernel's builds and its check.

The kernel (:mod:`convkernels.cpu.direct.sparse`) runs the kept blocks of a filter pruned
per vector of output channels (:func:`prune`); it is checked like every float32 kernel,
against torch's float64 convolution with the pruned filter (the tolerance of
:mod:`convbench.check.verify`), and a planted error (a kept block skipped) fails.
"""

from __future__ import annotations

from typing import Dict, Optional

from convbench.build.precision import DTYPES
from convbench.registry import Implementation, Layout, Param, Pass, stored_shape
from convkernels.cpu.direct import sparse
from convkernels.cpu.direct.blocking import cpu_schedule, switch_param


def _density(value: int) -> Optional[str]:
    return None if 1 <= value <= 100 else "a percentage, 1 to 100"


KERNEL = Implementation(
    name="directConvNDHWCsparse", layout=Layout.NDHWC, pass_=Pass.FWD,
    summary="block-sparse direct convolution on NDHWC for the CPU: the kept blocks (one "
            "input position x one vector of output channels) of a magnitude-pruned filter, "
            "stored compressed",
    algorithm=sparse.algorithm, schedules={"cpu": cpu_schedule},
    params=(Param("DENSITY", 100, "percent of each vector's blocks kept", minimum=1,
                  check=_density),
            Param("PIX", 16, "output pixels per tile along the width (a divisor of it)"),
            switch_param("PLANT", 0, "tests only: 1 skips the last kept block")),
    supports=sparse.supports,
    constraints="no groups or dilation; K a multiple of the vector's floats")


def _blocks(w, layer):
    """``w`` (logical KCDHW) as ``[K / V, V, KD KH KW C]``: per vector of output channels,
    its blocks in the order of :func:`convkernels.cpu.direct.sparse.offsets`."""
    V = sparse.lanes()
    run = w.permute(0, 2, 3, 4, 1).reshape(layer.out_channels, -1)
    return run.reshape(layer.out_channels // V, V, run.shape[-1])


#: The pruning patterns: ``blocks`` (the largest blocks of each vector, any density) and
#: ``2:4`` (the 2 largest of every 4 consecutive blocks along the reduction: 50%, the
#: structure of the GPU's sparse tensor cores, here as a compressed filter).
PATTERNS = ("blocks", "2:4")


def pattern_refusal(layer, pattern: str) -> str:
    """Why ``layer`` cannot be pruned in ``pattern`` ("" where it can)."""
    if pattern not in PATTERNS:
        return f"unknown pattern {pattern!r} (known: {', '.join(PATTERNS)})"
    run = layer.k_d * layer.k_h * layer.k_w * layer.in_channels
    if pattern == "2:4" and run % 4:
        return f"2:4 needs the reduction ({run} positions) in whole groups of 4"
    return ""


def prune(w, layer, density: int, pattern: str = "blocks"):
    """``(pruned, keep)``: ``w`` with, per vector of output channels, all but its
    :func:`~convkernels.cpu.direct.sparse.kept` blocks of largest l2 norm set to zero
    (``pattern`` 2:4: the 2 largest of every 4 consecutive ones, ``density`` 50), and the
    kept blocks' indices (``[K / V, NNZ]``, ascending)."""
    import torch
    blocks = _blocks(w, layer)
    nnz = sparse.kept(layer, density)
    norms = blocks.double().pow(2).sum(dim=1)
    if pattern == "2:4":
        if density != 50 or pattern_refusal(layer, pattern):
            raise ValueError(f"2:4 on {layer.name}: density 50 and whole groups of 4")
        groups = norms.view(norms.shape[0], -1, 4)
        top = torch.topk(groups, 2, dim=2).indices + 4 * torch.arange(
            groups.shape[1]).view(1, -1, 1)
        keep = torch.sort(top.flatten(1), dim=1).values
    else:
        keep = torch.sort(torch.topk(norms, nnz, dim=1).indices, dim=1).values
    mask = torch.zeros_like(norms, dtype=torch.bool).scatter_(1, keep, True)
    pruned = (blocks * mask.unsqueeze(1)).reshape(layer.out_channels, layer.k_d, layer.k_h,
                                                  layer.k_w, layer.in_channels)
    return pruned.permute(0, 4, 1, 2, 3).contiguous(), keep


def compress(w, keep, layer):
    """``(wv, offs)``: the kept blocks of ``w`` (float32) and where each reads the padded
    input (the kernel's compressed filter)."""
    import torch
    from convkernels.layer import layer_constants
    blocks = _blocks(w, layer)  # [KB, V, R]
    index = keep.unsqueeze(1).expand(-1, blocks.shape[1], -1)
    wv = torch.gather(blocks, 2, index).permute(0, 2, 1).contiguous().float()
    table = torch.tensor(sparse.offsets(layer_constants(layer, Layout.NDHWC)), dtype=torch.int32)
    return wv, table[keep].contiguous()


def build(layer, params: Optional[Dict[str, int]] = None, cachedir=None, policy: str = "rebuild"):
    from convbench.build import cache, toolchain
    return cache.build(toolchain.make_spec(KERNEL, layer, DTYPES["float32"], "cpu",
                                           params or {}), cachedir, policy=policy)


def kernel_arrays(x, w, layer, density: int, pattern: str = "blocks"):
    """``(arrays, pruned)``: the kernel's arguments for input ``x`` and filter ``w``
    (logical, float32) pruned to ``density`` in ``pattern``, and the pruned filter
    (logical)."""
    import torch
    pruned, keep = prune(w, layer, density, pattern)
    wv, offs = compress(pruned, keep, layer)
    y = torch.empty(stored_shape(Layout.NDHWC, "y", layer.output_shape), dtype=torch.float32)
    return {"x": x.permute(0, 2, 3, 4, 1).contiguous(), "wv": wv, "offs": offs, "y": y}, pruned


def verify(layer, density: int, params=None, seed: int = 0, plant: bool = False,
           cachedir=None, policy: str = "rebuild", pattern: str = "blocks"):
    """The kernel's output at ``density`` on fresh random inputs, checked against torch's
    float64 convolution with the pruned filter: the :class:`~convbench.check.verify.Check`."""
    from convbench.check.verify import compare, make_inputs, truth_for
    inputs = make_inputs(layer, Pass.FWD, seed)
    arrays, pruned = kernel_arrays(inputs["x"], inputs["w"], layer, density, pattern)
    b = build(layer, dict(params or {}, DENSITY=density, PLANT=int(plant)), cachedir, policy)
    b(**arrays)
    truth = truth_for(layer, Pass.FWD, {"x": inputs["x"], "w": pruned}, random_inputs=True)
    return compare(arrays["y"].permute(0, 4, 1, 2, 3), truth, DTYPES["float32"].rounding)


# -- the 2:4 sparse tensor-core forward (GPU), checked in its CPU emulation --------------------

def _mma_kernel():
    from convkernels.gpu.mma import sparse as mma_sparse
    return Implementation(**mma_sparse.fields(
        name="implicitGemmMMASparse", pass_=Pass.FWD,
        summary="implicit GEMM on NDHWC on 2:4 sparse tensor cores: the mma.sync kernels' "
                "stages and gather, the filter 2:4 compressed with its metadata (built "
                "once), mma.sp m16n8k32 with float32 sums (CPU: ldmatrix and the MMA "
                "emulated lane by lane)",
        constraints="C a multiple of 4; CTAtileK a multiple of 32; one image of the input "
                    "below 2^31 elements"))


#: The 2:4 sparse tensor-core forward (GPU; its CPU schedule emulates ``mma.sp``): 16-bit
#: input, the packed filter (:func:`convkernels.gpu.mma.sparse.pack`), float32 sums out.
MMA_KERNEL = _mma_kernel()


def integer_operands(layer, seed: int = 0):
    """Random small integers (logical NCDHW, float64): the input in [-8, 8], the filter in
    [-4, 4] pruned 2:4 along its channels.  Every product and partial sum is an integer
    below 2^24, exact in float32 and in both 16-bit types, so the sums can be checked bit
    for bit."""
    import torch
    from convkernels.gpu.mma.sparse import prune_2to4
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-8, 9, layer.input_shape, generator=gen).double()
    w = torch.randint(-4, 5, layer.filter_shape, generator=gen).double()
    pruned = prune_2to4(w.permute(0, 2, 3, 4, 1).numpy())  # channels last: groups of 4
    return x, torch.from_numpy(pruned).permute(0, 4, 1, 2, 3).contiguous()


def packed_filter(layer, params, w, dtype: str = "float16"):
    """The 2:4 filter ``w`` (logical, pruned) as the sparse tensor-core kernel reads it,
    as a torch tensor of ``dtype``."""
    import numpy as np
    import torch
    from convkernels.gpu.mma import sparse as mma_sparse
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    bits = w.permute(0, 2, 3, 4, 1).contiguous().to(tdt).view(torch.int16).numpy()
    params = MMA_KERNEL.resolve_params(params or {})
    packed = mma_sparse.pack(layer, params, bits.view(np.uint16))
    return torch.from_numpy(packed.view(np.int16)).view(tdt)


def verify_mma(layer, params=None, seed: int = 0, target: str = "cpu", cachedir=None,
               policy: str = "rebuild", planted: str = "", dtype: str = "float16"):
    """:data:`MMA_KERNEL`'s float32 sums on :func:`integer_operands` against the exact
    ones, bit for bit: on the CPU its emulation, on the GPU the sparse tensor cores.
    ``planted`` tags a build a test broke."""
    import torch
    from convbench.build import cache, toolchain
    x, w = integer_operands(layer, seed)
    spec = toolchain.make_spec(MMA_KERNEL, layer, dtype, target, params or {}, planted=planted)
    b = cache.build(spec, cachedir, policy=policy)
    device = "cuda" if target == "gpu" else "cpu"
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    y = torch.zeros(stored_shape(Layout.NDHWC, "y", layer.output_shape), dtype=torch.float32,
                    device=device)
    b(x=x.permute(0, 2, 3, 4, 1).contiguous().to(tdt).to(device),
      w=packed_filter(layer, params, w, dtype).to(device), y=y)
    from convbench.quant.int8 import exact_conv
    exact = exact_conv(layer, x, w).double()
    got = y.cpu().permute(0, 4, 1, 2, 3).double()
    bad = ~(got == exact)
    return {"mismatches": int(bad.sum()), "nan": int(torch.isnan(got).sum()),
            "elements": exact.numel(), "ok": not bool(bad.any())}
