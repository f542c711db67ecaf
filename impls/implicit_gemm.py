"""``implicitGemm``: implicit GEMM on NDHWC, scheduled by DaCe's auto-optimize.

The kernel: :mod:`convkernels.auto.implicit_gemm`.
"""

from convbench.registry import ALL_PRECISIONS, FEATURES, Implementation, Layout, Pass, register
from convkernels.auto.schedules import auto_cpu, auto_gpu
from convkernels.auto import implicit_gemm

register(Implementation(
    name="implicitGemm",
    summary="implicit GEMM (M=N*Do*Ho*Wo, N=K, K=C*kd*kh*kw) on NDHWC, DaCe auto-optimize",
    layout=Layout.NDHWC,
    pass_=Pass.FWD,
    algorithm=implicit_gemm.forward,
    schedules={"cpu": auto_cpu, "gpu": auto_gpu},
    handles=FEATURES,
    precisions=ALL_PRECISIONS,
))
