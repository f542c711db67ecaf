"""``directConvNCDHWBwdFilter``: dL/dw by the direct definition on NCDHW, scheduled by
DaCe's auto-optimize.

The kernel: :mod:`convkernels.auto.direct`.
"""

from convbench.registry import ALL_PRECISIONS, FEATURES, Implementation, Layout, Pass, register
from convkernels.auto.schedules import auto_cpu, auto_gpu
from convkernels.auto import direct

register(Implementation(
    name="directConvNCDHWBwdFilter",
    summary="backward filter by the direct definition on NCDHW: one map over filter "
            "elements, each reducing over every output pixel, DaCe auto-optimize",
    layout=Layout.NCDHW,
    pass_=Pass.BWD_FILTER,
    algorithm=direct.filter_gradient,
    schedules={"cpu": auto_cpu, "gpu": auto_gpu},
    handles=FEATURES,
    precisions=ALL_PRECISIONS,
))
