"""``directConvNCDHWBwdData``: dL/dx by the direct definition on NCDHW, scheduled by DaCe's
auto-optimize.

The kernel: :mod:`convkernels.auto.direct`.
"""

from convbench.registry import ALL_PRECISIONS, FEATURES, Implementation, Layout, Pass, register
from convkernels.auto.schedules import auto_cpu, auto_gpu
from convkernels.auto import direct

register(Implementation(
    name="directConvNCDHWBwdData",
    summary="backward data by the direct definition on NCDHW: every tap, per-tap output "
            "tables with a zero plane, DaCe auto-optimize",
    layout=Layout.NCDHW,
    pass_=Pass.BWD_DATA,
    algorithm=direct.data_gradient,
    schedules={"cpu": auto_cpu, "gpu": auto_gpu},
    handles=FEATURES,
    precisions=ALL_PRECISIONS,
))
