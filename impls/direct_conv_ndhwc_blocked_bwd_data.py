"""``directConvNDHWCblockedBwdData``: dL/dx on NDHWC with the register-blocked forward
kernel of ``directConvNDHWCblocked``.

The kernel: :mod:`convkernels.cpu.direct.data_gradient`.
"""

from convbench.registry import ALL_PRECISIONS, Implementation, Layout, Param, Pass, register
from convkernels.cpu.direct import data_gradient, bf16_dot
from convkernels.cpu.direct.blocking import (auto_switch, cblk_param, cpu_schedule,
                                             edge_param, group_param, inplace_param,
                                             kouter_param, lanes_param, nv_param,
                                             registers_of)
from convkernels.cpu.isa import fit_pixels
from convkernels.cpu.rules import DIRECT
from convkernels.transposed import supports

register(Implementation(
    name="directConvNDHWCblockedBwdData",
    search_space="PIX=2,3,4,6,8,16;NV=1,2,4,8;PACK=0,1;GROUP=2;KOUTER=0,1",
    default_for=("network-cpu",),
    summary="backward data on NDHWC for the CPU (stride 1): the register-blocked forward "
            "kernel on dL/dy with the filter flipped and transposed while packed",
    layout=Layout.NDHWC,
    pass_=Pass.BWD_DATA,
    algorithm=data_gradient.algorithm,
    schedules={"cpu": cpu_schedule},
    params=(Param("PIX", fit_pixels(8, 2), "input pixels per micro-tile: accumulator vectors"),
            Param("WB", 16, "at most this many of them along the width"),
            lanes_param("NB", "input channels per vector (the largest divisor of C up "
                              "to NB)"),
            nv_param(2),
            Param("PACK", 2, "1: copy the filter into tile order first; 0: read its "
                             "channel vectors in place (no copy, strided filter stream); 2: "
                             "copy it when it is smaller than dL/dy",
                  minimum=0, check=auto_switch),
            kouter_param(),
            cblk_param(),
            group_param(),
            edge_param(),
            inplace_param(),
            bf16_dot.dot_param()),
    supports=supports,
    constraints="stride 1, padding at most kernel - 1",
    anisotropic_pad=True,
    registers=registers_of(data_gradient.tile_sizes),
    precisions=ALL_PRECISIONS,
    wins=(DIRECT,),
))
