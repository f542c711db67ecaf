"""CosmoFlow networks whose convolutions are torch's or DaCe implementations.

The two models of :data:`MODELS` are described in docs/end2end.md.  At S = 128
``v1``'s convolutions are exactly the layers of ``convparams/cosmoflow.csv`` (which lists
the zero-padded inputs, 130^3 ... 4^3, with pad 0).

Every convolution of a model is a module holding torch's parameters and a *backend*,
:class:`TorchConv` or :class:`DaceConv`, both run inside one ``torch.autograd.Function``
so that the torch and DaCe models have the same structure and are timed the same way.
The bias is added outside, by torch, in both.  Tensors cross into the DaCe programs in
their stored layout (:mod:`convkernels.layouts`): with NDHWC programs and a model in
``channels_last_3d``, the crossing copies nothing.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import io
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from convbench import registry
from convbench.timing import devices
from convbench.timing.devices import synchronize
from convbench.base.errors import UsageError
# Which implementation runs where the user named none (re-exported: the network's callers
# and tests name them here).
from convbench.experiment.choice import (GENERAL, default_choice,  # noqa: F401
                                         default_implementation)
from convbench.layersets.layer import Layer
from convkernels.blocks.epilogue import SLOPE as LEAKY_SLOPE  # the fused blocks' slope too
from convkernels.layouts import PASS_SIGNATURE, Pass, from_layout, stored_shape, to_layout

#: Name of the torch backend in ``--impl`` and implementation maps.
TORCH = "torch"
PASSES = (Pass.FWD, Pass.BWD_DATA, Pass.BWD_FILTER)
KERNEL = 3


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    in_channels: int
    filters: Tuple[int, ...]
    #: Number of MaxPool3d(2) layers, one after each of the first ``pools`` convolutions.
    pools: int
    dense: Tuple[int, ...] = (128, 64)
    outputs: int = 4
    dropout: float = 0.5
    description: str = ""


MODELS: Dict[str, ModelSpec] = {
    "mlperf": ModelSpec("mlperf", 4, (32, 64, 128, 256, 512), pools=5,
                        description="MLPerf HPC CosmoFlow (5 conv blocks, 4 input channels)"),
    "v1": ModelSpec("v1", 1, (16, 32, 64, 128, 256, 256, 256), pools=6,
                    description="original work's CosmoFlow (7 convolutions, 1 input channel)"),
}


def conv_layers(spec: ModelSpec, size: int, batch: int) -> List[Layer]:
    """The convolutions of ``spec`` at input size ``size``^3 and ``batch``, named conv1..."""
    multiple = 2 ** spec.pools
    if size < multiple or size % multiple:
        raise UsageError(f"--size: the {spec.name} model pools {spec.pools} times: the size "
                         f"must be a positive multiple of {multiple}, got {size}")
    channels = (spec.in_channels,) + spec.filters
    edges = [size >> min(i, spec.pools) for i in range(len(spec.filters))]
    return [Layer(f"conv{i + 1}", batch, channels[i], channels[i + 1], e, e, e,
                  KERNEL, KERNEL, KERNEL, stride=1, pad=1) for i, e in enumerate(edges)]


class Recorder:
    """Times convolution calls (spans named ``conv3.fwd``, ``conv3.bwd``: CUDA-event pairs
    on the GPU, not synchronised until :meth:`collect`) and optionally checks DaCe calls
    against float64 torch (``checks``)."""

    def __init__(self, device: str = "cpu", check: bool = False):
        self.device = device
        self.check = check
        self._open: List[Tuple[str, Any, Any]] = []
        self.checks: List[Dict[str, Any]] = []

    def _stamp(self):
        if self.device == "gpu":
            import torch
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    @contextlib.contextmanager
    def span(self, name: str):
        start = self._stamp()
        try:
            yield
        finally:
            self._open.append((name, start, self._stamp()))

    def collect(self) -> Dict[str, float]:
        """Milliseconds per span name since the last collect (summed over repeats)."""
        synchronize(self.device)
        out: Dict[str, float] = {}
        for name, start, end in self._open:
            ms = start.elapsed_time(end) if self.device == "gpu" else (end - start) * 1e3
            out[name] = out.get(name, 0.0) + ms
        self._open = []
        return out


class TorchConv:
    """torch's convolution (oneDNN on the CPU, cuDNN on the GPU) for one layer."""

    def __init__(self, layer: Layer):
        self.layer = layer

    def describe(self) -> Dict[str, str]:
        return {str(p): TORCH for p in PASSES}

    def forward(self, x, w, recorder=None):
        import torch.nn.functional as F
        L = self.layer
        return F.conv3d(x, w, None, L.strides, L.pads, L.dilations, L.groups)

    def backward(self, x, w, gy, need_x: bool, need_w: bool, recorder=None):
        import torch
        gx, gw, _ = torch.ops.aten.convolution_backward(
            gy, x, w, None, list(self.layer.strides), list(self.layer.pads),
            list(self.layer.dilations), False, [0, 0, 0], self.layer.groups,
            [need_x, need_w, False])
        return gx, gw


class DaceConv:
    """One layer's DaCe builds (:class:`convbench.build.toolchain.Build`) per pass; None for a
    pass that is never run, such as backward data of the first layer."""

    def __init__(self, layer: Layer, builds: Mapping[Pass, Any], device: str = "cpu"):
        self.layer = layer
        self.builds = {Pass(p): b for p, b in builds.items()}
        self.device = device

    def describe(self) -> Dict[str, str]:
        return {str(p): (b.spec.impl.name if b is not None else "-")
                for p, b in self.builds.items()}

    def _run(self, pass_: Pass, inputs: Dict[str, Any], recorder: Optional[Recorder]):
        """Run the build of ``pass_`` on logical tensors; its output in logical layout."""
        import torch
        build = self.builds.get(pass_)
        if build is None:
            raise RuntimeError(f"{self.layer.name}: no DaCe build for {pass_}")
        impl, layer = build.spec.impl, build.spec.layer
        roles, out_role = PASS_SIGNATURE[pass_]
        logical = {"y": layer.output_shape, "x": layer.input_shape, "w": layer.filter_shape}
        for role in roles:
            if tuple(inputs[role].shape) != tuple(logical[role]):
                raise ValueError(f"{self.layer.name} {pass_}: {role} has shape "
                                 f"{tuple(inputs[role].shape)}, the build expects "
                                 f"{logical[role]} (builds are per batch size)")
        args = {r: to_layout(inputs[r].detach(), impl.layout, r) for r in roles}
        out = torch.empty(stored_shape(impl.layout, out_role, logical[out_role]),
                          dtype=args[roles[0]].dtype, device=args[roles[0]].device)
        build(**args, **{out_role: out})
        result = from_layout(out, impl.layout, out_role)
        if recorder is not None and recorder.check:
            from convbench.check.verify import check_result, truth_for
            reference = truth_for(self.layer, pass_, {r: inputs[r].float() for r in roles})
            check = check_result(result, reference, build.spec)
            recorder.checks.append({
                "layer": self.layer.name, "pass": str(pass_), "implementation": impl.name,
                "ok": check.ok, "worst_ratio": check.worst_ratio, "max_abs": check.max_abs,
                "rule": check.rule,
                "nonfinite": check.nonfinite})
        return result

    def forward(self, x, w, recorder=None):
        return self._run(Pass.FWD, {"x": x, "w": w}, recorder)

    def backward(self, x, w, gy, need_x: bool, need_w: bool, recorder=None):
        gx = self._run(Pass.BWD_DATA, {"y": gy, "w": w}, recorder) if need_x else None
        gw = self._run(Pass.BWD_FILTER, {"x": x, "y": gy}, recorder) if need_w else None
        return gx, gw


@functools.lru_cache(maxsize=None)
def _conv_module_class():
    import torch

    from convbench.network.blocks import conv_span as span

    class ConvFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, conv):
            kind = x.device.type
            # mixed precision: the convolution in the 16-bit type (its cast in its span)
            amp = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None
            ctx.conv = conv
            with torch.autocast(kind, enabled=False), span(conv, "fwd"):
                if amp is not None:
                    x, w = x.to(amp), w.to(amp)
                ctx.save_for_backward(x, w)
                return conv.backend.forward(x, w, conv.recorder)

        @staticmethod
        def backward(ctx, gy):
            x, w = ctx.saved_tensors
            gy = gy.to(x.dtype)  # (a no-op but under autocast; the engine casts gx and gw back)
            conv = ctx.conv
            need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            with span(conv, "bwd"):
                gx, gw = conv.backend.backward(x, w, gy, need_x, need_w, conv.recorder)
            return gx, gw, None

    class ConvModule(torch.nn.Module):
        """A 3D convolution with torch's parameters and a pluggable backend."""

        def __init__(self, layer: Layer):
            super().__init__()
            ref = torch.nn.Conv3d(layer.in_channels, layer.out_channels, KERNEL,
                                  stride=layer.stride, padding=layer.pad)
            self.weight, self.bias = ref.weight, ref.bias
            self.layer = layer
            self.backend: Any = TorchConv(layer)
            self.recorder: Optional[Recorder] = None
            #: the fused bias, activation and pool after it (convbench.network.blocks)
            self.epilogue: Any = None

        def forward(self, x):
            y = ConvFunction.apply(x, self.weight, self)
            # in y's type: under autocast the bias joins the 16-bit output, as torch's
            # own convolution adds it (otherwise a no-op)
            return y + self.bias.to(y.dtype).view(1, -1, 1, 1, 1)

        def extra_repr(self):
            return f"{self.layer.describe()}, backend={self.backend.describe()}"

    return ConvModule


@functools.lru_cache(maxsize=None)
def _pool_module_class():
    import torch
    import torch.nn.functional as F

    class Pool(torch.nn.Module):
        """MaxPool3d(2) that can record its choices (the argmax of every window) and
        replay recorded ones.  Replaying makes a float64 reference take the same
        discrete decisions as the float32 model under test, so that the two differ by
        rounding alone (a near-tie decided the other way would move a gradient)."""

        def __init__(self):
            super().__init__()
            self.recorded: Optional[List[Any]] = None
            self.replay: Optional[List[Any]] = None

        def forward(self, x):
            if self.replay is not None:
                idx = self.replay.pop(0).to(x.device)
                flat = x.flatten(2).gather(2, idx.flatten(2))
                return flat.view(idx.shape)
            if self.recorded is not None:
                y, idx = F.max_pool3d(x, 2, return_indices=True)
                self.recorded.append(idx.detach())
                return y
            return F.max_pool3d(x, 2)

    return Pool


def build_model(spec: ModelSpec, size: int, batch: int, dropout: Optional[float] = None):
    """A CosmoFlow torch module with torch convolutions (:func:`attach_backends` swaps
    them); ``batch`` fixes the geometry of the DaCe builds."""
    import torch
    from torch import nn

    from convbench.network.blocks import block_forward
    layers = conv_layers(spec, size, batch)
    ConvModule = _conv_module_class()

    class CosmoFlow(nn.Module):
        def __init__(self):
            super().__init__()
            self.spec, self.size = spec, size
            self.convs = nn.ModuleList(ConvModule(layer) for layer in layers)
            self.act = nn.LeakyReLU(LEAKY_SLOPE)
            self.pool = _pool_module_class()()
            features = spec.filters[-1] * (size >> spec.pools) ** 3
            head: List[nn.Module] = [nn.Flatten()]
            p = spec.dropout if dropout is None else dropout
            for width in spec.dense:
                head += [nn.Linear(features, width), nn.LeakyReLU(LEAKY_SLOPE), nn.Dropout(p)]
                features = width
            head.append(nn.Linear(features, spec.outputs))
            self.head = nn.Sequential(*head)

        @property
        def layers(self) -> List[Layer]:
            return [c.layer for c in self.convs]

        def forward(self, x):
            for i, conv in enumerate(self.convs):
                x = block_forward(self, conv, x, i < spec.pools)
            return torch.tanh(self.head(x)) * 1.2

        def set_recorder(self, recorder: Optional[Recorder]):
            for conv in self.convs:
                conv.recorder = recorder

    return CosmoFlow()


Choice = Dict[str, Dict[Pass, str]]  # layer name -> pass -> implementation name (or torch)


def choose(layers: Sequence[Layer], impl: Optional[str], maps: Sequence[str] = (),
           need_backward: bool = True, device: str = "cpu", dtype=None) -> Choice:
    """The implementation of each layer and pass (:func:`choose_explained`)."""
    return choose_explained(layers, impl, maps, need_backward, device, dtype)[0]


def choose_explained(layers: Sequence[Layer], impl: Optional[str], maps: Sequence[str] = (),
                     need_backward: bool = True, device: str = "cpu",
                     dtype=None) -> Tuple[Choice, Dict[str, Dict[Pass, str]]]:
    """The implementation of each layer and pass, and how each was chosen: ``impl``
    (``--impl``) forward, else :func:`default_choice`, whose backward passes also serve
    (torch's for a torch layer); overridden by the ``--impl-map`` files in ``maps``, whose
    ``*`` entry applies to the layers they do not name."""
    override = read_impl_maps(maps, [layer.name for layer in layers])
    every = override.get("*", {})
    chosen: Choice = {}
    how: Dict[str, Dict[Pass, str]] = {}

    def pick(layer, p, named):
        entry = override.get(layer.name, {})
        if p in entry or p in every:
            return entry.get(p, every.get(p)), "--impl-map"
        if named is not None:
            return named
        return default_choice(layer, p, device, dtype)

    for layer in layers:
        fwd = pick(layer, Pass.FWD, (impl, "--impl") if impl else None)
        per, why = {Pass.FWD: fwd[0]}, {Pass.FWD: fwd[1]}
        if need_backward:
            for p in (Pass.BWD_DATA, Pass.BWD_FILTER):
                per[p], why[p] = pick(layer, p, (TORCH, "torch's forward")
                                      if fwd[0] == TORCH else None)
        chosen[layer.name], how[layer.name] = per, why
    return chosen, how


def _parse_pass(text: str, message: str) -> Pass:
    try:
        return Pass(text)
    except ValueError:
        raise UsageError(message) from None


def read_impl_maps(paths: Sequence[str], layer_names: Sequence[str]) -> Dict[str, Dict[Pass, str]]:
    """Per-layer choices from ``--impl-map`` files, JSON or CSV (docs/end2end.md).

    A CSV row's pass defaults to its implementation's own.  Where CSV rows name the same
    layer and pass, the fastest (``median_ms``) wins, so the ``summary.csv`` files of
    several ``--compareprof`` runs, given together, pick the best implementation per layer
    (rows whose ``backend`` is not ``dace`` are skipped).  JSON entries always win.
    """
    picked: Dict[str, Dict[Pass, Tuple[float, str]]] = {}
    for path in paths:
        file = Path(path)
        if not file.is_file():
            raise UsageError(f"--impl-map: no such file: {path}")
        if file.suffix.lower() != ".json":
            _read_csv_map(path, file.read_text(), picked)
            continue
        try:
            data = json.loads(file.read_text())
        except json.JSONDecodeError as err:
            raise UsageError(f"--impl-map: {path}: not valid JSON ({err})") from None
        if not isinstance(data, dict):
            raise UsageError(f"--impl-map: {path}: expected an object of layer -> implementation")
        for layer, value in data.items():
            if isinstance(value, str):
                items = (dict.fromkeys(PASSES, TORCH) if value == TORCH
                         else {registry.get(value).pass_: value})
            elif isinstance(value, dict):
                items = {_parse_pass(key, f"--impl-map: {path}: {layer}: unknown pass '{key}' "
                                     "(fwd, bwd_data, bwd_filter)"): str(name)
                         for key, name in value.items()}
            else:
                raise UsageError(f"--impl-map: {path}: {layer}: expected a name or an object "
                                 "of pass -> name")
            for p, name in items.items():
                picked.setdefault(layer, {})[p] = (0.0, name)
    for layer in picked:
        if layer not in layer_names and layer != "*":
            raise UsageError(f"--impl-map: unknown layer '{layer}' (the model's layers: "
                             f"{', '.join(layer_names)})")
    return {layer: {p: name for p, (_, name) in per.items()} for layer, per in picked.items()}


def _read_csv_map(path: str, text: str, picked) -> None:
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows or not {"layer", "implementation"} <= set(rows[0]):
        raise UsageError(f"--impl-map: {path}: a CSV map needs the columns 'layer' and "
                         "'implementation'")
    for lineno, row in enumerate(rows, start=2):
        if row.get("backend") not in (None, "", "dace"):
            continue
        name = (row.get("implementation") or "").strip()
        layer = (row.get("layer") or "").strip()
        if not name or not layer:
            raise UsageError(f"--impl-map: {path}:{lineno}: empty layer or implementation")
        if row.get("pass"):
            pass_ = _parse_pass(row["pass"].strip(),
                                f"--impl-map: {path}:{lineno}: unknown pass '{row['pass']}'")
        else:
            pass_ = Pass.FWD if name == TORCH else registry.get(name).pass_
        try:
            cost = float(row.get("median_ms") or 0.0)
        except ValueError:
            cost = math.inf
        best = picked.setdefault(layer, {}).get(pass_)
        if best is None or cost < best[0]:
            picked[layer][pass_] = (cost, name)


def validate_choice(choice: Choice, layers: Sequence[Layer], device: str, dtype=None) -> None:
    """Every named implementation exists, computes its pass, has a schedule for
    ``device``, builds for the precision ``dtype`` and supports its layer; else a
    UsageError naming the layer."""
    by_name = {layer.name: layer for layer in layers}
    for layer_name, per in choice.items():
        layer = by_name[layer_name]
        for pass_, name in per.items():
            if name == TORCH:
                continue
            impl = registry.get(name)
            where = f"{layer_name} ({pass_})"
            if impl.pass_ != pass_:
                raise UsageError(f"{where}: {name} computes {impl.pass_}, not {pass_}")
            if device not in impl.targets:
                raise UsageError(f"{where}: {name} has no schedule for {device}")
            if dtype is not None and impl.unsupported_dtype(dtype, device):
                raise UsageError(f"{where}: {name} {impl.unsupported_dtype(dtype, device)}; "
                                 "choose another with --impl-map")
            reason = (devices.arch_problem(impl.cuda_arch, device)
                      or impl.unsupported_reason(layer, impl.resolve_params({})))
            if reason:
                raise UsageError(f"{where}: {name} does not support {layer.describe()}: "
                                 f"{reason}; choose another with --impl-map")


def attach_backends(model, choice: Choice, device: str, cachedir=None, policy: str = "reuse",
                    params: Optional[Mapping[str, Mapping[str, Any]]] = None,
                    log: Callable[[str], None] = print, skip: Sequence[Tuple[str, Pass]] = (),
                    dtype="float32"):
    """Give each convolution of ``model`` its backend: torch's where every pass is torch's,
    else a :class:`DaceConv` from the build cache, built in the precision ``dtype``
    (layers mixing torch and DaCe passes are refused).  ``skip``: (layer, pass) pairs
    never run, so not built."""
    from convbench.experiment.pipeline import Experiment
    exp = Experiment([], [], device, policy=policy, cachedir=cachedir, verify=False,
                     dtype=dtype)
    for conv in model.convs:
        layer, per = conv.layer, choice[conv.layer.name]
        if set(per.values()) == {TORCH}:
            conv.backend = TorchConv(layer)
            continue
        if TORCH in per.values():
            raise UsageError(f"{layer.name}: mixing torch and DaCe passes in one layer is not "
                             f"supported ({', '.join(f'{p}={n}' for p, n in per.items())})")
        builds = {}
        for pass_, name in per.items():
            builds[pass_] = None
            if (layer.name, pass_) in skip:
                continue
            impl = registry.get(name)
            chosen = exp.params(impl, layer, (params or {}).get(name))
            t0 = time.perf_counter()
            builds[pass_] = exp.build(impl, layer, chosen)
            log(f"  {layer.name} {str(pass_):10s} {name:28s} {builds[pass_].origin} "
                f"{time.perf_counter() - t0:6.1f}s")
        conv.backend = DaceConv(layer, builds, device)
