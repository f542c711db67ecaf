"""``directConvNDHWCamxBwdData``: the data gradient on AMX tiles (stride 1), in bfloat16
(``tdpbf16ps``) on NDHWC: the forward kernel on dL/dy, its filter packed flipped.

The kernel: :mod:`convkernels.cpu.direct.amx`.
"""

from convbench.registry import Implementation, Pass, register
from convkernels.cpu.direct import amx

register(Implementation(
    name="directConvNDHWCamxBwdData",
    summary="the data gradient on AMX tiles (stride 1): the forward kernel on dL/dy, the "
            "filter packed flipped; bfloat16 with float32 sums, 2 x 2 blocks of 16 x 16 tiles "
            "(tdpbf16ps), AMX-BF16 CPUs only (EMULATE=1: the tiles in C++, for tests)",
    **amx.registration(Pass.BWD_DATA, amx.data_gradient, amx.supports_data_gradient),
))
