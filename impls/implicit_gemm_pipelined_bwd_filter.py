"""``implicitGemmPipelinedBwdFilter``: dL/dw on the pipelined main loop, NDHWC
(``convkernels/gpu/simt/filter_gradient.py``): a GEMM of output channels by filter values
over batch x output pixels, split into slices (split-K) whose float32 partials a second
kernel adds
in a fixed order."""

from convbench.registry import Implementation, Layout, register
from convkernels.gpu.simt import filter_gradient

register(Implementation(**filter_gradient.fields(
    name="implicitGemmPipelinedBwdFilter",
    summary="backward filter on the pipelined main loop, NDHWC: output channels x filter "
            "values over batch x pixels in cp.async stages, split-K slices added in order",
    layout=Layout.NDHWC, default_for=("network", "best-of"))))
