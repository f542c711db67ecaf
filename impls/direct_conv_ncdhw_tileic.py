"""``directConvNCDHWtileIC``: the merged-DHW direct convolution with the input-channel
loop outside the thread-block map.  All threads of a block step through the input
channels together; per channel each thread applies every tap to its
``outputsPerThread`` pixels, accumulating in registers.  The kernel: :mod:`convkernels.gpu.direct`.
"""

from convbench.registry import Implementation, register
from convkernels.gpu import direct

register(Implementation(**direct.per_thread_fields(
    name="directConvNCDHWtileIC",
    summary="direct convolution on NCDHW, merged D*H*W pixel tiles, input-channel loop "
            "outside the thread-block map",
    channel_loop_outside=True)))
