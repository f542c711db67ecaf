"""``implicitGemmsplitKBwdFilter``: backward filter with the long N*Do*Ho*Wo reduction
split over ``nsplitK`` chunks of output depth planes into partial sums, then reduced
(:mod:`convkernels.auto.implicit_gemm`).  More independent work for the layers with few
filter elements and many pixels (the first CosmoFlow layers), where split-K pays most."""

from convbench.registry import (ALL_PRECISIONS, FEATURES, Implementation, Layout, Param, Pass,
                                register)
from convkernels.auto import implicit_gemm
from convkernels.auto.schedules import auto_cpu, auto_gpu


register(Implementation(
    name="implicitGemmsplitKBwdFilter",
    summary="backward filter, the N*Do*Ho*Wo reduction split over nsplitK chunks of output "
            "depth planes into partials, then a reduction map, NDHWC, DaCe auto-optimize",
    layout=Layout.NDHWC,
    pass_=Pass.BWD_FILTER,
    algorithm=lambda layer, dtype, params: implicit_gemm.filter_gradient(
        layer, dtype, params, nsplit=params["nsplitK"]),
    schedules={"cpu": auto_cpu, "gpu": auto_gpu},
    handles=FEATURES,
    precisions=ALL_PRECISIONS,
    params=(Param("nsplitK", 4, "chunks of output depth planes reduced separately (a chunk "
                  "beyond the last plane adds zeros)"),),
))
