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


class TorchReference(Reference):
    name = "torch"

    def prepare(self, layer, pass_, layout, device, inputs, options):
        import torch
        import torch.nn.functional as F
        if Pass(pass_) != Pass.FWD:
            raise NotImplementedError(f"torch reference for {pass_}")
        fmt = torch.channels_last_3d if Layout(layout) == Layout.NDHWC else torch.contiguous_format
        x = inputs["x"].contiguous(memory_format=fmt)
        w = inputs["w"].contiguous(memory_format=fmt)
        if device == "gpu":
            torch.backends.cudnn.benchmark = True
            torch.backends.cudnn.allow_tf32 = options.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = options.allow_tf32

        def call():
            with torch.no_grad():
                return F.conv3d(x, w, stride=layer.stride, padding=layer.pad)
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


#: Every reference, in the order they are timed and reported.
REFERENCES: List[Reference] = [TorchReference()]


def available(device: str) -> List[Reference]:
    return [r for r in REFERENCES if r.problem(device) is None]
