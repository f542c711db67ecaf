"""``torch.compile`` as a contestant of the end-to-end run (``--torch-compile``).

The compiled model is the same network as torch's eager one, written with torch's own
modules (``nn.Conv3d``, ``F.max_pool3d``: no autograd function of this project and no
timing spans inside, which would break the graph), holding a copy of the same weights, in
the DaCe model's memory format and precision.  Each timing process compiles it anew: its
first forward pass and its first training step are timed apart (``compile``, per phase:
what the first call took, compilation and one call; TorchInductor's on-disk cache may
serve a later process), then it runs the warm-up and timed iterations as the other
models do.  Its step is one span (``total``): its parts are not split.
"""

from __future__ import annotations

import copy
import time
from typing import Dict, Sequence

#: The contestant's name in the result files.
COMPILED = "torch-compile"
#: ``torch.compile``'s backend (tests use ``eager``, which compiles nothing).
BACKEND = "inductor"


def plain_model(model, memory_format):
    """The network of a CosmoFlow ``model`` (:func:`convbench.network.cosmoflow.build_model`)
    in plain torch modules, with a copy of its weights, on its device in its dtype, in
    ``memory_format``."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class PlainCosmoFlow(nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = nn.ModuleList()
            for conv in model.convs:
                L = conv.layer
                c = nn.Conv3d(L.in_channels, L.out_channels, (L.k_d, L.k_h, L.k_w),
                              stride=L.strides, padding=L.pads)
                c.weight = nn.Parameter(conv.weight.detach().clone())
                c.bias = nn.Parameter(conv.bias.detach().clone())
                self.convs.append(c)
            self.act, self.head = copy.deepcopy(model.act), copy.deepcopy(model.head)
            self.pools = model.spec.pools

        def forward(self, x):
            for i, conv in enumerate(self.convs):
                x = self.act(conv(x))
                if i < self.pools:
                    x = F.max_pool3d(x, 2)
            return torch.tanh(self.head(x)) * 1.2

        def set_recorder(self, recorder):  # no spans inside a compiled graph
            pass

    weight = model.convs[0].weight
    return PlainCosmoFlow().to(weight.device, weight.dtype, memory_format=memory_format)


def compile_model(plain):
    import torch
    return torch.compile(plain, backend=BACKEND)


def first_calls(model, opt, x, target, phases: Sequence[str], train_step,
                synchronize) -> Dict[str, float]:
    """Milliseconds of the compiled ``model``'s first forward pass (inference) and, with
    ``train`` in ``phases``, of its first training step: compilation and one call each."""
    import torch
    out = {}
    for phase in phases:
        t0 = time.perf_counter()
        if phase == "forward":
            model.eval()
            with torch.no_grad():
                model(x)
        else:
            model.train()
            train_step(model, opt, x, target)
        synchronize()
        out[phase] = (time.perf_counter() - t0) * 1e3
    return out
