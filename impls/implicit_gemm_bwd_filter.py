"""``implicitGemmBwdFilter``: dL/dw as an implicit GEMM on NDHWC: one output per filter
element, the whole N*Do*Ho*Wo reduction in it; DaCe auto-optimize.

The kernel: :mod:`convkernels.auto.implicit_gemm`.
"""

from convbench.registry import ALL_PRECISIONS, FEATURES, Implementation, Layout, Pass, register
from convkernels.auto import implicit_gemm
from convkernels.auto.schedules import auto_cpu, auto_gpu

register(Implementation(
    name="implicitGemmBwdFilter",
    default_for=("cli",),
    summary="backward filter: implicit GEMM dW[K, C*taps] = dY^T x im2col(x), reduction "
            "over N*Do*Ho*Wo, NDHWC, DaCe auto-optimize",
    layout=Layout.NDHWC,
    pass_=Pass.BWD_FILTER,
    algorithm=implicit_gemm.filter_gradient,
    schedules={"cpu": auto_cpu, "gpu": auto_gpu},
    handles=FEATURES,
    precisions=ALL_PRECISIONS,
))
