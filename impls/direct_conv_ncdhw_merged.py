"""``directConvNCDHWmerged``: merged-DHW direct convolution with shared-memory staging.
Per input channel, a block stages the input tile (taps x pixels) and the filter tile
(output channels x taps) in shared memory, and each thread accumulates a register tile
of output channels x pixels.  See ``impls/_direct.py``.
"""

from convbench.registry import Pass
from convbench.registry import Implementation, register
from impls import _direct


def algorithm(layer, dtype, params):
    return _direct.merged(layer, dtype, params)


register(Implementation(
    name="directConvNCDHWmerged",
    summary="direct convolution on NCDHW, merged D*H*W, input and filter tiles staged in "
            "shared memory per input channel, register tiles",
    layout=_direct.LAYOUT,
    pass_=Pass.FWD,
    algorithm=algorithm,
    schedules=_direct.MERGED_SCHEDULES,
    params=_direct.MERGED_PARAMS,
    check_params=_direct.check_merged_params,
    supports=_direct.merged_supports,
    constraints=_direct.MERGED_CONSTRAINT,
))
