"""``implicitGemmWGMMA``: the implicit GEMM on NDHWC on Hopper's tensor cores,
``wgmma.mma_async`` with float32 sums: m64nNk16 on float16 or bfloat16 operands, m64nNk8 on
TF32 operands (``--dtype float32 --math tf32``), both operands read from 128-byte-swizzled
shared memory through descriptors, 3-6 ``cp.async`` stages in dynamic shared memory beyond
48 KiB, one wgmma group in flight while the next stage lands
(:mod:`convkernels.gpu.wgmma.program`).  Built for sm_90a.  Its CPU schedule runs the same
code thread by thread and decodes each descriptor as the hardware does, so CI verifies the
swizzle, the descriptors and the accumulator layout that run on the GPU.
"""

from convbench.registry import Implementation, Pass, register
from convkernels.gpu.wgmma import program as wgmma

register(Implementation(**wgmma.fields(
    default_for=("network-hopper",),
    name="implicitGemmWGMMA",
    summary="implicit GEMM on NDHWC on Hopper tensor cores: cp.async stages in 128-byte-"
            "swizzled dynamic shared memory, wgmma.mma_async m64nNk16 (16-bit) or m64nNk8 "
            "(TF32) from shared-memory descriptors, one group in flight (sm_90a; CPU: the "
            "descriptors decoded and each MMA emulated thread by thread)",
    pass_=Pass.FWD,
    algorithm=lambda layer, dtype, params: wgmma.program(layer, dtype, params),
    schedules={t: wgmma.schedule(t) for t in ("cpu", "gpu")},
    supports=wgmma.supports,
    constraints="one image of the input below 2^31 elements",
    search_space=wgmma.SEARCH_SPACE,
)))
