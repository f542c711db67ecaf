"""``directConvNCDHWnobuffer``: direct convolution on NCDHW with the output's D*H*W merged
into one pixel index.  A thread block covers CTAtileDHW pixels of one output channel of
one image; each thread computes ``outputsPerThread`` of them, looping over every input
channel and tap itself with its accumulators in registers.  Nothing is staged in shared
memory.  The kernel: :mod:`convkernels.gpu.direct`.
"""

from convbench.registry import Implementation, register
from convkernels.gpu import direct

register(Implementation(**direct.per_thread_fields(
    name="directConvNCDHWnobuffer",
    summary="direct convolution on NCDHW, merged D*H*W pixel tiles, several outputs per "
            "thread in registers, no staging",
    channel_loop_outside=False)))
