"""Verification against torch in float64.

Every output element is compared with the same pass computed in float64 on the same
float32 inputs.  Element i must satisfy ``|out_i - s_i| <= tol_i``.  Here s_i is the
exact (float64) value, L the reduction length (:func:`reduction_length`), u the unit
roundoff, and t_ij = x*w the L products that element sums.

* **Random inputs** (the harness's own, :func:`make_inputs`)::

      tol_i = TOL_FACTOR * sqrt(L) * u * min(||t_i||_2 + |s_i|,  sum_j |t_ij|)

* **Any other inputs** (a network's activations, a caller's tensors)::

      tol_i = TOL_FACTOR * sqrt(L) * u * sum_j |t_ij|

``||t_i||_2`` is the square root of the pass computed on x^2 and w^2, ``sum |t|`` the pass
on |x| and |w|, both in float64.  The l2 term needs no more than that one extra
convolution.

**Why the first bound holds for every correct float32 kernel.**
- A kernel sums the products in some order: a sequential or FMA chain, register and cache
  blocks, split-K partial sums written out and added later, a pairwise tree, or a mixture.
  Each is a binary tree of L - 1 additions over the L products.
- Model each rounding as ``(1 + d)`` with |d| <= u, independent and of mean zero (the
  probabilistic model of Higham and Mary, 2019).  To first order the error is
  ``sum_n d_n * v_n`` plus the products' own roundings, where v_n is the exact partial sum
  formed at addition n.
- :func:`make_inputs` draws x and w independent and uniform on (-1, 1).  The products of one
  output element pair distinct elements of x with distinct elements of w, so they are
  independent with mean zero and variance sigma^2.
- The deepest tree is the sequential chain.  Given the final value s, its k-th partial sum
  is about ``(k/L) s`` plus a random-walk bridge of variance ``k (L - k) / L * sigma^2``.
  Summed over the chain, ``sum v^2 <= L s^2 / 3 + L^2 sigma^2 / 6``.
- So the error's standard deviation is at most ``u sqrt(L) (|s| / sqrt(3) + ||t||_2 /
  sqrt(6))``, with ``||t||_2 ~ sqrt(L) sigma``.  That is below
  ``0.58 u sqrt(L) (||t||_2 + |s|)``, and the tolerance is 14 such deviations (24 for d
  uniform on [-u, u]).
- The |s| term matters.  Over a million elements some sums lie 5 sigma out, and their
  partial sums are as large.  Without it, torch's own float32 filter gradient on CosmoFlow
  conv6 reached 0.45 of an l2-only tolerance.
- Blocked and pairwise sums have far smaller errors.  Rounding the inputs adds nothing,
  since the float64 reference is fed the same float32 values.
- Taking the min with ``sum |t|`` keeps every check at least as strict as the second bound,
  which was the only one before.  It decides only for sums of a few terms, where the
  second bound covers even the worst case: ``(L + 1) u sum|t| <= 8 sqrt(L) u sum|t|`` for
  L <= 62.

**Why it has power.**
- Dropping a fraction f of the terms moves an element by about ``sqrt(f L) sigma``.  The
  tolerance is ``TOL_FACTOR u L sigma (1 + |Z|)``, where ``s = Z sqrt(L) sigma``.
- So the error over the tolerance is about ``sqrt(f) / (TOL_FACTOR u sqrt(L)) / (1 + |Z|)``:
  about 70 in a typical element for f = 1% at L = 2.1M (CosmoFlow's first filter gradient
  at batch 1).
- A result 1% off everywhere scores ``0.01 |Z| / (1 + |Z|) / (TOL_FACTOR u sqrt(L))``: about
  10 in the elements with large |Z| at that L.
- ``scripts/check_power.py`` measures both (``convbench.check.power``).

**Other precisions** (:mod:`convbench.build.precision`).  The inputs are drawn as above and
rounded to the storage type before the float64 truth is computed, so the truth is exact
for the numbers the kernel reads.
- *16-bit storage, float32 sums* (float16, bfloat16).  Each operand is widened before it
  is multiplied, and the product of two 16-bit numbers is exact in float32, so the sums
  round as in float32 and the bound above holds for the value ``y`` before the store.
  The store rounds once more: ``|fl(y) - y| <= u_out |y|`` (``u_out`` = 2^-11 for float16,
  2^-8 for bfloat16), with ``|y| <= |s| + tol`` and, in float16's subnormal range, half the
  smallest subnormal instead.  So ``tol_i`` becomes ``tol_i (1 + u_out) + u_out |s_i| +
  tiny``.  That term is rigorous, so a correct kernel's worst element reaches 0.9 to 1
  of it (the store alone).
- *A kernel that sums in 16 bits* rounds every partial sum to ``u_out``: its error grows
  like ``u_out * sqrt(L / 3) * ||t||_2``, ``sqrt(L / 3) / |Z|`` times the store's term.
  ``tests/test_precision.py`` plants one (L = 432): err/tol 332 in float16, 1,210 in
  bfloat16.
- *TF32 operands* (``--math tf32``): each product carries ``|t_j| 2 u_tf32`` of random
  sign, which adds ``TOL_FACTOR * 2 u_tf32 ||t_i||_2`` (``2 u_tf32 sum|t|`` for inputs this
  module did not draw).

**The second bound** is the same model with nothing assumed about the inputs.  Partial sums
without random signs can grow like ``sum |t|``.  It is looser by about sqrt(L) on random
data (some 1,000 times at L = 2.1M, where a 1% loss passed).  It serves inputs this
module did not draw, and the float32 cross-checks on the GPU: torch's and cuDNN's own
algorithms, whose errors (FFT, Winograd) are theirs, not ours.  docs/verification.md has
the argument with the measurements.
"""


from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Dict, Optional

from convbench.layersets.layer import Layer
from convkernels.layouts import PASS_SIGNATURE, Pass, from_layout, stored_shape, to_layout
from convbench.build.precision import DType, Rounding, get_dtype
from convbench.check.references import TORCH_FP64, ReferenceOptions, cross_checks

if TYPE_CHECKING:  # torch is imported lazily: the CLI's error paths stay fast
    import torch

#: Safety factor of the tolerance (see the module docstring).
TOL_FACTOR = 8.0


def _rounding(value) -> Rounding:
    """A Rounding from a DType, a Rounding or a bare unit roundoff of float32 sums."""
    if isinstance(value, DType):
        return value.rounding
    if isinstance(value, Rounding):
        return value
    return Rounding(accumulate=float(value))


#: The rules a :class:`Check` is judged by: ``l2`` (the ground truth of random inputs:
#: ``min(||t||_2 + |s|, sum|t|)``), ``sum-abs`` (any inputs, or another float32 result as
#: the reference: ``sum|t|``) and ``bound`` (an implementation's own error bound).
RULES = ("l2", "sum-abs", "bound")


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
    #: The rule that gave the tolerance (:data:`RULES`).
    rule: str = ""

    def summary(self) -> str:
        text = (f"max abs {self.max_abs:.3e}  max rel {self.max_rel:.3e}  "
                f"err/tol {self.worst_ratio:.3g}" + (f" ({self.rule})" if self.rule else ""))
        if self.nonfinite:
            text += f"  non-finite {self.nonfinite}/{self.numel}"
        return text


@dataclasses.dataclass
class GroundTruth:
    """Inputs (logical NCDHW/KCTRS, float32, CPU) and their float64 results, for one layer
    and pass."""

    layer: Layer
    pass_: Pass
    inputs: Dict[str, "torch.Tensor"]
    ref: "torch.Tensor"
    reduction_len: int
    #: True where the inputs are independent and symmetric about zero (make_inputs):
    #: the verdict then uses the l2 tolerance of the module docstring.
    random_inputs: bool = False
    #: The device the float64 results were computed on.
    device: str = "cpu"
    _bounds: Dict[str, "torch.Tensor"] = dataclasses.field(default_factory=dict, repr=False)

    def _pass_on(self, key: str, fn):
        if key not in self._bounds:
            self._bounds[key] = TORCH_FP64.compute(
                self.layer, self.pass_, {k: fn(v) for k, v in self.inputs.items()}, self.device)
        return self._bounds[key]

    @property
    def absref(self):
        """sum_j |t_ij| per output element: the pass on |x| and |w|, in float64."""
        return self._pass_on("abs", lambda v: v.abs())

    @property
    def l2ref(self):
        """||t_i||_2 per output element: the square root of the pass on x^2 and w^2."""
        if "l2" not in self._bounds:
            self._bounds["l2"] = self._pass_on("sq", lambda v: v.double() ** 2).sqrt_()
            del self._bounds["sq"]
        return self._bounds["l2"]

    def drop(self) -> None:
        """Free the float64 tensors (the reference and the bounds)."""
        self.ref = None
        self._bounds.clear()


def make_inputs(layer: Layer, pass_: Pass, seed: int, dtype="float32"):
    """Fresh uniform(-1, 1) inputs, logical layout, on the CPU, rounded to the storage
    type of ``dtype`` (a name or a :class:`~convbench.build.precision.DType`): the float64
    truth is then exact for the very numbers the kernel reads.  The draw does not depend
    on the precision, so every precision sees the same inputs up to rounding."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    shapes = {"x": layer.input_shape, "w": layer.filter_shape, "y": layer.output_shape}
    roles, _ = PASS_SIGNATURE[Pass(pass_)]
    tdtype = get_dtype(dtype).torch
    return {r: (torch.rand(shapes[r], generator=gen, dtype=torch.float64) * 2 - 1).to(tdtype)
            for r in roles}


def reduction_length(layer: Layer, pass_: Pass) -> int:
    """The most terms an output element of the pass sums (the tolerance scales with it).

    Backward data: an input element meets each output channel of its group through at
    most ceil(k/stride) taps per dimension; backward filter: every output pixel."""
    pass_ = Pass(pass_)
    if pass_ == Pass.FWD:
        return layer.gemm_k
    if pass_ == Pass.BWD_DATA:
        taps = 1
        for k, s in zip((layer.k_d, layer.k_h, layer.k_w), layer.strides):
            taps *= -(-k // s)
        return layer.out_channels // layer.groups * taps
    return layer.gemm_m


def make_truth(layer: Layer, pass_: Pass = Pass.FWD, seed: int = 0,
               dtype="float32", device: str = "cpu") -> GroundTruth:
    """Fresh random inputs (:func:`make_inputs`) and their ground truth, checked with the
    l2 tolerance."""
    return truth_for(layer, pass_, make_inputs(layer, pass_, seed, dtype), device,
                     random_inputs=True)


def truth_for(layer: Layer, pass_: Pass, inputs, device: str = "cpu",
              random_inputs: bool = False) -> GroundTruth:
    """The float64 ground truth of ``pass_`` on given inputs (logical layout), computed by
    :data:`convbench.check.references.TORCH_FP64`.

    ``random_inputs``: the inputs are independent and symmetric about zero (as
    :func:`make_inputs` draws them), so the l2 tolerance applies; otherwise the sum|t| one.
    The inputs are kept on the CPU; the float64 results are computed on ``device``
    (``gpu``: torch's float64 convolution on the GPU, which is exact enough to be the
    ground truth and keeps large layers from taking minutes on the host) and stay there.
    The bound each comparison needs is computed when first asked for.
    """
    inputs = {k: v.detach().to("cpu") for k, v in inputs.items()}
    ref = TORCH_FP64.compute(layer, pass_, inputs, device)
    return GroundTruth(layer, Pass(pass_), inputs, ref, reduction_length(layer, pass_),
                       random_inputs=random_inputs, device=device)


def compare(out, truth: GroundTruth, rounding, name: str = "torch-fp64",
            ref=None, slack: float = 1.0, chunk: int = 1 << 22,
            rule: Optional[str] = None) -> Check:
    """Check ``out`` (logical layout, any device) against ``ref`` (default: the float64
    ground truth) with the tolerance of the module docstring times ``slack``: the l2
    one against the ground truth of random inputs, the sum|t| one otherwise (another
    float32 result as ``ref``, or inputs this module did not draw).  ``rounding``: the
    precision's :class:`~convbench.build.precision.Rounding` (a DType, or a bare unit roundoff
    for float32 sums), which adds the terms of "Other precisions" in the docstring.

    ``rule`` (:data:`RULES`) says which tolerance judges; by default ``l2`` where ``ref``
    is not given and the truth's inputs are random, else ``sum-abs``.  ``l2`` against a
    reference other than the ground truth of random inputs is refused.

    Works through ``chunk`` elements at a time on the device ``out`` lives on, so that
    large layers need no full-size float64 temporaries beyond the reference itself.
    """
    import torch
    if rule is None:
        rule = "l2" if ref is None and truth.random_inputs else "sum-abs"
    if rule not in RULES[:2] or (rule == "l2" and not truth.random_inputs):
        raise ValueError(f"compare: rule {rule!r} (l2 needs the ground truth of random "
                         "inputs; sum-abs holds for any)")
    ref = truth.ref if ref is None else ref
    dev = out.device
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"output shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    rounding = _rounding(rounding)
    scale = slack * TOL_FACTOR * math.sqrt(truth.reduction_len) * rounding.accumulate
    flat_out, flat_ref = out.detach().reshape(-1), ref.detach().reshape(-1)
    l2 = rule == "l2"
    flat_abs = truth.absref.reshape(-1)
    flat_l2 = truth.l2ref.reshape(-1) if l2 else None

    def tolerance(piece, r):
        bound = flat_abs[piece].to(dev)
        if l2:  # min(||t||_2 + |s|, sum|t|): see the module docstring
            bound = torch.minimum(flat_l2[piece].to(dev) + r.abs(), bound)
        tol = bound * scale
        if rounding.operands:  # operands rounded before each product (TF32)
            spread = flat_l2[piece].to(dev) * TOL_FACTOR if l2 else flat_abs[piece].to(dev)
            tol = tol + (slack * 2 * rounding.operands) * spread
        if rounding.output or rounding.tiny:  # the final store to a coarser format
            tol = (tol * (1 + rounding.output)
                   + slack * (rounding.output * r.abs() + rounding.tiny))
        return tol

    return dataclasses.replace(_chunked_check(name, flat_out, flat_ref, dev, chunk, tolerance),
                               rule=rule)


def _chunked_check(name: str, flat_out, flat_ref, dev, chunk: int, tolerance) -> Check:
    """The :class:`Check` of ``flat_out`` against ``flat_ref``, ``chunk`` elements at a time
    in float64 on ``dev``, each element within ``tolerance(piece, ref_piece)``: err/tol,
    exact matches passing even where the tolerance is 0, non-finite outputs (unwritten
    NaN poison) failing with an infinite ratio."""
    import torch
    nonfinite, max_abs, max_ref, worst = 0, 0.0, 0.0, 0.0
    for start in range(0, flat_out.numel(), chunk):
        piece = slice(start, start + chunk)
        o = flat_out[piece].to(dev, torch.float64)
        r = flat_ref[piece].to(dev, torch.float64)
        err = (o - r).abs()
        finite = torch.isfinite(o)
        nonfinite += int((~finite).sum())
        ratio = torch.where(err == 0, 0.0, err / tolerance(piece, r))
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
    dtype = dtype or torch.float32
    arrays = {r: to_layout(inputs[r], impl.layout, r).to(tdev, dtype) for r in roles}
    logical_out = {"y": layer.output_shape, "x": layer.input_shape, "w": layer.filter_shape}
    arrays[out_role] = torch.full(stored_shape(impl.layout, out_role, logical_out[out_role]),
                                  fill, dtype=dtype, device=tdev)
    return arrays


#: Elements of NaN on each side of a verified input (at most; see :func:`guarded`).
GUARD_ELEMENTS = 1 << 22


def guarded(tensor):
    """``tensor`` copied into the middle of a buffer of NaN, about its own size (at most
    :data:`GUARD_ELEMENTS`) on each side, a multiple of 64 elements so that the copy
    keeps the buffer's alignment: a kernel that reads past either end of its input (a
    wrong offset, the zero border of the first or last rows read in place) gets NaN,
    which poisons its output, instead of whatever memory lies there.  (A read that
    stays inside the input but at the wrong place gets a wrong value, which the
    comparison catches.)"""
    import torch
    n = tensor.numel()
    guard = -(-min(n, GUARD_ELEMENTS) // 64) * 64
    buffer = torch.full((n + 2 * guard,), math.nan, dtype=tensor.dtype, device=tensor.device)
    view = buffer[guard:guard + n].view(tensor.shape)
    view.copy_(tensor)
    return view


def run_build(build, truth: GroundTruth, device: str = "cpu"):
    """Run a loaded build on the reference inputs; return its output in logical layout.

    The output buffer is poisoned with NaN first, so unwritten elements fail, and every
    input lies between NaN guards (:func:`guarded`), so reads outside it fail.  The build
    runs twice, the output poisoned again before the second call, whose output is
    checked: a buffer kept from one call to the next (the CPU kernels allocate theirs
    once per loaded program) that is not rewritten or re-zeroed on every call fails.
    """
    import torch
    impl, layer = build.spec.impl, build.spec.layer
    roles, out_role = PASS_SIGNATURE[impl.pass_]
    args = program_arrays(impl, layer, truth.inputs, device, build.spec.dtype.torch)
    args.update({role: guarded(args[role]) for role in roles})
    build(**args)
    args[out_role].fill_(math.nan)
    build(**args)
    if device == "gpu":
        torch.cuda.synchronize()
    return from_layout(args[out_role], impl.layout, out_role)


def verify_build(build, truth: GroundTruth, device: str = "cpu",
                 cudnn_algo: str = "find", tamper=None) -> list:
    """All checks for one build: the float64 ground truth; on the GPU also torch's float32
    convolution (TF32 off) and, where cuDNN is usable, cuDNN through this project's
    bindings (IEEE FP32, algorithm ``cudnn_algo``).  ``tamper``: applied to the output
    before it is checked (the harness's own planted failures)."""
    drawn = {v.dtype for v in truth.inputs.values()}
    if truth.random_inputs and drawn != {build.spec.dtype.torch}:
        raise ValueError(f"the ground truth's inputs are {sorted(map(str, drawn))}, the build "
                         f"{build.spec.name} stores {build.spec.dtype.name}: draw them in its "
                         "precision (make_truth(..., dtype=...)), or the check compares "
                         "different numbers")
    out = run_build(build, truth, device)
    if tamper is not None:
        out = tamper(out)
    checks = check_output(out, truth, build.spec.dtype, device, cudnn_algo)
    if build.spec.impl.error_bound is not None:  # its own bound replaces the tolerance
        checks[0] = check_result(out, truth, build.spec)
    return checks


def compare_to_bound(out, truth: GroundTruth, bound, name: str = "torch-fp64",
                     chunk: int = 1 << 22) -> Check:
    """Check ``out`` against the float64 ground truth with a per-element ``bound`` on the
    error (an implementation's ``error_bound``): err/bound, exact matches passing.  Works
    through ``chunk`` elements at a time, as :func:`compare` does."""
    import torch
    flat_ref = truth.ref.detach().reshape(-1)
    flat_out = out.detach().reshape(-1)
    flat_bound = bound.detach().reshape(-1)
    if flat_out.numel() != flat_ref.numel() or flat_bound.numel() != flat_ref.numel():
        raise ValueError(f"output {tuple(out.shape)} and bound {tuple(bound.shape)} do not "
                         f"match the reference {tuple(truth.ref.shape)}")
    dev = out.device
    return dataclasses.replace(
        _chunked_check(name, flat_out, flat_ref, dev, chunk,
                       lambda piece, r: flat_bound[piece].to(dev, torch.float64)), rule="bound")


def check_result(out, truth: GroundTruth, spec) -> Check:
    """The ground-truth check of an output of build ``spec`` (logical layout): against its
    implementation's own error bound where it has one (Winograd), else with the direct
    sums' tolerance in its precision (:func:`compare`)."""
    bound = spec.impl.error_bound
    if bound is not None:
        return compare_to_bound(out, truth, bound(truth.layer, truth.inputs, TOL_FACTOR,
                                                  random_inputs=truth.random_inputs))
    return compare(out, truth, spec.dtype)


def check_output(out, truth: GroundTruth, rounding, device: str = "cpu",
                 cudnn_algo: str = "find") -> list:
    """The checks of :func:`verify_build` on an output already computed (logical layout);
    ``rounding`` as for :func:`compare`."""
    checks = [compare(out, truth, rounding)]
    options = ReferenceOptions(allow_tf32=False, cudnn_algo=cudnn_algo)  # IEEE FP32
    # 16-bit inputs widen exactly to float32: the references then round as the argument
    # for float32 assumes, not as their own 16-bit algorithms (Winograd, FFT) would.
    references = [r for r in cross_checks(device) if r.layer_problem(truth.layer) is None]
    wide = {k: v.float() if v.is_floating_point() and v.element_size() < 4 else v
            for k, v in truth.inputs.items()} if references else {}
    for reference in references:
        other = reference.compute(truth.layer, truth.pass_, wide, device, options)
        # Both sides carry float32 rounding: allow twice the tolerance.
        checks.append(compare(out, truth, rounding, name=reference.check_name, ref=other,
                              slack=2.0))
    return checks
