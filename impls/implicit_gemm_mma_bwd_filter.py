"""``implicitGemmMMABwdFilter``: dL/dw on tensor cores, NDHWC: the pipelined filter
gradient's slices (split-K into float32 partials, added in slice order) with the
tensor-core main loop; both operands staged N-major, read with ``ldmatrix.trans`` in 16
bits and with 32-bit loads in TF32 (:mod:`convkernels.gpu.mma.filter_gradient`)."""

from convbench.registry import Implementation, register
from convkernels.gpu.mma import filter_gradient

register(Implementation(**filter_gradient.fields(
    default_for=("network-tensor-cores",),
    name="implicitGemmMMABwdFilter",
    summary="backward filter on tensor cores, NDHWC: dL/dy and the input staged N-major by "
            "cp.async, ldmatrix.trans (16-bit) or 32-bit loads (TF32), mma.sync per warp "
            "tile, split-K with a deterministic reduction (CPU: ldmatrix and the MMA "
            "emulated lane by lane)",
)))
