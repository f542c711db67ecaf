"""``directConvNCDHWmerged``: merged-DHW direct convolution with shared-memory staging.
Per input channel, a block stages the input tile (taps x pixels) and the filter tile
(output channels x taps) in shared memory, and each thread accumulates a register tile
of output channels x pixels.  The kernel: :mod:`convkernels.gpu.direct`.
"""

from convbench.registry import Implementation, Pass, register
from convkernels.gpu import direct

register(Implementation(
    name="directConvNCDHWmerged",
    summary="direct convolution on NCDHW, merged D*H*W, input and filter tiles staged in "
            "shared memory per input channel, register tiles",
    layout=direct.LAYOUT,
    pass_=Pass.FWD,
    algorithm=direct.merged,
    schedules=direct.MERGED_SCHEDULES,
    params=direct.MERGED_PARAMS,
    check_params=direct.check_merged_params,
    supports=direct.merged_supports,
    constraints=direct.MERGED_CONSTRAINT,
))
