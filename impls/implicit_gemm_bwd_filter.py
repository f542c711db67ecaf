"""``implicitGemmBwdFilter``: dL/dw as an implicit GEMM on NDHWC (see ``_backward.py``):
one output per filter element, the whole N*Do*Ho*Wo reduction in it; DaCe auto-optimize."""

from convbench.registry import ALL_PRECISIONS, FEATURES, Layout, Pass
from convbench.registry import Implementation, register
from impls._backward import bwd_filter_algorithm
from impls._common import auto_cpu, auto_gpu

register(Implementation(
    name="implicitGemmBwdFilter",
    default_for=("cli",),
    summary="backward filter: implicit GEMM dW[K, C*taps] = dY^T x im2col(x), reduction "
            "over N*Do*Ho*Wo, NDHWC, DaCe auto-optimize",
    layout=Layout.NDHWC,
    pass_=Pass.BWD_FILTER,
    algorithm=bwd_filter_algorithm,
    schedules={"cpu": auto_cpu, "gpu": auto_gpu},
    handles=FEATURES,
    precisions=ALL_PRECISIONS,
))
