"""``implicitGemmBwdData``: dL/dx as an implicit GEMM on NDHWC: per input pixel, only the
taps of its stride phase, from tap tables; DaCe auto-optimize.

The kernel: :mod:`convkernels.auto.implicit_gemm`.
"""

from convbench.registry import ALL_PRECISIONS, FEATURES, Implementation, Layout, Pass, register
from convkernels.auto import implicit_gemm
from convkernels.auto.schedules import auto_cpu, auto_gpu

register(Implementation(
    name="implicitGemmBwdData",
    default_for=("cli",),
    summary="backward data: implicit GEMM dX[N*D*H*W, C] = dY-gather x flipped filter, "
            "per-stride-phase taps from tables (no zero insertion), NDHWC, DaCe auto-optimize",
    layout=Layout.NDHWC,
    pass_=Pass.BWD_DATA,
    algorithm=implicit_gemm.data_gradient,
    schedules={"cpu": auto_cpu, "gpu": auto_gpu},
    handles=FEATURES,
    precisions=ALL_PRECISIONS,
))
