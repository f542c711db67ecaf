"""``winogradF2TiledBwdData``: dL/dx of a stride-1 3x3x3 layer with ``winogradF2Tiled``'s
program on the transposed layer (:mod:`impls._transposed`), the filter flipped and its
channels swapped where the filter transform reads it."""

from convbench.registry import Implementation, Layout, Pass, register
from impls import _winograd_fields, _winograd_tiled

register(Implementation(
    name="winogradF2TiledBwdData",
    summary="backward data with winogradF2Tiled's GPU program on dL/dy (stride 1), the "
            "filter flipped and its channels swapped in the filter transform",
    layout=Layout.NDHWC,
    pass_=Pass.BWD_DATA,
    schedules={"cpu": _winograd_tiled.schedule("cpu", transposed=True),
               "gpu": _winograd_tiled.schedule("gpu", transposed=True)},
    params=_winograd_tiled.params(),
    check_params=_winograd_tiled.check_params,
    **_winograd_fields.pass_fields(Pass.BWD_DATA, _winograd_tiled.program),
))
