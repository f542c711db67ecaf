"""``im2colGemm``: explicit im2col into a buffer, then a BLAS GEMM, on NCDHW.

The kernel: :mod:`convkernels.auto.im2col`.
"""

from convbench.registry import Implementation, Layout, Pass, register
from convkernels.auto import im2col

register(Implementation(
    name="im2colGemm",
    summary="explicit im2col per image into a [C*kd*kh*kw, Do*Ho*Wo] buffer, then "
            "Y_b = W @ col_b with BLAS (MKL on the CPU, cuBLAS on the GPU) on NCDHW",
    layout=Layout.NCDHW,
    pass_=Pass.FWD,
    algorithm=im2col.forward,
    schedules={"cpu": im2col.cpu_schedule, "gpu": im2col.gpu_schedule},
))
