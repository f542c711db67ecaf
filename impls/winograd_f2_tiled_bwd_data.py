"""``winogradF2TiledBwdData``: dL/dx of a stride-1 3x3x3 layer with ``winogradF2Tiled``'s
program on the transposed layer (:mod:`convkernels.transposed`), the filter flipped and its
channels swapped where the filter transform reads it."""

from convbench.registry import Implementation, Layout, Pass, register
from convkernels.winograd import fields
from convkernels.gpu import winograd

register(Implementation(
    name="winogradF2TiledBwdData",
    summary="backward data with winogradF2Tiled's GPU program on dL/dy (stride 1), the "
            "filter flipped and its channels swapped in the filter transform",
    layout=Layout.NDHWC,
    pass_=Pass.BWD_DATA,
    schedules={"cpu": winograd.schedule("cpu", transposed=True),
               "gpu": winograd.schedule("gpu", transposed=True)},
    params=winograd.params(),
    check_params=winograd.check_params,
    **fields.pass_fields(Pass.BWD_DATA, winograd.program),
))
