"""``implicitGemmPipelined``: the pipelined implicit GEMM on NDHWC (``impls/_pipelined.py``):
channels innermost, so a thread's run of reduction values is contiguous in memory and
its copies are 16-byte ``cp.async`` where the channels are a multiple of 4."""

from convbench.registry import Layout, register
from impls import _pipelined

register(_pipelined.implementation(
    name="implicitGemmPipelined",
    summary="implicit GEMM with CUTLASS's SIMT main loop on NDHWC: cp.async stages, "
            "LDS.128 fragments, tap-major K tiles, no tables",
    layout=Layout.NDHWC, default_for=("best-of", "network")))
