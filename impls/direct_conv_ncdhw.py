"""``directConvNCDHW``: direct convolution on NCDHW, scheduled by DaCe's auto-optimize.

The kernel: :mod:`convkernels.auto.direct`.
"""

from convbench.registry import ALL_PRECISIONS, FEATURES, Implementation, Layout, Pass, register
from convkernels.auto.schedules import auto_cpu, auto_gpu
from convkernels.auto import direct

register(Implementation(
    name="directConvNCDHW",
    summary="direct convolution on NCDHW, one map over all outputs, DaCe auto-optimize",
    layout=Layout.NCDHW,
    pass_=Pass.FWD,
    algorithm=direct.forward,
    schedules={"cpu": auto_cpu, "gpu": auto_gpu},
    handles=FEATURES,
    precisions=ALL_PRECISIONS,
))
