"""Verification against torch in float64.

The ground truth is ``torch.nn.functional.conv3d`` in float64 on the CPU, fed
with the same float32 inputs upcast exactly.  On a GPU the result is also
compared with torch's float32 convolution on the GPU with TF32 off.

Tolerance.  A float32 sum of L products, each term ``x_i * w_i``, is off from
the exact sum by roundings whose size follows the partial sums; for any
summation order the error is well within ``sqrt(L) * u * sum_i |x_i * w_i|`` for
random data (``u`` the unit roundoff), whereas the worst-case bound
``L * u * sum|x_i w_i|`` is too loose to notice a skipped term.  So each output
element i must satisfy::

    |out_i - ref_i| <= TOL_FACTOR * sqrt(L) * u * absref_i

where ``absref`` is the same convolution of ``|x|`` and ``|w|`` in float64 and
L the reduction length.  A missing or doubled reduction term, a wrong tap, or
an unwritten element (outputs are poisoned with NaN before each run) fails.
Inputs are fresh uniform(-1, 1) random numbers, never zeros.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Dict

from .layers import Layer
from .layouts import PASS_SIGNATURE, Pass, from_layout, stored_shape, to_layout

if TYPE_CHECKING:  # torch is imported lazily: the CLI's error paths stay fast
    import torch

#: Safety factor of the tolerance (see the module docstring).
TOL_FACTOR = 8.0


@dataclasses.dataclass
class Check:
    """The outcome of comparing one output with its reference."""

    reference: str
    ok: bool
    max_abs: float
    #: max |out - ref| / max |ref|.
    max_rel: float
    #: max over elements of |out - ref| / tolerance (pass iff <= 1 and nothing is NaN).
    worst_ratio: float
    #: elements that are NaN or infinite (unwritten or broken).
    nonfinite: int
    numel: int

    def summary(self) -> str:
        text = (f"max abs {self.max_abs:.3e}  max rel {self.max_rel:.3e}  "
                f"err/tol {self.worst_ratio:.3g}")
        if self.nonfinite:
            text += f"  non-finite {self.nonfinite}/{self.numel}"
        return text


@dataclasses.dataclass
class Reference:
    """Inputs (logical NCDHW/KCTRS, float32, CPU) and float64 results for one layer."""

    layer: Layer
    pass_: Pass
    inputs: Dict[str, "torch.Tensor"]
    ref: "torch.Tensor"
    absref: "torch.Tensor"
    reduction_len: int


def make_inputs(layer: Layer, pass_: Pass, seed: int, dtype="float32"):
    """Fresh uniform(-1, 1) inputs, logical layout, on the CPU."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    shapes = {"x": layer.input_shape, "w": layer.filter_shape, "y": layer.output_shape}
    roles, _ = PASS_SIGNATURE[Pass(pass_)]
    tdtype = getattr(torch, dtype)
    return {r: (torch.rand(shapes[r], generator=gen, dtype=torch.float64) * 2 - 1).to(tdtype)
            for r in roles}


def torch_pass(layer: Layer, pass_: Pass, inputs):
    """The pass computed by torch on ``inputs`` (any dtype and device): the forward
    convolution, or autograd's gradients for the input and the filter."""
    import torch.nn.functional as F
    from torch.nn import grad
    pass_ = Pass(pass_)
    if pass_ == Pass.FWD:
        return F.conv3d(inputs["x"], inputs["w"], stride=layer.stride, padding=layer.pads)
    if pass_ == Pass.BWD_DATA:
        return grad.conv3d_input(layer.input_shape, inputs["w"], inputs["y"], layer.stride,
                                 layer.pads)
    return grad.conv3d_weight(inputs["x"], layer.filter_shape, inputs["y"], layer.stride,
                              layer.pads)


def reduction_length(layer: Layer, pass_: Pass) -> int:
    """The most terms an output element of the pass sums (the tolerance scales with it).

    Backward data: an input element meets each output channel through at most
    ceil(k/stride) taps per dimension; backward filter: every output pixel."""
    pass_ = Pass(pass_)
    if pass_ == Pass.FWD:
        return layer.gemm_k
    if pass_ == Pass.BWD_DATA:
        taps = 1
        for k in (layer.k_d, layer.k_h, layer.k_w):
            taps *= -(-k // layer.stride)
        return layer.out_channels * taps
    return layer.gemm_m


def make_reference(layer: Layer, pass_: Pass = Pass.FWD, seed: int = 0,
                   dtype="float32", device: str = "cpu") -> Reference:
    return reference_for(layer, pass_, make_inputs(layer, pass_, seed, dtype), device)


def reference_for(layer: Layer, pass_: Pass, inputs, device: str = "cpu") -> Reference:
    """The float64 ground truth of ``pass_`` on given inputs (logical layout).

    The inputs are kept on the CPU; the float64 results are computed on ``device``
    (``gpu``: torch's float64 convolution on the GPU, which is exact enough to be the
    ground truth and keeps large layers from taking minutes on the host) and stay there.
    """
    import torch
    inputs = {k: v.detach().to("cpu") for k, v in inputs.items()}
    tdev = "cuda" if device == "gpu" else "cpu"
    with torch.no_grad():
        ref = torch_pass(layer, pass_, {k: v.to(tdev, torch.float64) for k, v in inputs.items()})
        absref = torch_pass(layer, pass_, {k: v.to(tdev, torch.float64).abs()
                                           for k, v in inputs.items()})
    return Reference(layer, Pass(pass_), inputs, ref, absref, reduction_length(layer, pass_))


def compare(out, reference: Reference, unit_roundoff: float, name: str = "torch-fp64",
            ref=None, slack: float = 1.0, chunk: int = 1 << 22) -> Check:
    """Check ``out`` (logical layout, any device) against ``ref`` (default: the float64
    ground truth) with the tolerance of the module docstring times ``slack``.

    Works through ``chunk`` elements at a time on the device ``out`` lives on, so that
    large layers need no full-size float64 temporaries beyond the reference itself.
    """
    import torch
    ref = reference.ref if ref is None else ref
    dev = out.device
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"output shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    scale = slack * TOL_FACTOR * math.sqrt(reference.reduction_len) * unit_roundoff
    flat_out, flat_ref = out.detach().reshape(-1), ref.detach().reshape(-1)
    flat_abs = reference.absref.reshape(-1)
    nonfinite, max_abs, max_ref, worst = 0, 0.0, 0.0, 0.0
    for start in range(0, flat_out.numel(), chunk):
        piece = slice(start, start + chunk)
        o = flat_out[piece].to(dev, torch.float64)
        r = flat_ref[piece].to(dev, torch.float64)
        err = (o - r).abs()
        finite = torch.isfinite(o)
        nonfinite += int((~finite).sum())
        # err/tol, with exact matches passing even where the tolerance is 0 (all terms 0);
        # non-finite outputs (unwritten NaN poison) get an infinite ratio.
        ratio = torch.where(err == 0, 0.0, err / (flat_abs[piece].to(dev) * scale))
        ratio = torch.where(finite, ratio, math.inf)
        worst = max(worst, float(ratio.max()))
        if bool(finite.any()):
            max_abs = max(max_abs, float(err[finite].max()))
        max_ref = max(max_ref, float(r.abs().max()))
    if nonfinite:
        max_abs = math.nan
    return Check(reference=name, ok=nonfinite == 0 and worst <= 1.0, max_abs=max_abs,
                 max_rel=max_abs / max_ref if max_ref > 0 else max_abs, worst_ratio=worst,
                 nonfinite=nonfinite, numel=flat_out.numel())


def program_arrays(impl, layer: Layer, inputs, device: str = "cpu", dtype=None,
                   fill: float = math.nan):
    """The arguments of ``impl``'s program: ``inputs`` (logical layout) converted to its
    stored layout on ``device``, plus its output buffer filled with ``fill``."""
    import torch
    roles, out_role = PASS_SIGNATURE[impl.pass_]
    tdev = torch.device("cuda" if device == "gpu" else "cpu")
    arrays = {r: to_layout(inputs[r], impl.layout, r).to(tdev) for r in roles}
    logical_out = {"y": layer.output_shape, "x": layer.input_shape, "w": layer.filter_shape}
    arrays[out_role] = torch.full(stored_shape(impl.layout, out_role, logical_out[out_role]),
                                  fill, dtype=dtype or torch.float32, device=tdev)
    return arrays


def run_build(build, reference: Reference, device: str = "cpu"):
    """Run a loaded build on the reference inputs; return its output in logical layout.

    The output buffer is poisoned with NaN first, so unwritten elements fail.
    """
    import torch
    impl, layer = build.spec.impl, build.spec.layer
    out_role = PASS_SIGNATURE[impl.pass_][1]
    args = program_arrays(impl, layer, reference.inputs, device, build.spec.dtype.torch)
    build(**args)
    if device == "gpu":
        torch.cuda.synchronize()
    return from_layout(args[out_role], impl.layout, out_role)


def verify_build(build, reference: Reference, device: str = "cpu",
                 cudnn_algo: str = "find") -> list:
    """All checks for one build: the float64 ground truth; on the GPU also torch's float32
    convolution (TF32 off) and, where cuDNN is usable, cuDNN through this project's
    bindings (IEEE FP32, algorithm ``cudnn_algo``)."""
    out = run_build(build, reference, device)
    return check_output(out, reference, build.spec.dtype.unit_roundoff, device, cudnn_algo)


def check_output(out, reference: Reference, unit_roundoff: float, device: str = "cpu",
                 cudnn_algo: str = "find") -> list:
    """The checks of :func:`verify_build` on an output already computed (logical layout)."""
    import torch
    u = unit_roundoff
    checks = [compare(out, reference, u)]
    if device == "gpu":
        prev = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        try:
            with torch.no_grad():
                gpu_ref = torch_pass(reference.layer, reference.pass_,
                                     {k: v.cuda() for k, v in reference.inputs.items()})
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev
        # Both sides carry float32 rounding: allow twice the tolerance.
        checks.append(compare(out, reference, u, name="torch-gpu-fp32", ref=gpu_ref, slack=2.0))
        cudnn_out = cudnn_pass(reference, cudnn_algo)
        if cudnn_out is not None:
            checks.append(compare(out, reference, u, name="cudnn-fp32", ref=cudnn_out,
                                  slack=2.0))
    return checks


def cudnn_pass(reference: Reference, algo: str = "find"):
    """The reference's pass computed by cuDNN on the GPU (IEEE FP32), or None where
    cuDNN is not usable."""
    import cudnn_bindings
    if cudnn_bindings.problem() is not None:
        return None
    layer, g = reference.layer, {r: t.cuda() for r, t in reference.inputs.items()}
    common = dict(stride=layer.stride, padding=layer.pads, algo=algo, math="ieee")
    if reference.pass_ == Pass.FWD:
        return cudnn_bindings.conv3d_forward(g["x"], g["w"], **common)
    if reference.pass_ == Pass.BWD_DATA:
        return cudnn_bindings.conv3d_backward_data(g["y"], g["w"], layer.input_shape, **common)
    return cudnn_bindings.conv3d_backward_filter(g["x"], g["y"], layer.filter_shape, **common)
