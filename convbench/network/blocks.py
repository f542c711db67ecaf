"""Fused CosmoFlow blocks in the network: a DaCe convolution followed by the fused epilogue
(bias, LeakyReLU, 2x2x2 max-pool: :mod:`convkernels.blocks.epilogue`) as one autograd
function, so that the activation is never a torch tensor.

The epilogue's two programs are builds like the convolutions' (cached, loaded without
compiling), of two implementations that are not in the registry (they are not
convolutions): :data:`FORWARD` and :data:`BACKWARD`, per convolution layer, with ``POOL``
2 (the block pools) or 1, and ``KB`` (channels per map point: all on the CPU, one on the
GPU).  A block fuses where the DaCe forward stores NDHWC, in float32, on either device
(:func:`fusable`; the run fuses by default on the CPU only, ``--fuse`` on the GPU);
elsewhere the network runs today's path.

With ``--check`` each epilogue call is checked like a convolution call (against float64
torch on the inputs it got: ``block.fwd``, ``block.bwd``), and the pooling decisions it
made are recorded where the model's pool would record them, so that the float64 reference
replays them.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, List, Optional

from convbench.registry import Implementation, Layout, Param, Pass
from convkernels.blocks import epilogue
from convkernels.layouts import from_layout, to_layout


def _pool(value: int) -> Optional[str]:
    return None if value in epilogue.POOLS else "1 (no pool) or 2 (a 2x2x2 max-pool)"


_POOL = Param("POOL", 2, "the pool window's edge after the convolution (1: no pool)",
              check=_pool)
_KB = Param("KB", 0, "channels per map point (0: all, the CPU's; 1: the GPU's)", minimum=0)
_SCHEDULES = {"cpu": epilogue.cpu_schedule, "gpu": epilogue.gpu_schedule}
FORWARD = Implementation(
    name="blockEpilogue", layout=Layout.NDHWC, pass_=Pass.FWD,
    summary="a block's bias, LeakyReLU and 2x2x2 max-pool fused after its convolution",
    algorithm=epilogue.forward, schedules=_SCHEDULES, params=(_POOL, _KB))
BACKWARD = Implementation(
    name="blockEpilogueBwd", layout=Layout.NDHWC, pass_=Pass.BWD_DATA,
    summary="the gradients of a block's pool, LeakyReLU and bias, fused",
    algorithm=epilogue.backward, schedules=_SCHEDULES, params=(_POOL, _KB))


def epilogue_params(pool: bool, device: str) -> dict:
    """The epilogue's parameters on ``device``: its pool, and a map point per channel on
    the GPU."""
    return {"POOL": 2 if pool else 1, "KB": 1 if device == "gpu" else 0}


#: Tags the epilogue's builds as deliberately altered (tests that plant a bug in the code
#: :mod:`convkernels.blocks.epilogue` generates; :attr:`BuildSpec.planted`): never set in a
#: real run.
PLANTED = ""


def fusable(forward_impl, device: str, dtype_label: str) -> Optional[str]:
    """None where a block with this DaCe forward fuses (on either device), else why not."""
    if dtype_label != "float32":
        return "the fused epilogue is float32 only"
    if forward_impl.layout != Layout.NDHWC:
        return f"{forward_impl.name} stores NCDHW (the epilogue reads NDHWC)"
    return None


class Epilogue:
    """One block's fused epilogue: the forward and backward builds for ``layer`` (the
    block's convolution) and whether it pools."""

    def __init__(self, layer, pool: bool, exp):
        from convbench.build import cache, toolchain
        self.layer, self.pool = layer, pool
        self.fwd, self.bwd = (
            cache.build(toolchain.make_spec(impl, layer, exp.dtype, exp.device,
                                            epilogue_params(pool, exp.device),
                                            planted=PLANTED),
                        exp.cachedir, policy=exp.policy)
            for impl in (FORWARD, BACKWARD))

    def forward(self, y, b, recorder=None):
        """``(p, idx)``: the block's output (logical NCDHW, stored NDHWC) and the window
        positions of its maxima (stored NDHWC, one byte each; None without a pool)."""
        import torch
        ys = to_layout(y.detach(), Layout.NDHWC, "y")
        N, D, H, W, K = ys.shape
        P = 2 if self.pool else 1
        p = torch.empty((N, D // P, H // P, W // P, K), dtype=ys.dtype, device=ys.device)
        arrays = {"y": ys, "b": b.detach().contiguous(), "p": p}
        idx = None
        if self.pool:
            idx = arrays["idx"] = torch.empty(p.shape, dtype=torch.uint8, device=ys.device)
        self.fwd(**arrays)
        out = from_layout(p, Layout.NDHWC, "y")
        if recorder is not None and recorder.check:
            recorder.checks.append(_check_forward(self.layer, y, b, out, idx))
        return out, idx

    def backward(self, g, p, idx, recorder=None):
        """``(gy, db)``: the gradients of the convolution's output (logical) and of the
        bias, from the block output's gradient ``g``."""
        import torch
        gs = to_layout(g.detach(), Layout.NDHWC, "y")
        ps = to_layout(p.detach(), Layout.NDHWC, "y")
        L = self.layer
        gy = torch.empty((L.batch, L.out_d, L.out_h, L.out_w, L.out_channels), dtype=gs.dtype,
                         device=gs.device)
        db = torch.empty(L.out_channels, dtype=gs.dtype, device=gs.device)
        arrays = {"g": gs, "p": ps, "gy": gy, "db": db}
        if idx is not None:
            arrays["idx"] = idx
        self.bwd(**arrays)
        gy = from_layout(gy, Layout.NDHWC, "y")
        if recorder is not None and recorder.check:
            recorder.checks.append(_check_backward(self.layer, g, p, idx, gy, db))
        return gy, db


def torch_indices(idx, H: int, W: int):
    """torch's ``max_pool3d`` indices (logical NCDHW, int64: the flat position in the
    unpooled plane) of the epilogue's window positions ``idx`` (stored NDHWC)."""
    import torch
    i = from_layout(idx, Layout.NDHWC, "y").long()
    _, _, PD, PH, PW = i.shape
    d = 2 * torch.arange(PD, device=i.device).view(PD, 1, 1) + (i >> 2)
    h = 2 * torch.arange(PH, device=i.device).view(1, PH, 1) + ((i >> 1) & 1)
    w = 2 * torch.arange(PW, device=i.device).view(1, 1, PW) + (i & 1)
    return ((d * H + h) * W + w).contiguous()


def _reference_forward(y64, b64, pool: bool):
    import torch.nn.functional as F
    a = F.leaky_relu(y64 + b64.view(1, -1, 1, 1, 1), epilogue.SLOPE)
    return F.max_pool3d(a, 2) if pool else a


def _row(layer, pass_: str, ok: bool, ratio: float, max_abs: float, nonfinite: int, rule: str):
    return {"layer": layer.name, "pass": pass_, "implementation":
            FORWARD.name if pass_ == "block.fwd" else BACKWARD.name, "ok": ok,
            "worst_ratio": ratio, "max_abs": max_abs, "rule": rule, "nonfinite": nonfinite}


def _bounded(value, reference, tol) -> tuple:
    """(ok, worst error/tol, max |error|, non-finite count) of ``value`` against ``tol``."""
    import torch
    v = value.detach().double()
    err = (v - reference).abs()
    nonfinite = int((~torch.isfinite(v)).sum())
    ratio = float((err / tol).max()) if err.numel() else 0.0
    if nonfinite:
        ratio = float("inf")
    return ratio <= 1.0, ratio, float(err.max()) if err.numel() else 0.0, nonfinite


#: float32 roundoffs a value of the epilogue may be off: the sum with the bias and the
#: product with the slope round once each, and the slope is float32's 0.3 (0.67 of one)
ROUNDOFFS = 3


def _check_forward(layer, y, b, out, idx):
    """The block's output against float64 torch (bias, LeakyReLU, pool on the same ``y``):
    :data:`ROUNDOFFS` units of float32 roundoff of each value, and each recorded position
    a maximum of its window."""
    import torch
    y64, b64 = y.detach().double(), b.detach().double()
    ref = _reference_forward(y64, b64, idx is not None)
    u = 2.0 ** -24
    ok, ratio, worst, nonfinite = _bounded(out, ref, ROUNDOFFS * u * ref.abs() + 1e-30)
    rule = f"{ROUNDOFFS}u|ref|"
    if idx is not None:
        N, K, D, H, W = y.shape
        flat = torch_indices(idx, H, W)
        picked = y64.flatten(2).gather(2, flat.flatten(2)).view(flat.shape)
        if not bool((picked == torch.nn.functional.max_pool3d(y64, 2)).all()):
            ok, ratio, rule = False, float("inf"), rule + "; a recorded position is no maximum"
    return _row(layer, "block.fwd", ok, ratio, worst, nonfinite, rule)


def _check_backward(layer, g, p, idx, gy, db):
    """The gradients against float64 torch: the convolution's output gradient within
    :data:`ROUNDOFFS` units of roundoff (a product with float32's slope), the bias
    gradient within the sum's bound (``ROUNDOFFS sqrt(n) u`` times the sum of
    magnitudes, n the values summed)."""
    import torch
    g64 = g.detach().double()
    scaled = torch.where(p.detach() > 0, g64, g64 * epilogue.SLOPE)
    if idx is not None:
        N, K, D, H, W = gy.shape
        flat = torch_indices(idx, H, W)
        ref = torch.zeros((N, K, D * H * W), dtype=torch.float64, device=g64.device)
        ref.scatter_(2, flat.flatten(2), scaled.flatten(2))
        ref = ref.view(N, K, D, H, W)
    else:
        ref = scaled
    u = 2.0 ** -24
    ok1, r1, w1, n1 = _bounded(gy, ref, ROUNDOFFS * u * ref.abs() + 1e-30)
    n = scaled.numel() // scaled.shape[1]
    db_ref = scaled.sum((0, 2, 3, 4))
    tol = ROUNDOFFS * n ** 0.5 * u * scaled.abs().sum((0, 2, 3, 4)) + 1e-30
    ok2, r2, w2, n2 = _bounded(db, db_ref, tol)
    return _row(layer, "block.bwd", ok1 and ok2, max(r1, r2), max(w1, w2), n1 + n2,
                f"gy: {ROUNDOFFS}u|ref|; db: {ROUNDOFFS} sqrt(n) u sum|g|")


def conv_span(conv, direction: str):
    """The recorder's span of ``conv``'s pass ``direction`` (``fwd``, ``bwd``), or none
    where nothing records (the convolution's own autograd function times itself so too)."""
    rec = conv.recorder
    return rec.span(f"{conv.layer.name}.{direction}") if rec else contextlib.nullcontext()


@functools.lru_cache(maxsize=None)
def block_function():
    """The fused block as a ``torch.autograd.Function``:
    ``apply(x, w, b, conv, epilogue, pool_module) -> block output``."""
    import torch

    class BlockFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b, conv, ep, pool_module):
            rec = conv.recorder
            with conv_span(conv, "fwd"):
                y = conv.backend.forward(x, w, rec)
            out, idx = ep.forward(y, b, rec)
            if idx is not None and pool_module is not None:
                if pool_module.replay is not None:
                    raise RuntimeError("a fused block cannot replay pooling decisions")
                if pool_module.recorded is not None:
                    pool_module.recorded.append(torch_indices(idx, y.shape[3], y.shape[4]))
            ctx.conv, ctx.ep, ctx.idx = conv, ep, idx
            ctx.save_for_backward(x, w, out)
            return out

        @staticmethod
        def backward(ctx, g):
            x, w, out = ctx.saved_tensors
            conv = ctx.conv
            rec = conv.recorder
            gy, db = ctx.ep.backward(g, out, ctx.idx, rec)
            need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            with conv_span(conv, "bwd"):
                gx, gw = conv.backend.backward(x, w, gy, need_x, need_w, rec)
            return gx, gw, db, None, None, None

    return BlockFunction


def attach_epilogues(model, device: str, cachedir=None, policy: str = "reuse",
                     dtype="float32", log=print) -> List[str]:
    """Give each block of ``model`` whose convolution is DaCe's and fusable its
    :class:`Epilogue` (``conv.epilogue``); returns the fused blocks' layer names
    (``dtype``: a name or a :class:`~convbench.build.precision.DType`)."""
    import time

    from convbench.experiment.pipeline import Experiment
    exp = Experiment([], [], device, policy=policy, cachedir=cachedir, verify=False,
                     dtype=dtype)
    label = getattr(dtype, "label", dtype)
    fused = []
    for i, conv in enumerate(model.convs):
        conv.epilogue = None
        builds = getattr(conv.backend, "builds", None)  # a DaCe backend (cosmoflow.DaceConv)
        if not builds or builds.get(Pass.FWD) is None:
            continue
        if fusable(builds[Pass.FWD].spec.impl, device, label) is not None:
            continue
        t0 = time.perf_counter()
        conv.epilogue = Epilogue(conv.layer, i < model.spec.pools, exp)
        fused.append(conv.layer.name)
        log(f"  {conv.layer.name} block      {FORWARD.name:28s} {conv.epilogue.fwd.origin} "
            f"{time.perf_counter() - t0:6.1f}s")
    return fused


def block_forward(model, conv, x: Any, pool: bool):
    """The block of ``conv`` on ``x``: fused where it has an epilogue, else torch's
    bias (in the convolution module), LeakyReLU and pool."""
    if conv.epilogue is not None:
        return block_function().apply(x, conv.weight, conv.bias, conv, conv.epilogue,
                                      model.pool if pool else None)
    x = model.act(conv(x))
    return model.pool(x) if pool else x
