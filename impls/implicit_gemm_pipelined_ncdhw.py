"""``implicitGemmPipelinedNCDHW``: the pipelined implicit GEMM on NCDHW
(``convkernels/gpu/simt/``): the same main loop, with 4-byte copies of the input (its
channels are a plane apart) coalesced along the output pixels."""

from convbench.registry import Implementation, Layout, register
from convkernels.gpu.simt import forward

register(Implementation(**forward.fields(
    name="implicitGemmPipelinedNCDHW",
    summary="implicit GEMM with CUTLASS's SIMT main loop on NCDHW: cp.async stages, "
            "LDS.128 fragments, tap-major K tiles, no tables",
    layout=Layout.NCDHW)))
