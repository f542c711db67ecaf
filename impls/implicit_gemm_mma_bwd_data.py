"""``implicitGemmMMABwdData``: dL/dx on tensor cores, for stride 1.

dL/dx of a stride-1 layer is the forward convolution of dL/dy with the filter flipped in
space and its channel dimensions swapped (``transposed_layer``).  This is
``implicitGemmMMA``'s program (:mod:`convkernels.gpu.mma.program`) on that layer; the filter's gather reads
the forward filter where it is.  Its output channels are the contiguous ones: it is
staged N-major in 16-byte chunks by ``cp.async``, and read with ``ldmatrix.trans`` in 16
bits and with 32-bit shared loads from :func:`convkernels.gpu.mma.layout.blocked`'s layout in TF32.
"""

from convbench.registry import Implementation, Pass, register
from convkernels.gpu.mma import program as mma
from convkernels.transposed import transposed_layer

register(Implementation(**mma.fields(
    default_for=("network-tensor-cores",),
    name="implicitGemmMMABwdData",
    summary="backward data on tensor cores (stride 1): implicitGemmMMA on dL/dy with the "
            "filter flipped and its channels swapped as it is staged N-major (ldmatrix.trans "
            "in 16 bits, 32-bit loads in TF32) (CPU: ldmatrix and the MMA emulated lane by "
            "lane)",
    pass_=Pass.BWD_DATA,
    algorithm=mma.data_gradient,
    schedules={t: mma.schedule(t, flip=True, layer_of=transposed_layer)
               for t in ("cpu", "gpu")},
    supports=mma.data_gradient_supports,
    constraints="stride 1, padding at most kernel - 1; one image of dL/dy below 2^31 elements",
)))
