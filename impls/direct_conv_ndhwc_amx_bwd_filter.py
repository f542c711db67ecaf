"""``directConvNDHWCamxBwdFilter``: the filter gradient on AMX tiles, in bfloat16
(``tdpbf16ps``) on NDHWC.

The kernel: :mod:`convkernels.cpu.direct.amx`.
"""

from convbench.registry import Implementation, Pass, register
from convkernels.cpu.direct import amx

register(Implementation(
    name="directConvNDHWCamxBwdFilter",
    summary="the filter gradient on AMX tiles, bfloat16 with float32 sums: 2 x 2 blocks of "
            "16 x 16 tiles (tdpbf16ps), AMX-BF16 CPUs only (EMULATE=1: the tiles in C++, for "
            "tests)",
    **amx.registration(Pass.BWD_FILTER, amx.filter_gradient),
))
