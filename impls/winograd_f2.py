"""``winogradF2``: 3D Winograd F(2^3, 3^3) on NDHWC for the CPU (the kernel:
:mod:`convkernels.cpu.winograd.forward`): 64 element-wise products per 2 x 2 x 2 output tile instead of 216, at
the price of a larger rounding error, which its check bounds with
:func:`convkernels.winograd.algebra.error_bound` instead of the direct sums' tolerance
(docs/winograd.md)."""

from convbench.registry import Implementation, Layout, Pass, register
from convkernels.cpu.winograd import forward
from convkernels.winograd import fields
from convkernels.cpu.rules import WINOGRAD
from convkernels.cpu.direct.blocking import cpu_schedule

register(Implementation(
    name="winogradF2",
    summary="3D Winograd F(2^3, 3^3) on NDHWC for the CPU: blocks of output tiles times "
            "groups of output channels, each with its input transform, one "
            "register-blocked GEMM per transform point and its output transform in a "
            "thread's cache; checked against its own rigorous bound",
    layout=Layout.NDHWC,
    pass_=Pass.FWD,
    schedules={"cpu": cpu_schedule},
    params=forward.params(),
    search_space=forward.SEARCH_SPACE,
    registers=forward.registers_of(Pass.FWD),
    **fields.pass_fields(Pass.FWD, forward.program),
    wins=(WINOGRAD,),
))
