"""``directConvNDHWCdotBwdData``: dL/dx on NDHWC with the dot-product kernel of
``directConvNDHWCdot``, for stride 1.

Like ``directConvNDHWCblockedBwdData`` it runs the forward kernel on the transposed layer
(dL/dy padded by ``k - 1 - p``, the filter flipped in space with its channels swapped),
but vectorised over the reduction channels (the layer's output channels ``K``) instead
of over the channels it writes.  That suits layers with few input channels, where a
vector of ``C`` channels would be mostly empty: CosmoFlow's first layers (C = 1 or 4)
reduce over K = 16 or 32 channels, one or two full vectors.  The filter is first copied
into the transposed layer's KTRSC order, so the kernel reads it as the forward one does.

The kernel: :mod:`convkernels.cpu.direct.dot`.
"""

from convbench.registry import Implementation, Layout, Pass, register
from convkernels.cpu.direct import dot
from convkernels.cpu.direct.blocking import cpu_schedule
from convkernels.transposed import supports

register(Implementation(
    name="directConvNDHWCdotBwdData",
    search_space="PIX=4,6;KT=1,4",
    summary="backward data on NDHWC for the CPU (stride 1): the dot-product forward kernel "
            "(vectorised over the reduction channels K) on dL/dy, filter flipped and "
            "transposed first; for layers with few input channels",
    layout=Layout.NDHWC,
    pass_=Pass.BWD_DATA,
    algorithm=dot.data_gradient,
    schedules={"cpu": cpu_schedule},
    params=dot.PARAMS,
    check_params=dot.check_params_dot,
    supports=supports,
    constraints="stride 1, padding at most kernel - 1",
    anisotropic_pad=True,
    registers=dot.data_gradient_registers,
))
