"""``implicitGemmMMA``: the implicit GEMM on NDHWC on tensor cores, ``mma.sync`` with
float32 sums: m16n8k16 on float16 or bfloat16 operands, m16n8k8 on TF32 operands
(``--dtype float32 --math tf32``).  Operands reach shared memory through multistage
``cp.async`` copies into a swizzled layout and the warps' registers through
``ldmatrix.x4`` (:mod:`convkernels.gpu.mma.program`).  Its CPU schedule runs the same code thread by
thread and emulates ``ldmatrix`` and each MMA on the lanes' registers, so CI verifies the
layout, the lane mapping and the fragments that run on the GPU.
"""

from convbench.registry import Implementation, Pass, register
from convkernels.gpu.mma import program as mma

register(Implementation(**mma.fields(
    default_for=("network-tensor-cores",),
    name="implicitGemmMMA",
    summary="implicit GEMM on NDHWC on tensor cores: cp.async stages in a swizzled shared "
            "layout, ldmatrix.x4 fragments, mma.sync m16n8k16 (16-bit) or m16n8k8 (TF32) "
            "per warp tile (CPU: ldmatrix and the MMA emulated lane by lane)",
    pass_=Pass.FWD,
    algorithm=lambda layer, dtype, params: mma.program(layer, dtype, params),
    schedules={t: mma.schedule(t) for t in ("cpu", "gpu")},
    supports=mma.supports,
    constraints="one image of the input below 2^31 elements",
)))
