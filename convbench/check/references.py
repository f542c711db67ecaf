"""Reference backends: what a DaCe result is checked against and timed next to.

Every reference has one interface, :class:`Reference` (docs/architecture.md, "Adding a
reference"); :meth:`~Reference.prepare` runs outside the timed region, so cuDNN's Find
runs there.  The instances: :data:`TORCH_FP64`, the ground truth of
:mod:`convbench.check.verify` (on the GPU for large layers); :data:`TORCH`, the timing
reference on both targets and a second check on the GPU; :data:`CUDNN` (GPU only), a
timing reference and a third check.  docs/profiling.md gives their settings.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional

from convbench.layersets.layer import Layer
from convkernels.layouts import Layout, Pass


@dataclasses.dataclass
class ReferenceOptions:
    allow_tf32: bool = False
    #: cuDNN's algorithm: ``find``, ``heuristic`` or a name (see :mod:`cudnn_bindings`).
    cudnn_algo: str = "find"


def torch_device(device: str) -> str:
    return "cuda" if device == "gpu" else "cpu"


def _format(layout):
    import torch
    return torch.channels_last_3d if Layout(layout) == Layout.NDHWC else torch.contiguous_format


def _in_layout(inputs, layout):
    """The inputs in the memory format of ``layout`` (channels_last_3d for NDHWC)."""
    return {r: t.contiguous(memory_format=_format(layout)) for r, t in inputs.items()}


class Reference:
    #: The ``backend`` column of the result files when timed.
    name = ""
    #: The name of the check when used for verification.
    check_name = ""

    def problem(self, device: str) -> Optional[str]:
        """None if this reference can run on ``device``, else why not."""
        return None

    def layer_problem(self, layer: Layer) -> Optional[str]:
        """None if this reference computes ``layer``, else why not."""
        return None

    def prepare(self, layer: Layer, pass_: Pass, layout: Layout, device: str,
                inputs: Dict[str, "object"], options: ReferenceOptions) -> Callable[[], object]:
        """A no-argument callable computing the pass on ``inputs`` (logical layout, already
        on ``device``) and returning its output (in ``layout``'s memory format)."""
        raise NotImplementedError

    def compute(self, layer: Layer, pass_: Pass, inputs: Dict[str, "object"], device: str,
                options: Optional[ReferenceOptions] = None):
        """The pass on ``inputs`` (logical layout, any device), computed once on ``device``;
        the output is in logical layout on ``device``."""
        tdev = torch_device(device)
        call = self.prepare(layer, pass_, Layout.NCDHW, device,
                            {r: t.to(tdev) for r, t in inputs.items()},
                            options or ReferenceOptions())
        return call()

    def settings(self, device: str, options: ReferenceOptions) -> Dict[str, object]:
        """What the result metadata should record about this reference."""
        return {}


def torch_pass(layer: Layer, pass_: Pass, inputs):
    """The pass computed by torch on ``inputs`` (any dtype and device): the forward
    convolution, or autograd's gradients for the input and the filter."""
    import torch.nn.functional as F
    from torch.nn import grad
    s, p, d, g = layer.strides, layer.pads, layer.dilations, layer.groups
    pass_ = Pass(pass_)
    if layer.asymmetric:  # torch pads alike at both ends: pad x itself, convolve unpadded
        return _asymmetric_pass(layer, pass_, inputs)
    if pass_ == Pass.FWD:
        return F.conv3d(inputs["x"], inputs["w"], stride=s, padding=p, dilation=d, groups=g)
    if pass_ == Pass.BWD_DATA:
        if layer.transposed:  # the transposed convolution itself, as a user would call it
            return F.conv_transpose3d(inputs["y"], inputs["w"], stride=s, padding=p,
                                      output_padding=layer.output_pads, groups=g,
                                      dilation=d)
        return grad.conv3d_input(layer.input_shape, inputs["w"], inputs["y"], s, p, d, g)
    return grad.conv3d_weight(inputs["x"], layer.filter_shape, inputs["y"], s, p, d, g)


def _asymmetric_pass(layer: Layer, pass_: Pass, inputs):
    """:func:`torch_pass` of a layer padded differently at the two ends of a dimension:
    the forward convolves the explicitly padded input without padding, the data gradient
    is that of the padded input cropped back to x, the filter gradient that of the padded
    input."""
    import torch.nn.functional as F
    from torch.nn import grad
    s, d, g = layer.strides, layer.dilations, layer.groups
    (pd, ph, pw), (ed, eh, ew) = layer.pads, layer.pads_end
    widths = (pw, ew, ph, eh, pd, ed)  # F.pad's order: last dimension first
    if pass_ == Pass.BWD_DATA:
        n, c, D, H, W = layer.input_shape
        padded = (n, c, D + pd + ed, H + ph + eh, W + pw + ew)
        full = grad.conv3d_input(padded, inputs["w"], inputs["y"], s, 0, d, g)
        return full[:, :, pd:pd + D, ph:ph + H, pw:pw + W]
    xp = F.pad(inputs["x"], widths)
    if pass_ == Pass.FWD:
        return F.conv3d(xp, inputs["w"], stride=s, padding=0, dilation=d, groups=g)
    return grad.conv3d_weight(xp, layer.filter_shape, inputs["y"], s, 0, d, g)


def torch_gpu_math(allow_tf32: bool = False) -> Dict[str, Any]:
    """Set torch's process-wide GPU math the way every comparison here wants it, and
    return the settings for the metadata: cuDNN's autotuner on, trying every engine
    (``benchmark_limit`` 0: torch's default tries 10, and the project's own cuDNN Find once
    reported 93 ms where torch had found 6.5 ms), so that torch picks its fastest
    algorithm, as the cuDNN bindings' Find does; and TF32 as asked.  torch's default lets
    cuDNN convolutions run in TF32 (about 1e-3 relative error and faster), so an FP32
    DaCe kernel timed against torch's defaults races a lower precision."""
    import torch
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.benchmark_limit = 0
    torch.backends.cudnn.allow_tf32 = allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    return {"cudnn_benchmark": True, "cudnn_benchmark_limit": 0, "allow_tf32": allow_tf32}


class TorchReference(Reference):
    """torch's convolution; ``dtype`` (a torch dtype name) converts the inputs first."""

    def __init__(self, name: str = "torch", check_name: str = "torch-gpu-fp32",
                 dtype: Optional[str] = None):
        self.name, self.check_name, self.dtype = name, check_name, dtype

    def prepare(self, layer, pass_, layout, device, inputs, options):
        import torch
        t = _in_layout(inputs, layout)
        if self.dtype is not None:
            t = {r: v.to(getattr(torch, self.dtype)) for r, v in t.items()}
        if device == "gpu":
            torch_gpu_math(options.allow_tf32)

        def call():
            with torch.no_grad():
                return torch_pass(layer, pass_, t)
        return call

    def settings(self, device, options):
        import torch
        out = {"version": torch.__version__, "threads": torch.get_num_threads()}
        if device == "gpu":
            out.update({"cudnn": torch.backends.cudnn.version(), "cudnn_benchmark": True,
                        "cudnn_benchmark_limit": 0, "allow_tf32": options.allow_tf32})
        else:
            out["mkldnn"] = bool(torch.backends.mkldnn.is_available())
        return out


class CudnnReference(Reference):
    """cuDNN through this project's ctypes bindings, on torch's tensors and stream.

    The algorithm is chosen (Find, by default) when the callable is prepared, outside
    any timed region; the callable's ``info`` says which one and how long Find took."""

    name = "cudnn"
    check_name = "cudnn-fp32"

    def layer_problem(self, layer):
        if layer.asymmetric:  # its descriptors take one padding per dimension
            return "cuDNN pads both ends of a dimension alike"
        return None

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
        out_role = {Pass.FWD: "y", Pass.BWD_DATA: "x", Pass.BWD_FILTER: "w"}[Pass(pass_)]
        for role in ("x", "w", "y"):  # the pass's output buffer
            if role not in t:
                like = next(iter(t.values()))
                t[role] = torch.empty(shapes[role], dtype=like.dtype, device=like.device,
                                      memory_format=_format(layout))
        plan = cudnn_bindings.plan(str(Pass(pass_)), t["x"], t["w"], t["y"], layer.strides,
                                   layer.pads, layer.dilations, algo=options.cudnn_algo,
                                   math=cudnn_math(options, t["x"].dtype), groups=layer.groups)

        def call():
            plan.run(t["x"], t["w"], t["y"])
            return t[out_role]
        call.info = plan.info()
        return call

    def settings(self, device, options):
        import cudnn_bindings
        lib = cudnn_bindings.load()
        return {"version": ".".join(map(str, lib.version_tuple)), "library": str(lib.path),
                "found_via": lib.source, "algo": options.cudnn_algo,
                "math": cudnn_math(options)}


def cudnn_math(options: ReferenceOptions, tdtype=None) -> str:
    """cuDNN's math: 16-bit tensors on the tensor cores (float32 sums), float32 in IEEE
    unless TF32 is allowed."""
    import torch
    if tdtype in (torch.float16, torch.bfloat16):
        return "tensor_op"
    return "tf32" if options.allow_tf32 else "ieee"


#: The ground truth of verification.
TORCH_FP64 = TorchReference("torch-fp64", "torch-fp64", dtype="float64")
TORCH = TorchReference()
CUDNN = CudnnReference()
#: Every timing reference, in the order they are timed and reported.
REFERENCES: List[Reference] = [TORCH, CUDNN]


def available(device: str) -> List[Reference]:
    """The timing references that can run on ``device``."""
    return [r for r in REFERENCES if r.problem(device) is None]


def cross_checks(device: str) -> List[Reference]:
    """The references a result is checked against besides the float64 ground truth:
    on the GPU, torch's float32 convolution and cuDNN (where usable); none on the CPU."""
    return available(device) if device == "gpu" else []
