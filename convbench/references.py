"""Reference backends that ``--compareprof`` times next to a DaCe implementation.

A reference has a name (the ``backend`` column of the result files), says whether
it can run on a device, and turns a layer and its inputs into a no-argument
callable.  torch's ``conv3d`` is the reference on both targets: on the CPU it runs
in the implementation's memory format (``channels_last_3d`` for NDHWC) with the same
thread count; on the GPU it runs with ``cudnn.benchmark`` on, so it uses the
fastest algorithm cuDNN finds, and with TF32 off unless asked for.  cuDNN through
this project's own bindings joins as a second GPU reference once they exist.
"""

import dataclasses
from typing import Callable, Dict, List, Optional

from .layers import Layer
from .layouts import Layout, Pass


@dataclasses.dataclass
class ReferenceOptions:
    allow_tf32: bool = False
    #: cuDNN's algorithm: ``find``, ``heuristic`` or a name (see :mod:`cudnn_bindings`).
    cudnn_algo: str = "find"


class Reference:
    name = ""

    def problem(self, device: str) -> Optional[str]:
        """None if this reference can run on ``device``, else why not."""
        return None

    def prepare(self, layer: Layer, pass_: Pass, layout: Layout, device: str,
                inputs: Dict[str, "object"], options: ReferenceOptions) -> Callable[[], object]:
        """A callable computing the pass on ``inputs`` (logical layout, on ``device``)."""
        raise NotImplementedError

    def settings(self, device: str, options: ReferenceOptions) -> Dict[str, object]:
        """What the result metadata should record about this reference."""
        return {}


def _format(layout):
    import torch
    return torch.channels_last_3d if Layout(layout) == Layout.NDHWC else torch.contiguous_format


def _in_layout(inputs, layout):
    """The inputs in the memory format of ``layout`` (channels_last_3d for NDHWC)."""
    return {r: t.contiguous(memory_format=_format(layout)) for r, t in inputs.items()}


class TorchReference(Reference):
    name = "torch"

    def prepare(self, layer, pass_, layout, device, inputs, options):
        import torch
        import torch.nn.functional as F
        from torch.nn import grad
        t = _in_layout(inputs, layout)
        if device == "gpu":
            torch.backends.cudnn.benchmark = True
            torch.backends.cudnn.allow_tf32 = options.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = options.allow_tf32
        s, p = layer.stride, layer.pads
        if Pass(pass_) == Pass.FWD:
            def compute():
                return F.conv3d(t["x"], t["w"], stride=s, padding=p)
        elif Pass(pass_) == Pass.BWD_DATA:
            def compute():
                return grad.conv3d_input(layer.input_shape, t["w"], t["y"], s, p)
        else:
            def compute():
                return grad.conv3d_weight(t["x"], layer.filter_shape, t["y"], s, p)

        def call():
            with torch.no_grad():
                return compute()
        return call

    def settings(self, device, options):
        import torch
        out = {"version": torch.__version__, "threads": torch.get_num_threads()}
        if device == "gpu":
            out.update({"cudnn": torch.backends.cudnn.version(), "cudnn_benchmark": True,
                        "allow_tf32": options.allow_tf32})
        else:
            out["mkldnn"] = bool(torch.backends.mkldnn.is_available())
        return out


class CudnnReference(Reference):
    """cuDNN through this project's ctypes bindings, on torch's tensors and stream.

    The algorithm is chosen (Find, by default) when the callable is prepared, outside
    any timed region; the callable's ``info`` says which one and how long Find took."""

    name = "cudnn"

    def problem(self, device):
        if device != "gpu":
            return "cuDNN runs on the GPU only"
        import cudnn_bindings
        return cudnn_bindings.problem()

    def prepare(self, layer, pass_, layout, device, inputs, options):
        import torch

        import cudnn_bindings
        t = _in_layout(inputs, layout)
        shapes = {"x": layer.input_shape, "w": layer.filter_shape, "y": layer.output_shape}
        for role in ("x", "w", "y"):  # the pass's output buffer
            if role not in t:
                like = next(iter(t.values()))
                t[role] = torch.empty(shapes[role], dtype=like.dtype, device=like.device,
                                      memory_format=_format(layout))
        plan = cudnn_bindings.plan(str(Pass(pass_)), t["x"], t["w"], t["y"], layer.stride,
                                   layer.pads, 1, algo=options.cudnn_algo,
                                   math=cudnn_math(options))

        def call():
            plan.run(t["x"], t["w"], t["y"])
        call.info = plan.info()
        return call

    def settings(self, device, options):
        import cudnn_bindings
        lib = cudnn_bindings.load()
        return {"version": ".".join(map(str, lib.version_tuple)), "library": str(lib.path),
                "found_via": lib.source, "algo": options.cudnn_algo,
                "math": cudnn_math(options)}


def cudnn_math(options: ReferenceOptions) -> str:
    return "tf32" if options.allow_tf32 else "ieee"


#: Every reference, in the order they are timed and reported.
REFERENCES: List[Reference] = [TorchReference(), CudnnReference()]


def available(device: str) -> List[Reference]:
    return [r for r in REFERENCES if r.problem(device) is None]
