"""``winogradF2Tiled``: 3D Winograd F(2^3, 3^3) as a tiled GPU program (:mod:`convkernels.gpu.winograd`):
the input transform of a block's tiles in shared memory, each thread's 64 products per
tile and output channel summed in registers, its output transform.  Its CPU schedule
runs the same blocks and threads (slowly), so the CPU check verifies what the GPU runs;
``winogradF2`` is the CPU kernel."""

from convbench.registry import Implementation, Layout, Pass, register
from convkernels.winograd import fields
from convkernels.gpu import winograd

register(Implementation(
    name="winogradF2Tiled",
    summary="3D Winograd F(2^3, 3^3) tiled for the GPU: a block of TT tiles x TK output "
            "channels, the input transform in shared memory, 64 sums per thread in "
            "registers, its output transform (CPU: the same blocks, threads in sequence)",
    layout=Layout.NDHWC,
    pass_=Pass.FWD,
    schedules={"cpu": winograd.schedule("cpu"), "gpu": winograd.schedule("gpu")},
    params=winograd.params(),
    check_params=winograd.check_params,
    **fields.pass_fields(Pass.FWD, winograd.program),
))
