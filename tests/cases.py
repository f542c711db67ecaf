"""Verification cases: an implementation on a layer of a named set, and the sets of each tier.

A test that takes a :class:`Case` as a parameter has its build compiled up front, with
every other collected case's, by the session's build cache (see ``conftest.py``), and
its outcome goes into the coverage table (verified, refused or failed).

The fast tier (``make test``) verifies every implementation on :data:`FAST_LAYERS`, two
layers that together reach the common code paths: a first layer at a small size (1 input
channel, so a GEMM reduction of 27, shorter than one tile; padding 1), and a deep odd
non-cubic layer at batch 2, strided with padding 2 (37 channels in and 36 out, so
several channel blocks and a tail in each; stride phases, border taps, tails in every
tile dimension, the batch loop).  An implementation that refuses strides takes the deep
odd stride-1 shape at batch 2 instead (:func:`fast_layers`).  The full tier (``make
test-full``) adds every layer of both sets at batch 1 and 2 for every pass (the first
layers at their full 128^3 and 130^3; the last, 256 channels on 4^3, is one output tile),
and every odd shape.  (Until issue 62 the fast tier also ran CosmoFlow's last layer for
every implementation: 35 builds, about a sixth of its time.)
"""

import dataclasses
import os
import time
from typing import Dict, Iterable, List, Sequence, Tuple

import pytest

from convbench import registry
from convbench.check import verify
from convbench.experiment.case import LayerCase
from convbench.layersets.layer import Layer
from convbench.layersets.sets import load_layers
from convkernels.layouts import Pass


#: The full tier's CPU budget, in GFLOP of one pass of a layer at its batch: the
#: largest layer on which these implementations are verified on the CPU.  Their CPU
#: schedules keep the GPU's structure, one filter element per thread with the whole
#: N*Do*Ho*Wo reduction in it, reading dL/dy and x with strides of K and C floats; once
#: that sweep leaves the caches they slow down by far more than their FLOPs grow
#: (docs/testing.md has the measurements).  A larger layer is counted as deferred in
#: the coverage table; both CosmoFlow sets keep layers under the budget, and the GPU
#: campaign's core tier verifies these kernels on cosmoflow_mlperf conv1 at batch 2.
CPU_CHECK_GFLOP: Dict[str, float] = {"implicitGemmBwdFilter": 7.5,
                                     "implicitGemmsplitKBwdFilter": 7.5,
                                     # each emulated MMA gathers its operands lane by
                                     # lane: 2-6 s per GFLOP on the 2-core EPYC
                                     "implicitGemmMMA": 8.0, "implicitGemmMMABwdData": 8.0,
                                     "implicitGemmMMABwdFilter": 8.0,
                                     # each thread decodes both operands' descriptors
                                     "implicitGemmWGMMA": 8.0,
                                     "implicitGemmWGMMABwdData": 8.0,
                                     # its slices' emulation is cheaper: 8-68 s per
                                     # CosmoFlow layer at batch 1, up to 29 GFLOP
                                     "implicitGemmWGMMABwdFilter": 30.0}


#: An environment variable that raises every budget of :data:`CPU_CHECK_GFLOP` to its
#: value (GFLOP) for one run, to verify the deferred layers once (the coverage table's
#: metadata.json records it as ``cpu_check_gflop``).
RAISE_BUDGET = "CONVBENCH_CPU_CHECK_GFLOP"


@dataclasses.dataclass(frozen=True)
class Case(LayerCase):
    """One build to verify: ``impl`` on ``layer`` (a member of ``layer_set``)."""

    target: str = "cpu"
    #: Parameter overrides as sorted (name, value) pairs (hashable); empty: the defaults.
    params: Tuple[Tuple[str, int], ...] = ()

    def resolved_params(self):
        return self.implementation.resolve_params(dict(self.params))

    def refused(self):
        """Why the implementation does not handle this layer, or None."""
        return self.implementation.unsupported_reason(self.layer, self.resolved_params())

    def deferred(self):
        """Why the full tier leaves this CPU case out (over :data:`CPU_CHECK_GFLOP`), or None."""
        limit = CPU_CHECK_GFLOP.get(self.impl) if self.target == "cpu" else None
        if limit is not None and os.environ.get(RAISE_BUDGET):  # a one-off longer sweep
            limit = max(limit, float(os.environ[RAISE_BUDGET]))
        gflop = self.layer.flops() / 1e9
        if limit is None or gflop <= limit:
            return None
        return (f"{gflop:.1f} GFLOP, over the CPU budget of {limit:g} GFLOP for {self.impl} "
                "(tests/cases.py CPU_CHECK_GFLOP)")

    def spec(self):
        return self.job().spec()

    @property
    def id(self) -> str:
        text = f"{self.impl}-{self.layer_set}-{self.layer.name}-b{self.layer.batch}"
        if self.params:
            text += "-" + ",".join(f"{k}={v}" for k, v in self.params)
        if self.precision != "float32":
            text += f"-{self.precision}"
        return text if self.target == "cpu" else f"{text}-{self.target}"


def params_of(values) -> Tuple[Tuple[str, int], ...]:
    return tuple(sorted((values or {}).items()))


def cases(names: Iterable[str], layers: Iterable[Tuple[str, Layer]], target: str = "cpu",
          params=None) -> List[Case]:
    """Every name on every ``(set, layer)``, layer-major (so that the float64 reference of
    a layer, which the session keeps, serves every implementation before the next one)."""
    layers = list(layers)
    return [Case(n, layer, s, target, params=params_of(params)) for s, layer in layers
            for n in names]


def case_params(fast: Sequence[Case], full: Sequence[Case] = ()):
    """``pytest.mark.parametrize`` arguments, with readable ids: the ``fast`` cases, and the
    ``full`` ones marked for the full tier only."""
    return ([pytest.param(c, id=c.id) for c in fast]
            + [pytest.param(c, id=c.id, marks=pytest.mark.full) for c in full if c not in fast])


# -- implementations -------------------------------------------------------------------------

def _by_pass(name):
    impl = registry.get(name)
    return impl.pass_ != Pass.FWD, str(impl.pass_), name


#: Every registered implementation, forward first, then by pass (a layer's reference is
#: made once per pass).
IMPLS = sorted(registry.all_implementations(), key=_by_pass)
GPU_IMPLS = sorted(n for n in IMPLS if "gpu" in registry.get(n).targets)


# -- layers ------------------------------------------------------------------------------------

ODD_SHAPES = [
    Layer("noncubic", 2, 3, 5, 5, 7, 9, 3, 3, 3),
    Layer("stride2", 1, 4, 6, 9, 8, 7, 3, 3, 3, stride=2),
    Layer("pad2_stride2", 2, 5, 3, 6, 7, 5, 3, 3, 3, stride=2, pad=2),
    Layer("channels_7_13", 1, 7, 13, 6, 6, 6, 3, 3, 3, pad=1),
    Layer("k1x1x1", 2, 6, 10, 4, 5, 6, 1, 1, 1),
    Layer("k1x1x1_pad", 1, 3, 4, 3, 3, 3, 1, 1, 1, pad=1),
    Layer("k5x5x5", 1, 3, 4, 7, 8, 9, 5, 5, 5, pad=2),
    Layer("k_mixed", 1, 2, 3, 6, 5, 9, 3, 1, 5, stride=2, pad=1),
    Layer("single_out", 1, 1, 1, 3, 3, 3, 3, 3, 3),
    # every dimension 1 but the input's extents: a one-element filter
    Layer("ones", 1, 1, 1, 4, 4, 4, 1, 1, 1),
    # a one-deep input and filter (a 2D layer written as 3D), two channels in, three out
    Layer("depth1", 1, 2, 3, 1, 5, 6, 1, 3, 3),
    # groups of one channel (depthwise), batch 2
    Layer("depthwise", 2, 3, 3, 4, 5, 3, 3, 3, 3, pad=1, groups=3),
    # a one-high, one-deep input (a 1D layer written as 3D) with a 1x1x3 filter
    Layer("line", 1, 2, 3, 1, 1, 7, 1, 1, 3),
    # K = 130 > every output-channel tile; GK = 27 * 3 = 81 is a tail for every K step
    Layer("k130_batch3", 3, 3, 130, 5, 6, 4, 3, 3, 3, pad=1),
    # the fast tier's odd layers: deep (channel blocks and their tails), batch 2,
    # strided with padding 2, and its stride-1 form (no padding) for kernels without strides
    Layer("deep_s2", 2, 37, 36, 6, 7, 5, 3, 3, 3, stride=2, pad=2),
    Layer("deep_noncubic", 2, 37, 36, 5, 7, 9, 3, 3, 3),
]
ODD = {layer.name: layer for layer in ODD_SHAPES}
#: Layers where dimensions are 1: channels, filter extents, input extents, batch, groups
#: of one channel (issue 62); every implementation verifies on them or refuses with its
#: reason (the full tier; the fast tier runs the general kernels on two of them).
DEGENERATE = [ODD[n] for n in ("ones", "depth1", "depthwise", "line")]

#: Padding that differs per dimension (2D layers written as 3D among them).
ANISO = [Layer("a2d", 2, 3, 4, 1, 7, 6, 1, 3, 3, pad=1, pad_d=0),
         Layer("a2d_s2", 2, 3, 4, 1, 7, 6, 1, 3, 3, stride=2, pad=1, pad_d=0),
         Layer("a3d", 1, 2, 3, 5, 6, 7, 3, 3, 3, stride=2, pad=1, pad_d=2, pad_w=0),
         Layer("alcf1", 1, 32, 32, 1, 7, 7, 1, 3, 3),
         Layer("alcf2_b1", 1, 128, 256, 1, 14, 14, 1, 3, 3, pad=1, pad_d=0)]
ANISO_IMPLS = sorted(n for n in IMPLS if "anisotropic padding" in registry.get(n).handles)

COSMOFLOW_SETS = ("cosmoflow_mlperf", "cosmoflow")


def cosmoflow(batches=(1, 2)) -> List[Tuple[str, Layer]]:
    """Every layer of both CosmoFlow sets at each batch size."""
    return [(s, layer.with_batch(b)) for s in COSMOFLOW_SETS for layer in load_layers(s)
            for b in batches]


def _first(layer_set, index=0):
    return layer_set, load_layers(layer_set)[index].with_batch(1)


#: CosmoFlow's first layer at 20^3 (its code paths; the full tier checks 128^3 and 130^3,
#: whose float64 checks took about 5 of the fast tier's minutes).
FIRST_SMALL = Layer("conv1_small", 1, 1, 16, 20, 20, 20, 3, 3, 3, pad=1)

#: The fast tier's layers (see the module's docstring).
FAST_LAYERS = [("small", FIRST_SMALL), ("odd", ODD["deep_s2"])]


#: The odd fast layer of a kernel for few input channels, which refuses the deep ones:
#: strided, padded, and K = 24 fills no whole vector.
FEW_ODD = Layer("few_odd", 2, 3, 24, 5, 7, 9, 3, 3, 3, stride=2, pad=1)


def fast_layers(name: str) -> List[Tuple[str, Layer]]:
    """:data:`FAST_LAYERS` for implementation ``name``: in place of the strided deep shape,
    the first of the stride-1 deep shape (batch 2, no padding) and :data:`FEW_ODD` that
    ``name`` takes, where it refuses the strided one."""
    impl = registry.get(name)

    def takes(layer):
        return impl.unsupported_reason(layer, impl.resolve_params()) is None
    odd = next((layer for layer in (ODD["deep_s2"], ODD["deep_noncubic"], FEW_ODD)
                if takes(layer)), ODD["deep_noncubic"])
    return [("odd", odd) if layer is ODD["deep_s2"] else (s, layer) for s, layer in FAST_LAYERS]


def fast_cases(names: Iterable[str]) -> List[Case]:
    """Every name on its :func:`fast_layers`, layer-major as :func:`cases`."""
    names = list(names)
    per = {n: fast_layers(n) for n in names}
    return [Case(n, per[n][i][1], per[n][i][0]) for i in range(len(FAST_LAYERS)) for n in names]


# -- running a case ----------------------------------------------------------------------------

def verify_case(case: Case, builds, reference, coverage, seed: int = 0) -> None:
    """Build (from the session cache), run and verify ``case`` against torch float64; record
    the outcome.  A layer the implementation refuses is recorded and skipped."""
    reason = case.refused()
    if reason:
        coverage.record(case, "refused", reason)
        pytest.skip(f"{case.impl} does not support {case.layer.name}: {reason}")
    reason = case.deferred()
    if reason:
        coverage.record(case, "deferred", reason)
        pytest.skip(f"{case.impl} on {case.layer.name} deferred: {reason}")
    t0 = time.perf_counter()
    try:
        build = builds(case.spec())
        check = verify.verify_build(build, reference(case.layer, seed=seed, pass_=case.pass_,
                                                     dtype=case.precision))[0]
    except Exception as err:
        coverage.record(case, "failed", f"{type(err).__name__}: {err}", time.perf_counter() - t0)
        raise
    coverage.record(case, "verified" if check.ok else "failed", check.summary(),
                    time.perf_counter() - t0)
    assert check.ok, f"{case.impl} on {case.layer.name} ({case.layer.describe()}): {check.summary()}"
