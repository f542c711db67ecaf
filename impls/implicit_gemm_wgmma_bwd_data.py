"""``implicitGemmWGMMABwdData``: dL/dx on Hopper's tensor cores, for stride 1.

dL/dx of a stride-1 layer is the forward convolution of dL/dy with the filter flipped in
space and its channel dimensions swapped (``transposed_layer``).  A first kernel writes
that filter K-major (each input channel's run of output channels per tap), which TF32's
``wgmma`` needs and the 16-bit types use too; then ``implicitGemmWGMMA``'s main loop runs on
the transposed layer (:func:`convkernels.gpu.wgmma.program.data_gradient`).  Built for
sm_90a; its CPU schedule emulates the descriptors and each MMA thread by thread.
"""

from convbench.registry import Implementation, Pass, register
from convkernels.gpu.wgmma import program as wgmma
from convkernels.transposed import transposed_layer

register(Implementation(**wgmma.fields(
    default_for=("network-hopper",),
    name="implicitGemmWGMMABwdData",
    summary="backward data on Hopper tensor cores (stride 1): the filter flipped and "
            "transposed K-major by a first kernel, then implicitGemmWGMMA's wgmma main loop "
            "on dL/dy (sm_90a; CPU: the descriptors decoded and each MMA emulated)",
    pass_=Pass.BWD_DATA,
    algorithm=wgmma.data_gradient,
    schedules={t: wgmma.schedule(t, layer_of=transposed_layer) for t in ("cpu", "gpu")},
    supports=wgmma.data_gradient_supports,
    constraints="stride 1, padding at most kernel - 1; one image of dL/dy below 2^31 elements",
    search_space=wgmma.SEARCH_SPACE,
)))
