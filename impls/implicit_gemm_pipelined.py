"""``implicitGemmPipelined``: the pipelined implicit GEMM on NDHWC (``convkernels/gpu/simt/``):
channels innermost, so a thread's run of reduction values is contiguous in memory and
its copies are 16-byte ``cp.async`` where the channels are a multiple of 4."""

from convbench.registry import Implementation, Layout, register
from convkernels.gpu.simt import forward

register(Implementation(**forward.fields(
    name="implicitGemmPipelined",
    summary="implicit GEMM with CUTLASS's SIMT main loop on NDHWC: cp.async stages, "
            "LDS.128 fragments, tap-major K tiles, no tables",
    layout=Layout.NDHWC, default_for=("best-of", "network"))))
