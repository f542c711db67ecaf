"""``implicitGemmsplitKBwdFilter``: backward filter with the long N*Do*Ho*Wo reduction
split over ``nsplitK`` chunks of output depth planes into partial sums, then reduced
(see ``_backward.py``).  More independent work for the layers with few filter
elements and many pixels (the first CosmoFlow layers), where split-K pays most."""

from convbench.registry import ALL_PRECISIONS, FEATURES, Layout, Pass
from convbench.registry import Implementation, Param, register
from impls._backward import bwd_filter_algorithm
from impls._common import auto_cpu, auto_gpu


def algorithm(layer, dtype, params):
    return bwd_filter_algorithm(layer, dtype, params, nsplit=params["nsplitK"])


register(Implementation(
    name="implicitGemmsplitKBwdFilter",
    summary="backward filter, the N*Do*Ho*Wo reduction split over nsplitK chunks of output "
            "depth planes into partials, then a reduction map, NDHWC, DaCe auto-optimize",
    layout=Layout.NDHWC,
    pass_=Pass.BWD_FILTER,
    algorithm=algorithm,
    schedules={"cpu": auto_cpu, "gpu": auto_gpu},
    handles=FEATURES,
    precisions=ALL_PRECISIONS,
    params=(Param("nsplitK", 4, "chunks of output depth planes reduced separately (a chunk "
                  "beyond the last plane adds zeros)"),),
))
