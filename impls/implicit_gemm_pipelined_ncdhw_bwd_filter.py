"""``implicitGemmPipelinedNCDHWBwdFilter``: dL/dw on the pipelined main loop, NCDHW
(``implicitGemmPipelinedBwdFilter``'s program in the other layout: dL/dy's pixels are
contiguous, so its copies are 16-byte where output rows are whole K tiles)."""

from convbench.registry import Implementation, Layout, register
from convkernels.gpu.simt import filter_gradient

register(Implementation(**filter_gradient.fields(
    name="implicitGemmPipelinedNCDHWBwdFilter",
    summary="backward filter on the pipelined main loop, NCDHW: output channels x filter "
            "values over batch x pixels in cp.async stages, split-K slices added in order",
    layout=Layout.NCDHW)))
