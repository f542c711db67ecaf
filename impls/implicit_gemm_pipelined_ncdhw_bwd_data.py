"""``implicitGemmPipelinedNCDHWBwdData``: dL/dx on the pipelined main loop, NCDHW, stride
1 (``implicitGemmPipelinedBwdData``'s program in the other layout)."""

from convbench.registry import Layout, register
from impls import _pipelined_bwd

register(_pipelined_bwd.bwd_data_implementation(
    name="implicitGemmPipelinedNCDHWBwdData",
    summary="backward data (stride 1) on the pipelined main loop, NCDHW: dL/dy through the "
            "forward's cp.async stages and LDS.128 fragments, the filter flipped as staged",
    layout=Layout.NCDHW))
