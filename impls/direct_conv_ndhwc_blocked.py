"""``directConvNDHWCblocked``: a register-blocked direct convolution for the CPU, on NDHWC.

The kernel: :mod:`convkernels.cpu.direct.forward`.
"""

from convbench.registry import ALL_PRECISIONS, Implementation, Layout, Param, Pass, register
from convkernels.cpu.direct import forward, bf16_dot
from convkernels.cpu.direct.blocking import (cblk_param, cpu_schedule, edge_param,
                                             group_param, inplace_param, kouter_param,
                                             lanes_param, nv_param, registers_of)
from convkernels.cpu.isa import fit_pixels
from convkernels.cpu.rules import DIRECT

register(Implementation(
    name="directConvNDHWCblocked",
    search_space="PIX=2,4,8,16;NV=1,2,4,8;KOUTER=0,1",
    default_for=("network-cpu",),
    summary="direct convolution on NDHWC for the CPU: register-blocked micro-tiles of WB "
            "output pixels x NV vectors of NB output channels, packed filter, "
            "unrolled broadcast-FMAs, OpenMP over all tiles",
    layout=Layout.NDHWC,
    pass_=Pass.FWD,
    algorithm=forward.algorithm,
    schedules={"cpu": cpu_schedule},
    params=(Param("PIX", fit_pixels(8, 2),
                  "output pixels per micro-tile: accumulator vectors (width first, then "
                  "height and depth, by divisors of the output size)"),
            Param("WB", 16, "at most this many of them along the width"),
            lanes_param("NB", "output channels per vector (the largest divisor of K up "
                              "to NB)"),
            nv_param(2),
            kouter_param(),
            cblk_param(),
            group_param(),
            edge_param(),
            inplace_param(),
            bf16_dot.dot_param()),
    anisotropic_pad=True,
    registers=registers_of(forward.tile_sizes),
    precisions=ALL_PRECISIONS,
    wins=(DIRECT,),
))
