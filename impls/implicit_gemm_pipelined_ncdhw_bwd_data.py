"""``implicitGemmPipelinedNCDHWBwdData``: dL/dx on the pipelined main loop, NCDHW, stride
1 (``implicitGemmPipelinedBwdData``'s program in the other layout)."""

from convbench.registry import Implementation, Layout, register
from convkernels.gpu.simt import data_gradient

register(Implementation(**data_gradient.fields(
    name="implicitGemmPipelinedNCDHWBwdData",
    summary="backward data (stride 1) on the pipelined main loop, NCDHW: dL/dy through the "
            "forward's cp.async stages and LDS.128 fragments, the filter flipped as staged",
    layout=Layout.NCDHW)))
