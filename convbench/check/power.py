"""The power of the verification (:mod:`convbench.check.verify`): how far inside its tolerance a
correct float32 result lies, and how far outside it results with planted errors lie.

For one layer and pass, on the harness's random inputs, :func:`measure` compares with the
float64 ground truth:

* ``torch-fp32``: torch's own float32 result (correct; must pass);
* ``lost-1%``: float32 computed with a random 1% of the first input's elements zeroed,
  so every output element misses about 1% of its terms;
* ``lost-plane``: the first input's first depth plane zeroed (a dropped loop iteration);
* ``off-1%``: the correct result times 1.01.

Each is scored under both tolerances of :mod:`convbench.check.verify`: ``l2`` (random inputs,
the verdict's) and ``sum|t|`` (any inputs), as the worst err/tol over the elements, and,
where a Winograd kernel computes the layer's pass, under that kernel's own error bound
on random inputs (:data:`WINOGRAD_BOUNDS`, the ``bound`` rule its checks use): a result
of any algorithm that is 1% off or misses 1% of its terms must fail that too.
``scripts/check_power.py`` writes the table; the tests assert its verdicts.
"""

from __future__ import annotations

from typing import Dict, List

from convbench.layersets.layer import Layer
from convkernels.layouts import PASS_SIGNATURE, Pass
from convbench.check.references import torch_pass
from convbench.check.verify import GroundTruth, compare, make_truth

#: The results :func:`measure` scores, and whether each must pass.
RESULTS = {"torch-fp32": True, "lost-1%": False, "lost-plane": False, "off-1%": False}
UNIT_ROUNDOFF = 2.0 ** -24
#: Per pass, the Winograd kernels whose error bounds :func:`measure` scores (the data
#: gradient's two forms have different bounds).
WINOGRAD_BOUNDS = {"fwd": ("winogradF2",),
                   "bwd_data": ("winogradF2BwdData", "winogradF2BwdDataAdjoint"),
                   "bwd_filter": ("winogradF2BwdFilter",)}


def winograd_bounds(truth: GroundTruth) -> Dict[str, object]:
    """The error bounds (float64, shaped like the output) of the Winograd kernels of
    :data:`WINOGRAD_BOUNDS` that compute the truth's layer, on its random inputs."""
    from convbench.registry import get
    from convbench.check.verify import TOL_FACTOR
    bounds = {}
    for name in WINOGRAD_BOUNDS[str(Pass(truth.pass_))]:
        impl = get(name)
        if impl.unsupported_reason(truth.layer, impl.resolve_params({})) is None:
            bounds[name] = impl.error_bound(truth.layer, truth.inputs, TOL_FACTOR,
                                            random_inputs=truth.random_inputs)
    return bounds


def results(truth: GroundTruth, fraction: float = 0.01, seed: int = 1) -> Dict[str, object]:
    """The outputs of :data:`RESULTS` (logical layout, float32, on the CPU)."""
    import torch
    inputs = {k: v.float() for k, v in truth.inputs.items()}
    correct = torch_pass(truth.layer, truth.pass_, inputs)
    first = PASS_SIGNATURE[Pass(truth.pass_)][0][0]
    gen = torch.Generator().manual_seed(seed)
    keep = (torch.rand(inputs[first].shape, generator=gen) >= fraction).float()
    plane = inputs[first].clone()
    plane[:, :, 0] = 0  # depth plane 0 (of x or y: dims N, C, D, H, W; of w: K, C, T, R, S)
    return {"torch-fp32": correct,
            "lost-1%": torch_pass(truth.layer, truth.pass_, dict(inputs, **{first: inputs[first] * keep})),
            "lost-plane": torch_pass(truth.layer, truth.pass_, dict(inputs, **{first: plane})),
            "off-1%": correct * 1.01}


def measure(layer: Layer, pass_: Pass, seed: int = 0, device: str = "cpu",
            winograd: bool = True) -> List[dict]:
    """One row per result of :data:`RESULTS`: its worst err/tol under each tolerance, and
    (``winograd``) under each Winograd bound that applies (``bound_<kernel>`` and
    ``bound_<kernel>_ok``)."""
    from convbench.check.verify import compare_to_bound
    truth = make_truth(layer, pass_, seed, device=device)
    bounds = winograd_bounds(truth) if winograd else {}
    rows = []
    for name, out in results(truth).items():
        new = compare(out, truth, UNIT_ROUNDOFF, rule="l2")
        old = compare(out, truth, UNIT_ROUNDOFF, rule="sum-abs")
        row = {"layer": layer.name, "batch": layer.batch, "pass": str(Pass(pass_)),
               "reduction_len": truth.reduction_len, "result": name,
               "must_pass": RESULTS[name], "l2_err_over_tol": new.worst_ratio,
               "l2_ok": new.ok, "sumabs_err_over_tol": old.worst_ratio, "sumabs_ok": old.ok}
        for kernel, bound in bounds.items():
            check = compare_to_bound(out, truth, bound)
            row.update({f"bound_{kernel}": check.worst_ratio, f"bound_{kernel}_ok": check.ok})
        rows.append(row)
    truth.drop()
    return rows
