"""``directConvNDHWCfew``: the CPU forward convolution for few input channels, on NDHWC.

The kernel: :mod:`convkernels.cpu.direct.few`.
"""

from convbench.registry import Implementation, Layout, Pass, register
from convkernels.cpu.direct import few
from convkernels.cpu.direct.blocking import cpu_schedule
from convkernels.cpu.rules import FEW

register(Implementation(
    name="directConvNDHWCfew",
    summary="direct convolution on NDHWC for the CPU, for few input channels: per output "
            "row, register blocks of PB pixels x NV vectors of output channels over a "
            "reduction written out in C++ (broadcasts inside the FMAs with AVX-512), "
            "output streamed past the cache where it outgrows it",
    layout=Layout.NDHWC,
    pass_=Pass.FWD,
    algorithm=few.program,
    schedules={"cpu": cpu_schedule},
    params=few.params(),
    supports=few.supports,
    constraints="KW x C at most 24 (few input channels); AVX2 with FMA, or AVX-512",
    check_params=few.check_params,
    search_space="PB=0,8,12;NV=0,1;STREAM=2,0",
    anisotropic_pad=True,
    registers=few.registers,
    wins=(FEW,),
))
