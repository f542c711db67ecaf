"""``winogradF2BwdData``: dL/dx of a stride-1 3x3x3 layer with Winograd F(2^3, 3^3).

dL/dx of a stride-1 layer is the forward convolution of dL/dy with the filter flipped in
space and its channels swapped (:mod:`convkernels.transposed`), a 3x3x3 stride-1 convolution
again, so ``winogradF2``'s kernel computes it.  The flip and the swap happen while the
filter is transformed, which the kernel does anyway: the original filter's output
channels are already its innermost dimension, the vector dimension of the transform."""

from convbench.registry import Implementation, Layout, Pass, register
from convkernels.cpu.winograd import forward
from convkernels.winograd import fields
from convkernels.cpu.rules import WINOGRAD_DATA
from convkernels.cpu.direct.blocking import cpu_schedule

register(Implementation(
    name="winogradF2BwdData",
    summary="backward data with 3D Winograd F(2^3, 3^3) (stride 1): winogradF2's kernel on "
            "dL/dy, the filter flipped and its channels swapped while it is transformed",
    layout=Layout.NDHWC,
    pass_=Pass.BWD_DATA,
    schedules={"cpu": cpu_schedule},
    params=forward.params(),
    search_space=forward.SEARCH_SPACE,
    registers=forward.registers_of(Pass.BWD_DATA),
    **fields.pass_fields(Pass.BWD_DATA, forward.program),
    wins=(WINOGRAD_DATA,),
))
