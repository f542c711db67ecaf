"""``directConvNDHWCdot``: a register-blocked direct convolution for the CPU, on NDHWC,
vectorised over the *input* channels (dot-product form), with no filter packing.

The kernel: :mod:`convkernels.cpu.direct.dot`.
"""

from convbench.registry import Implementation, Layout, Pass, register
from convkernels.cpu.direct import dot
from convkernels.cpu.direct.blocking import cpu_schedule

register(Implementation(
    name="directConvNDHWCdot",
    search_space="PIX=2,4,6;KT=4,8;KOUTER=0,1",
    summary="direct convolution on NDHWC for the CPU, vectorised over input channels: "
            "register-blocked micro-tiles of PIX output pixels x KT output channels (PIX*KT "
            "accumulator vectors of CV channels), filter read in place (no packing), OpenMP "
            "over all tiles",
    layout=Layout.NDHWC,
    pass_=Pass.FWD,
    algorithm=dot.algorithm,
    schedules={"cpu": cpu_schedule},
    params=dot.PARAMS,
    check_params=dot.check_params_dot,
    anisotropic_pad=True,
    registers=dot.registers,
))
