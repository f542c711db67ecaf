"""``implicitGemmPipelinedBwdFilter``: dL/dw on the pipelined main loop, NDHWC
(``impls/_pipelined_bwd.py``): a GEMM of output channels by filter values over batch x
output pixels, split into slices (split-K) whose float32 partials a second kernel adds
in a fixed order."""

from convbench.registry import Layout, register
from impls import _pipelined_bwd

register(_pipelined_bwd.wgrad_implementation(
    name="implicitGemmPipelinedBwdFilter",
    summary="backward filter on the pipelined main loop, NDHWC: output channels x filter "
            "values over batch x pixels in cp.async stages, split-K slices added in order",
    layout=Layout.NDHWC, default_for=("network", "best-of")))
