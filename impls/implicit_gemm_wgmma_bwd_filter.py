"""``implicitGemmWGMMABwdFilter``: dL/dw on Hopper's tensor cores, NDHWC: the pipelined
filter gradient's slices (split-K into float32 partials, added in slice order) with the
wgmma main loop.  In 16 bits both operands are staged M- and N-major by 16-byte
``cp.async`` and read transposed by ``wgmma``; TF32, which ``wgmma`` reads K-major only,
is transposed by 4-byte copies (:mod:`convkernels.gpu.wgmma.filter_gradient`).  Built for
sm_90a; its CPU schedule decodes both descriptors and emulates each MMA thread by thread.
"""

from convbench.registry import Implementation, register
from convkernels.gpu.wgmma import filter_gradient

register(Implementation(**filter_gradient.fields(
    default_for=("network-hopper",),
    name="implicitGemmWGMMABwdFilter",
    summary="backward filter on Hopper tensor cores, NDHWC: cp.async stages in 128-byte-"
            "swizzled dynamic shared memory (16-bit: M/N-major, read transposed; TF32: "
            "transposed K-major by 4-byte copies), wgmma.mma_async from descriptors, split-K "
            "with a deterministic reduction (sm_90a; CPU: the descriptors decoded and each "
            "MMA emulated)",
)))
