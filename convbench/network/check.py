"""Checking a whole network with DaCe convolutions against torch (``--check``).

Two levels, both must pass (docs/end2end.md): every DaCe convolution call
against float64 torch on the inputs it got, with the harness's tolerance
(:func:`convbench.check.verify.compare`); and the output, loss and parameter gradients of the
network against float64.  An element-wise bound does not exist through pooling and
activations, so the second bound is relative, with torch's own float32 network as the
yardstick: the DaCe model's ``max |error| / max |reference|`` may be at most
``TOL_FACTOR`` times torch-float32's, or ``TOL_FACTOR * sqrt(L) * u`` where that is
larger (``L``: the network's longest reduction, ``u``: float32's unit roundoff).  In 16
bits both models hold the 16-bit type, torch's 16-bit network is the yardstick, and
the floor adds the storage's unit roundoff (each stored activation is rounded once).
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any, Dict

from convbench.check.verify import TOL_FACTOR, reduction_length

UNIT_ROUNDOFF = 2.0 ** -24


def network_step(model, x, target, replay=None) -> Dict[str, Any]:
    """One training step's output, loss and parameter gradients (dropout off, weights
    unchanged: no optimizer step), with the pooling choices it made (``pool``), or
    with ``replay``'s choices forced on it."""
    import torch
    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.eval()
    for p in model.parameters():
        p.grad = None
    model.pool.recorded, model.pool.replay = [], (list(replay) if replay is not None else None)
    try:
        out = model(x)
    finally:
        pool, model.pool.recorded, model.pool.replay = model.pool.recorded, None, None
    loss = torch.nn.functional.mse_loss(out, target)
    loss.backward()
    result = {"output": out.detach(), "loss": loss.detach()}
    for name, p in model.named_parameters():  # convs.2.weight -> conv3.weight
        name = re.sub(r"^convs\.(\d+)\.(\w+)$", lambda m: f"conv{int(m[1]) + 1}.{m[2]}", name)
        result[f"grad {name}"] = p.grad.detach() if p.grad is not None else None
    return result, pool


def relative_error(value, reference) -> float:
    """max |value - reference| / max |reference| (in float64 on the CPU); inf if ``value``
    has a non-finite element or is missing."""
    import torch
    if value is None:
        return math.inf
    v = value.detach().to("cpu", torch.float64)
    r = reference.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(v).all()):
        return math.inf
    scale = float(r.abs().max()) if r.numel() else 0.0
    err = float((v - r).abs().max()) if r.numel() else 0.0
    return err / scale if scale > 0 else err


def compare_steps(ref_dace, ref_torch32, torch32, dace, floor: float):
    """Per tensor: the relative errors of both float32 models (each against the float64
    reference that took its pooling decisions) and the DaCe model's bound."""
    rows = []
    for name, r in ref_dace.items():
        e_t = relative_error(torch32[name], ref_torch32[name])
        e_d = relative_error(dace.get(name), r)
        bound = TOL_FACTOR * max(e_t if math.isfinite(e_t) else 0.0, floor)
        rows.append({"name": name, "rel_dace": e_d, "rel_torch32": e_t, "bound": bound,
                     "ok": e_d <= bound, "ratio": e_d / bound})
    return rows


def check_networks(torch_model, dace_model, x, target, device: str = "cpu",
                   dtype=None) -> Dict[str, Any]:
    """Both levels for one training step on ``x``/``target``; ``torch_model`` has torch
    convolutions and the same weights as ``dace_model`` (neither model's weights change).
    ``worst``: the largest error/bound over tensors and err/tol over calls."""
    import torch

    from convbench.network.cosmoflow import PASSES, Recorder
    m64 = copy.deepcopy(torch_model).to("cpu", torch.float64)
    x64, target64 = x.to("cpu", torch.float64), target.to("cpu", torch.float64)
    t32, pool_t = network_step(torch_model, x, target)
    recorder = Recorder(device, check=True)
    dace_model.set_recorder(recorder)
    try:
        d, pool_d = network_step(dace_model, x, target)
    finally:
        dace_model.set_recorder(None)
    recorder.collect()
    # Float64 references that take each float32 model's own pooling decisions.
    ref_d, _ = network_step(m64, x64, target64, replay=pool_d)
    flips = sum(int((a.cpu() != b.cpu()).sum()) for a, b in zip(pool_t, pool_d))
    ref_t = ref_d if flips == 0 else network_step(m64, x64, target64, replay=pool_t)[0]
    longest = max(reduction_length(layer, p) for layer in dace_model.layers for p in PASSES)
    # the stored activations' rounding, and TF32's rounding of each product's operands
    storage = dtype.rounding.output + 2 * dtype.rounding.operands if dtype is not None else 0.0
    rows = compare_steps(ref_d, ref_t, t32, d, math.sqrt(longest) * UNIT_ROUNDOFF + storage)
    calls = recorder.checks
    worst = max([r["ratio"] for r in rows] + [c["worst_ratio"] for c in calls])
    ok = all(r["ok"] for r in rows) and all(c["ok"] for c in calls)
    return {"ok": ok, "worst": worst, "calls": calls, "tensors": rows, "pool_flips": flips,
            "longest_reduction": longest, "tol_factor": TOL_FACTOR}
