"""``implicitGemmMMA``: the tiled implicit GEMM on NDHWC with its inner product on tensor
cores, ``mma.sync`` m16n8k16 on float16 or bfloat16 operands with float32 sums (see
``_mma.py``).  Its CPU schedule keeps the warps, the lanes and the fragment layout and
emulates each MMA from the fragments, so CI verifies the indexing that runs on the GPU.
"""

from convbench.registry import Implementation, Layout, Pass, register
from impls import _mma
from impls import _tiling as T


def algorithm(layer, dtype, params):
    return _mma.program(layer, Layout.NDHWC, dtype, params)


register(Implementation(
    name="implicitGemmMMA",
    summary="implicit GEMM on NDHWC on tensor cores: mma.sync m16n8k16 per warp tile, "
            "A and B staged in shared memory (CPU: the MMA emulated on the fragment layout)",
    layout=Layout.NDHWC,
    pass_=Pass.FWD,
    algorithm=algorithm,
    schedules={"cpu": _mma.schedule("cpu"), "gpu": _mma.schedule("gpu")},
    params=_mma.PARAMS,
    check_params=_mma.check_params,
    supports=T.int32_offsets,
    constraints=T.INT32_CONSTRAINT,
    precisions=("float16", "bfloat16"),
))
