"""``implicitGemmBwdData``: dL/dx as an implicit GEMM on NDHWC (see ``_backward.py``):
per input pixel, only the taps of its stride phase, from tap tables; DaCe auto-optimize."""

from convbench.registry import ALL_PRECISIONS, FEATURES, Layout, Pass
from convbench.registry import Implementation, register
from impls._backward import bwd_data_algorithm
from impls._common import auto_cpu, auto_gpu

register(Implementation(
    name="implicitGemmBwdData",
    default_for=("cli",),
    summary="backward data: implicit GEMM dX[N*D*H*W, C] = dY-gather x flipped filter, "
            "per-stride-phase taps from tables (no zero insertion), NDHWC, DaCe auto-optimize",
    layout=Layout.NDHWC,
    pass_=Pass.BWD_DATA,
    algorithm=bwd_data_algorithm,
    schedules={"cpu": auto_cpu, "gpu": auto_gpu},
    handles=FEATURES,
    precisions=ALL_PRECISIONS,
))
